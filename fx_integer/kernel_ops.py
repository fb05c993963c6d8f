"""Ops that run the CUDA kernels of ``kernels/engine.cu`` (shared by the CPU build and CuPy).

The forward driver, KV cache and sampling are the oracle's; only the ops differ. Host glue is
integer array code only (slicing, concatenation, integer additions).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from . import oracle
from .artifact import Artifact
from .forward import fusion_plan
from .oracle import FixedPointOverflow

# kernel name -> argument kinds after (grid, block): p = pointer, i = int32, l = int64
SIGNATURES: Final[dict[str, str]] = {
    "nl_embed": "ppppi",
    "nl_q4_matmul": "pppppiii",
    "nl_q8_matmul": "ppppiii",
    "nl_rmsnorm": "pppil",
    "nl_rope": "pppppii",
    "nl_attention": "ppppppiiiil",
    "nl_swiglu": "pppl",
}


def wq_of(scale: Any, offset: Any | None, qmax: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Per-block (W >> 10) + 1 for the matmul exactness check (see oracle module doc)."""
    w = qmax * np.abs(scale.astype(np.int64))
    if offset is not None:
        w = w + np.abs(offset.astype(np.int64))
    wmax = w.max(axis=0)  # scale is [O, nb] -> [nb]
    if wmax.max() >= (1 << 38):
        raise FixedPointOverflow("quantization scales too large for the exactness bound")
    return np.asarray((wmax >> 10) + 1, dtype=np.int64)


class UnsupportedArtifact(ValueError):
    """The backend cannot run this artifact's architecture or formats."""


