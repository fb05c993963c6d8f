"""Token choice from Q.16 integer logits: greedy, or seeded sampling in fixed point.

Parameters are parsed once into integers (:class:`SamplingParams`): temperature and top_p
become Q.16 integers via exact decimal rounding (never float arithmetic on the path).
Sampling uses a counter-based PRNG: ``u = splitmix64(seed_key + step)``, a pure function of
the request's seed and the token index, so a replay draws the same numbers.
"""

from __future__ import annotations

import dataclasses
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from . import fixed_point as fx

_M64: Final = (1 << 64) - 1
MAX_TOP_K: Final = 49152
#: Largest temperature in Q.16 (32768.0): keeps every intermediate of :func:`choose` in int64
#: (a larger one would not fit the divisor array; the draw is already uniform long before).
MAX_TEMPERATURE_Q16: Final = (1 << 31) - 1


def splitmix64(x: int) -> int:
    """SplitMix64 finaliser (Steele, Lea, Flood 2014) on a 64-bit counter."""
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def random_u64(seed: int, step: int) -> int:
    """The step-th 64-bit draw of the stream keyed by ``seed``."""
    key = splitmix64(seed & _M64)
    return splitmix64((key + (step & _M64) * 0x9E3779B97F4A7C15) & _M64)


def to_q16(value: Any, what: str) -> int:
    """Parse a JSON number (int, float or decimal string) to Q.16, round half up, exactly."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number")
    try:
        d = Decimal(str(value)) if not isinstance(value, Decimal) else value
    except ArithmeticError as e:
        raise ValueError(f"{what} must be a number, got {value!r}") from e
    if not d.is_finite():
        raise ValueError(f"{what} must be finite")
    return int((d * 65536).to_integral_value(rounding=ROUND_HALF_UP))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    temperature_q16: int = 0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p_q16: int = 65536  # 1.0 = off
    seed: int = 0

    def __post_init__(self) -> None:
        # Checked on construction, so parameters taken from a receipt (re-execution) are held to
        # the same ranges as a request's.
        for name in ("temperature_q16", "top_k", "top_p_q16", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{name} must be an integer")
        if not 0 <= self.temperature_q16 <= MAX_TEMPERATURE_Q16:
            raise ValueError("temperature must be in [0, 32768)")
        if not 0 < self.top_p_q16 <= 65536:
            raise ValueError("top_p must be in (0, 1]")
        if not 0 <= self.top_k <= MAX_TOP_K:
            raise ValueError("top_k must be in [0, 49152]")
        if not 0 <= self.seed < 2**64:
            raise ValueError("seed must be in [0, 2**64)")

    @classmethod
    def parse(cls, params: dict[str, Any]) -> SamplingParams:
        t = to_q16(params.get("temperature", 0), "temperature")
        p = to_q16(params.get("top_p", 1), "top_p")
        k = _whole(params.get("top_k", 0), "top_k", 0, 1 << 31)
        seed = _whole(params.get("seed", 0), "seed", 0, (1 << 64) - 1)
        return cls(temperature_q16=t, top_k=k, top_p_q16=p, seed=seed)

    def canonical(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def _whole(value: Any, name: str, lo: int, hi: int) -> int:
    """``value`` when it is an integer in ``[lo, hi]`` (not a bool, not a float); ValueError
    otherwise (``top_k: true`` or ``3.9`` are refused, never read as 1 or 3)."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], not {value!r}")
    return value


def greedy(logits: npt.NDArray[np.int64]) -> int:
    """argmax; ties go to the lowest token id."""
    return int(np.argmax(logits))


def choose(logits: npt.NDArray[np.int64], sp: SamplingParams, step: int) -> int:
    """Choose the next token from one row of Q.16 logits."""
    if sp.temperature_q16 == 0:
        return greedy(logits)
    lg = np.asarray(logits, dtype=np.int64)
    # Candidates in (logit desc, id asc) order: stable sort on -logit.
    order = np.argsort(-lg, kind="stable")
    if sp.top_k > 0:
        order = order[: sp.top_k]
    diff = np.maximum(lg[order] - lg[order[0]], np.int64(-(1 << 26)))  # Q.16, <= 0
    # (l - lmax) * log2(e) / T in Q.16: diff * LOG2E_Q30 / T_q16 is Q.30, then >> 14.
    num = -(diff * np.int64(fx.LOG2E_Q30))  # >= 0, < 2**57
    t = -fx.rshift_round(fx.div_round(num, np.full_like(num, sp.temperature_q16)), 14)
    w = fx.exp2_neg_q30(t)  # Q.30 weights, the first is exactly 2**30
    cum = np.cumsum(w)  # < 49152 * 2**30 < 2**46
    total = int(cum[-1])
    if sp.top_p_q16 < 65536:
        # smallest prefix whose mass reaches top_p: cum * 2**16 >= p * total (< 2**63)
        keep = int(np.searchsorted(cum * np.int64(65536) >= np.int64(sp.top_p_q16) * total,
                                   True)) + 1
        keep = min(keep, len(cum))
        cum = cum[:keep]
        total = int(cum[-1])
    r = (random_u64(sp.seed, step) * total) >> 64  # uniform integer in [0, total)
    idx = int(np.searchsorted(cum, r, side="right"))
    return int(order[idx])
