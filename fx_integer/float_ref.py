"""float32 numpy reference forward over the dequantized weights (fidelity reference, bench).

Same forward driver and KV cache as the oracle (``oracle.forward``), float32 operations:
RMSNorm with sqrt, softmax with exp, SiLU with exp, RoPE from cos/sin computed in float64 from
theta (not from the committed integer tables).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .artifact import Artifact, QWeight, attn_scale_q30
from .forward import build_matrices

F32 = npt.NDArray[np.float32]


def dequantize(w: QWeight) -> F32:
    """The matrix's float values ([O, K] float32) from its exact integers."""
    g = w.group
    q = w.codes.astype(np.float64)
    v = q * np.repeat(w.scale.astype(np.float64), g, axis=1)
    if w.offset is not None:
        v += np.repeat(w.offset.astype(np.float64), g, axis=1)
    return (v / 2.0**24).astype(np.float32)


def dequantize_q4(art: Artifact, name: str) -> F32:
    return dequantize(art.weight(name))


def dequantize_embedding(art: Artifact) -> F32:
    return dequantize(art.weight("tok_embd"))


class FloatOps:
    xp = np

    def __init__(self, art: Artifact) -> None:
        self.config = cfg = art.config
        self.mats: dict[str, F32]
        self.mats, self.plan = build_matrices(
            art, lambda w: np.ascontiguousarray(dequantize(w).T))  # [K, O] for x @ w
        self.emb_w = art.weight("tok_embd")
        self.gains = {k: (v.astype(np.float64) / 2.0**24).astype(np.float32)
                      for k, v in art.tensors.items() if k.endswith("norm")}
        self.eps = np.float32(cfg.norm_eps_q32 / 2.0**32)
        half = cfg.head_dim // 2
        self.tables: dict[str, tuple[F32, F32]] = {}
        for table, theta_s in (("", cfg.rope_theta), ("swa", cfg.rope_theta_swa)):
            if not theta_s:
                continue
            inv = float(theta_s) ** (-(2.0 * np.arange(half)) / cfg.head_dim)
            ang = np.arange(cfg.ctx_len, dtype=np.float64)[:, None] * inv[None, :]
            self.tables[table] = (np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32))
        # the float scale the integer one rounds: 1/sqrt(head_dim) unless the model names
        # another (gemma3's query_pre_attn_scalar)
        self.scale_attn = (np.float32(1.0 / np.sqrt(cfg.head_dim))
                           if cfg.attn_scale_q30 == attn_scale_q30(cfg.head_dim)
                           else np.float32(cfg.attn_scale_q30 / 2.0**30 / np.log2(np.e)))

    def zeros(self, shape: tuple[int, ...]) -> F32:
        return np.zeros(shape, dtype=np.float32)

    def add(self, a: F32, b: F32) -> F32:
        return a + b

    def embed(self, tokens: npt.NDArray[np.int64]) -> F32:
        w = self.emb_w
        rows = QWeight(w.codes[tokens], w.scale[tokens],
                       None if w.offset is None else w.offset[tokens], w.group, w.qmax, w.format)
        return dequantize(rows)

    def matmul(self, x: F32, mat: str) -> F32:
        return np.asarray(x @ self.mats[mat], dtype=np.float32)

    def rmsnorm(self, x: F32, gain: str) -> F32:
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return np.asarray(x / np.sqrt(ms + self.eps) * self.gains[gain], dtype=np.float32)

    def layernorm(self, x: F32, gain: str) -> F32:
        return self.rmsnorm(x - x.mean(axis=-1, keepdims=True), gain)

    def rope(self, x: F32, pos: npt.NDArray[np.int64], table: str = "") -> F32:
        cos, sin = self.tables[table]
        c = cos[pos][:, None, :]
        s = sin[pos][:, None, :]
        half = x.shape[-1] // 2
        i0, i1 = ((slice(0, None, 2), slice(1, None, 2))
                  if self.config.rope_layout == "interleaved"
                  else (slice(0, half), slice(half, None)))
        x0 = x[..., i0]
        x1 = x[..., i1]
        out = np.empty_like(x)
        out[..., i0] = x0 * c - x1 * s
        out[..., i1] = x0 * s + x1 * c
        return out

    def attention(self, q: F32, k: F32, v: F32, qpos: npt.NDArray[np.int64],
                  window: int = 0) -> F32:
        n, h, hd = q.shape
        m, kvh, _ = k.shape
        g = h // kvh
        qg = q.reshape(n, kvh, g, hd).transpose(1, 2, 0, 3)
        sc = np.matmul(qg, k.transpose(1, 2, 0)[:, None]) * self.scale_attn  # [KV, g, n, m]
        j = np.arange(m)[None, :]
        allowed = j <= qpos[:, None]
        if window:
            allowed &= j > qpos[:, None] - window
        sc = np.where(allowed, sc, -np.inf)
        sc = sc - sc.max(axis=-1, keepdims=True)
        p = np.exp(sc)
        p = p / p.sum(axis=-1, keepdims=True)
        out = np.matmul(p, v.transpose(1, 0, 2)[:, None])  # [KV, g, n, hd]
        return np.ascontiguousarray(out.transpose(2, 0, 1, 3)).reshape(n, h * hd).astype(
            np.float32)

    def swiglu(self, g: F32, u: F32) -> F32:
        return np.asarray(g / (np.float32(1) + np.exp(-g)) * u, dtype=np.float32)

    def geglu(self, g: F32, u: F32) -> F32:
        c = np.float32(np.sqrt(2.0 / np.pi))
        gelu = 0.5 * g * (1 + np.tanh(c * (g + np.float32(0.044715) * g * g * g)))
        return np.asarray(gelu * u, dtype=np.float32)

    def scale(self, x: F32, factor_q24: int) -> F32:
        return np.asarray(x * np.float32(factor_q24 / 2.0**24), dtype=np.float32)

    def route(self, logits: F32, k: int, gating: str, normalise: bool
              ) -> tuple[npt.NDArray[np.int64], F32]:
        if gating == "sigmoid":
            prob = 1.0 / (1.0 + np.exp(-logits))
        else:
            z = np.exp(logits - logits.max(axis=1, keepdims=True))
            prob = z / z.sum(axis=1, keepdims=True)
        order = np.argsort(-prob, axis=1, kind="stable")[:, :k]
        w = np.take_along_axis(prob, order, axis=1)
        if normalise:
            w = w / w.sum(axis=1, keepdims=True)
        return order.astype(np.int64), w.astype(np.float32)

    def combine(self, n: int, d: int, experts: npt.NDArray[np.int64], weights: F32,
                ys: Sequence[tuple[int, npt.NDArray[np.int64], F32]]) -> F32:
        acc = np.zeros((n, d), dtype=np.float32)
        for e, rows, y in ys:
            w = (weights[rows] * (experts[rows] == e)).sum(axis=1)
            acc[rows] += w[:, None] * y
        return acc