class KernelOps(ABC):
    """Base: prepares fused weights on the host, subclasses move them and launch kernels."""

    xp: Any = np

    def __init__(self, art: Artifact, *, threads: int) -> None:
        if art.format_version != 1:
            raise UnsupportedArtifact(
                f"the CUDA kernels run format 1 artifacts (llama, Q4_1/Q8_0) only; this is "
                f"format {art.format_version} ({art.config.arch}): use the oracle or "
                "oracle-native backend")
        self.config = art.config
        self.model_hash = art.model_hash
        self.threads = threads
        self.q4: dict[str, tuple[Any, Any, Any, Any, int, int]] = {}
        layout, self.plan = fusion_plan(art)
        for fused, names in layout.items():
            if fused == "output":
                continue
            codes = np.concatenate([art.tensors[f"{n}.codes"] for n in names])
            scale = np.concatenate([art.tensors[f"{n}.scale"] for n in names])
            off = np.concatenate([art.tensors[f"{n}.offset"] for n in names])
            o, kh = codes.shape
            self.q4[fused] = (self.put(codes), self.put(scale), self.put(off),
                              self.put(wq_of(scale, off, 15)), o, 2 * kh)
        ec = art.tensors["tok_embd.codes"]
        es = art.tensors["tok_embd.scale"]
        self.emb_codes = self.put(ec)
        self.emb_scale = self.put(es)
        self.out_wq = self.put(wq_of(es, None, 128))
        self.gains = {k: self.put(v) for k, v in art.tensors.items() if k.endswith("norm")}
        self.rope_cos = self.put(art.tensors["rope.cos"])
        self.rope_sin = self.put(art.tensors["rope.sin"])

    # subclass hooks --------------------------------------------------------------------
    def put(self, a: Any) -> Any:
        return np.ascontiguousarray(a)

    @abstractmethod
    def launch(self, name: str, grid: tuple[int, ...], args: tuple[Any, ...]) -> None:
        """Run kernel ``name`` over ``grid`` blocks (g++ threads on the CPU, CUDA on a GPU)."""

    def check(self, what: str, maxabs: Any, limit: int) -> None:
        oracle.check_bound(what, int(maxabs), limit)

    def finish(self) -> None:
        """Called once at the end of a forward (the CuPy backend checks its flags here)."""
        return None

    # ops --------------------------------------------------------------------------------
    def _c(self, a: Any) -> Any:
        return self.xp.ascontiguousarray(a, dtype=self.xp.int64)

    def zeros(self, shape: tuple[int, ...]) -> Any:
        return self.xp.zeros(shape, dtype=self.xp.int64)

    def add(self, a: Any, b: Any) -> Any:
        out = a + b
        self.check("residual", self.xp.abs(out).max(), oracle.RESID_LIMIT)
        return out

    def embed(self, tokens: Any) -> Any:
        d = self.config.d_model
        t = self._c(self.xp.asarray(tokens))
        x = self.zeros((len(tokens), d))
        self.launch("nl_embed", (len(tokens),), (self.emb_codes, self.emb_scale, t, x, d))
        return x

    def _matmul_check(self, x: Any, wq: Any, what: str) -> None:
        xp = self.xp
        ax = xp.abs(x)
        self.check(what, ax.max(), 1 << 41)
        a = ax.reshape(x.shape[0], -1, 32).sum(axis=2)
        bound = (((a >> 20) + 1) * wq[None, :]).sum(axis=1)
        self.check(f"{what} (accumulation bound)", bound.max(), 1 << 32)
        # the oracle's float32 split also requires |x| <= 2**31 + 2**15 (Q4) / 2**35 (Q8):
        # checked the same way so that both backends refuse the same inputs.

    def matmul(self, x: Any, mat: str) -> Any:
        x = self._c(x)
        t, k = x.shape
        if mat == "output":
            o = self.config.vocab_size
            self._matmul_check(x, self.out_wq, mat)
            self.check("matmul input (top piece)", self._top_piece(x, 12, 3), 1 << 11)
            y = self.zeros((t, o))
            self.launch("nl_q8_matmul", (o, t), (self.emb_codes, self.emb_scale, x, y, t, o, k))
            return y
        codes, scale, off, wq, o, kk = self.q4[mat]
        self._matmul_check(x, wq, mat)
        self.check("matmul input (top piece)", self._top_piece(x, 16, 2), 1 << 15)
        y = self.zeros((t, o))
        self.launch("nl_q4_matmul", (o, t), (codes, scale, off, x, y, t, o, kk))
        return y

    def _top_piece(self, x: Any, bits: int, n: int) -> Any:
        half = 1 << (bits - 1)
        mask = (1 << bits) - 1
        rest = x
        for _ in range(n - 1):
            lo = ((rest + half) & mask) - half
            rest = (rest - lo) >> bits
        return self.xp.abs(rest).max()

    def rmsnorm(self, x: Any, gain: str) -> Any:
        x = self._c(x)
        t, d = x.shape
        y = self.zeros((t, d))
        self.launch("nl_rmsnorm", (t,), (x, self.gains[gain], y, d, self.config.norm_eps_q32))
        return y

    def rope(self, x: Any, pos: Any, table: str = "") -> Any:
        if table:
            raise self._format2("rope table " + table)
        x = self._c(x)
        n, nh, hd = x.shape
        self.check("rope input", self.xp.abs(x).max(), oracle.ROPE_X_LIMIT)
        y = self.zeros(x.shape)
        p = self._c(self.xp.asarray(pos))
        self.launch("nl_rope", (n, nh), (x, self.rope_cos, self.rope_sin, p, y, nh, hd))
        return y

    def attention(self, q: Any, k: Any, v: Any, qpos: Any, window: int = 0) -> Any:
        if window:
            raise self._format2("sliding-window attention")
        xp = self.xp
        q, k, v = self._c(q), self._c(k), self._c(v)
        n, h, hd = q.shape
        m, kvh, _ = k.shape
        self.check("attention q", xp.abs(q).max(), oracle.QK_LIMIT)
        self.check("attention k", xp.abs(k).max(), oracle.QK_LIMIT)
        self.check("attention v", xp.abs(v).max(), oracle.V_LIMIT)
        out = self.zeros((n, h * hd))
        scratch = xp.empty((n, h, m), dtype=xp.int64)
        p = self._c(xp.asarray(qpos))
        self.launch("nl_attention", (n, h), (q, k, v, p, out, scratch, h, kvh, hd, m,
                                             self.config.attn_scale_q30))
        return out

    def swiglu(self, g: Any, u: Any) -> Any:
        xp = self.xp
        g, u = self._c(g), self._c(u)
        self.check("ffn gate", xp.abs(g).max(), oracle.SWIGLU_LIMIT)
        self.check("ffn up", xp.abs(u).max(), oracle.SWIGLU_LIMIT)
        a = self.zeros(g.shape)
        n = int(g.size)
        self.launch("nl_swiglu", (max(1, min(1024, (n + 255) // 256)),), (g, u, a, n))
        return a


    # format 2 operations: the constructor refuses every artifact that needs them --------
    def _format2(self, op: str) -> UnsupportedArtifact:
        return UnsupportedArtifact(f"{op}: the CUDA kernels run format 1 artifacts only")

    def layernorm(self, x: Any, gain: str) -> Any:
        raise self._format2("layernorm")

    def geglu(self, g: Any, u: Any) -> Any:
        raise self._format2("geglu")

    def scale(self, x: Any, factor_q24: int) -> Any:
        raise self._format2("scale")

    def route(self, logits: Any, k: int, gating: str, normalise: bool) -> tuple[Any, Any]:
        raise self._format2("route")

    def combine(self, n: int, d: int, experts: Any, weights: Any,
                ys: Sequence[tuple[int, Any, Any]]) -> Any:
        raise self._format2("combine")


def kernel_source() -> str:
    """engine.cu with common.cuh inlined: one translation unit for NVRTC / cupy.RawModule."""
    from pathlib import Path

    d = Path(__file__).resolve().parent / "kernels"
    common = (d / "common.cuh").read_text().replace("#pragma once\n", "")
    return (d / "engine.cu").read_text().replace('#include "common.cuh"\n', common)
