from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from fx_integer import fixed_point as fx
from fx_integer.artifact import f32_to_fixed


def _ref_round(num: int, den: int) -> int:
    """floor(num/den + 1/2), the engine's one rounding rule."""
    return math.floor(Fraction(num, den) + Fraction(1, 2))


def test_rshift_round_is_round_half_up() -> None:
    xs = np.array([-5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, -(2**40) - 1, 2**40 + 3],
                  dtype=np.int64)
    for s in (1, 2, 3, 16):
        got = fx.rshift_round(xs, s)
        assert got.tolist() == [_ref_round(int(x), 1 << s) for x in xs]
    assert fx.rshift_round(np.array([-1, 1], dtype=np.int64), 1).tolist() == [0, 1]


def test_div_round_matches_rule() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**40, 2000)
    b = rng.integers(1, 2**20, 2000)
    got = fx.div_round(a, b)
    assert got.tolist() == [_ref_round(int(x), int(y)) for x, y in zip(a, b, strict=True)]


def test_isqrt_exact() -> None:
    rng = np.random.default_rng(1)
    n = np.concatenate([np.arange(0, 5000), rng.integers(0, 2**62, 5000),
                        np.array([2**62 - 1, 2**60, 2**60 - 1])]).astype(np.int64)
    assert fx.isqrt(n).tolist() == [math.isqrt(int(v)) for v in n]


def test_bit_length() -> None:
    n = np.array([0, 1, 2, 3, 255, 256, 2**40, 2**62, 2**63 - 1], dtype=np.int64)
    assert fx.bit_length(n).tolist() == [int(v).bit_length() for v in n]


def test_exp2_polynomial_error_exhaustive() -> None:
    fr = np.arange(1 << 16, dtype=np.int64)
    got = fx.exp2_frac_q30(fr)
    exact = np.exp2(fr / 65536.0) * 2.0**30  # measurement only
    err = np.abs(got - exact).max()
    assert err < 3.0  # units of 2**-30; measured 2.4
    assert got[0] == 1 << 30 and got.max() < 1 << 31


def test_exp2_neg_range_and_monotone() -> None:
    t = np.arange(-(40 << 16), 1, 997, dtype=np.int64)
    e = fx.exp2_neg_q30(t)
    assert e[-1] == (1 << 30) if t[-1] == 0 else True
    assert np.all(np.diff(e) >= 0) and e.min() >= 0
    big = fx.exp2_neg_q30(np.array([-(1 << 40), -(64 << 16), -(33 << 16)], dtype=np.int64))
    assert big.tolist() == [0, 0, 0]


def test_sigmoid_properties() -> None:
    x = np.arange(-(20 << 16), 20 << 16, 4099, dtype=np.int64)
    s = fx.sigmoid_q30(x)
    assert fx.sigmoid_q30(np.array([0], dtype=np.int64))[0] == 1 << 29
    assert np.all(np.diff(s) >= 0)
    assert np.abs(s + fx.sigmoid_q30(-x) - (1 << 30)).max() <= 1
    exact = 1 / (1 + np.exp(-x / 65536.0)) * 2.0**30
    # measured max 1,253 units of 2**-30 (1.2e-6): the exp2 argument is rounded to Q.16
    assert np.abs(s - exact).max() < 1600


def test_f16_decoding_exact() -> None:
    bits = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = ((bits >> 10) & 0x1F) != 0x1F
    vals = fx.f16_bits_to_q24(bits[finite])
    ref = bits[finite].view(np.float16).astype(np.float64) * 2.0**24  # exact in float64
    assert np.array_equal(vals, ref.astype(np.int64))
    with pytest.raises(ValueError):
        fx.f16_bits_to_q24(np.array([0x7C00], dtype=np.uint16))


def test_f32_to_fixed_rounds_half_up() -> None:
    a = np.array([0.5, -0.5, 1.25, -3.34375, 1e-9, 2.0**-25, 3 * 2.0**-25, -(2.0**-25)],
                 dtype=np.float32)
    got = f32_to_fixed(a, 24).tolist()
    ref = [_ref_round(Fraction(float(v)).numerator * (1 << 24), Fraction(float(v)).denominator)
           for v in a]
    assert got == ref


def test_mul_rshift_round32_is_the_plain_product_where_it_fits() -> None:
    """RMSNorm's gain product without forming n * g: equal to rshift_round(n * g, 32) wherever
    that fits int64, and exact (Python integers) up to |n| < 2**31, |g| < 2**40."""
    rng = np.random.Generator(np.random.PCG64(11))
    n = rng.integers(-(1 << 31) + 1, 1 << 31, size=20000, dtype=np.int64)
    g = rng.integers(-(1 << 40) + 1, 1 << 40, size=20000, dtype=np.int64)
    n[:4] = [0, -1, (1 << 31) - 1, -(1 << 31) + 1]
    g[:4] = [(1 << 40) - 1, -(1 << 40) + 1, -(1 << 40) + 1, (1 << 40) - 1]
    got = fx.mul_rshift_round32(n, g)
    want = [(int(a) * int(b) + (1 << 31)) >> 32 for a, b in zip(n, g, strict=True)]
    assert got.tolist() == want
    small = g >> 12  # |g| < 2**28: the plain int64 product fits
    assert np.array_equal(fx.mul_rshift_round32(n, small), fx.rshift_round(n * small, 32))
