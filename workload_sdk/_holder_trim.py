"""The lease holder's periodic trim (``HolderConfig.trim_every_s``): every so often it trims the
workload's log by the spec's audit horizon with the same
:func:`~workload_sdk._trim_io.trim_workload` that ``fx trim`` runs. A failed trim is logged and
tried again next time; it never stops the holder.
"""

from __future__ import annotations

import asyncio

from aiokafka.errors import KafkaError

from workload_sdk._holder_config import HOLDER_LOG as log
from workload_sdk._holder_config import HolderStats
from workload_sdk._trim_io import trim_workload

__all__ = ["PeriodicTrim"]


class PeriodicTrim:
    """Trims one workload's log every ``every_s`` seconds, counting into ``stats``."""

    def __init__(self, bootstrap: str, workload_id: str, every_s: float,
                 stats: HolderStats) -> None:
        self.bootstrap = bootstrap
        self.workload_id = workload_id
        self.every_s = every_s
        self.stats = stats

    async def run(self, stop: asyncio.Event) -> None:
        """Every ``every_s`` seconds until ``stop``: trim the log (a failure is logged and
        retried next time; it never stops the holder)."""
        wid, every_s = self.workload_id, self.every_s
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=every_s)
                return
            except TimeoutError:
                pass
            try:
                plan = await trim_workload(self.bootstrap, wid)
            except (KafkaError, OSError, TimeoutError) as exc:
                self.stats.trims_failed += 1
                log.warning("trim of %s failed (retried in %.0f s): %r", wid, every_s, exc)
                continue
            self.stats.trims += 1
            if not plan.changes:
                log.debug("trim of %s: nothing to delete (%s)", wid, plan.note or "at the floor")
