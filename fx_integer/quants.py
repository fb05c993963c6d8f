"""GGUF quantization formats decoded to exact integers (no float anywhere).

Every format the engine reads is a block format whose weights are ``w = D * code + M`` per
block, with ``D`` and ``M`` built from f16 fields (dyadic rationals: exact in Q.24) and small
integers (the K-quants' 6- or 8-bit sub-scales), so each is decoded into int8 ``codes`` with
per-block ``scale`` (``D``) and ``offset`` (``M``, or None) in Q.24, exactly::

    w[r, c] == (scale[r, c // group] * codes[r, c] + offset[r, c // group]) / 2**24

The byte layouts are documented in docs/integer-quants.md; the unit tests hold every decode to
``gguf.quants.dequantize`` (and Q1_0, which gguf cannot dequantize, to ggml's rule).
"""

from __future__ import annotations

import dataclasses
from typing import Final

import numpy as np
import numpy.typing as npt

from ._fixed import f16_bits_to_q24

I64 = npt.NDArray[np.int64]
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
SUPPORTED: Final = tuple(BLOCKS)


class QuantError(ValueError):
    """A tensor the decoder cannot read: an unknown format, a shape that is not a whole number
    of blocks, a byte count that does not match, an f16 scale that is inf or NaN."""


@dataclasses.dataclass(frozen=True)
class Decoded:
    """One matrix as exact integers (see the module docstring)."""

    codes: npt.NDArray[np.int8]  # [rows, cols]
    scale: I64  # [rows, cols // group], Q.24
    offset: I64 | None  # [rows, cols // group], Q.24
    group: int
    qmax: int  # the largest |code| the format can produce


def _f16(b: U8, at: int) -> I64:
    """The Q.24 value of the f16 at byte ``at`` of every block (exact integer decoding)."""
    bits = np.ascontiguousarray(b[..., at:at + 2]).view("<u2")[..., 0]
    try:
        return f16_bits_to_q24(bits)
    except ValueError as e:
        raise QuantError(str(e)) from e


def _k_scale_min(q: I64) -> tuple[I64, I64]:
    """Q4_K/Q5_K: the eight 6-bit scales and mins packed in 12 bytes (ggml's
    get_scale_min_k4): j < 4 in the low 6 bits of bytes j and j + 4; j >= 4 in the nibbles
    of byte j + 4 with their top 2 bits in the top bits of bytes j - 4 and j."""
    sc = np.empty((*q.shape[:-1], 8), dtype=np.int64)
    mn = np.empty_like(sc)
    for j in range(8):
        if j < 4:
            sc[..., j] = q[..., j] & 63
            mn[..., j] = q[..., j + 4] & 63
        else:
            sc[..., j] = (q[..., j + 4] & 0xF) | ((q[..., j - 4] >> 6) << 4)
            mn[..., j] = (q[..., j + 4] >> 4) | ((q[..., j] >> 6) << 4)
    return sc, mn


def decode(kind: str, raw: npt.NDArray[np.generic], rows: int, cols: int) -> Decoded:
    """Decode a GGUF tensor's raw bytes (``rows`` x ``cols`` weights, row-major blocks)."""
    if kind not in BLOCKS:
        raise QuantError(f"quantization {kind} is not supported (supported: "
                         f"{', '.join(SUPPORTED)})")
    qk, size = BLOCKS[kind]
    if rows <= 0 or cols <= 0 or cols % qk:
        raise QuantError(f"{kind}: rows of {cols} weights are not whole blocks of {qk}")
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    nb = cols // qk
    if data.size != rows * nb * size:
        raise QuantError(f"{kind}: {data.size} bytes for {rows} x {cols} weights, expected "
                         f"{rows * nb * size}")
    b = data.reshape(rows, nb, size)
    return _DECODERS[kind](b, rows, cols)


def _q8_0(b: U8, rows: int, cols: int) -> Decoded:
    codes = np.ascontiguousarray(b[:, :, 2:34]).view(np.int8).reshape(rows, cols)
    return Decoded(codes, _f16(b, 0), None, 32, 128)


