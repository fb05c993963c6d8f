"""The lease holder's estimate of the broker's clock: the latest broker append time it has seen
(a record read from ``.resp``, a transaction's metadata), advanced by the local monotonic clock
since. Deadlines are judged against broker time; this only says when to look again.
"""

from __future__ import annotations

import time

__all__ = ["BrokerClock"]


class BrokerClock:
    """The latest broker time seen and the local monotonic time it was seen at."""

    def __init__(self) -> None:
        self._seen: tuple[int, float] | None = None  # (broker ms, local monotonic s)

    def observe(self, broker_ms: int) -> None:
        """A broker append time (ms) seen now; an older one (or -1, none) changes nothing."""
        if broker_ms >= 0 and (self._seen is None or broker_ms >= self._seen[0]):
            self._seen = (broker_ms, time.monotonic())

    def now_ms(self) -> float:
        """The broker's time now, estimated (the local wall clock before anything was seen)."""
        if self._seen is None:
            return time.time() * 1000
        return self._seen[0] + (time.monotonic() - self._seen[1]) * 1000
