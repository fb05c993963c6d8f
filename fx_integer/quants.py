"""GGUF quantization formats decoded to exact integers (no float anywhere), and encoded back.

Every format the engine reads is a block format whose weights are ``w = D * code + M`` per
block of ``group`` weights, with ``D`` and ``M`` built from f16 fields (dyadic rationals: exact
in Q.24) and small integers (the K-quants' 6- or 8-bit sub-scales), so each is decoded into
int8 ``codes`` with per-block ``scale`` (``D``) and ``offset`` (``M``, or None) in Q.24::

    w[r, c] == (scale[r, c // group] * codes[r, c] + offset[r, c // group]) / 2**24   exactly

* :func:`decode` -> :class:`Decoded`: what the engine serves from (codes, D, M).
* :func:`unpack` -> :class:`Fields`: the stored fields themselves (codes, the f16 bits of d and
  m/dmin, the K-quants' sub-scales and sub-mins); :func:`encode` is its exact inverse, so
  ``encode(kind, **fields) == raw`` byte for byte for any valid tensor. ``encode`` builds valid
  GGUF block bytes from chosen integers, e.g. to write synthetic GGUFs deterministically.

The byte layouts, bit orders and the integer mapping of each format are documented in
docs/integer-quants.md; tests/unit/integer/test_quants.py holds every decode to
``gguf.quants.dequantize`` and to ggml's own C dequantisers (Q1_0 included).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from .fixed_point import f16_bits_to_q24

I64 = npt.NDArray[np.int64]
I16 = npt.NDArray[np.int16]
I8 = npt.NDArray[np.int8]
U16 = npt.NDArray[np.uint16]
U8 = npt.NDArray[np.uint8]

#: format -> (weights per block, bytes per block)
BLOCKS: Final[dict[str, tuple[int, int]]] = {
    "Q1_0": (128, 18),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}
SUPPORTED: Final[tuple[str, ...]] = tuple(BLOCKS)
#: format -> weights per scale (D, M) in :class:`Decoded` (the K-quants' sub-blocks)
GROUP: Final[dict[str, int]] = {"Q1_0": 128, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q8_0": 32,
                                "Q4_K": 32, "Q5_K": 32, "Q6_K": 16}
#: format -> (smallest, largest) code; Q1_0's codes are -1 and +1 only (never 0)
CODES: Final[dict[str, tuple[int, int]]] = {
    "Q1_0": (-1, 1), "Q4_0": (-8, 7), "Q4_1": (0, 15), "Q5_0": (-16, 15), "Q8_0": (-128, 127),
    "Q4_K": (0, 15), "Q5_K": (0, 31), "Q6_K": (-32, 31)}
#: format -> the largest |code| it can produce
QMAX: Final[dict[str, int]] = {k: max(-lo, hi) for k, (lo, hi) in CODES.items()}
# formats with a second f16 (Q4_1: m; Q4_K/Q5_K: dmin) and with sub-scales / sub-mins
_M_FIELD: Final = {"Q4_1": "m", "Q4_K": "dmin", "Q5_K": "dmin"}
_SUB_SCALES: Final = {"Q4_K": (0, 63), "Q5_K": (0, 63), "Q6_K": (-128, 127)}
_SUB_MINS: Final = {"Q4_K": (0, 63), "Q5_K": (0, 63)}

# Every f16 bit pattern's exact Q.24 value, built once by the integer decoder (a table lookup
# is ~10x faster than decoding each scale); inf/NaN patterns (exponent 31) are flagged.
_ALL_BITS = np.arange(1 << 16, dtype=np.int64)
_F16_FINITE: Final = ((_ALL_BITS >> 10) & 0x1F) != 0x1F
_F16_Q24: Final = f16_bits_to_q24(np.where(_F16_FINITE, _ALL_BITS, 0).astype(np.uint16))
del _ALL_BITS


class QuantError(ValueError):
    """A tensor the decoder or encoder cannot handle: an unknown format, a shape that is not a
    whole number of blocks, a byte count that does not match, an f16 scale that is inf or NaN,
    a code or sub-scale out of its format's range. The message names the format."""


@dataclasses.dataclass(frozen=True)
class Decoded:
    """One matrix as exact integers: ``w = (scale * code + offset) / 2**24`` per weight, with
    ``scale``/``offset`` repeated over each run of ``group`` weights of a row."""

    codes: npt.NDArray[np.int8]  # [rows, cols], signed integer codes, one per weight
    scale: I64  # [rows, cols // group], the block scale D in Q.24 (exact)
    offset: I64 | None  # [rows, cols // group], the block offset M in Q.24, or None
    group: int  # weights per scale block
    qmax: int  # the largest |code| the format can produce


