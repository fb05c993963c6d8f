from __future__ import annotations

import numpy as np
import pytest

from fx_integer.sampling import SamplingParams, choose, random_u64, splitmix64, to_q16


def test_splitmix_known_values() -> None:
    # reference values of SplitMix64 seeded with 0: first outputs of the standard generator
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4
    assert random_u64(1, 0) != random_u64(1, 1) != random_u64(2, 0)


def test_to_q16_exact() -> None:
    assert to_q16(1, "t") == 65536
    assert to_q16(0.7, "t") == 45875  # 0.7 * 65536 = 45875.2
    assert to_q16("0.5", "t") == 32768
    assert to_q16(2**-17, "t") == 1  # exactly half an ulp rounds up
    with pytest.raises(ValueError):
        to_q16(float("nan"), "t")


def test_greedy_and_topk1() -> None:
    lg = np.array([5, 9, 9, -3], dtype=np.int64) << 16
    assert choose(lg, SamplingParams(), 0) == 1  # ties go to the lowest id
    sp = SamplingParams(temperature_q16=65536, top_k=1, seed=5)
    assert all(choose(lg, sp, s) == 1 for s in range(20))


def test_sampling_distribution_and_determinism() -> None:
    lg = (np.array([0, 1, 2, 3], dtype=np.int64) << 16)
    sp = SamplingParams(temperature_q16=65536, seed=123)
    draws = [choose(lg, sp, s) for s in range(4000)]
    assert draws == [choose(lg, sp, s) for s in range(4000)]
    freq = np.bincount(draws, minlength=4) / 4000
    p = np.exp([0, 1, 2, 3]) / np.exp([0, 1, 2, 3]).sum()
    assert np.abs(freq - p).max() < 0.03
    top_p = SamplingParams(temperature_q16=65536, top_p_q16=to_q16(0.6, "p"), seed=1)
    assert {choose(lg, top_p, s) for s in range(500)} <= {3, 2}