def _nibbles32(qs: I64) -> I64:
    """16 bytes -> 32 codes: element j in the low nibble of byte j, j + 16 in the high."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _q4_0(b: U8, rows: int, cols: int) -> Decoded:
    c = _nibbles32(b[:, :, 2:18].astype(np.int64)) - 8
    return Decoded(c.astype(np.int8).reshape(rows, cols), _f16(b, 0), None, 32, 8)


def _q4_1(b: U8, rows: int, cols: int) -> Decoded:
    c = _nibbles32(b[:, :, 4:20].astype(np.int64))
    return Decoded(c.astype(np.int8).reshape(rows, cols), _f16(b, 0), _f16(b, 2), 32, 15)


def _q5_0(b: U8, rows: int, cols: int) -> Decoded:
    qh = np.ascontiguousarray(b[:, :, 2:6]).view("<u4")[:, :, 0].astype(np.int64)
    j = np.arange(32, dtype=np.int64)
    high = (qh[:, :, None] >> j) & 1  # bit j: the fifth bit of element j
    c = (_nibbles32(b[:, :, 6:22].astype(np.int64)) | (high << 4)) - 16
    return Decoded(c.astype(np.int8).reshape(rows, cols), _f16(b, 0), None, 32, 16)


def _q1_0(b: U8, rows: int, cols: int) -> Decoded:
    bits = (b[:, :, 2:18, None] >> np.arange(8, dtype=np.uint8)) & 1  # LSB first
    c = bits.reshape(rows, cols).astype(np.int8) * 2 - 1  # 1 -> +d, 0 -> -d
    return Decoded(c, _f16(b, 0), None, 128, 1)


def _q4_k(b: U8, rows: int, cols: int) -> Decoded:
    nb = cols // 256
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scale_min(b[:, :, 4:16].astype(np.int64))
    qs = b[:, :, 16:144].astype(np.int64)
    codes = np.empty((rows, nb, 256), dtype=np.int64)
    for c in range(4):  # 32 bytes -> sub-blocks 2c (low nibbles) and 2c + 1 (high)
        q = qs[:, :, 32 * c:32 * c + 32]
        codes[:, :, 64 * c:64 * c + 32] = q & 0xF
        codes[:, :, 64 * c + 32:64 * c + 64] = q >> 4
    scale = (d[:, :, None] * sc).reshape(rows, nb * 8)
    offset = (-(dmin[:, :, None] * mn)).reshape(rows, nb * 8)
    return Decoded(codes.astype(np.int8).reshape(rows, cols), scale, offset, 32, 15)


def _q5_k(b: U8, rows: int, cols: int) -> Decoded:
    nb = cols // 256
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scale_min(b[:, :, 4:16].astype(np.int64))
    qh = b[:, :, 16:48].astype(np.int64)
    qs = b[:, :, 48:176].astype(np.int64)
    codes = np.empty((rows, nb, 256), dtype=np.int64)
    for c in range(4):  # the fifth bits: bit 2c of qh[l] for the low nibbles, 2c + 1 high
        q = qs[:, :, 32 * c:32 * c + 32]
        codes[:, :, 64 * c:64 * c + 32] = (q & 0xF) | (((qh >> (2 * c)) & 1) << 4)
        codes[:, :, 64 * c + 32:64 * c + 64] = (q >> 4) | (((qh >> (2 * c + 1)) & 1) << 4)
    scale = (d[:, :, None] * sc).reshape(rows, nb * 8)
    offset = (-(dmin[:, :, None] * mn)).reshape(rows, nb * 8)
    return Decoded(codes.astype(np.int8).reshape(rows, cols), scale, offset, 32, 31)


def _q6_k(b: U8, rows: int, cols: int) -> Decoded:
    nb = cols // 256
    ql = b[:, :, 0:128].astype(np.int64)
    qh = b[:, :, 128:192].astype(np.int64)
    sc = np.ascontiguousarray(b[:, :, 192:208]).view(np.int8).astype(np.int64)
    d = _f16(b, 208)
    codes = np.empty((rows, nb, 256), dtype=np.int64)
    for n in range(2):  # two halves of 128 weights: 64 bytes of ql, 32 of qh each
        lo, hi, at = ql[:, :, 64 * n:64 * n + 64], qh[:, :, 32 * n:32 * n + 32], 128 * n
        codes[:, :, at:at + 32] = (lo[:, :, :32] & 0xF) | ((hi & 3) << 4)
        codes[:, :, at + 32:at + 64] = (lo[:, :, 32:] & 0xF) | (((hi >> 2) & 3) << 4)
        codes[:, :, at + 64:at + 96] = (lo[:, :, :32] >> 4) | (((hi >> 4) & 3) << 4)
        codes[:, :, at + 96:at + 128] = (lo[:, :, 32:] >> 4) | (((hi >> 6) & 3) << 4)
    scale = (d[:, :, None] * sc).reshape(rows, nb * 16)
    return Decoded((codes - 32).astype(np.int8).reshape(rows, cols), scale, None, 16, 32)


_DECODERS: Final = {"Q1_0": _q1_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0,
                    "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def values(dec: Decoded) -> npt.NDArray[np.float64]:
    """The exact weights as float64 (exact: every value is an integer times 2**-24 below
    2**53); for tests and the float reference, never on the serving path."""
    v = dec.codes.astype(np.float64) * np.repeat(dec.scale.astype(np.float64), dec.group, 1)
    if dec.offset is not None:
        v += np.repeat(dec.offset.astype(np.float64), dec.group, 1)
    return v / 2.0**24
