"""The numpy integer oracle: the canonical verifier of the integer engine.

The forward pass (:func:`forward`) is written once over an ``Ops`` object; :class:`OracleOps`
implements every operation in int64 fixed point (see ``_fixed``), the kernel backends implement
the same operations with the CUDA sources in ``kernels/`` and the float reference
(``float_ref.FloatOps``) with float32. Everything except :class:`OracleOps` is a producer that
the parity tests hold byte-identical to it.

Matmul exactness (Q4_1 matrices, the Q8_0 output head): for row ``o`` and input row ``x``
(Q.16 int64), with block scale ``D`` and offset ``M`` in Q.24::

    y_o = round_half_up( sum_b D[o,b] * P[o,b] + M[o,b] * S[b]  ,  24 )
    P[o,b] = sum_{j<32} q[o,32b+j] * x[32b+j]      (q in 0..15, or -128..127 for Q8_0)
    S[b]   = sum_{j<32} x[32b+j]

``P`` runs through float32 BLAS on split inputs: ``x = sum_j piece_j * 2**(bits*j)`` with
centred pieces ``|piece_j| <= 2**(bits-1)`` (Q4_1: bits 16, 2 pieces, |x| < 2**31; Q8_0:
bits 12, 3 pieces). Every product and every partial sum of a block dot product is an integer of
magnitude <= 32 * qmax * 2**(bits-1) <= 2**23 (15 * 2**20 for Q4_1, 2**23 for Q8_0), exactly
representable in float32 (24-bit significand), so any summation order and any FMA use gives the
exact integer; ``P = sum_j P_j << (bits*j)`` is then rebuilt in int64.
The int64 accumulation: every partial sum, in any order, is bounded by
``sum_b W[b] * A[b]`` with ``W[b] = max_o (qmax * |D[o,b]| + |M[o,b]|)`` (per tensor, < 2**38)
and ``A[b] = sum_j |x[32b+j]|`` (per input row). Each call checks, in exact int64,
``sum_b ((W[b] >> 10) + 1) * ((A[b] >> 20) + 1) <= 2**32``, which implies that bound is
<= 2**62; otherwise it raises :class:`FixedPointOverflow` (deterministically: the check is
integer too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from . import _fixed as fx
from .artifact import Artifact, Config, unpack_nibbles

I64 = npt.NDArray[np.int64]
#: A backend's own representation of one quantized matrix (:func:`fused_matrices`).
M = TypeVar("M")
F64 = npt.NDArray[np.float64]

# Largest |x| allowed into a matmul: keeps the accumulation-bound check itself in int64
# (A[b] <= 32 * 2**41 = 2**46). The float32 split then asks far less (see split_pieces).
_BLAS_X_LIMIT = 1 << 41
# Element budget for the (nb, O, n_pieces * T) float32 temporary of one matmul chunk.
_CHUNK_ELEMS = 1 << 22
# sum_b ((W>>10)+1) * ((A>>20)+1) <= 2**32 implies sum_b W * A <= 2**62.
_ACC_CHECK_LIMIT = 1 << 32


class FixedPointOverflow(ArithmeticError):
    """An activation left the range in which the integer arithmetic is proven exact."""


def check_bound(what: str, maxabs: int, limit: int) -> None:
    if maxabs > limit:
        raise FixedPointOverflow(f"{what}: max |value| {maxabs} exceeds proven-exact bound {limit}")


# Bounds asserted on op inputs (Q.16 values); see docs/integer-engine.md.
ROPE_X_LIMIT = 1 << 31  # x * cos < 2**61, two terms < 2**62
QK_LIMIT = (1 << 28) - 1  # q_d * k_d < 2**56; 64 terms < 2**62, score differences < 2**63
V_LIMIT = 1 << 31  # prob * v summed: (2**30 + m) * 2**31 < 2**62
SWIGLU_LIMIT = 1 << 31  # g * sigmoid < 2**61; silu * u < 2**62
RESID_LIMIT = 1 << 40


@dataclasses.dataclass(frozen=True)
class QMatrix:
    """A quantized matrix prepared for the oracle: block-major float32 codes plus Q.24 scales."""

    codes: npt.NDArray[np.float32]  # [nb, O, 32] codes as float32 (exact small integers)
    scale: I64  # [nb, O] D in Q.24
    offset: I64 | None  # [nb, O] M in Q.24 (None for Q8_0)
    wq: I64  # [nb] (W[b] >> 10) + 1, for the exactness check
    out_features: int
    in_features: int
    piece_bits: int  # input split for exact float32 block dots
    n_pieces: int


def exactness_weights(d: I64, m: I64 | None, qmax: int) -> I64:
    """``(W[b] >> 10) + 1`` of the exactness check from block-major scales ``d``, offsets ``m``
    ([nb, O], Q.24); raises :class:`FixedPointOverflow` when a scale is too large for it."""
    w = qmax * np.abs(d)
    if m is not None:
        w = w + np.abs(m)
    wmax = w.max(axis=1)  # [nb]
    if wmax.max() >= (1 << 38):
        raise FixedPointOverflow("quantization scales too large for the exactness bound")
    return np.ascontiguousarray((wmax >> 10) + 1, dtype=np.int64)


def piece_split(qmax: int) -> tuple[int, int]:
    """(bits, pieces) of the float32 input split for codes of magnitude ``qmax``."""
    return (16, 2) if qmax <= 15 else (12, 3)


def _qmatrix(codes: npt.NDArray[Any], scale: npt.NDArray[Any],
             offset: npt.NDArray[Any] | None, qmax: int) -> QMatrix:
    o, k = codes.shape
    nb = k // 32
    c = np.ascontiguousarray(codes.reshape(o, nb, 32).transpose(1, 0, 2), dtype=np.float32)
    d = np.ascontiguousarray(scale.astype(np.int64).T)
    m = None if offset is None else np.ascontiguousarray(offset.astype(np.int64).T)
    wq = exactness_weights(d, m, qmax)
    bits, pieces = piece_split(qmax)
    return QMatrix(codes=c, scale=d, offset=m, wq=wq, out_features=o, in_features=k,
                   piece_bits=bits, n_pieces=pieces)


def split_pieces(x: I64, bits: int, n: int) -> list[I64]:
    """x = sum_j piece_j << (bits*j), |piece_j| <= 2**(bits-1) (checked for the last one)."""
    half = np.int64(1 << (bits - 1))
    mask = np.int64((1 << bits) - 1)
    out = []
    rest = x
    for _ in range(n - 1):
        lo = ((rest + half) & mask) - half
        out.append(lo)
        rest = (rest - lo) >> np.int64(bits)
    check_bound("matmul input (top piece)", int(np.abs(rest).max()), int(half))
    out.append(rest)
    return out


def check_matmul_input(x: I64, wq: I64, what: str) -> None:
    """The integer exactness check of a quantized matmul input (see the module docstring)."""
    if x.size == 0:
        return
    ax = np.abs(x)
    check_bound(what, int(ax.max()), _BLAS_X_LIMIT)
    a = ax.reshape(x.shape[0], -1, 32).sum(axis=2)  # [T, nb] <= 2**46
    bound = ((a >> 20) + 1) @ wq  # each term < 2**55, sum < 2**63
    check_bound(f"{what} (accumulation bound)", int(bound.max()), _ACC_CHECK_LIMIT)


def fuse_q4(art: Artifact, names: Sequence[str]) -> tuple[npt.NDArray[np.uint8], I64, I64]:
    """Concatenate Q4_1 matrices along the output dimension: (codes [O,K], scale, offset)."""
    codes = np.concatenate([unpack_nibbles(art.tensors[f"{n}.codes"]) for n in names])
    scale = np.concatenate([art.tensors[f"{n}.scale"] for n in names]).astype(np.int64)
    off = np.concatenate([art.tensors[f"{n}.offset"] for n in names]).astype(np.int64)
    return codes, scale, off


def fused_layout(cfg: Config, layer: int) -> dict[str, tuple[str, ...]]:
    p = f"blk.{layer}"
    return {
        f"{p}.qkv": (f"{p}.attn_q", f"{p}.attn_k", f"{p}.attn_v"),
        f"{p}.attn_output": (f"{p}.attn_output",),
        f"{p}.gate_up": (f"{p}.ffn_gate", f"{p}.ffn_up"),
        f"{p}.ffn_down": (f"{p}.ffn_down",),
    }


class Ops(Protocol):
    """The operations the forward pass needs; arrays are backend arrays (numpy, CuPy)."""

    config: Config

    @property
    def xp(self) -> Any: ...

    def embed(self, tokens: I64) -> Any: ...
    def rmsnorm(self, x: Any, gain: str) -> Any: ...
    def matmul(self, x: Any, mat: str) -> Any: ...
    def rope(self, x: Any, pos: I64) -> Any: ...
    def attention(self, q: Any, k: Any, v: Any, qpos: I64) -> Any: ...
    def swiglu(self, g: Any, u: Any) -> Any: ...
    def add(self, a: Any, b: Any) -> Any: ...
    def zeros(self, shape: tuple[int, ...]) -> Any: ...


class KVCache:
    """Per-sequence key/value cache: per layer [capacity, n_kv_heads, head_dim] arrays."""

    def __init__(self, ops: Ops) -> None:
        self.ops = ops
        self.length = 0
        self.k: list[Any] = []
        self.v: list[Any] = []
        self.tokens: list[int] = []

    def _ensure(self, n: int) -> None:
        cfg = self.ops.config
        cap = self.k[0].shape[0] if self.k else 0
        if n <= cap:
            return
        new_cap = max(n, 2 * cap, 64)
        shape = (new_cap, cfg.n_kv_heads, cfg.head_dim)
        for lst in (self.k, self.v):
            for i in range(cfg.n_layers):
                buf = self.ops.zeros(shape)
                if i < len(lst):
                    buf[:cap] = lst[i][:cap]
                    lst[i] = buf
                else:
                    lst.append(buf)

    def clone(self) -> KVCache:
        c = KVCache(self.ops)
        c.length = self.length
        c.k = [a.copy() for a in self.k]
        c.v = [a.copy() for a in self.v]
        c.tokens = list(self.tokens)
        return c


def forward(ops: Ops, batch: Sequence[tuple[KVCache, Sequence[int]]], *,
            all_logits: bool = False, logits_from: int = 0) -> list[Any]:
    """Append each sequence's new tokens to its cache; return logits ([rows, V] Q.16).

    Rows of all sequences go through the matmuls together (batching cannot change a row's
    bytes: every op is row-local except attention, which reads only its own sequence).
    ``all_logits`` returns a row per new token from the ``logits_from``-th new token of each
    sequence on (the output head runs on those rows only), otherwise only the last row per
    sequence.
    """
    cfg = ops.config
    xp = ops.xp
    d, h, kv, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    kvd = kv * hd
    toks: list[int] = []
    pos: list[int] = []
    spans: list[tuple[int, int, int]] = []  # (row start, row end, cache length before)
    if all_logits and any(not 0 <= logits_from < len(new) for _, new in batch):
        raise ValueError("logits_from must be below every sequence's number of new tokens")
    for cache, new in batch:
        if len(new) == 0:
            raise ValueError("each sequence in a forward batch needs at least one new token")
        if cache.length + len(new) > cfg.ctx_len:
            raise ValueError(f"context length {cfg.ctx_len} exceeded")
        start = len(toks)
        toks.extend(int(t) for t in new)
        pos.extend(range(cache.length, cache.length + len(new)))
        spans.append((start, len(toks), cache.length))
        cache._ensure(cache.length + len(new))
    tok_arr = np.asarray(toks, dtype=np.int64)
    if tok_arr.min() < 0 or tok_arr.max() >= cfg.vocab_size:
        raise ValueError("token id out of range")
    pos_arr = np.asarray(pos, dtype=np.int64)
    n = len(toks)

    x = ops.embed(tok_arr)  # [n, d]
    for layer in range(cfg.n_layers):
        p = f"blk.{layer}"
        hn = ops.rmsnorm(x, f"{p}.attn_norm")  # [n, d]
        qkv = ops.matmul(hn, f"{p}.qkv")  # [n, d + 2 kvd]
        q = ops.rope(qkv[:, :d].reshape(n, h, hd), pos_arr)  # [n, h, hd]
        k = ops.rope(qkv[:, d:d + kvd].reshape(n, kv, hd), pos_arr)  # [n, kv, hd]
        v = qkv[:, d + kvd:].reshape(n, kv, hd)
        outs = []
        for (cache, _), (r0, r1, before) in zip(batch, spans, strict=True):
            after = before + (r1 - r0)
            cache.k[layer][before:after] = k[r0:r1]
            cache.v[layer][before:after] = v[r0:r1]
            outs.append(ops.attention(q[r0:r1], cache.k[layer][:after], cache.v[layer][:after],
                                      pos_arr[r0:r1]))
        att = outs[0] if len(outs) == 1 else xp.concatenate(outs, axis=0)  # [n, d]
        x = ops.add(x, ops.matmul(att, f"{p}.attn_output"))
        hn = ops.rmsnorm(x, f"{p}.ffn_norm")
        gu = ops.matmul(hn, f"{p}.gate_up")  # [n, 2 d_ff]
        a = ops.swiglu(gu[:, :cfg.d_ff], gu[:, cfg.d_ff:])
        x = ops.add(x, ops.matmul(a, f"{p}.ffn_down"))
    for (cache, new), (_, _, before) in zip(batch, spans, strict=True):
        cache.length = before + len(new)
        cache.tokens.extend(int(t) for t in new)
    if all_logits and logits_from > 0:
        idx = np.concatenate([np.arange(r0 + logits_from, r1, dtype=np.int64)
                              for (r0, r1, _) in spans])
        rows = x[xp.asarray(idx)]
        spans = [(r0 - i * logits_from, r1 - (i + 1) * logits_from, before)
                 for i, (r0, r1, before) in enumerate(spans)]
    elif all_logits:
        rows = x
    else:
        idx = np.asarray([r1 - 1 for (_, r1, _) in spans], dtype=np.int64)
        rows = x[xp.asarray(idx)]
    logits = ops.matmul(ops.rmsnorm(rows, "output_norm"), "output")
    finish = getattr(ops, "finish", None)
    if finish is not None:
        finish()  # backends that defer their bound checks raise here
    if all_logits:
        return [logits[r0:r1] for (r0, r1, _) in spans]
    return [logits[i:i + 1] for i in range(len(spans))]


def fused_matrices(art: Artifact,
                   make: Callable[[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any] | None,
                                   int], M]) -> dict[str, M]:
    """Every matrix of the forward in the fused layout (:func:`fused_layout`, :func:`fuse_q4`;
    ``output`` the tied Q8_0 embedding), each built by ``make(codes, scales, offsets, qmax)``
    into a backend's own representation."""
    mats: dict[str, M] = {}
    for layer in range(art.config.n_layers):
        for fused, names in fused_layout(art.config, layer).items():
            c, s, o = fuse_q4(art, names)
            mats[fused] = make(c, s, o, 15)
    mats["output"] = make(art.tensors["tok_embd.codes"], art.tensors["tok_embd.scale"], None, 128)
    return mats