@dataclasses.dataclass(frozen=True)
class Fields:
    """One matrix's stored block fields (what :func:`encode` takes, :func:`unpack` returns).

    ``codes`` use :class:`Decoded`'s convention (signed where the format subtracts a bias).
    ``d_bits``/``m_bits`` are raw IEEE half bits, one per block of ``BLOCKS[kind][0]``
    weights (``m_bits``: Q4_1's m, Q4_K/Q5_K's dmin; None elsewhere). ``sub_scales`` and
    ``sub_mins`` are the K-quants' per-``GROUP[kind]`` integers (Q4_K/Q5_K: 6-bit scales and
    mins 0..63; Q6_K: int8 scales, no mins; None elsewhere)."""

    codes: I8  # [rows, cols]
    d_bits: U16  # [rows, cols // QK]
    m_bits: U16 | None  # [rows, cols // QK]
    sub_scales: I16 | None  # [rows, cols // GROUP]
    sub_mins: I16 | None  # [rows, cols // GROUP]


def row_bytes(kind: str, cols: int) -> int:
    """Bytes of one row of ``cols`` weights in format ``kind``."""
    qk, size = _block(kind)
    if cols <= 0 or cols % qk:
        raise QuantError(f"{kind}: rows of {cols} weights are not whole blocks of {qk}")
    return cols // qk * size


def _block(kind: str) -> tuple[int, int]:
    if kind not in BLOCKS:
        raise QuantError(f"quantization {kind} is not supported (supported: "
                         f"{', '.join(SUPPORTED)})")
    return BLOCKS[kind]


# ------------------------------------------------------------------------------- decoding


def unpack(kind: str, raw: npt.NDArray[np.generic], rows: int, cols: int) -> Fields:
    """The stored fields of a GGUF tensor's raw bytes (``rows`` x ``cols`` weights, each row
    a run of whole blocks, as ``GGUFReader`` gives ``tensor.data``). Integer operations only."""
    _, size = _block(kind)
    if rows <= 0:
        raise QuantError(f"{kind}: {rows} rows")
    nb = row_bytes(kind, cols) // size
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if data.size != rows * nb * size:
        raise QuantError(f"{kind}: {data.size} bytes for {rows} x {cols} weights, expected "
                         f"{rows * nb * size} ({rows} rows of {nb} blocks of {size} bytes)")
    return _UNPACK[kind](data.reshape(rows, nb, size), rows, cols)


def decode(kind: str, raw: npt.NDArray[np.generic], rows: int, cols: int) -> Decoded:
    """Decode a GGUF tensor's raw bytes (``rows`` x ``cols`` weights, row-major blocks) into
    exact int8 codes and Q.24 block scales/offsets. No float anywhere."""
    f = unpack(kind, raw, rows, cols)
    d = _q24(kind, "d", f.d_bits)
    m = None if f.m_bits is None else _q24(kind, _M_FIELD[kind], f.m_bits)
    group = GROUP[kind]
    if f.sub_scales is None:
        return Decoded(f.codes, d, m, group, QMAX[kind])
    per = BLOCKS[kind][0] // group  # sub-blocks per super-block
    nb = d.shape[1]
    scale = (d[:, :, None] * f.sub_scales.reshape(rows, nb, per)).reshape(rows, nb * per)
    offset = None
    if f.sub_mins is not None:
        assert m is not None
        offset = -(m[:, :, None] * f.sub_mins.reshape(rows, nb, per)).reshape(rows, nb * per)
    return Decoded(f.codes, scale, offset, group, QMAX[kind])


def _q24(kind: str, name: str, bits: U16) -> I64:
    """Exact Q.24 values of f16 bits (table of the integer decoder); inf/NaN -> QuantError."""
    finite = _F16_FINITE[bits]
    if not finite.all():
        r, b = (int(i) for i in np.argwhere(~finite)[0])
        raise QuantError(f"{kind}: f16 {name} of row {r}, block {b} is inf/nan "
                         f"(bits 0x{int(bits[r, b]):04x})")
    return _F16_Q24[bits]


def _bits16(b: U8, at: int) -> U16:
    """The little-endian u16 at byte ``at`` of every block."""
    return np.ascontiguousarray(b[:, :, at:at + 2]).view("<u2")[:, :, 0].astype(np.uint16)


