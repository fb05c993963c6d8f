"""Every GGUF quantization format decoded to exact integers, held to gguf's own dequantisation.

For each format: random blocks (seeded, every byte random except the f16 scales, which are
drawn finite) and blocks from real files (SmolLM2, Gemma 3 270M, the synthetic models); our
exact value ``(scale * code + offset) / 2**24`` must equal ``gguf.quants.dequantize`` bit for
bit after rounding to float32 (gguf computes in float32; both sides are the same dyadic
numbers). Q1_0 is not implemented by gguf 0.19's numpy dequantiser: it is held to ggml's rule
(``dequantize_row_q1_0``: bit j of byte j // 8, LSB first, 1 -> +d, 0 -> -d) written here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from fx_integer import quants, synthetic_gguf

# where each format keeps its f16 fields (byte offsets in the block)
_F16_AT = {"Q1_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q8_0": (0,),
           "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _random_blocks(kind: str, rows: int, nb: int, seed: int) -> np.ndarray:
    _, size = quants.BLOCKS[kind]
    rng = np.random.Generator(np.random.PCG64(seed))
    b = rng.integers(0, 256, size=(rows, nb, size), dtype=np.uint8)
    for at in _F16_AT[kind]:
        # finite f16 of every exponent, normal and subnormal, both signs
        v = (rng.standard_normal((rows, nb)) * np.exp2(rng.integers(-20, 6, (rows, nb))))
        b[:, :, at:at + 2] = v.astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    b[0, 0, _F16_AT[kind][0]:_F16_AT[kind][0] + 2] = [1, 0]  # the smallest subnormal, 2**-24
    return b.reshape(rows, nb * size)


def _ggml_q1_0(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    b = raw.reshape(rows, cols // 128, 18)
    d = b[:, :, 0:2].copy().view(np.float16).astype(np.float32)
    out = np.empty((rows, cols // 128, 128), dtype=np.float32)
    for j in range(128):
        bit = (b[:, :, 2 + j // 8] >> (j % 8)) & 1
        out[:, :, j] = np.where(bit == 1, d[:, :, 0], -d[:, :, 0])
    return out.reshape(rows, cols)


def _reference(kind: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    if kind == "Q1_0":
        return _ggml_q1_0(raw, rows, cols)
    return dequantize(raw, GGMLQuantizationType[kind]).reshape(rows, cols)


@pytest.mark.parametrize("kind", quants.SUPPORTED)
def test_random_blocks_equal_gguf(kind: str) -> None:
    qk, _ = quants.BLOCKS[kind]
    rows, nb = 7, 3
    raw = _random_blocks(kind, rows, nb, seed=len(kind) * 31 + qk)
    dec = quants.decode(kind, raw, rows, nb * qk)
    ours = quants.values(dec)
    ref = _reference(kind, raw, rows, nb * qk)
    assert np.array_equal(ours.astype(np.float32), ref), kind
    assert dec.codes.dtype == np.int8 and int(np.abs(dec.codes).max()) <= dec.qmax
    assert dec.scale.shape == (rows, nb * qk // dec.group)


def _real_tensors(path: Path) -> dict[str, object]:
    """The first tensor of each quantized format in a GGUF."""
    out: dict[str, object] = {}
    for t in GGUFReader(str(path)).tensors:
        kind = t.tensor_type.name
        if kind in quants.BLOCKS and kind not in out and len(t.shape) == 2:
            out[kind] = t
    return out


def _check_real(path: Path, want: set[str]) -> None:
    found = _real_tensors(path)
    assert want <= set(found), (path.name, sorted(found))
    for kind, t in found.items():
        rows, cols = int(t.shape[1]), int(t.shape[0])  # type: ignore[attr-defined]
        raw = np.asarray(t.data)  # type: ignore[attr-defined]
        ours = quants.values(quants.decode(kind, raw, rows, cols)).astype(np.float32)
        assert np.array_equal(ours, _reference(kind, raw, rows, cols)), (path.name, kind)


def test_real_gemma3_tensors() -> None:
    from fx_integer import _paths
    from tests.unit.integer.real_model import gemma_artifact

    gemma_artifact()  # skips (fails in CI) when the package is absent
    _check_real(_paths.locate_model_gguf("gemma3-270m"), {"Q5_0", "Q4_K", "Q6_K", "Q8_0"})


def test_real_smollm2_tensors() -> None:
    from fx_integer import _paths
    from tests.unit.integer.real_model import real_artifact

    real_artifact()
    _check_real(_paths.locate_gguf(), {"Q4_1", "Q8_0"})


def test_synthetic_files_tensors(tmp_path: Path) -> None:
    q1 = synthetic_gguf.write("qwen3-q1_0-synthetic", tmp_path / "q.gguf")
    _check_real(q1, {"Q1_0", "Q8_0"})
    moe = synthetic_gguf.write("cohere2moe-synthetic", tmp_path / "m.gguf")
    _check_real(moe, {"Q4_K", "Q6_K", "Q8_0"})


def test_bad_input_is_a_clear_error() -> None:
    raw = _random_blocks("Q4_K", 2, 1, seed=1)
    with pytest.raises(quants.QuantError, match="not supported"):
        quants.decode("Q3_K", raw, 2, 256)
    with pytest.raises(quants.QuantError, match="whole blocks of 256"):
        quants.decode("Q4_K", raw, 2, 200)
    with pytest.raises(quants.QuantError, match="bytes for"):
        quants.decode("Q4_K", raw[:, :-1], 2, 256)
    inf = raw.copy()
    inf[0, 0:2] = np.array([np.inf], dtype=np.float16).view(np.uint8)
    with pytest.raises(quants.QuantError, match="inf/nan"):
        quants.decode("Q4_K", inf, 2, 256)