class OracleOps:
    """int64 fixed-point operations in numpy: the canonical definition of the engine."""

    xp = np

    def __init__(self, art: Artifact) -> None:
        self._load_common(art)
        self.mats: dict[str, QMatrix] = fused_matrices(art, _qmatrix)

    def _load_common(self, art: Artifact) -> None:
        """What every int64 backend on the CPU keeps as the oracle does: the config, the
        embedding's codes and scales, the norm gains and the RoPE tables (the matrices are each
        backend's own layout: :func:`fused_matrices`)."""
        self.config = art.config
        self.model_hash = art.model_hash
        self.art = art
        self.emb_codes = art.tensors["tok_embd.codes"]
        self.emb_scale = art.tensors["tok_embd.scale"].astype(np.int64)
        self.gains = {k: v.astype(np.int64) for k, v in art.tensors.items()
                      if k.endswith("norm")}
        self.rope_cos = art.tensors["rope.cos"].astype(np.int64)
        self.rope_sin = art.tensors["rope.sin"].astype(np.int64)

    # -- ops --------------------------------------------------------------------------
    def zeros(self, shape: tuple[int, ...]) -> I64:
        return np.zeros(shape, dtype=np.int64)

    def add(self, a: I64, b: I64) -> I64:
        out = a + b
        check_bound("residual", int(np.abs(out).max()), RESID_LIMIT)
        return out

    def embed(self, tokens: I64) -> I64:
        """Q8_0 row -> Q.16: round_half_up(q * D, 8)."""
        d = self.config.d_model
        c = self.emb_codes[tokens].astype(np.int64).reshape(len(tokens), d // 32, 32)
        s = self.emb_scale[tokens][:, :, None]
        return fx.rshift_round(c * s, fx.SCALE_FRAC - fx.ACT_FRAC).reshape(len(tokens), d)

    def matmul(self, x: I64, mat: str) -> I64:
        w = self.mats[mat]
        return qmatmul(x, w, mat)

    def rmsnorm(self, x: I64, gain: str) -> I64:
        return rmsnorm(x, self.gains[gain], self.config.norm_eps_q32)

    def rope(self, x: I64, pos: I64) -> I64:
        return rope(x, self.rope_cos[pos], self.rope_sin[pos])

    def attention(self, q: I64, k: I64, v: I64, qpos: I64) -> I64:
        return attention(q, k, v, qpos, self.config.attn_scale_q30)

    def swiglu(self, g: I64, u: I64) -> I64:
        return swiglu(g, u)


# ------------------------------------------------------------------------------ the ops


def qmatmul(x: I64, w: QMatrix, what: str = "matmul") -> I64:
    """[T, K] Q.16 x quantized [O, K] -> [T, O] Q.16 (exact sums, one rounding)."""
    t, k = x.shape
    nb = k // 32
    o = w.out_features
    check_matmul_input(x, w.wq, what)
    xb = x.reshape(t, nb, 32)
    s = xb.sum(axis=2)  # [T, nb] int64
    pieces = split_pieces(x, w.piece_bits, w.n_pieces)
    xf = np.concatenate([pc.reshape(t, nb, 32).transpose(1, 2, 0) for pc in pieces], axis=2)
    xf = np.ascontiguousarray(xf, dtype=np.float32)  # [nb, 32, n_pieces * T], exact
    out = np.empty((o, t), dtype=np.int64)
    step = max(1, _CHUNK_ELEMS // max(1, nb * t * w.n_pieces))
    for o0 in range(0, o, step):
        o1 = min(o, o0 + step)
        pf = np.matmul(w.codes[:, o0:o1], xf).astype(np.int64)  # [nb, Oc, n*T] exact
        p = pf[:, :, 0:t]
        for j in range(1, w.n_pieces):
            p = p + (pf[:, :, j * t:(j + 1) * t] << np.int64(w.piece_bits * j))
        acc = np.einsum("bot,bo->ot", p, w.scale[:, o0:o1])
        if w.offset is not None:
            acc += w.offset[:, o0:o1].T @ s.T
        out[o0:o1] = acc
    return fx.rshift_round(np.ascontiguousarray(out.T), fx.SCALE_FRAC)


def rmsnorm(x: I64, gain: I64, eps_q32: int) -> I64:
    """y = x / sqrt(mean(x^2) + eps) * g, all integer (see docs/integer-engine.md)."""
    d = x.shape[-1]
    ax = np.abs(x).max(axis=-1)  # [T]
    s = np.maximum(fx.bit_length(ax) - 26, 0)  # per-row shift so that |u| <= 2**26
    u = fx.rshift_round_var(x, s[:, None])
    ss = (u * u).sum(axis=-1)  # <= d * 2**52 < 2**63 for d < 2048
    ms = ss // np.int64(d)  # mean square, scale 2**(2s - 32)
    eps_s = fx.rshift_round_var(np.full_like(ms, eps_q32), 2 * s)
    v = ms + eps_s
    c2 = ((62 - fx.bit_length(v)) >> 1) << 1  # even shift: v << c2 in [2**60, 2**62)
    r = fx.isqrt(v << c2)  # rms * 2**(16 - s + c2/2), in [2**30, 2**31)
    inv = fx.div_round(np.full_like(r, 1 << 62), r)  # (2**31, 2**32]
    e = 38 - (c2 >> 1)  # Q.24 normalised value: u * inv * 2**(24 + c2/2 - 62)
    nrm = fx.rshift_round_var(u * inv[:, None], e[:, None])
    return fx.rshift_round(nrm * gain, fx.NORM_FRAC + fx.GAIN_FRAC - fx.ACT_FRAC)


def rope(x: I64, cos: I64, sin: I64) -> I64:
    """Interleaved pairs (2i, 2i+1) rotated by Q.30 tables; x [n, heads, hd], cos/sin [n, hd/2]."""
    check_bound("rope input", int(np.abs(x).max()) if x.size else 0, ROPE_X_LIMIT)
    x0 = x[..., 0::2]
    x1 = x[..., 1::2]
    c = cos[:, None, :]
    s = sin[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = fx.rshift_round(x0 * c - x1 * s, 30)
    out[..., 1::2] = fx.rshift_round(x0 * s + x1 * c, 30)
    return out


def attention(q: I64, k: I64, v: I64, qpos: I64, scale_q30: int) -> I64:
    """Causal GQA attention of new rows q [n, H, hd] over cache rows k, v [m, KV, hd].

    A row at position p sees cache rows 0..p. Scores are exact (Q.32); softmax in base 2 with
    the integer exp2; probabilities Q.30 (round half up); output Q.16.
    """
    n, h, hd = q.shape
    m, kvh, _ = k.shape
    g = h // kvh
    check_bound("attention q", int(np.abs(q).max()), QK_LIMIT)
    check_bound("attention k", int(np.abs(k).max()), QK_LIMIT)
    check_bound("attention v", int(np.abs(v).max()), V_LIMIT)
    qg = q.reshape(n, kvh, g, hd).transpose(1, 2, 0, 3)  # [KV, g, n, hd]
    kt = k.transpose(1, 2, 0)[:, None]  # [KV, 1, hd, m]
    raw = np.matmul(qg, kt)  # [KV, g, n, m] Q.32, exact int64
    allowed = np.arange(m, dtype=np.int64)[None, :] <= qpos[:, None]  # [n, m]
    mx = np.where(allowed, raw, np.int64(-(1 << 62))).max(axis=-1, keepdims=True)
    z = fx.rshift_round(np.where(allowed, raw - mx, 0), 16)
    z = np.maximum(z, np.int64(fx.EXP2_ARG_MIN))  # Q.16 of (raw - max) * 2**-32
    t = fx.rshift_round(z * np.int64(scale_q30), 30)  # log2-domain score, Q.16, <= 0
    pw = np.where(allowed, fx.exp2_neg_q30(t), 0)  # Q.30, the max row entry is exactly 2**30
    tot = pw.sum(axis=-1, keepdims=True)
    prob = fx.div_round(pw << np.int64(30), tot)  # Q.30
    vt = v.transpose(1, 0, 2)[:, None]  # [KV, 1, m, hd]
    out = fx.rshift_round(np.matmul(prob, vt), 30)  # [KV, g, n, hd]
    return np.ascontiguousarray(out.transpose(2, 0, 1, 3)).reshape(n, h * hd)


def swiglu(g: I64, u: I64) -> I64:
    """silu(g) * u in Q.16."""
    check_bound("ffn gate", int(np.abs(g).max()), SWIGLU_LIMIT)
    check_bound("ffn up", int(np.abs(u).max()), SWIGLU_LIMIT)
    return fx.rshift_round(fx.silu_q16(g) * u, 16)
