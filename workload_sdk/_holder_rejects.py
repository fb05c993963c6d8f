"""The lease holder's foreign ticks: a tick on ``.resp`` that its epoch's holder did not write
(:func:`~workload_sdk._core.tick_problem`, against the epochs' holders on ``.claims``) is never
taken as the clock; it is logged, counted (``HolderStats.foreign_ticks``, the
``foreign_tick`` skip metric) and recorded on ``sys.rejects``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from broker_schema import RejectedRecord, TickRecord, encode, sha256_hex, topics
from fx_kafka.workload import ensure_rejects_topic
from workload_sdk._core import tick_problem
from workload_sdk._holder_config import HOLDER_LOG as log
from workload_sdk._holder_config import HolderConfig, HolderStats

if TYPE_CHECKING:  # the metrics are the process's (cli), never needed to run the fold
    from workload_sdk._holder_metrics import HolderMetrics

__all__ = ["TickRejects"]


class TickRejects:
    """Judges the ticks a holder reads and queues the foreign ones for ``sys.rejects``."""

    def __init__(self, config: HolderConfig, stats: HolderStats,
                 metrics: HolderMetrics | None) -> None:
        self.config = config
        self.stats = stats
        self.metrics = metrics
        #: epoch -> its holder id, from ``.claims`` (whose ticks are the holder's own)
        self.epoch_holders: dict[int, str] = {}
        self._queued: list[RejectedRecord] = []
        self._topic_made = False

    def rejected(self, msg: Any, tick: TickRecord) -> bool:
        """True (logged, counted, queued) when ``tick``, read as ``msg``, is not its epoch's
        holder's."""
        problem = tick_problem(tick, self.epoch_holders)
        if problem is None:
            return False
        wid = self.config.workload_id
        log.warning("rejected tick at %s@%d: %s", msg.topic, msg.offset, problem)
        self.stats.foreign_ticks += 1
        if self.metrics is not None:
            self.metrics.skipped(wid, "foreign_tick")
        value = msg.value or b""
        self._queued.append(RejectedRecord(
            topic=msg.topic, partition=msg.partition, offset=msg.offset, code="foreign_tick",
            detail=problem[:4096], size=len(value), value_hash=sha256_hex(value),
            seen_by=self.config.holder_id))
        return True

    async def flush(self, write: Callable[[list[tuple[str, bytes]]], Awaitable[Any]]) -> None:
        """Write what is queued to ``sys.rejects`` with ``write`` (the holder's transaction)."""
        if not self._queued:
            return
        rejects, self._queued = self._queued, []
        if not self._topic_made:
            await ensure_rejects_topic(self.config.bootstrap)
            self._topic_made = True
        await write([(topics.REJECTS, encode(r)) for r in rejects])