def _signed(u: npt.NDArray[np.integer[Any]], bias: int) -> I8:
    """uint8 codes 0..255 - bias as int8 (the caller guarantees the result fits)."""
    return (u.astype(np.int16) - bias).astype(np.int8)


def _nibbles32(qs: U8) -> U8:
    """16 bytes -> 32 values: element j in the low nibble of byte j, j + 16 in the high."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _u_q8_0(b: U8, rows: int, cols: int) -> Fields:
    codes = np.ascontiguousarray(b[:, :, 2:34]).view(np.int8).reshape(rows, cols)
    return Fields(codes, _bits16(b, 0), None, None, None)


def _u_q4_0(b: U8, rows: int, cols: int) -> Fields:
    codes = _signed(_nibbles32(b[:, :, 2:18]), 8).reshape(rows, cols)
    return Fields(codes, _bits16(b, 0), None, None, None)


def _u_q4_1(b: U8, rows: int, cols: int) -> Fields:
    codes = _nibbles32(b[:, :, 4:20]).view(np.int8).reshape(rows, cols)
    return Fields(codes, _bits16(b, 0), _bits16(b, 2), None, None)


def _u_q5_0(b: U8, rows: int, cols: int) -> Fields:
    high = np.unpackbits(b[:, :, 2:6], axis=-1, bitorder="little")  # bit j of the u32 qh
    codes = _signed(_nibbles32(b[:, :, 6:22]) | (high << 4), 16).reshape(rows, cols)
    return Fields(codes, _bits16(b, 0), None, None, None)


def _u_q1_0(b: U8, rows: int, cols: int) -> Fields:
    bits = np.unpackbits(b[:, :, 2:18], axis=-1, bitorder="little")  # bit j % 8 of byte j // 8
    codes = (bits.view(np.int8) * np.int8(2) - np.int8(1)).reshape(rows, cols)  # 1: +1, 0: -1
    return Fields(codes, _bits16(b, 0), None, None, None)


def _k_scale_min(q: U8) -> tuple[I16, I16]:
    """Q4_K/Q5_K: the eight 6-bit scales and mins packed in 12 bytes (ggml's
    get_scale_min_k4): j < 4 in the low 6 bits of bytes j (scale) and j + 4 (min); j >= 4 in
    the low (scale) and high (min) nibble of byte j + 4, their top 2 bits in the top 2 bits of
    bytes j - 4 (scale) and j (min)."""
    lo, mid, hi = q[..., 0:4], q[..., 4:8], q[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 0xF) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc.astype(np.int16), mn.astype(np.int16)


def _k_low_nibbles(qs: U8) -> U8:
    """Q4_K/Q5_K: 128 bytes -> the 4 low bits of 256 weights, [..., 8 sub-blocks, 32]: chunk
    c of 32 bytes holds sub-block 2c in its low nibbles and 2c + 1 in its high nibbles."""
    q = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return np.concatenate([q & 0xF, q >> 4], axis=-2).reshape(*qs.shape[:-1], 8, 32)


def _u_q4_k(b: U8, rows: int, cols: int) -> Fields:
    sc, mn = _k_scale_min(b[:, :, 4:16])
    codes = _k_low_nibbles(b[:, :, 16:144]).view(np.int8).reshape(rows, cols)
    return Fields(codes, _bits16(b, 0), _bits16(b, 2), sc.reshape(rows, -1), mn.reshape(rows, -1))


def _u_q5_k(b: U8, rows: int, cols: int) -> Fields:
    sc, mn = _k_scale_min(b[:, :, 4:16])
    # the fifth bit of element l of sub-block s is bit s of qh[l]
    high = np.unpackbits(b[:, :, 16:48, None], axis=-1, bitorder="little")  # [.., 32 l, 8 s]
    low = _k_low_nibbles(b[:, :, 48:176])
    codes = (low | (np.swapaxes(high, -1, -2) << 4)).view(np.int8).reshape(rows, cols)
    return Fields(codes, _bits16(b, 0), _bits16(b, 2), sc.reshape(rows, -1), mn.reshape(rows, -1))


def _u_q6_k(b: U8, rows: int, cols: int) -> Fields:
    nb = cols // 256
    # two halves of 128 weights; quarter k of a half, element l < 32: low 4 bits in nibble
    # k // 2 of ql[32 * (k % 2) + l], high 2 bits at bit 2k of qh[l]
    ql = b[:, :, 0:128].reshape(rows, nb, 2, 1, 2, 32)  # [half, ., k % 2, l]
    qh = b[:, :, 128:192].reshape(rows, nb, 2, 1, 32)
    low = np.concatenate([ql & 0xF, ql >> 4], axis=3).reshape(rows, nb, 2, 4, 32)
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3  # [half, k, l]
    codes = _signed(low | (high << 4), 32).reshape(rows, cols)
    sc = np.ascontiguousarray(b[:, :, 192:208]).view(np.int8).astype(np.int16)
    return Fields(codes, _bits16(b, 208), None, sc.reshape(rows, nb * 16), None)


_UNPACK: Final = {"Q1_0": _u_q1_0, "Q4_0": _u_q4_0, "Q4_1": _u_q4_1, "Q5_0": _u_q5_0,
                  "Q8_0": _u_q8_0, "Q4_K": _u_q4_k, "Q5_K": _u_q5_k, "Q6_K": _u_q6_k}


# ------------------------------------------------------------------------------- encoding


def _ints(kind: str, name: str, a: npt.ArrayLike, shape: tuple[int, int], lo: int,
          hi: int) -> I64:
    """``a`` as int64 of ``shape`` with every value in [lo, hi], else QuantError."""
    arr = np.asarray(a)
    if arr.shape != shape:
        raise QuantError(f"{kind}: {name} has shape {arr.shape}, expected {shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise QuantError(f"{kind}: {name} must be integers, not {arr.dtype}")
    out = arr.astype(np.int64)
    if out.size and (out.min() < lo or out.max() > hi):
        bad = np.argwhere((out < lo) | (out > hi))[0]
        raise QuantError(f"{kind}: {name}[{', '.join(str(int(i)) for i in bad)}] = "
                         f"{int(out[tuple(bad)])} is outside {lo}..{hi}")
    return out


def _f16_field(kind: str, name: str, a: npt.ArrayLike, shape: tuple[int, int]) -> U8:
    """Validated f16 bits -> [rows, nb, 2] little-endian bytes (inf/NaN refused)."""
    bits = _ints(kind, name, a, shape, 0, 0xFFFF)
    if not _F16_FINITE[bits].all():
        r, b = (int(i) for i in np.argwhere(~_F16_FINITE[bits])[0])
        raise QuantError(f"{kind}: f16 {name}[{r}, {b}] = 0x{int(bits[r, b]):04x} is inf/nan")
    return bits.astype("<u2").view(np.uint8).reshape(*shape, 2)


def encode(kind: str, codes: npt.ArrayLike, d_bits: npt.ArrayLike, *,
           m_bits: npt.ArrayLike | None = None, sub_scales: npt.ArrayLike | None = None,
           sub_mins: npt.ArrayLike | None = None) -> bytes:
    """Valid GGUF block bytes (``rows`` x :func:`row_bytes`, row-major) from chosen integers.

    ``codes``: [rows, cols] in :class:`Decoded`'s convention, within ``CODES[kind]`` (Q1_0:
    -1 or +1). ``d_bits``: [rows, cols // QK] IEEE half bits of ``d`` (finite). ``m_bits``
    (Q4_1: m; Q4_K/Q5_K: dmin; required there, refused elsewhere): like ``d_bits``.
    ``sub_scales`` (K-quants: [rows, cols // GROUP], Q4_K/Q5_K 0..63, Q6_K -128..127) and
    ``sub_mins`` (Q4_K/Q5_K: [rows, cols // 32], 0..63). ``decode`` of the result gives back
    exactly these codes with ``D = d * sub_scale`` and ``M = m`` or ``-dmin * sub_min``; and
    ``encode(kind, **vars(unpack(kind, raw, rows, cols))) == raw`` for every valid ``raw``."""
    qk, size = _block(kind)
    c = np.asarray(codes)
    if c.ndim != 2:
        raise QuantError(f"{kind}: codes must be [rows, cols], not shape {c.shape}")
    rows, cols = c.shape
    if rows <= 0:
        raise QuantError(f"{kind}: {rows} rows")
    nb = row_bytes(kind, cols) // size
    lo, hi = CODES[kind]
    q = _ints(kind, "codes", c, (rows, cols), lo, hi)
    if kind == "Q1_0" and not np.all(q != 0):
        bad = np.argwhere(q == 0)[0]
        raise QuantError(f"{kind}: codes[{int(bad[0])}, {int(bad[1])}] = 0; Q1_0 codes are -1 "
                         "or +1")
    d = _f16_field(kind, "d_bits", d_bits, (rows, nb))
    for name, arg, has in (("m_bits", m_bits, kind in _M_FIELD),
                           ("sub_scales", sub_scales, kind in _SUB_SCALES),
                           ("sub_mins", sub_mins, kind in _SUB_MINS)):
        if arg is None and has:
            raise QuantError(f"{kind}: {name} is required")
        if arg is not None and not has:
            raise QuantError(f"{kind}: the format has no {name} (pass None)")
    group = GROUP[kind]
    sc = mn = None
    if sub_scales is not None:
        sc = _ints(kind, "sub_scales", sub_scales, (rows, cols // group), *_SUB_SCALES[kind])
    if sub_mins is not None:
        mn = _ints(kind, "sub_mins", sub_mins, (rows, cols // group), *_SUB_MINS[kind])
    m = None if m_bits is None else _f16_field(kind, "m_bits", m_bits, (rows, nb))
    u = (q - lo if kind in ("Q4_0", "Q5_0", "Q6_K") else q).astype(np.uint8)  # stored values
    u = u.reshape(rows, nb, qk)
    parts: list[npt.NDArray[np.integer[Any]]]
    if kind == "Q8_0":
        parts = [d, q.astype(np.int8).view(np.uint8).reshape(rows, nb, qk)]
    elif kind == "Q1_0":
        parts = [d, np.packbits(u == 1, axis=-1, bitorder="little")]
    elif kind in ("Q4_0", "Q4_1"):
        qs = u[:, :, :16] | (u[:, :, 16:] << 4)
        parts = [d, qs] if m is None else [d, m, qs]
    elif kind == "Q5_0":
        qh = np.packbits(u >> 4, axis=-1, bitorder="little")  # bit j: element j's fifth bit
        parts = [d, qh, (u[:, :, :16] & 0xF) | ((u[:, :, 16:] & 0xF) << 4)]
    elif kind in ("Q4_K", "Q5_K"):
        assert m is not None and sc is not None and mn is not None
        parts = [d, m, _k_pack_scale_min(sc.reshape(rows, nb, 8), mn.reshape(rows, nb, 8))]
        s = u.reshape(rows, nb, 4, 2, 32)  # chunk c: sub-blocks 2c (low), 2c + 1 (high)
        if kind == "Q5_K":
            high = np.swapaxes(u.reshape(rows, nb, 8, 32) >> 4, -1, -2)  # [l, s]
            parts.append(np.packbits(high, axis=-1, bitorder="little")[..., 0])
        parts.append(((s[:, :, :, 0] & 0xF) | ((s[:, :, :, 1] & 0xF) << 4)).reshape(rows, nb,
                                                                                    128))
    else:  # Q6_K
        assert sc is not None
        h = u.reshape(rows, nb, 2, 4, 32)  # [half, quarter k, l]
        ql = (h[:, :, :, 0:2] & 0xF) | ((h[:, :, :, 2:4] & 0xF) << 4)  # [half, k % 2, l]
        shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
        qh = np.bitwise_or.reduce((h >> 4) << shifts, axis=3)  # [half, l]
        parts = [ql.reshape(rows, nb, 128), qh.reshape(rows, nb, 64),
                 sc.astype(np.int8).view(np.uint8).reshape(rows, nb, 16), d]
    out = np.concatenate(parts, axis=-1)
    assert out.shape == (rows, nb, size), (kind, out.shape)
    return out.tobytes()


def _k_pack_scale_min(sc: I64, mn: I64) -> U8:
    """The inverse of :func:`_k_scale_min`: eight 6-bit scales and mins -> 12 bytes."""
    return np.concatenate([sc[..., :4] | ((sc[..., 4:] >> 4) << 6),
                           mn[..., :4] | ((mn[..., 4:] >> 4) << 6),
                           (sc[..., 4:] & 0xF) | ((mn[..., 4:] & 0xF) << 4)],
                          axis=-1).astype(np.uint8)


def values(dec: Decoded) -> npt.NDArray[np.float64]:
    """The exact weights as float64, for tests and float references, never on the serving path.

    Exact: ``scale * code + offset`` is an integer below 2**53 in magnitude for every format
    (at most 65,504 * 2**24 * 128 * 32 < 2**52 for Q6_K), so it and its quotient by 2**24 are
    float64 values without rounding."""
    v = dec.codes.astype(np.float64) * np.repeat(dec.scale.astype(np.float64), dec.group, 1)
    if dec.offset is not None:
        v += np.repeat(dec.offset.astype(np.float64), dec.group, 1)
    return v / 2.0**24
