"""Project-made SYNTHETIC GGUFs of the seed's two engines whose weights cannot be had here.

* ``qwen3-q1_0-synthetic``: a small dense ``qwen3`` (QK-norm, NEOX RoPE, SwiGLU) whose every
  attention and FFN matrix is ``Q1_0`` (1 bit per weight, one f16 scale per 128), the format of
  the 1-bit "Bonsai" Qwen3 GGUFs; embedding Q8_0.
* ``cohere2moe-synthetic``: a small ``cohere2moe`` (the architecture of the seed's
  "north-mini-code"): parallel attention + FFN block, sliding-window layers with RoPE
  interleaved with full-attention layers without RoPE (NoPE), one leading dense layer, then a
  routed mixture of 4 experts (top 2, softmax, renormalised) with an F32 router, matrices in
  ``Q4_K`` and ``Q6_K``, a logit scale.

Both are written with the ``gguf`` package from fixed seeds (the same bytes every time), with
SmolLM2's vocabulary and tokenizer (so prompts are real text) and SmolLM2's embedding rows
(so the activations entering the first layer are realistic); every other weight is drawn from
a seeded normal distribution scaled like a trained model's. They are synthetic: their output is
not meaningful text. They exist to prove that the engine reads these architectures and formats
the way llama.cpp reads them (the same file through both) and that every backend agrees byte
for byte on them. Their names say ``synthetic`` everywhere they appear.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from . import quants

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]

MODELS: Final = ("qwen3-q1_0-synthetic", "cohere2moe-synthetic")


# ------------------------------------------------------------------ block encoders (ggml)


def _bits(v: npt.NDArray[Any]) -> npt.NDArray[np.uint16]:
    return np.asarray(v, dtype=np.float16).view(np.uint16)


def _rows(data: bytes, rows: int) -> U8:
    return np.frombuffer(data, dtype=np.uint8).reshape(rows, -1)


# The quantisers below only choose integers from floats (simple min/max rules, not ggml's
# search: any valid bytes serve a synthetic model); the block bytes are quants.encode's.


def encode_q1_0(w: F32) -> U8:
    """Q1_0: per 128 weights d = mean |w| (f16), code +1 where w >= 0, else -1."""
    rows, cols = w.shape
    b = w.reshape(rows, cols // 128, 128)
    codes = np.where(b >= 0, 1, -1).reshape(rows, cols)
    return _rows(quants.encode("Q1_0", codes, _bits(np.abs(b).mean(axis=-1))), rows)


def encode_q4_k(w: F32) -> U8:
    """Q4_K: w = d * sc_j * q - dmin * m_j per sub-block of 32, q in 0..15."""
    rows, cols = w.shape
    nb = cols // 256
    b = w.reshape(rows, nb, 8, 32).astype(np.float64)
    lo = np.minimum(b.min(axis=-1), 0.0)
    scale = (b.max(axis=-1) - lo) / 15.0
    d16 = (np.maximum(scale.max(axis=-1), 1e-8) / 63.0).astype(np.float16)
    dmin16 = (np.maximum((-lo).max(axis=-1), 1e-8) / 63.0).astype(np.float16)
    sc = np.clip(np.rint(scale / d16.astype(np.float64)[..., None]), 1, 63).astype(np.int64)
    mn = np.clip(np.rint(-lo / dmin16.astype(np.float64)[..., None]), 0, 63).astype(np.int64)
    eff_d = d16.astype(np.float64)[..., None] * sc
    eff_m = dmin16.astype(np.float64)[..., None] * mn
    q = np.clip(np.rint((b + eff_m[..., None]) / eff_d[..., None]), 0, 15).astype(np.int64)
    return _rows(quants.encode("Q4_K", q.reshape(rows, cols), _bits(d16),
                                       m_bits=_bits(dmin16), sub_scales=sc.reshape(rows, -1),
                                       sub_mins=mn.reshape(rows, -1)), rows)


def encode_q6_k(w: F32) -> U8:
    """Q6_K: w = d * sc_j * code per sub-block of 16, code in -32..31."""
    rows, cols = w.shape
    nb = cols // 256
    b = w.reshape(rows, nb, 16, 16).astype(np.float64)
    scale = np.maximum(np.abs(b).max(axis=-1), 1e-8) / 31.0
    d16 = (np.maximum(scale.max(axis=-1), 1e-8) / 127.0).astype(np.float16)
    sc = np.clip(np.rint(scale / d16.astype(np.float64)[..., None]), 1, 127).astype(np.int64)
    eff = d16.astype(np.float64)[..., None] * sc
    q = np.clip(np.rint(b / eff[..., None]), -32, 31).astype(np.int64)
    return _rows(quants.encode("Q6_K", q.reshape(rows, cols), _bits(d16),
                                       sub_scales=sc.reshape(rows, -1)), rows)


# ------------------------------------------------------------------------------ writers


class _Source:
    """SmolLM2's GGUF: the vocabulary, tokenizer and embedding rows the synthetic models use."""

    def __init__(self) -> None:
        from gguf import GGUFReader
        from gguf.quants import dequantize

        from .model_paths import locate_gguf

        r = GGUFReader(str(locate_gguf()))
        f = r.fields
        self.tokens = [str(t) for t in f["tokenizer.ggml.tokens"].contents()]
        self.types = [int(t) for t in f["tokenizer.ggml.token_type"].contents()]
        self.merges = [str(m) for m in f["tokenizer.ggml.merges"].contents()]
        emb = next(t for t in r.tensors if t.name == "token_embd.weight")
        self.embedding = dequantize(np.asarray(emb.data), emb.tensor_type).reshape(
            len(self.tokens), -1).astype(np.float32)

    def tokenizer(self, wr: Any) -> None:
        wr.add_tokenizer_model("gpt2")
        wr.add_tokenizer_pre("smollm")
        wr.add_token_list(self.tokens)
        wr.add_token_types(self.types)
        wr.add_token_merges(self.merges)
        wr.add_bos_token_id(1)
        wr.add_eos_token_id(2)
        wr.add_pad_token_id(2)
        wr.add_add_bos_token(False)

    def embedding_rows(self, width: int) -> F32:
        """SmolLM2's embedding (576 wide) cut or tiled to ``width`` columns."""
        e = self.embedding
        reps = -(-width // e.shape[1])
        return np.ascontiguousarray(np.tile(e, (1, reps))[:, :width])


def _normal(rng: np.random.Generator, rows: int, cols: int, gain: float = 1.0) -> F32:
    return (rng.standard_normal((rows, cols)) * (gain / math.sqrt(cols))).astype(np.float32)


def _common(wr: Any, *, ctx: int, d: int, layers: int, ff: int, heads: int, kv: int,
            head_dim: int, theta: float) -> None:
    wr.add_name(wr.arch + " synthetic (ninelives-fx, not a trained model)")
    wr.add_context_length(ctx)
    wr.add_embedding_length(d)
    wr.add_block_count(layers)
    wr.add_feed_forward_length(ff)
    wr.add_head_count(heads)
    wr.add_head_count_kv(kv)
    wr.add_key_length(head_dim)
    wr.add_value_length(head_dim)
    wr.add_rope_dimension_count(head_dim)
    wr.add_rope_freq_base(theta)


def _finish(wr: Any) -> None:
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def write_qwen3_q1_0(path: str | os.PathLike[str], *, seed: int = 1) -> Path:
    """A 4-layer dense qwen3, width 256, 4 heads of 64 over 2 KV heads, FFN 768, Q1_0
    matrices, Q8_0 embedding (tied head), context 1024."""
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFWriter
    from gguf.quants import quantize

    src = _Source()
    rng = np.random.Generator(np.random.PCG64(seed))
    d, layers, heads, kv, hd, ff = 256, 4, 4, 2, 64, 768
    p = Path(path)
    wr = GGUFWriter(str(p), "qwen3")
    _common(wr, ctx=1024, d=d, layers=layers, ff=ff, heads=heads, kv=kv, head_dim=hd,
            theta=1000000.0)
    wr.add_layer_norm_rms_eps(1e-6)
    src.tokenizer(wr)
    emb = src.embedding_rows(d)
    wr.add_tensor("token_embd.weight", quantize(emb, T.Q8_0), raw_dtype=T.Q8_0)
    wr.add_tensor("output_norm.weight", rng.uniform(0.8, 1.2, d).astype(np.float32))

    def q1(name: str, rows: int, cols: int, gain: float) -> None:
        wr.add_tensor(name, encode_q1_0(_normal(rng, rows, cols, gain)), raw_dtype=T.Q1_0)

    for i in range(layers):
        b = f"blk.{i}"
        wr.add_tensor(f"{b}.attn_norm.weight", rng.uniform(0.8, 1.2, d).astype(np.float32))
        q1(f"{b}.attn_q.weight", heads * hd, d, 1.0)
        q1(f"{b}.attn_k.weight", kv * hd, d, 1.0)
        q1(f"{b}.attn_v.weight", kv * hd, d, 1.0)
        q1(f"{b}.attn_output.weight", d, heads * hd, 0.5)
        wr.add_tensor(f"{b}.attn_q_norm.weight", rng.uniform(0.8, 1.2, hd).astype(np.float32))
        wr.add_tensor(f"{b}.attn_k_norm.weight", rng.uniform(0.8, 1.2, hd).astype(np.float32))
        wr.add_tensor(f"{b}.ffn_norm.weight", rng.uniform(0.8, 1.2, d).astype(np.float32))
        q1(f"{b}.ffn_gate.weight", ff, d, 1.0)
        q1(f"{b}.ffn_up.weight", ff, d, 1.0)
        q1(f"{b}.ffn_down.weight", d, ff, 0.5)
    _finish(wr)
    return p


def write_cohere2moe(path: str | os.PathLike[str], *, seed: int = 2) -> Path:
    """A 6-layer cohere2moe, width 256, 4 heads of 64 over 2 KV heads, window 16, layers
    "full, swa, swa, swa, full, swa" (the first of every 4 full, as llama.cpp's default
    pattern for cohere2moe), layer 0 a dense FFN (768), layers 1-5 a mixture of 4 experts of
    256 (top 2, softmax, renormalised), an F32 router, Q4_K attention/gate/up matrices and
    Q6_K down matrices, Q8_0 embedding (tied head), RMSNorm, logit scale 0.25, context 1024."""
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFWriter
    from gguf.constants import ExpertGatingFuncType
    from gguf.quants import quantize

    src = _Source()
    rng = np.random.Generator(np.random.PCG64(seed))
    d, layers, heads, kv, hd, ff, n_exp, n_used, ffe = 256, 6, 4, 2, 64, 768, 4, 2, 256
    p = Path(path)
    wr = GGUFWriter(str(p), "cohere2moe")
    _common(wr, ctx=1024, d=d, layers=layers, ff=ff, heads=heads, kv=kv, head_dim=hd,
            theta=10000.0)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_sliding_window(16)
    wr.add_logit_scale(0.25)
    wr.add_leading_dense_block_count(1)
    wr.add_expert_count(n_exp)
    wr.add_expert_used_count(n_used)
    wr.add_expert_feed_forward_length(ffe)
    wr.add_expert_weights_norm(True)
    wr.add_expert_gating_func(ExpertGatingFuncType.SOFTMAX)
    src.tokenizer(wr)
    emb = src.embedding_rows(d)
    wr.add_tensor("token_embd.weight", quantize(emb, T.Q8_0), raw_dtype=T.Q8_0)
    wr.add_tensor("output_norm.weight", rng.uniform(0.8, 1.2, d).astype(np.float32))

    def k4(name: str, rows: int, cols: int, gain: float) -> None:
        wr.add_tensor(name, encode_q4_k(_normal(rng, rows, cols, gain)), raw_dtype=T.Q4_K)

    def k6(name: str, rows: int, cols: int, gain: float) -> None:
        wr.add_tensor(name, encode_q6_k(_normal(rng, rows, cols, gain)), raw_dtype=T.Q6_K)

    def exps(name: str, rows: int, cols: int, gain: float, enc: Any, kind: Any) -> None:
        per = [enc(_normal(rng, rows, cols, gain)) for _ in range(n_exp)]
        wr.add_tensor(name, np.stack(per), raw_dtype=kind)

    for i in range(layers):
        b = f"blk.{i}"
        wr.add_tensor(f"{b}.attn_norm.weight", rng.uniform(0.8, 1.2, d).astype(np.float32))
        k4(f"{b}.attn_q.weight", heads * hd, d, 1.0)
        k4(f"{b}.attn_k.weight", kv * hd, d, 1.0)
        k4(f"{b}.attn_v.weight", kv * hd, d, 1.0)
        k4(f"{b}.attn_output.weight", d, heads * hd, 0.5)
        if i == 0:
            k4(f"{b}.ffn_gate.weight", ff, d, 1.0)
            k4(f"{b}.ffn_up.weight", ff, d, 1.0)
            k6(f"{b}.ffn_down.weight", d, ff, 0.5)
        else:
            wr.add_tensor(f"{b}.ffn_gate_inp.weight", _normal(rng, n_exp, d, 2.0))
            exps(f"{b}.ffn_gate_exps.weight", ffe, d, 1.0, encode_q4_k, T.Q4_K)
            exps(f"{b}.ffn_up_exps.weight", ffe, d, 1.0, encode_q4_k, T.Q4_K)
            exps(f"{b}.ffn_down_exps.weight", d, ffe, 0.5, encode_q6_k, T.Q6_K)
    _finish(wr)
    return p


def write(model: str, path: str | os.PathLike[str]) -> Path:
    """Write one of :data:`MODELS` to ``path`` (deterministic bytes)."""
    if model == "qwen3-q1_0-synthetic":
        return write_qwen3_q1_0(path)
    if model == "cohere2moe-synthetic":
        return write_cohere2moe(path)
    raise KeyError(f"unknown synthetic model {model!r}; known: {MODELS}")


def main(argv: list[str] | None = None) -> int:
    """``python -m fx_integer.synthetic_gguf MODEL PATH``: write a synthetic GGUF, then
    ``fx models import-int NAME --gguf PATH`` converts it like any other."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m fx_integer.synthetic_gguf",
                                 description="write one of the project's SYNTHETIC GGUFs")
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("path")
    args = ap.parse_args(argv)
    p = write(args.model, args.path)
    print(f"{p} ({p.stat().st_size} bytes, synthetic)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
