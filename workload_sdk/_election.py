"""Holder election: many ``fx workload run ID`` processes, one lease holder, through Kafka itself.

Every candidate joins the consumer group ``fx-holder-elect.<id>`` subscribed to ``wl.<id>.claims``
(one partition). The group coordinator assigns that partition to exactly one member per
generation, with this project's assignor (:class:`~workload_sdk._election.choose_leader`, pure): the
member that holds the lease now keeps it; otherwise the first member by id. The member assigned the
partition runs a :class:`~workload_sdk._holder.LeaseHolder`; the others stand by. "Holds the lease
now" is told by the epoch each member says it holds (its subscription's user data): the highest
epoch wins, so a member that was paused past its session and comes back still running an old
holder does not win the lease back from its successor. A candidate that
loses the partition stops its holder; one that dies (SIGKILL, a lost machine) is dropped by the
coordinator after ``session_timeout_ms`` and a standby is assigned, claims the next epoch and
fences the old holder's transactional id, so nothing of the dead holder can commit after that.

The election is for liveness; safety is the lease's own: a claim with a higher epoch, the
transactional id fencing every older producer, executors refusing lower epochs. Two members that
both believe they lead (a paused process whose session expired) cannot both commit: the second
``InitProducerId`` fences the first, whose next transaction fails (:class:`Fenced`).

Take-over time after a SIGKILL is about ``session_timeout_ms`` (the broker's
``group.min.session.timeout.ms``, 6 s by default, is the floor) plus the new holder's resume;
after a graceful stop (SIGTERM) the leaving member's LeaveGroup triggers the rebalance at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import KafkaError

from broker_schema import topics
from fx_kafka.client import make_consumer
from fx_kafka.retry import broker_unavailable, jittered_backoff_s
from workload_sdk._api import Workload
from workload_sdk._holder import Fenced, HolderConfig, LeaseHolder
from workload_sdk._holder_watch import ClaimWatch

if TYPE_CHECKING:
    from workload_sdk._holder_metrics import HolderMetrics

__all__ = ["ElectionConfig", "ElectionStats", "HolderElection", "choose_leader", "group_id_for"]

log = logging.getLogger(__name__)



def group_id_for(workload_id: str) -> str:
    """The election's consumer group: ``fx-holder-elect.<id>``."""
    return f"fx-holder-elect.{topics.check_workload_id(workload_id)}"


def choose_leader(members: Mapping[str, int | None]) -> str | None:
    """The member to hold the lease, from ``member id -> the epoch it holds now`` (None: holds
    nothing): the member holding the highest epoch keeps it (the smallest id on a tie), else the
    smallest id; None for no members. Pure: the group leader's assignor runs it, so every
    generation has one answer."""
    if not members:
        return None
    holding = [(-e, m) for m, e in members.items() if e is not None]
    return min(holding)[1] if holding else min(members)


def _epoch_of(user_data: bytes) -> int | None:
    try:
        return int(user_data.decode("ascii")) if user_data else None
    except (UnicodeDecodeError, ValueError):
        return None


def _assignor_for(election: HolderElection) -> type[AbstractPartitionAssignor]:
    """An assignor class bound to one election (aiokafka calls assignors as classes)."""

    class HolderAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
        name = "fx-holder"
        version = 0

        @classmethod
        def metadata(cls, topics_: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            held = election.held_epoch
            return ConsumerProtocolMemberMetadata(
                cls.version, sorted(topics_), b"" if held is None else str(held).encode())

        @classmethod
        def assign(cls, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
                   ) -> dict[str, ConsumerProtocolMemberAssignment]:
            leader = choose_leader({m: _epoch_of(md.user_data) for m, md in members.items()})
            topic = election.topic
            return {m: ConsumerProtocolMemberAssignment(
                cls.version, [(topic, [0])] if m == leader else [], b"") for m in members}

        @classmethod
        def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
            return None

    return HolderAssignor


@dataclass(frozen=True)
class ElectionConfig:
    """How a candidate takes part: the group's session timeout and heartbeat, and how long a
    holder that stopped with an error waits before it tries again while still elected."""

    session_timeout_ms: int = 6000
    heartbeat_interval_ms: int = 1000
    retry_cap_s: float = 10.0


@dataclass
class ElectionStats:
    """What a candidate went through."""

    #: times this candidate was elected and started a holder
    terms: int = 0
    #: times it lost the election while holding (another member was assigned)
    demoted: int = 0
    #: monotonic time of each election won (for take-over measurements)
    elected_at: list[float] = field(default_factory=list)
    #: holders of this candidate that ended fenced or replaced while it was elected
    fenced: int = 0


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, election: HolderElection) -> None:
        self.election = election

    async def on_partitions_revoked(self, revoked: Any) -> None:
        # eager rebalancing revokes everything first; the new assignment says who holds
        return None

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.election._assigned(TopicPartition(self.election.topic, 0) in set(assigned))


