"""The lease holder's metrics observation: what its gauges say, taken from the holder's state
and the broker (nothing here is decided on; replay and the simulator never import it).

:class:`MetricsObserver` sets the lease and outstanding-request gauges when the holder asks, and
every ``observe_every_s`` (:meth:`MetricsObserver.run`, one admin client for the holder's run)
asks the broker for the merge lag on ``.resp`` and the committed ``.out`` offsets of the
executor groups, for ``fx_workload_unread_requests`` (the arithmetic is
:mod:`workload_sdk._observe`). Without metrics (``HolderMetrics`` None) it does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from broker_schema import DecodeError, SnapshotRecord, SpecRecord, decode, topics
from fx_kafka.client import make_admin
from fx_kafka.workload_log import TopicView
from workload_sdk._holder_config import HOLDER_LOG as log
from workload_sdk._holder_config import HolderConfig
from workload_sdk._observe import (
    PendingRequest,
    executor_groups,
    merge_lag,
    outstanding_by_kind,
    unread_requests,
)
from workload_sdk._round import MergedBatch

if TYPE_CHECKING:  # the metrics are the process's (cli), never needed to run the fold
    from workload_sdk._core import Core
    from workload_sdk._holder_metrics import HolderMetrics

__all__ = ["MetricsObserver", "ObservedHolder"]


class ObservedHolder(Protocol):
    """What the observer reads of a holder: its fold, its spec and its pending requests."""

    @property
    def core(self) -> Core | None: ...

    @property
    def spec(self) -> SpecRecord | None: ...

    def pending_requests(self) -> list[PendingRequest]:
        """The pending effects whose request offset on ``.out`` is known."""
        ...


class MetricsObserver:
    """Sets the holder's gauges (see the module docstring)."""

    def __init__(self, config: HolderConfig, metrics: HolderMetrics | None,
                 holder: ObservedHolder) -> None:
        self.config = config
        self.metrics = metrics
        self.holder = holder

    def lease(self, held: bool, epoch: int) -> None:
        """The lease gauge: held (at ``epoch``) or not."""
        if self.metrics is not None:
            self.metrics.lease(self.config.workload_id, held=held, epoch=epoch)

    def outstanding(self) -> None:
        """Requests written and not yet merged, per kind."""
        core, spec = self.holder.core, self.holder.spec
        if self.metrics is None or core is None or spec is None:
            return
        self.metrics.set_outstanding(self.config.workload_id, outstanding_by_kind(
            spec.effect_kinds, (p.effect_kind for p in core.pending.values())))

    def merged(self, batch: MergedBatch, metas: list[Any],
               round_trips: list[tuple[str, float]]) -> None:
        """After a merge transaction committed (``metas``: its records' metadata, in order):
        the answers merged and passed over, round trips, the newest snapshot, the outstanding
        requests."""
        if self.metrics is None:
            return
        wid = self.config.workload_id
        self.metrics.merged(wid, batch.answers, batch.passed_over_by, round_trips)
        self.metrics.inputs_skipped_by(wid, [e.skip.cause for e in batch.skipped if e.skip])
        snaps = [metas[i] for i, (_, rec) in enumerate(batch.records)
                 if isinstance(rec, SnapshotRecord)] if batch.records else []
        if snaps:
            self.metrics.snapshot(wid, snaps[-1].timestamp / 1000)
        self.outstanding()

    def resumed(self, merge: TopicView) -> None:
        """After a resume: the time of the newest snapshot resumed from (on ``merge``), and the
        outstanding requests."""
        if self.metrics is None:
            return
        for rec in reversed(list(merge)):  # the newest snapshot resumed from
            with contextlib.suppress(DecodeError):
                if isinstance(decode(rec.value), SnapshotRecord):
                    self.metrics.snapshot(self.config.workload_id, rec.time_ms / 1000)
                    break
        self.outstanding()

    async def run(self, consumer: Any, tp_resp: TopicPartition, stop: asyncio.Event) -> None:
        """Every ``observe_every_s``: the merge lag on ``.resp`` and the executor groups'
        unread requests on ``.out`` (one admin client for the holder's run). A failed round is
        logged at DEBUG and tried again next time: metrics never stop the holder."""
        cfg = self.config
        admin = make_admin(cfg.bootstrap, request_timeout_ms=10_000)
        started = False
        try:
            while not stop.is_set():
                try:
                    if not started:
                        await asyncio.wait_for(admin.start(), timeout=15.0)
                        started = True
                    await asyncio.wait_for(self._once(admin, consumer, tp_resp), timeout=15.0)
                except (KafkaError, OSError, TimeoutError) as exc:
                    log.debug("metrics round of %s failed (next in %.0f s): %r",
                              cfg.workload_id, cfg.observe_every_s, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=cfg.observe_every_s)
        finally:
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                await asyncio.wait_for(admin.close(), timeout=5.0)

    async def _once(self, admin: Any, consumer: Any, tp_resp: TopicPartition) -> None:
        cfg, metrics = self.config, self.metrics
        assert metrics is not None
        wid = cfg.workload_id
        ends = await consumer.end_offsets([tp_resp])
        lag = merge_lag(ends.get(tp_resp), await consumer.position(tp_resp))
        if lag is not None:
            metrics.set_merge_lag(wid, lag)
        self.outstanding()
        if self.holder.core is None or self.holder.spec is None:
            return
        existing = {g[0] for g in await admin.list_consumer_groups()}
        spec = self.holder.spec
        if spec is None:  # restarting from the log meanwhile
            return
        groups = executor_groups(cfg.executor_group_prefixes, spec.effect_kinds, existing)
        tp_out = TopicPartition(topics.out(wid), 0)
        committed: dict[str, int | None] = {}
        for group in groups:
            if group not in existing:
                committed[group] = None
                continue
            offsets = await admin.list_consumer_group_offsets(group, partitions=[tp_out])
            meta = offsets.get(tp_out)
            committed[group] = None if meta is None else meta.offset
        if self.holder.core is not None:
            metrics.set_unread(wid, unread_requests(groups, committed,
                                                    self.holder.pending_requests()))
