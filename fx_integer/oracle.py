"""The numpy integer oracle: the canonical verifier of the integer engine.

The forward pass (:func:`forward`) is written once over an ``Ops`` object; :class:`OracleOps`
implements every operation in int64 fixed point (see ``fixed_point``), the kernel backends implement
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
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from . import fixed_point as fx
from .artifact import Artifact, QWeight
from .forward import KVCache, Ops, build_matrices, forward

__all__ = ["FixedPointOverflow", "KVCache", "Ops", "OracleOps", "forward", "qmatmul"]

I64 = npt.NDArray[np.int64]
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
    """A quantized matrix prepared for the oracle: block-major codes plus Q.24 scales."""

    codes: npt.NDArray[Any]  # [nb, O, group]: float32 (exact small integers), or int8 for
    #                          matrices over _F32_CODES_LIMIT elements, converted per chunk
    scale: I64  # [nb, O] D in Q.24
    offset: I64 | None  # [nb, O] M in Q.24 (None: no offset)
    wq: I64  # [nb] (W[b] >> 10) + 1, for the exactness check
    out_features: int
    in_features: int
    group: int
    piece_bits: int  # input split for exact float32 block dots
    n_pieces: int


# Matrices with more codes than this keep them as int8 (a 262k-token output head would take
# 670 MB as float32); each matmul chunk converts its slice, which gives the same bytes.
_F32_CODES_LIMIT: Final = 1 << 25


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


def piece_split(qmax: int, group: int = 32) -> tuple[int, int]:
    """(bits, pieces) of the float32 input split for codes of magnitude ``qmax`` in blocks of
    ``group``: every partial block dot ``group * qmax * 2**(bits-1)`` stays <= 2**24, so
    float32 sums it exactly, and ``bits * pieces`` covers the 2**41 input limit. Format 1's
    two matrices keep their original splits (Q4_1: 16 bits x 2, Q8_0: 12 x 3), which also set
    the largest input they accept."""
    if group == 32 and qmax <= 15:
        return 16, 2
    if group == 32 and qmax == 128:
        return 12, 3
    bits = min(16, ((1 << 24) // (group * qmax)).bit_length())
    return bits, -(-43 // bits)


def qmatrix(w: QWeight) -> QMatrix:
    """The oracle's layout of one (fused) matrix."""
    o, k = w.shape
    g = w.group
    nb = k // g
    c = np.ascontiguousarray(w.codes.reshape(o, nb, g).transpose(1, 0, 2))
    if c.size <= _F32_CODES_LIMIT:
        c = c.astype(np.float32)
    d = np.ascontiguousarray(w.scale.astype(np.int64).T)
    m = None if w.offset is None else np.ascontiguousarray(w.offset.astype(np.int64).T)
    wq = exactness_weights(d, m, w.qmax)
    bits, pieces = piece_split(w.qmax, g)
    return QMatrix(codes=c, scale=d, offset=m, wq=wq, out_features=o, in_features=k, group=g,
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


def check_matmul_input(x: I64, wq: I64, what: str, group: int = 32) -> None:
    """The integer exactness check of a quantized matmul input (see the module docstring)."""
    if x.size == 0:
        return
    ax = np.abs(x)
    check_bound(what, int(ax.max()), _BLAS_X_LIMIT)
    a = ax.reshape(x.shape[0], -1, group).sum(axis=2)  # [T, nb] <= group * 2**41
    bound = ((a >> 20) + 1) @ wq  # each term < 2**55, sum < 2**63
    check_bound(f"{what} (accumulation bound)", int(bound.max()), _ACC_CHECK_LIMIT)


class OracleOps:
    """int64 fixed-point operations in numpy: the canonical definition of the engine."""

    xp = np

    def __init__(self, art: Artifact) -> None:
        self._load_common(art)
        self.mats: dict[str, QMatrix]
        self.mats, self.plan = build_matrices(art, qmatrix)

    def _load_common(self, art: Artifact) -> None:
        """What every int64 backend on the CPU keeps as the oracle does: the config, the
        embedding (quantized, rows decoded on use), the norm gains and the RoPE tables (the
        matrices are each backend's own layout: :func:`~fx_integer.forward.build_matrices`)."""
        self.config = art.config
        self.model_hash = art.model_hash
        self.art = art
        self.emb = art.weight("tok_embd")
        self.gains = {k: v.astype(np.int64) for k, v in art.tensors.items()
                      if k.endswith("norm")}
        self.rope_tables = {"": (art.tensors["rope.cos"].astype(np.int64),
                                 art.tensors["rope.sin"].astype(np.int64))}
        if "rope_swa.cos" in art.tensors:
            self.rope_tables["swa"] = (art.tensors["rope_swa.cos"].astype(np.int64),
                                       art.tensors["rope_swa.sin"].astype(np.int64))
        self.rope_cos, self.rope_sin = self.rope_tables[""]

    # -- ops --------------------------------------------------------------------------
    def zeros(self, shape: tuple[int, ...]) -> I64:
        return np.zeros(shape, dtype=np.int64)

    def add(self, a: I64, b: I64) -> I64:
        out = a + b
        check_bound("residual", int(np.abs(out).max()), RESID_LIMIT)
        return out

    def embed(self, tokens: I64) -> I64:
        return embed_rows(self.emb, tokens)

    def matmul(self, x: I64, mat: str) -> I64:
        w = self.mats[mat]
        return qmatmul(x, w, mat)

    def rmsnorm(self, x: I64, gain: str) -> I64:
        return rmsnorm(x, self.gains[gain], self.config.norm_eps_q32)

    def layernorm(self, x: I64, gain: str) -> I64:
        return rmsnorm(center(x), self.gains[gain], self.config.norm_eps_q32)

    def rope(self, x: I64, pos: I64, table: str = "") -> I64:
        cos, sin = self.rope_tables[table]
        return rope(x, cos[pos], sin[pos], self.config.rope_layout)

    def attention(self, q: I64, k: I64, v: I64, qpos: I64, window: int = 0) -> I64:
        return attention(q, k, v, qpos, self.config.attn_scale_q30, window)

    def swiglu(self, g: I64, u: I64) -> I64:
        return swiglu(g, u)

    def geglu(self, g: I64, u: I64) -> I64:
        return geglu(g, u)

    def scale(self, x: I64, factor_q24: int) -> I64:
        return scale_q24(x, factor_q24)

    def route(self, logits: I64, k: int, gating: str, normalise: bool) -> tuple[I64, I64]:
        return route(logits, k, gating, normalise)

    def combine(self, n: int, d: int, experts: I64, weights: I64,
                ys: Sequence[tuple[int, I64, I64]]) -> I64:
        return combine(n, d, experts, weights, ys)


# ------------------------------------------------------------------------------ the ops


def embed_rows(w: QWeight, tokens: I64) -> I64:
    """Quantized rows -> Q.16: round_half_up(q * D + M, 8); only the rows asked for are
    decoded (the embedding stays quantized in memory)."""
    n, (_, k) = len(tokens), w.shape
    g = w.group
    c = w.codes[tokens].astype(np.int64).reshape(n, k // g, g)
    v = c * w.scale[tokens].astype(np.int64)[:, :, None]
    if w.offset is not None:
        v = v + w.offset[tokens].astype(np.int64)[:, :, None]
    return fx.rshift_round(v, fx.SCALE_FRAC - fx.ACT_FRAC).reshape(n, k)


def qmatmul(x: I64, w: QMatrix, what: str = "matmul") -> I64:
    """[T, K] Q.16 x quantized [O, K] -> [T, O] Q.16 (exact sums, one rounding)."""
    t, k = x.shape
    g = w.group
    nb = k // g
    o = w.out_features
    check_matmul_input(x, w.wq, what, g)
    xb = x.reshape(t, nb, g)
    s = xb.sum(axis=2)  # [T, nb] int64
    pieces = split_pieces(x, w.piece_bits, w.n_pieces)
    xf = np.concatenate([pc.reshape(t, nb, g).transpose(1, 2, 0) for pc in pieces], axis=2)
    xf = np.ascontiguousarray(xf, dtype=np.float32)  # [nb, g, n_pieces * T], exact
    out = np.empty((o, t), dtype=np.int64)
    step = max(1, _CHUNK_ELEMS // max(1, nb * t * w.n_pieces))
    if w.codes.dtype != np.float32:
        step = max(1, min(step, _CHUNK_ELEMS // (nb * g)))
    for o0 in range(0, o, step):
        o1 = min(o, o0 + step)
        cw = w.codes[:, o0:o1]
        if cw.dtype != np.float32:
            cw = cw.astype(np.float32)
        pf = np.matmul(cw, xf).astype(np.int64)  # [nb, Oc, n*T] exact
        p = pf[:, :, 0:t]
        for j in range(1, w.n_pieces):
            p = p + (pf[:, :, j * t:(j + 1) * t] << np.int64(w.piece_bits * j))
        acc = np.einsum("bot,bo->ot", p, w.scale[:, o0:o1])
        if w.offset is not None:
            acc += w.offset[:, o0:o1].T @ s.T
        out[o0:o1] = acc
    return fx.rshift_round(np.ascontiguousarray(out.T), fx.SCALE_FRAC)


def center(x: I64) -> I64:
    """x minus its row mean rounded half up (LayerNorm's centring, exact integers)."""
    d = x.shape[-1]
    tot = x.sum(axis=-1, keepdims=True)  # |sum| <= d * 2**41 < 2**52
    mean: I64 = (2 * tot + d) // (2 * d)  # floor(tot / d + 1/2)
    out: I64 = x - mean
    return out


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
    return fx.mul_rshift_round32(nrm, gain)


def rope(x: I64, cos: I64, sin: I64, layout: str = "interleaved") -> I64:
    """Pairs rotated by Q.30 tables; x [n, heads, hd], cos/sin [n, hd/2]. ``interleaved``:
    pairs (2i, 2i+1) (llama's GGUF layout); ``neox``: pairs (i, i + hd/2)."""
    check_bound("rope input", int(np.abs(x).max()) if x.size else 0, ROPE_X_LIMIT)
    half = x.shape[-1] // 2
    i0, i1 = ((slice(0, None, 2), slice(1, None, 2)) if layout == "interleaved"
              else (slice(0, half), slice(half, None)))
    x0 = x[..., i0]
    x1 = x[..., i1]
    c = cos[:, None, :]
    s = sin[:, None, :]
    out = np.empty_like(x)
    out[..., i0] = fx.rshift_round(x0 * c - x1 * s, 30)
    out[..., i1] = fx.rshift_round(x0 * s + x1 * c, 30)
    return out


def qk_limit(head_dim: int) -> int:
    """Largest |q|, |k| (Q.16) for which a score's exact sum stays below 2**62: head_dim terms
    of q_d * k_d < 2**(62 - ceil(log2 head_dim)). head_dim 64: QK_LIMIT (2**28 - 1)."""
    return (1 << ((62 - (head_dim - 1).bit_length()) // 2)) - 1


def attention(q: I64, k: I64, v: I64, qpos: I64, scale_q30: int, window: int = 0) -> I64:
    """Causal GQA attention of new rows q [n, H, hd] over cache rows k, v [m, KV, hd].

    A row at position p sees cache rows 0..p, and with a sliding ``window`` only the rows j
    with p - window < j <= p. Scores are exact (Q.32); softmax in base 2 with the integer
    exp2; probabilities Q.30 (round half up); output Q.16.
    """
    n, h, hd = q.shape
    m, kvh, _ = k.shape
    g = h // kvh
    lim = qk_limit(hd)
    check_bound("attention q", int(np.abs(q).max()), lim)
    check_bound("attention k", int(np.abs(k).max()), lim)
    check_bound("attention v", int(np.abs(v).max()), V_LIMIT)
    qg = q.reshape(n, kvh, g, hd).transpose(1, 2, 0, 3)  # [KV, g, n, hd]
    kt = k.transpose(1, 2, 0)[:, None]  # [KV, 1, hd, m]
    raw = np.matmul(qg, kt)  # [KV, g, n, m] Q.32, exact int64
    j = np.arange(m, dtype=np.int64)[None, :]
    allowed = j <= qpos[:, None]  # [n, m]
    if window:
        allowed &= j > qpos[:, None] - window
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


def geglu(g: I64, u: I64) -> I64:
    """gelu_tanh(g) * u in Q.16 (:func:`~fx_integer.fixed_point.gelu_tanh_q16`)."""
    check_bound("ffn gate", int(np.abs(g).max()), SWIGLU_LIMIT)
    check_bound("ffn up", int(np.abs(u).max()), SWIGLU_LIMIT)
    return fx.rshift_round(fx.gelu_tanh_q16(g) * u, 16)


def scale_q24(x: I64, factor_q24: int) -> I64:
    """round_half_up(x * factor / 2**24): the embedding scale, the logit scale."""
    check_bound("scaled value", int(np.abs(x).max()) if x.size else 0,
                (1 << 62) // max(1, abs(factor_q24)))
    return fx.rshift_round(x * np.int64(factor_q24), 24)


def route(logits: I64, k: int, gating: str, normalise: bool) -> tuple[I64, I64]:
    """The router: ``softmax`` over every expert (Q.30, the integer exp2) or ``sigmoid`` of
    each expert's logit (Q.30), the k most probable (ties: the lower expert index first),
    their weights renormalised to sum to 2**30 when ``normalise``. Returns
    (experts [n, k], weights [n, k] Q.30)."""
    if gating == "sigmoid":
        prob = fx.sigmoid_q30(logits)
    else:
        mx = logits.max(axis=1, keepdims=True)
        z = np.maximum(logits - mx, np.int64(fx.EXP2_ARG_MIN))  # Q.16, <= 0, clamped
        t = fx.rshift_round(z * np.int64(fx.LOG2E_Q30), 30)  # log2 domain, Q.16
        pw = fx.exp2_neg_q30(t)
        prob = fx.div_round(pw << np.int64(30), pw.sum(axis=1, keepdims=True))  # Q.30
    order = np.argsort(-prob, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(prob, order, axis=1)
    if normalise:
        w = fx.div_round(w << np.int64(30), w.sum(axis=1, keepdims=True))
    return order.astype(np.int64), w.astype(np.int64)


def combine(n: int, d: int, experts: I64, weights: I64,
            ys: Sequence[tuple[int, I64, I64]]) -> I64:
    """sum_k weight_k * y_k over each row's experts, one rounding from Q.46 to Q.16.

    ``ys``: (expert, the rows that chose it, their outputs). With W the largest sum of a row's
    weights (2**30 + k normalised, up to k * 2**30 for sigmoid weights), |y| <= 2**62 / W
    keeps the exact sum below 2**62 in any order."""
    acc = np.zeros((n, d), dtype=np.int64)
    limit = (1 << 62) // max(1, int(weights.sum(axis=1).max()) if weights.size else 1)
    for e, rows, y in ys:
        check_bound("expert output", int(np.abs(y).max()), limit)
        w = (weights[rows] * (experts[rows] == e)).sum(axis=1)  # the row's weight for e
        acc[rows] += w[:, None] * y
    return fx.rshift_round(acc, 30)
