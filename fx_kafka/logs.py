"""Keeping a broker outage readable in the logs.

While a broker is down, aiokafka logs a connection error on every retry of every client: about
28,000 ERROR lines in a 16 s restart, measured here. :class:`RepeatFilter` lets the first record
of each kind through, then at most one per interval, saying how many like it were held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["RepeatFilter", "quiet_client_logs"]


class RepeatFilter(logging.Filter):
    """Pass the first record per (logger, level, message template) from loggers under
    ``prefix``, then one per ``interval_s``; a passed record after held-back ones ends with
    ``(N more like this in S s)``. Records of other loggers pass untouched."""

    def __init__(self, prefix: str = "aiokafka", interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = 1024) -> None:
        super().__init__()
        self.prefix = prefix
        self.interval_s = interval_s
        self.clock = clock
        self.max_keys = max_keys
        self.held_back = 0
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.name == self.prefix or record.name.startswith(self.prefix + ".")):
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.interval_s:
            self._seen[key] = (last[0], last[1] + 1)
            self.held_back += 1
            return False
        if len(self._seen) >= self.max_keys:
            self._seen.clear()
        if last is not None and last[1]:
            record.msg = f"{record.msg} ({last[1]} more like this in {now - last[0]:.0f} s)"
        self._seen[key] = (now, 0)
        return True


def quiet_client_logs(interval_s: float = 10.0) -> RepeatFilter:
    """Install one :class:`RepeatFilter` for aiokafka on every handler of the root logger (call
    after ``logging.basicConfig``); returns it."""
    flt = RepeatFilter(interval_s=interval_s)
    for handler in logging.getLogger().handlers:
        handler.addFilter(flt)
    return flt
