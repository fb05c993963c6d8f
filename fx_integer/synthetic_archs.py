"""Small SYNTHETIC format 2 artifacts of each architecture the forward runs, for parity tests.

:func:`synthetic_v2` writes an artifact directly (``artifact.serialize``, no GGUF, no
converter) from a fixed seed, so every backend can be held byte for byte to the numpy oracle on
each architecture's choices, on models small enough for a unit test:

* ``gemma3``: sliding-window attention on 5 of 6 layers (window 8) with their own RoPE table
  (``rope_swa``), NEOX RoPE, QK-norm, post-attention/post-FFN norms (one post-FFN gain past
  2**31 in Q.24, stored int64, as Gemma 3's are), GeGLU (gelu_tanh), the embedding scale
  sqrt(d_model), a head dimension unlike d_model / n_heads, one KV head; Q4_K-like and
  Q6_K-like matrices (Q4_K_M's mix: q, k, v unfusable), a tied Q8_0 embedding;
* ``qwen3``: QK-norm, NEOX RoPE, SwiGLU, every layer matrix Q1_0-like (codes -1/+1, one scale
  per 128), a Q8_0 embedding and a separate Q8_0 output head;
* ``cohere2-moe``: LayerNorm, the parallel block, layer kinds ``sssn`` (sliding window with
  RoPE, then a full-attention layer without RoPE), a leading dense layer then a mixture of 4
  experts (top 2, softmax, renormalised) with a Q8_0 router, the logit scale 1/4, Q4_K-like
  (group 32 with offsets) and Q6_K-like (group 16) matrices, a tied Q4_K-like embedding (with
  offsets).

The weights are seeded random draws scaled like a trained model's (every activation stays far
inside the engine's proven-exact bounds); their output is not meaningful text. The code ranges
and block sizes are those of :mod:`fx_integer.quants`' formats.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from . import artifact, quants
from .artifact import Config

ARCHS: Final = ("gemma3", "qwen3", "cohere2-moe")
VOCAB: Final = 320
CTX: Final = 96
_OFFSET_FORMATS: Final = frozenset({"Q4_1", "Q4_K", "Q5_K"})


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.tensors: dict[str, npt.NDArray[Any]] = {}
        self.quant: dict[str, dict[str, Any]] = {}

    def matrix(self, name: str, fmt: str, rows: int, cols: int, std: float) -> None:
        """A ``rows x cols`` matrix in ``fmt``'s block size and code range whose weights have
        about ``std`` standard deviation; offset formats get a block offset centring them."""
        g = quants.GROUP[fmt]
        lo, hi = quants.CODES[fmt]
        rng = self.rng
        nb = cols // g
        if fmt == "Q1_0":
            codes = rng.choice(np.array([-1, 1], dtype=np.int8), size=(rows, cols))
            var, mid = 1.0, 0.0
        else:
            codes = rng.integers(lo, hi + 1, size=(rows, cols), dtype=np.int8)
            var, mid = ((hi - lo + 1) ** 2 - 1) / 12.0, (lo + hi) / 2.0
        d = std / math.sqrt(var) * rng.uniform(0.5, 1.5, size=(rows, nb))
        self.tensors[f"{name}.codes"] = codes
        self.tensors[f"{name}.scale"] = np.round(d * 2**24).astype("<i4")
        if fmt in _OFFSET_FORMATS:
            m = -d * mid * rng.uniform(0.9, 1.1, size=d.shape)
            self.tensors[f"{name}.offset"] = np.round(m * 2**24).astype("<i4")
        self.quant[name] = {"format": fmt, "group": g, "qmax": quants.QMAX[fmt]}

    def gain(self, name: str, n: int, lo: float = 0.5, hi: float = 1.5) -> None:
        self.tensors[name] = np.round(self.rng.uniform(lo, hi, n) * 2**24).astype("<i4")

    def rope(self, prefix: str, head_dim: int, theta: float) -> None:
        self.tensors[f"{prefix}.cos"], self.tensors[f"{prefix}.sin"] = artifact.rope_tables(
            head_dim, CTX, theta)


def _base(**kw: Any) -> Config:
    hd = kw["head_dim"]
    return Config(vocab_size=VOCAB, ctx_len=CTX, norm_eps_q32=4295,
                  attn_scale_q30=artifact.attn_scale_q30(hd), **kw)


def _gemma3(b: _Builder) -> Config:
    d, hd, h, kv, ff, n = 64, 32, 4, 1, 128, 6
    cfg = _base(arch="gemma3", n_layers=n, d_model=d, d_ff=ff, n_heads=h, n_kv_heads=kv,
                head_dim=hd, rope_theta="1000000.0", rope_theta_swa="10000.0",
                layer_kinds="sssssf", window=8, qk_norm=1, post_norms=1, act="gelu_tanh",
                rope_layout="neox", embd_scale_q24=round(math.sqrt(d) * 2**24))
    for i in range(n):
        p = f"blk.{i}"
        b.matrix(f"{p}.attn_q", "Q4_K", h * hd, d, 0.6 / math.sqrt(d))
        b.matrix(f"{p}.attn_k", "Q4_K", kv * hd, d, 0.6 / math.sqrt(d))
        b.matrix(f"{p}.attn_v", "Q6_K", kv * hd, d, 1.0 / math.sqrt(d))
        b.matrix(f"{p}.attn_output", "Q4_K", d, h * hd, 1.0 / math.sqrt(h * hd))
        b.matrix(f"{p}.ffn_gate", "Q4_K", ff, d, 1.0 / math.sqrt(d))
        b.matrix(f"{p}.ffn_up", "Q4_K", ff, d, 1.0 / math.sqrt(d))
        b.matrix(f"{p}.ffn_down", "Q6_K", d, ff, 1.0 / math.sqrt(ff))
        for g in ("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm"):
            b.gain(f"{p}.{g}", d)
        b.gain(f"{p}.attn_q_norm", hd)
        b.gain(f"{p}.attn_k_norm", hd)
    # Gemma 3's post-norm gains reach ~1,657: one past 2**31 in Q.24 (stored int64)
    big = b.tensors["blk.1.post_ffw_norm"].astype("<i8")
    big[3] = round(300.5 * 2**24)
    b.tensors["blk.1.post_ffw_norm"] = big
    b.gain("output_norm", d)
    b.matrix("tok_embd", "Q8_0", VOCAB, d, 0.15)
    b.rope("rope", hd, 1000000.0)
    b.rope("rope_swa", hd, 10000.0)
    return cfg


def _qwen3(b: _Builder) -> Config:
    d, hd, h, kv, ff, n = 128, 32, 4, 2, 256, 3
    cfg = _base(arch="qwen3", n_layers=n, d_model=d, d_ff=ff, n_heads=h, n_kv_heads=kv,
                head_dim=hd, rope_theta="1000000.0", qk_norm=1, rope_layout="neox")
    for i in range(n):
        p = f"blk.{i}"
        b.matrix(f"{p}.attn_q", "Q1_0", h * hd, d, 0.6 / math.sqrt(d))
        b.matrix(f"{p}.attn_k", "Q1_0", kv * hd, d, 0.6 / math.sqrt(d))
        b.matrix(f"{p}.attn_v", "Q1_0", kv * hd, d, 1.0 / math.sqrt(d))
        b.matrix(f"{p}.attn_output", "Q1_0", d, h * hd, 1.0 / math.sqrt(h * hd))
        b.matrix(f"{p}.ffn_gate", "Q1_0", ff, d, 1.0 / math.sqrt(d))
        b.matrix(f"{p}.ffn_up", "Q1_0", ff, d, 1.0 / math.sqrt(d))
        b.matrix(f"{p}.ffn_down", "Q1_0", d, ff, 1.0 / math.sqrt(ff))
        for g in ("attn_norm", "ffn_norm"):
            b.gain(f"{p}.{g}", d)
        b.gain(f"{p}.attn_q_norm", hd)
        b.gain(f"{p}.attn_k_norm", hd)
    b.gain("output_norm", d)
    b.matrix("tok_embd", "Q8_0", VOCAB, d, 0.5)
    b.matrix("output", "Q8_0", VOCAB, d, 1.0 / math.sqrt(d))
    b.rope("rope", hd, 1000000.0)
    return cfg


def _cohere2_moe(b: _Builder) -> Config:
    d, hd, h, kv, ff, fe, n, ne = 64, 16, 4, 2, 128, 64, 4, 4
    cfg = _base(arch="cohere2moe", n_layers=n, d_model=d, d_ff=ff, n_heads=h, n_kv_heads=kv,
                head_dim=hd, rope_theta="50000.0", norm="layer", parallel_block=1,
                layer_kinds="sssn", window=8, n_experts=ne, n_experts_used=2, d_ff_expert=fe,
                moe_gating="softmax", moe_norm_topk=1, n_dense_lead=1,
                logit_scale_q24=1 << 22)
    for i in range(n):
        p = f"blk.{i}"
        b.matrix(f"{p}.attn_q", "Q4_K", h * hd, d, 0.6 / math.sqrt(d))
        b.matrix(f"{p}.attn_k", "Q4_K", kv * hd, d, 0.6 / math.sqrt(d))
        b.matrix(f"{p}.attn_v", "Q6_K", kv * hd, d, 1.0 / math.sqrt(d))
        b.matrix(f"{p}.attn_output", "Q4_K", d, h * hd, 1.0 / math.sqrt(h * hd))
        b.gain(f"{p}.attn_norm", d)
        if i < cfg.n_dense_lead:
            b.matrix(f"{p}.ffn_gate", "Q4_K", ff, d, 1.0 / math.sqrt(d))
            b.matrix(f"{p}.ffn_up", "Q4_K", ff, d, 1.0 / math.sqrt(d))
            b.matrix(f"{p}.ffn_down", "Q6_K", d, ff, 1.0 / math.sqrt(ff))
            continue
        b.matrix(f"{p}.ffn_gate_inp", "Q8_0", ne, d, 2.0 / math.sqrt(d))
        for e in range(ne):
            b.matrix(f"{p}.ffn_gate_exps.{e}", "Q4_K", fe, d, 1.0 / math.sqrt(d))
            b.matrix(f"{p}.ffn_up_exps.{e}", "Q4_K", fe, d, 1.0 / math.sqrt(d))
            b.matrix(f"{p}.ffn_down_exps.{e}", "Q6_K", d, fe, 1.0 / math.sqrt(fe))
    b.gain("output_norm", d)
    b.matrix("tok_embd", "Q4_K", VOCAB, d, 0.3)
    b.rope("rope", hd, 50000.0)
    return cfg


_BUILD: Final = {"gemma3": _gemma3, "qwen3": _qwen3, "cohere2-moe": _cohere2_moe}


def synthetic_v2(seed: int, *, arch: str) -> bytes:
    """Artifact bytes (format 2) of a small synthetic ``arch`` model (one of :data:`ARCHS`);
    the same bytes for the same seed."""
    if arch not in _BUILD:
        raise ValueError(f"unknown synthetic architecture {arch!r}: one of {ARCHS}")
    b = _Builder(seed)
    cfg = _BUILD[arch](b)
    cfg.validate()
    return artifact.serialize(config=cfg, tokenizer=artifact.synthetic_tokenizer(VOCAB),
                              source={"synthetic_seed": seed, "synthetic_arch": arch},
                              tensors=b.tensors, quant=b.quant)