class HolderElection:
    """One candidate: joins the election and runs a :class:`LeaseHolder` while elected."""

    def __init__(self, workload: Workload, config: HolderConfig,
                 election: ElectionConfig | None = None,
                 metrics: HolderMetrics | None = None) -> None:
        self.workload = workload
        self.config = config
        #: handed to every holder this candidate runs; a stand-by reports ``fx_holder_leader 0``
        self.metrics = metrics
        self.election = election or ElectionConfig()
        self.topic = topics.claims(config.workload_id)
        self.stats = ElectionStats()
        self.holder: LeaseHolder | None = None
        self._task: asyncio.Task[None] | None = None
        self._holder_stop = asyncio.Event()
        self._elected = False
        self._failures = 0
        self._retry_at = 0.0
        self._joined = False
        #: reads ``.claims`` for ``/readyz``; shared with the holders this candidate runs
        self.watch = ClaimWatch(config.bootstrap, config.workload_id)

    @property
    def holding(self) -> bool:
        """Whether this candidate runs a holder now."""
        return self._task is not None and not self._task.done()

    @property
    def held_epoch(self) -> int | None:
        """The epoch of the holder this candidate runs now (0 while it is still claiming), or
        None when it runs none."""
        if not self.holding or self.holder is None:
            return None
        return self.holder.epoch or 0

    def status(self) -> dict[str, Any]:
        """For ``/readyz``: while elected and holding, the holder's (:meth:`LeaseHolder.status`:
        ``leader`` once its claim is confirmed, ``candidate`` before; ``candidate`` too while
        it stops after losing the election); otherwise ``standby``, ready while this candidate
        is in the election group and the broker answers (``starting`` before it joined)."""
        if self.holding and self.holder is not None:
            body = {**self.holder.status(), "elected": self._elected}
            if not self._elected:
                body.update(ready=False, role="candidate")
            return body
        broker = self.watch.broker_ok()
        body = {"ready": self._joined and broker,
                "role": "standby" if self._joined else "starting", "broker": broker,
                "workload": self.config.workload_id, "holder_id": self.config.holder_id,
                "epoch": None, "seq": None, "elected": self._elected}
        if self.watch.error is not None:
            body["broker_error"] = self.watch.error
        return body

    @property
    def elected(self) -> bool:
        """Whether the coordinator's latest assignment made this candidate the holder."""
        return self._elected

    async def _assigned(self, elected: bool) -> None:
        was = self._elected
        self._elected = elected
        if elected and not was:
            log.info("%s: elected lease holder of %s", self.config.holder_id,
                     self.config.workload_id)
        if not elected and self.holding:
            log.warning("%s: another candidate was elected for %s: stopping this holder",
                        self.config.holder_id, self.config.workload_id)
            self.stats.demoted += 1
            await self._stop_holder()

    async def _stop_holder(self) -> None:
        task = self._task
        if task is None:
            return
        self._holder_stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=30.0)
        except TimeoutError:
            task.cancel()
        except Exception:
            pass

    def _start_holder(self) -> None:
        self._holder_stop = asyncio.Event()
        self.holder = LeaseHolder(self.workload, self.config, self.metrics, watch=self.watch)
        self.stats.terms += 1
        self.stats.elected_at.append(time.monotonic())
        self._task = asyncio.create_task(self.holder.run(self._holder_stop))

    def _reap(self) -> None:
        """Judge a holder task that ended: fenced or replaced while elected is retried with
        backoff (a holder outside the election, or one of ours that lost a race); anything else
        (a workload error, a spec or log it cannot run) goes up."""
        task = self._task
        if task is None or not task.done():
            return
        self._task = None
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            self._failures = 0
            return
        if isinstance(exc, Fenced):
            self.stats.fenced += 1
            self._failures += 1
            delay = jittered_backoff_s(self._failures, cap_s=self.election.retry_cap_s)
            self._retry_at = time.monotonic() + delay
            log.warning("%s: holder of %s ended fenced (%s); trying again in %.1f s if still "
                        "elected", self.config.holder_id, self.config.workload_id, exc, delay)
            return
        raise exc

    def _consumer(self) -> Any:
        return make_consumer(
            self.config.bootstrap, group_id=group_id_for(self.config.workload_id),
            partition_assignment_strategy=(_assignor_for(self),),
            session_timeout_ms=self.election.session_timeout_ms,
            heartbeat_interval_ms=self.election.heartbeat_interval_ms,
            auto_offset_reset="latest", enable_auto_commit=False,
        )

    async def _start_consumer(self, stop: asyncio.Event) -> Any | None:
        """A started election consumer. A candidate started while the broker is away (a
        restart, an outage) waits for it, with backoff, instead of exiting: it has nothing to
        lose by waiting, and a supervisor restarting it would only do the same."""
        attempt = 0
        while True:
            consumer = self._consumer()
            try:
                await consumer.start()
                return consumer
            except KafkaError as exc:
                await consumer.stop()
                if not broker_unavailable(exc):
                    raise
                if stop.is_set():
                    return None
                attempt += 1
                delay = jittered_backoff_s(attempt, cap_s=self.election.retry_cap_s)
                log.warning("%s: broker unavailable for the election of %s (%r); trying again "
                            "in %.1f s", self.config.holder_id, self.config.workload_id, exc,
                            delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    return None  # asked to stop while it waited: nothing held, nothing to do

    async def run(self, stop: asyncio.Event) -> None:
        """Take part until ``stop`` is set: hold the lease while elected, stand by otherwise."""
        watching = asyncio.create_task(self.watch.run(stop))
        try:
            await self._run(stop)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)

    async def _run(self, stop: asyncio.Event) -> None:
        consumer = await self._start_consumer(stop)
        if consumer is None:
            return
        try:
            consumer.subscribe([self.topic], listener=_Listener(self))
            self._joined = True
            if self.metrics is not None:
                self.metrics.lease(self.config.workload_id, held=False, epoch=0)
            log.info("%s: candidate for the lease of %s (group %s)", self.config.holder_id,
                     self.config.workload_id, group_id_for(self.config.workload_id))
            while not stop.is_set():
                # fetching keeps the membership and drives rebalances; the claims are not used
                await consumer.getmany(timeout_ms=200, max_records=100)
                self._reap()
                if self._elected and self._task is None and time.monotonic() >= self._retry_at:
                    self._start_holder()
        finally:
            self._joined = False
            await self._stop_holder()
            await consumer.stop()  # LeaveGroup: a standby is elected at once
        self._reap()
