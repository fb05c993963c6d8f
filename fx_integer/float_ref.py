"""float32 numpy reference forward over the dequantized weights (fidelity reference, bench).

Same forward driver and KV cache as the oracle (``oracle.forward``), float32 operations:
RMSNorm with sqrt, softmax with exp, SiLU with exp, RoPE from cos/sin computed in float64 from
theta (not from the committed integer tables).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .artifact import Artifact, unpack_nibbles
from .oracle import fused_layout

F32 = npt.NDArray[np.float32]


def dequantize_q4(art: Artifact, name: str) -> F32:
    q = unpack_nibbles(art.tensors[f"{name}.codes"]).astype(np.float64)
    d = np.repeat(art.tensors[f"{name}.scale"].astype(np.float64), 32, axis=1)
    m = np.repeat(art.tensors[f"{name}.offset"].astype(np.float64), 32, axis=1)
    return ((d * q + m) / 2.0**24).astype(np.float32)


def dequantize_embedding(art: Artifact) -> F32:
    q = art.tensors["tok_embd.codes"].astype(np.float64)
    d = np.repeat(art.tensors["tok_embd.scale"].astype(np.float64), 32, axis=1)
    return (q * d / 2.0**24).astype(np.float32)


class FloatOps:
    xp = np

    def __init__(self, art: Artifact) -> None:
        self.config = cfg = art.config
        self.mats: dict[str, F32] = {}
        for layer in range(cfg.n_layers):
            for fused, names in fused_layout(cfg, layer).items():
                w = np.concatenate([dequantize_q4(art, n) for n in names])
                self.mats[fused] = np.ascontiguousarray(w.T)  # [K, O] for x @ w
        self.emb = dequantize_embedding(art)
        self.mats["output"] = np.ascontiguousarray(self.emb.T)
        self.gains = {k: (v.astype(np.float64) / 2.0**24).astype(np.float32)
                      for k, v in art.tensors.items() if k.endswith("norm")}
        self.eps = np.float32(cfg.norm_eps_q32 / 2.0**32)
        theta = float(cfg.rope_theta)
        half = cfg.head_dim // 2
        inv = theta ** (-(2.0 * np.arange(half)) / cfg.head_dim)
        ang = np.arange(cfg.ctx_len, dtype=np.float64)[:, None] * inv[None, :]
        self.cos = np.cos(ang).astype(np.float32)
        self.sin = np.sin(ang).astype(np.float32)
        self.scale = np.float32(1.0 / np.sqrt(cfg.head_dim))

    def zeros(self, shape: tuple[int, ...]) -> F32:
        return np.zeros(shape, dtype=np.float32)

    def add(self, a: F32, b: F32) -> F32:
        return a + b

    def embed(self, tokens: npt.NDArray[np.int64]) -> F32:
        return self.emb[tokens]

    def matmul(self, x: F32, mat: str) -> F32:
        return np.asarray(x @ self.mats[mat], dtype=np.float32)

    def rmsnorm(self, x: F32, gain: str) -> F32:
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return np.asarray(x / np.sqrt(ms + self.eps) * self.gains[gain], dtype=np.float32)

    def rope(self, x: F32, pos: npt.NDArray[np.int64]) -> F32:
        c = self.cos[pos][:, None, :]
        s = self.sin[pos][:, None, :]
        x0 = x[..., 0::2]
        x1 = x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def attention(self, q: F32, k: F32, v: F32, qpos: npt.NDArray[np.int64]) -> F32:
        n, h, hd = q.shape
        m, kvh, _ = k.shape
        g = h // kvh
        qg = q.reshape(n, kvh, g, hd).transpose(1, 2, 0, 3)
        sc = np.matmul(qg, k.transpose(1, 2, 0)[:, None]) * self.scale  # [KV, g, n, m]
        allowed = np.arange(m)[None, :] <= qpos[:, None]
        sc = np.where(allowed, sc, -np.inf)
        sc = sc - sc.max(axis=-1, keepdims=True)
        p = np.exp(sc)
        p = p / p.sum(axis=-1, keepdims=True)
        out = np.matmul(p, v.transpose(1, 0, 2)[:, None])  # [KV, g, n, hd]
        return np.ascontiguousarray(out.transpose(2, 0, 1, 3)).reshape(n, h * hd).astype(
            np.float32)

    def swiglu(self, g: F32, u: F32) -> F32:
        return np.asarray(g / (np.float32(1) + np.exp(-g)) * u, dtype=np.float32)
