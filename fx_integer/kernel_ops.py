"""Ops that run the CUDA kernels of ``kernels/engine.cu`` (shared by the CPU build and CuPy).

The forward driver (:mod:`fx_integer.forward`), KV cache and sampling are the oracle's; only the
ops differ. Every architecture of artifact formats 1 and 2 runs here:

* matrices: format 1's nibble-packed Q4_1 matrices keep their own kernel (``nl_q4_matmul``,
  half the bytes of int8 codes); every other matrix -- format 2's of any block size, format
  1's Q8_0 head -- runs ``nl_qmatmul_s32``/``_s64``: int8 codes ``[O, K]``, Q.24 block scales
  (and offsets) ``[O, K/group]`` as int32 where every value fits, else int64. A tied
  embedding is the output head's matrix itself: its codes stay int8 on the device, once;
* the oracle's range checks before each op, the same values and the same messages
  (:func:`fx_integer.oracle.check_matmul_input` with the block size, the top-piece check of
  :func:`fx_integer.oracle.piece_split`, :func:`fx_integer.oracle.qk_limit`, ...);
* the router (:func:`fx_integer.oracle.route`) runs on the host over the ``[n, experts]``
  router logits (the forward needs each row's experts on the host to pick their rows
  anyway), and :meth:`KernelOps.combine` is integer array code in ``xp`` (numpy or CuPy).

Host glue is integer array code only (slicing, concatenation, integer additions and shifts).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from . import oracle
from .artifact import Artifact, QWeight
from .forward import fused_weight, fusion_plan
from .oracle import FixedPointOverflow, piece_split, qk_limit

I64 = npt.NDArray[np.int64]

# kernel name -> argument kinds after (grid, block): p = pointer, i = int32, l = int64
SIGNATURES: Final[dict[str, str]] = {
    "nl_embed_s32": "pppippii",
    "nl_embed_s64": "pppippii",
    "nl_q4_matmul": "pppppiii",
    "nl_qmatmul_s32": "pppippiiii",
    "nl_qmatmul_s64": "pppippiiii",
    "nl_rmsnorm": "pppiil",
    "nl_rope": "pppppiii",
    "nl_attention": "ppppppiiiiil",
    "nl_swiglu": "pppl",
    "nl_geglu": "pppl",
    "nl_scale": "ppll",
}
#: kernels launched over a two-dimensional grid (the others: one dimension)
GRID2: Final = frozenset({"nl_q4_matmul", "nl_qmatmul_s32", "nl_qmatmul_s64", "nl_rope",
                          "nl_attention"})

_I32 = np.iinfo(np.int32)


def wq_of(scale: Any, offset: Any | None, qmax: int) -> I64:
    """Per-block (W >> 10) + 1 for the matmul exactness check (see oracle module doc), from
    ``[O, nb]`` scales/offsets (:func:`fx_integer.oracle.exactness_weights`' values)."""
    w = qmax * np.abs(np.asarray(scale, dtype=np.int64))
    if offset is not None:
        w = w + np.abs(np.asarray(offset, dtype=np.int64))
    wmax = w.max(axis=0)  # scale is [O, nb] -> [nb]
    if wmax.max() >= (1 << 38):
        raise FixedPointOverflow("quantization scales too large for the exactness bound")
    return np.asarray((wmax >> 10) + 1, dtype=np.int64)


def _fits_int32(a: npt.NDArray[Any] | None) -> bool:
    return a is None or a.size == 0 or (int(a.min()) >= _I32.min and int(a.max()) <= _I32.max)


class UnsupportedArtifact(ValueError):
    """The backend cannot run this artifact's architecture or formats."""


@dataclasses.dataclass(frozen=True)
class DeviceMatrix:
    """One (fused) matrix as the kernels read it, its arrays on the backend's device."""

    kernel: str  # nl_q4_matmul (format 1 nibbles), nl_qmatmul_s32 or nl_qmatmul_s64
    codes: Any  # [O, K] int8 (nl_q4_matmul: [O, K/2] uint8, two codes per byte)
    scale: Any  # [O, K/group] Q.24, int32 or int64
    offset: Any  # [O, K/group] like scale, or a one-element stand-in when has_off is 0
    has_off: int
    wq: Any  # [K/group] int64: (W >> 10) + 1 of the exactness check (None: rows only)
    out_features: int
    in_features: int
    group: int
    piece_bits: int  # the oracle's float32 split (piece_split): its top piece is checked
    n_pieces: int

    @property
    def wide(self) -> bool:
        return self.kernel.endswith("_s64")


class KernelOps(ABC):
    """Base: prepares the weights on the host, subclasses move them and launch kernels."""

    xp: Any = np

    def __init__(self, art: Artifact, *, threads: int) -> None:
        self.config = art.config
        self.model_hash = art.model_hash
        self.threads = threads
        self._none = {32: self.put(np.zeros(1, dtype=np.int32)),
                      64: self.put(np.zeros(1, dtype=np.int64))}
        layout, self.plan = fusion_plan(art)
        # the embedding's scales meet the matmul's exactness check only where it is the head
        tied = ("tok_embd",) in layout.values()
        self.emb = self.device_matrix(art.weight("tok_embd"), exactness=tied)
        self.mats: dict[str, DeviceMatrix] = {}
        for fused, names in layout.items():
            if names == ("tok_embd",):
                self.mats[fused] = self.emb  # the tied head: the embedding's arrays, once
            elif art.format_version == 1:
                self.mats[fused] = self._q4_1(art, names)
            else:
                self.mats[fused] = self.device_matrix(fused_weight(art, names))
        self.gains = {k: self.put(np.asarray(v, dtype=np.int64)) for k, v in art.tensors.items()
                      if k.endswith("norm")}
        self.rope_tables: dict[str, tuple[Any, Any]] = {}
        for table, prefix in (("", "rope"), ("swa", "rope_swa")):
            if f"{prefix}.cos" in art.tensors:
                cos, sin = (np.asarray(art.tensors[f"{prefix}.{f}"]) for f in ("cos", "sin"))
                if not (_fits_int32(cos) and _fits_int32(sin)):
                    raise UnsupportedArtifact(f"{prefix} tables do not fit int32")
                self.rope_tables[table] = (self.put(cos.astype(np.int32)),
                                           self.put(sin.astype(np.int32)))
        self.neox = int(self.config.rope_layout == "neox")

    def device_matrix(self, w: QWeight, *, exactness: bool = True) -> DeviceMatrix:
        """Any format's matrix laid out for nl_qmatmul (and the embedding for nl_embed).
        ``exactness`` False: rows only (the embedding of an untied model), no matmul check
        weights (nor the oracle's refusal of scales too large for them)."""
        o, k = w.shape
        if k % w.group:
            raise UnsupportedArtifact(f"{k} columns are not a whole number of {w.group} blocks")
        scale = np.asarray(w.scale, dtype=np.int64)
        off = None if w.offset is None else np.asarray(w.offset, dtype=np.int64)
        bits = 32 if _fits_int32(scale) and _fits_int32(off) else 64
        dt = np.int32 if bits == 32 else np.int64
        bits_p, pieces = piece_split(w.qmax, w.group)
        return DeviceMatrix(
            kernel=f"nl_qmatmul_s{bits}",
            codes=self.put(np.ascontiguousarray(w.codes, dtype=np.int8)),
            scale=self.put(scale.astype(dt)),
            offset=self._none[bits] if off is None else self.put(off.astype(dt)),
            has_off=int(off is not None),
            wq=self.put(wq_of(scale, off, w.qmax)) if exactness else None,
            out_features=o, in_features=k, group=w.group, piece_bits=bits_p, n_pieces=pieces)

    def _q4_1(self, art: Artifact, names: Sequence[str]) -> DeviceMatrix:
        """Format 1's Q4_1 matrices, fused, nibble-packed as the artifact stores them."""
        codes = np.concatenate([art.tensors[f"{n}.codes"] for n in names])
        scale = np.concatenate([art.tensors[f"{n}.scale"] for n in names])
        off = np.concatenate([art.tensors[f"{n}.offset"] for n in names])
        o, kh = codes.shape
        bits, pieces = piece_split(15, 32)
        return DeviceMatrix(
            kernel="nl_q4_matmul", codes=self.put(codes), scale=self.put(scale),
            offset=self.put(off), has_off=1, wq=self.put(wq_of(scale, off, 15)),
            out_features=o, in_features=2 * kh, group=32, piece_bits=bits, n_pieces=pieces)

    # subclass hooks --------------------------------------------------------------------
    def put(self, a: Any) -> Any:
        return np.ascontiguousarray(a)

    def host(self, a: Any) -> I64:
        """A backend array as a host numpy int64 array."""
        return np.asarray(a, dtype=np.int64)

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

    def _grid1(self, n: int) -> tuple[int]:
        return (max(1, min(1024, (n + 255) // 256)),)

    def zeros(self, shape: tuple[int, ...]) -> Any:
        return self.xp.zeros(shape, dtype=self.xp.int64)

    def add(self, a: Any, b: Any) -> Any:
        out = a + b
        self.check("residual", self.xp.abs(out).max(), oracle.RESID_LIMIT)
        return out

    def embed(self, tokens: Any) -> Any:
        d = self.config.d_model
        if isinstance(tokens, np.ndarray) and tokens.size and (
                int(tokens.min()) < 0 or int(tokens.max()) >= self.config.vocab_size):
            raise IndexError("token id out of range")
        e = self.emb
        t = self._c(self.xp.asarray(tokens))
        x = self.zeros((len(tokens), d))
        if len(tokens):
            self.launch("nl_embed_s64" if e.wide else "nl_embed_s32", (len(tokens),),
                        (e.codes, e.scale, e.offset, e.has_off, t, x, d, e.group))
        return x

    def _matmul_check(self, x: Any, wq: Any, what: str, group: int) -> None:
        """:func:`fx_integer.oracle.check_matmul_input` on the backend's arrays."""
        xp = self.xp
        ax = xp.abs(x)
        self.check(what, ax.max(), 1 << 41)
        a = ax.reshape(x.shape[0], -1, group).sum(axis=2)
        bound = (((a >> 20) + 1) * wq[None, :]).sum(axis=1)
        self.check(f"{what} (accumulation bound)", bound.max(), 1 << 32)

    def matmul(self, x: Any, mat: str) -> Any:
        m = self.mats[mat]
        x = self._c(x)
        t, k = x.shape
        if k != m.in_features:
            raise ValueError(f"{mat}: input has {k} features, the matrix {m.in_features}")
        if m.wq is None:
            raise ValueError(f"{mat}: laid out for its rows only, not as a matrix")
        o = m.out_features
        y = self.zeros((t, o))
        if t == 0:
            return y
        self._matmul_check(x, m.wq, mat, m.group)
        # the oracle's float32 split (split_pieces) refuses inputs whose top piece is too big:
        # checked the same way so that every backend refuses the same inputs
        self.check("matmul input (top piece)", self._top_piece(x, m.piece_bits, m.n_pieces),
                   1 << (m.piece_bits - 1))
        if m.kernel == "nl_q4_matmul":
            self.launch(m.kernel, (o, t), (m.codes, m.scale, m.offset, x, y, t, o, k))
        else:
            self.launch(m.kernel, (o, t), (m.codes, m.scale, m.offset, m.has_off, x, y, t, o,
                                           k, m.group))
        return y

    def _top_piece(self, x: Any, bits: int, n: int) -> Any:
        half = 1 << (bits - 1)
        mask = (1 << bits) - 1
        rest = x
        for _ in range(n - 1):
            lo = ((rest + half) & mask) - half
            rest = (rest - lo) >> bits
        return self.xp.abs(rest).max()

    def _norm(self, x: Any, gain: str, center: int) -> Any:
        x = self._c(x)
        t, d = x.shape
        g = self.gains[gain]
        if g.shape != (d,):
            raise ValueError(f"{gain}: {g.shape[0]} gains for rows of {d}")
        y = self.zeros((t, d))
        if t:
            self.launch("nl_rmsnorm", (t,), (x, g, y, d, center, self.config.norm_eps_q32))
        return y

    def rmsnorm(self, x: Any, gain: str) -> Any:
        return self._norm(x, gain, 0)

    def layernorm(self, x: Any, gain: str) -> Any:
        """RMSNorm of the centred rows (:func:`fx_integer.oracle.center`), one kernel."""
        return self._norm(x, gain, 1)

    def rope(self, x: Any, pos: Any, table: str = "") -> Any:
        cos, sin = self.rope_tables[table]
        x = self._c(x)
        n, nh, hd = x.shape
        self.check("rope input", self.xp.abs(x).max() if x.size else 0, oracle.ROPE_X_LIMIT)
        if isinstance(pos, np.ndarray) and pos.size and (
                int(pos.min()) < 0 or int(pos.max()) >= cos.shape[0]):
            raise IndexError("position outside the RoPE table")
        y = self.zeros(x.shape)
        p = self._c(self.xp.asarray(pos))
        if x.size:
            self.launch("nl_rope", (n, nh), (x, cos, sin, p, y, nh, hd, self.neox))
        return y

    def attention(self, q: Any, k: Any, v: Any, qpos: Any, window: int = 0) -> Any:
        xp = self.xp
        q, k, v = self._c(q), self._c(k), self._c(v)
        n, h, hd = q.shape
        m, kvh, _ = k.shape
        lim = qk_limit(hd)
        self.check("attention q", xp.abs(q).max(), lim)
        self.check("attention k", xp.abs(k).max(), lim)
        self.check("attention v", xp.abs(v).max(), oracle.V_LIMIT)
        if isinstance(qpos, np.ndarray) and qpos.size and int(qpos.min()) < 0:
            raise IndexError("negative query position")
        out = self.zeros((n, h * hd))
        scratch = xp.empty((n, h, m), dtype=xp.int64)
        p = self._c(xp.asarray(qpos))
        self.launch("nl_attention", (n, h), (q, k, v, p, out, scratch, h, kvh, hd, m,
                                             int(window), self.config.attn_scale_q30))
        return out

    def _gated(self, kernel: str, g: Any, u: Any) -> Any:
        xp = self.xp
        g, u = self._c(g), self._c(u)
        self.check("ffn gate", xp.abs(g).max(), oracle.SWIGLU_LIMIT)
        self.check("ffn up", xp.abs(u).max(), oracle.SWIGLU_LIMIT)
        a = self.zeros(g.shape)
        n = int(g.size)
        self.launch(kernel, self._grid1(n), (g, u, a, n))
        return a

    def swiglu(self, g: Any, u: Any) -> Any:
        return self._gated("nl_swiglu", g, u)

    def geglu(self, g: Any, u: Any) -> Any:
        return self._gated("nl_geglu", g, u)

    def scale(self, x: Any, factor_q24: int) -> Any:
        """round_half_up(x * factor / 2**24) (:func:`fx_integer.oracle.scale_q24`)."""
        x = self._c(x)
        self.check("scaled value", self.xp.abs(x).max() if x.size else 0,
                   (1 << 62) // max(1, abs(factor_q24)))
        y = self.zeros(x.shape)
        n = int(x.size)
        if n:
            self.launch("nl_scale", self._grid1(n), (x, y, n, int(factor_q24)))
        return y

    def route(self, logits: Any, k: int, gating: str, normalise: bool) -> tuple[I64, I64]:
        """The oracle's router on the host over the [n, experts] router logits: (experts,
        weights Q.30), both host arrays. The checks of everything before it are settled first
        (the CuPy backend's deferred flags), so that it never routes a row an error spoilt."""
        self.finish()
        return oracle.route(self.host(logits), k, gating, normalise)

    def combine(self, n: int, d: int, experts: Any, weights: Any,
                ys: Sequence[tuple[int, I64, Any]]) -> Any:
        """:func:`fx_integer.oracle.combine` in ``xp``: each row's experts' outputs times their
        Q.30 weights, summed exactly in int64, one rounding to Q.16."""
        xp = self.xp
        ex, w_all = self.host(experts), self.host(weights)
        acc = self.zeros((n, d))
        limit = (1 << 62) // max(1, int(w_all.sum(axis=1).max()) if w_all.size else 1)
        for e, rows, y in ys:
            y = self._c(y)
            self.check("expert output", xp.abs(y).max(), limit)
            w = (w_all[rows] * (ex[rows] == e)).sum(axis=1)  # each row's weight for e
            sel = xp.asarray(np.asarray(rows, dtype=np.int64))
            acc[sel] += xp.asarray(w)[:, None] * y
        return (acc + (1 << 29)) >> 30


def kernel_source() -> str:
    """engine.cu with common.cuh inlined: one translation unit for NVRTC / cupy.RawModule."""
    from pathlib import Path

    d = Path(__file__).resolve().parent / "kernels"
    common = (d / "common.cuh").read_text().replace("#pragma once\n", "")
    return (d / "engine.cu").read_text().replace('#include "common.cuh"\n', common)
