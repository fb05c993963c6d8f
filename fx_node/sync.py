"""Catching up on a workload's ``.claims`` and ``.spec`` (and a shadow evaluation's ``.eval``)
before deciding on one of its requests: the state fencing rests on. One reader for the executor
and the actuator gateway.

:class:`ClaimsSpecReader` reads the topics up to their end offsets at the time of the call into
an :class:`~fx_node.admission.ExecutorState` (one end-offset look-up when nothing is new);
:func:`catch_up` retries a read that fails (a broker error, a read that does not reach the end
in ``attempt_s``) with backoff until it succeeds:
deciding on a stale spec or epoch would be a guessed outcome, so a request waits, unsettled,
meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from broker_schema import DecodeError, topics
from broker_schema.codec import decode
from broker_schema.records import (
    ClaimRecord,
    RejectCode,
    ShadowEvalRecord,
    ShadowReportRecord,
    SpecRecord,
)
from fx_kafka.client import check_authorized
from fx_kafka.retry import jittered_backoff_s
from fx_node.admission import ExecutorState

__all__ = ["ClaimsSpecReader", "catch_up"]

log = logging.getLogger(__name__)


async def catch_up(read: Callable[[str, str | None], Awaitable[None]], workload_id: str,
                   shadow: str | None, *, on_failure: Callable[[], None],
                   attempt_s: float = 15.0, max_backoff_s: float = 10.0) -> None:
    """``await read(workload_id, shadow)`` until one attempt succeeds within ``attempt_s``;
    each failure calls ``on_failure`` (a metric) and waits, doubling from 0.5 s up to
    ``max_backoff_s``, with jitter (:func:`fx_kafka.retry.jittered_backoff_s`)."""
    attempt = 0
    while True:
        delay = jittered_backoff_s(attempt + 1, base_s=0.5, cap_s=max_backoff_s)
        try:
            await asyncio.wait_for(read(workload_id, shadow), attempt_s)
            return
        except (TimeoutError, KafkaError) as exc:
            on_failure()
            log.error("could not catch up on claims/spec of %s: %r; retrying in %.1f s "
                      "(no request of it is decided meanwhile)", workload_id, exc, delay)
        await asyncio.sleep(delay)
        attempt += 1


class ClaimsSpecReader:
    """Reads ``.claims`` and ``.spec`` of the workloads seen so far with one side consumer
    (``side``, assigned here) and looks offsets up with ``probe`` (a consumer that fetches
    nothing). ``on_undecodable(code)`` counts a record that does not decode;
    ``on_rejected(msg, code, detail)`` is told of a claim refused (``epoch_jump``).

    The side consumer's partitions stay paused between reads, so it has no long-poll fetch in
    flight when a read needs its connection (Kafka answers the requests of one connection in
    order: a metadata or offset request sent behind an idle fetch waits for that fetch, up to
    ``fetch_max_wait_ms``). A new workload's partitions are added at their beginning offsets
    (looked up on the probe) and the others keep their positions (``seek``): neither a reset
    nor a re-read of what was read already, however many workloads are watched."""

    def __init__(self, state: ExecutorState, side: AIOKafkaConsumer, probe: AIOKafkaConsumer,
                 *, on_undecodable: Callable[[str], None],
                 on_rejected: Callable[[Any, RejectCode, str], None] | None = None) -> None:
        self.state, self.side, self.probe = state, side, probe
        self.on_undecodable = on_undecodable
        #: (record, code, detail) of a record refused after decoding (a claim too far ahead)
        self.on_rejected = on_rejected
        self._lock = asyncio.Lock()
        self._watched: dict[str, list[TopicPartition]] = {}

    async def read(self, workload_id: str, shadow: str | None = None) -> None:
        """One attempt: read ``workload_id``'s ``.claims`` and ``.spec`` (and ``shadow``'s
        ``.eval``) up to their end offsets now."""
        async with self._lock:
            tps = [TopicPartition(topics.claims(workload_id), 0),
                   TopicPartition(topics.spec(workload_id), 0)]
            if shadow is not None:
                tps.append(TopicPartition(topics.shadow_stream(workload_id, shadow, "eval"), 0))
            watch_key = workload_id if shadow is None else f"{workload_id}/{shadow}"
            if watch_key not in self._watched:
                await self._watch(tps)
                self._watched[watch_key] = tps
            end = await self.probe.end_offsets(tps)
            behind = [tp for tp in tps if await self.side.position(tp) < end[tp]]
            if not behind:
                return
            self.side.resume(*behind)
            try:
                while behind:
                    data = await self.side.getmany(*behind, timeout_ms=1000)
                    for _tp, msgs in data.items():
                        for msg in msgs:
                            self._observe(workload_id, msg)
                    behind = [tp for tp in behind if await self.side.position(tp) < end[tp]]
            finally:
                self.side.pause(*self.side.assignment())

    async def _watch(self, tps: list[TopicPartition]) -> None:
        """Add those of ``tps`` the side consumer does not read yet to its assignment, at their
        beginning offsets (a shadow evaluation's ``.eval`` beside its workload's claims and spec
        already read adds only itself)."""
        new = [tp for tp in tps if tp not in self.side.assignment()]
        if not new:
            return
        names = sorted({tp.topic for tp in new})
        # both clients learn the topics' leaders first (aiokafka would otherwise find them
        # unknown, ask for metadata and sleep its retry back-off before looking again), and a
        # topic this node may not read is refused at once instead of retried to a timeout
        await check_authorized(self.probe, names)
        begin = await self.probe.beginning_offsets(new)
        await check_authorized(self.side, names)
        kept = {tp: await self.side.position(tp) for tp in self.side.assignment()
                if tp not in begin}
        self.side.assign([*kept, *new])
        for tp, offset in (*kept.items(), *begin.items()):
            self.side.seek(tp, offset)
        self.side.pause(*self.side.assignment())

    def _observe(self, workload_id: str, msg: Any) -> None:
        try:
            record = decode(msg.value)
        except DecodeError as exc:
            log.warning("undecodable record at %s offset %d: %s", msg.topic, msg.offset, exc)
            self.on_undecodable(exc.code)
            return
        if isinstance(record, ClaimRecord) and record.workload_id == workload_id:
            problem = self.state.claim_refused(record)
            if problem is not None:
                log.warning("refused claim at %s offset %d: %s", msg.topic, msg.offset, problem)
                if self.on_rejected is not None:
                    self.on_rejected(msg, "epoch_jump", problem)
                return
            self.state.observe_claim(record)
        elif isinstance(record, SpecRecord) and record.workload_id == workload_id:
            self.state.observe_spec(record, msg.offset)
        elif (isinstance(record, ShadowEvalRecord) and record.workload_id == workload_id
              and msg.topic == topics.shadow_stream(workload_id, record.eval_id, "eval")):
            self.state.observe_shadow(record)
        elif isinstance(record, ShadowReportRecord):
            pass  # an evaluation's result: nothing an executor decides on
        else:
            log.warning("unexpected %s record at %s offset %d", record.kind, msg.topic, msg.offset)
