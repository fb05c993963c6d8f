"""Fixed-point primitives of the integer engine (numpy, int64 only, no floats, no libm).

Every function here has a line-for-line twin in ``kernels/common.cuh``; both must stay equal.

Formats (``Q.f`` means "integer holding value * 2**f"):

* activations, residual stream, q/k/v, logits: ``Q.16`` in int64 (the residual's
  ~22,000 attention-sink value is ~2**30.4, so it also fits a signed 32-bit Q15.16);
* probabilities, exp2 results, sigmoid, RoPE cos/sin: ``Q.30``;
* RMSNorm gains: ``Q.24``; quantized-weight scales/offsets: exact ``Q.24`` (f16 is dyadic).

The one rounding rule: **round half up** (towards +infinity), i.e. ``floor(v + 1/2)``.
``rshift_round(x, s) = (x + 2**(s-1)) >> s`` with an arithmetic (flooring) shift and
``div_round(a, b) = (a + b // 2) // b`` for ``a >= 0, b > 0``; both equal ``floor(a/b + 1/2)``.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]

ACT_FRAC: Final = 16  # activations Q.16
PROB_FRAC: Final = 30  # probabilities / exp2 / sigmoid / RoPE Q.30
GAIN_FRAC: Final = 24  # RMSNorm gains Q.24
SCALE_FRAC: Final = 24  # Q4_1 / Q8_0 scales and offsets (exact for every finite f16 >= 2**-24)
NORM_FRAC: Final = 24  # normalised (x / rms) value inside RMSNorm

ONE_Q30: Final = 1 << 30
# round(log2(e) * 2**30)
LOG2E_Q30: Final = 1549082005
# Clamp of exp2 arguments: below -2**26 in Q.16 (i.e. -1024) the result is 0 anyway.
EXP2_ARG_MIN: Final = -(1 << 26)

# 2**f for f in [0, 1): degree-7 polynomial in Q.30, Horner with a Q.16 argument.
# Fitted once (weighted least squares on Chebyshev nodes) and frozen here as integers;
# measured exhaustively over all 65,536 arguments: max |error| 2.2e-9 (2.4 units of 2**-30).
EXP2_POLY_Q30: Final = (
    1073741824,
    744261124,
    257941118,
    59598166,
    10323001,
    1441201,
    154140,
    23074,
)


def rshift_round(x: I64, s: int) -> I64:
    """floor(x / 2**s + 1/2) for int64 arrays; ``s >= 0``."""
    if s == 0:
        return x
    return (x + np.int64(1 << (s - 1))) >> np.int64(s)


def rshift_round_var(x: I64, s: I64) -> I64:
    """Like :func:`rshift_round` with a per-element shift ``0 <= s <= 62`` (callers clamp)."""
    s = np.asarray(s, dtype=np.int64)
    half = np.where(s > 0, np.left_shift(np.int64(1), np.maximum(s - 1, 0)), 0)
    return np.right_shift(x + half, s)


def div_round(a: I64, b: I64) -> I64:
    """floor(a / b + 1/2) for ``a >= 0``, ``b > 0`` (callers guarantee the signs)."""
    return (a + (b >> np.int64(1))) // b


def isqrt(n: I64) -> I64:
    """Exact floor(sqrt(n)) for int64 ``0 <= n < 2**62`` (digit-by-digit, 31 steps)."""
    n = np.array(n, dtype=np.int64, copy=True)
    res = np.zeros_like(n)
    bit = np.int64(1 << 60)
    for _ in range(31):
        t = res + bit
        ge = n >= t
        n = np.where(ge, n - t, n)
        res = np.where(ge, (res >> np.int64(1)) + bit, res >> np.int64(1))
        bit = bit >> np.int64(2)
    return res


def bit_length(n: I64) -> I64:
    """Number of bits of ``0 <= n < 2**63`` (0 for 0), int64, binary search without floats."""
    v = np.array(n, dtype=np.int64, copy=True)
    out = np.zeros(v.shape, dtype=np.int64)
    for sh in (32, 16, 8, 4, 2, 1):
        big = v >= np.int64(1 << sh)
        out += np.where(big, sh, 0)
        v = np.where(big, v >> np.int64(sh), v)
    return out + (v > 0)


def exp2_frac_q30(fr: I64) -> I64:
    """2**(fr / 2**16) in Q.30 for ``0 <= fr < 2**16``; result in [2**30, 2**31)."""
    acc = np.full(np.shape(fr), EXP2_POLY_Q30[-1], dtype=np.int64)
    for c in EXP2_POLY_Q30[-2::-1]:
        acc = rshift_round(acc * fr, 16) + np.int64(c)
    return acc


def exp2_neg_q30(t: I64) -> I64:
    """2**(t / 2**16) in Q.30 for ``t <= 0`` (Q.16); result in [0, 2**30]."""
    t = np.maximum(np.asarray(t, dtype=np.int64), np.int64(EXP2_ARG_MIN))
    i = t >> np.int64(16)  # floor, <= 0
    fr = t - (i << np.int64(16))  # [0, 2**16)
    p = exp2_frac_q30(fr)  # < 2**31, so any shift >= 32 gives 0: clamp the shift to 40
    return rshift_round_var(p, np.minimum(-i, np.int64(40)))


def sigmoid_q30(x: I64) -> I64:
    """sigmoid(x) in Q.30 for x in Q.16 (|x| < 2**40)."""
    a = np.minimum(np.abs(x), np.int64(1 << 26))
    t = -rshift_round(a * np.int64(LOG2E_Q30), 30)
    e = exp2_neg_q30(t)  # 2**(-|x| log2 e) = e**-|x|, Q.30
    den = np.int64(ONE_Q30) + e
    pos = div_round(np.full_like(den, 1 << 60), den)
    neg = div_round(e << np.int64(30), den)
    return np.where(x >= 0, pos, neg)


def silu_q16(x: I64) -> I64:
    """x * sigmoid(x), Q.16 in and out."""
    return rshift_round(x * sigmoid_q30(x), 30)


def f16_bits_to_q24(bits: npt.NDArray[np.uint16]) -> I64:
    """Exact value * 2**24 of IEEE half floats given as raw bits (integer decoding only).

    Normal: (1024 + frac) * 2**(e - 25) -> (1024 + frac) << (e - 1); subnormal: frac.
    Inf/NaN are rejected.
    """
    b = np.asarray(bits, dtype=np.int64)
    sign = (b >> 15) & 1
    e = (b >> 10) & 0x1F
    frac = b & 0x3FF
    if np.any(e == 0x1F):
        raise ValueError("f16 inf/nan in quantization scales")
    mag = np.where(e == 0, frac, (frac + 1024) << np.maximum(e - 1, 0))
    return np.where(sign == 1, -mag, mag).astype(np.int64)


# gelu_tanh(x) = x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x**3)), the constants in Q.30:
# round(2 * sqrt(2 / pi) * 2**30), round(0.044715 * 2**30).
GELU_2C_Q30: Final = 1713444047
GELU_A_Q30: Final = 48012366
# |x| >= 16 (Q.16: 2**20) saturates the sigmoid to exactly 0 or 2**30 in Q.30 (argument beyond
# +-318), so the cube is taken of x clamped there: same result, no overflow.
GELU_CLAMP: Final = 1 << 20


def gelu_tanh_q16(x: I64) -> I64:
    """GELU with the tanh approximation, Q.16 in and out (|x| < 2**31)."""
    c = np.clip(x, -GELU_CLAMP, GELU_CLAMP)
    c2 = rshift_round(c * c, 16)  # <= 2**24
    c3 = rshift_round(c2 * c, 16)  # <= 2**28
    inner = c + rshift_round(c3 * np.int64(GELU_A_Q30), 30)
    arg = rshift_round(inner * np.int64(GELU_2C_Q30), 30)
    return rshift_round(x * sigmoid_q30(arg), 30)


def mul_rshift_round32(n: I64, g: I64) -> I64:
    """``rshift_round(n * g, 32)`` for |n| < 2**31 and |g| < 2**40 without forming ``n * g``
    (which may pass 2**63): with g = gh * 2**16 + gl, 0 <= gl < 2**16, the exact result is
    ``(n * gh + ((n * gl) >> 16) + 2**15) >> 16`` (floor shifts). RMSNorm's gain product
    (NORM_FRAC + GAIN_FRAC - ACT_FRAC = 32): Gemma 3's post-norm gains reach 1,657 (2**34.7
    in Q.24), where the plain product would overflow."""
    gh = g >> np.int64(16)
    gl = g & np.int64(0xFFFF)
    out: I64 = (n * gh + ((n * gl) >> np.int64(16)) + np.int64(1 << 15)) >> np.int64(16)
    return out
