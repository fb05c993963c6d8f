"""Speculative reads (``speculative_reads``, off by default; docs/executor.md, "Speculative
reads"): the executor's work on an inference request done while the holder's transaction that
holds it is still open, answered only once it commits.

The executor reads ``.out`` ``read_committed``, so it sees a request only once the holder's
transaction marker is written (~3 ms after the commit returned, ~6 ms after the request's
append, measured). :class:`SpeculativeReader` reads the same partitions ``read_uncommitted``
(one consumer, no group, following the assignment of the node's consumers of the kinds it
speculates on) and prepares each request it sees: decoded, its workload's ``.claims``/``.spec``
caught up (after the request's append: every claim written before the request is seen, and no
later epoch can be claimed while the request's transaction is open, since a new holder's
producer fences the workload's one transactional id first), the holder's signature checked, and,
for a loaded µs-scale model with an inline input, the model run. What it prepared is kept in a
:class:`SpeculationCache` keyed by the record's place (topic, partition, offset) and checked
against its bytes and holder signature.

Nothing is written: the authoritative ``read_committed`` path, when it reads the record, takes
what was prepared (:meth:`SpeculativeReader.take`) instead of doing it again, decides
(:func:`fx_node.admission.decide`, with the clock of that moment: deadlines, duplicates and
queue limits are judged then) and writes ``accepted`` and the response as without speculation.
A request in a transaction that aborts never reaches that path, so what was prepared for it is
never used and leaves the cache when it expires. Only model kinds are speculated on (never a
kind handler; the executor serves no actuation kind, and the actuator gateway has no
speculation: a kind that acts must have its ``accepted`` acknowledged before it acts).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from broker_schema import DecodeError, topics
from broker_schema.fast_codec import decode
from broker_schema.records import EffectRequest, InlineBody
from broker_schema.signatures import HOLDER_SIG_HEADER
from executor.engine_pool import EnginePool
from executor.engines import Engine, EngineResult
from executor.metrics import ExecutorMetrics
from fx_kafka.client import MIRROR_OFFSET_HEADER, header_value, make_consumer, mirror_header
from fx_kafka.errors import MirrorCopyError
from fx_node.admission import ExecutorState, holder_problem
from fx_node.errors import EngineError, OutcomeError
from fx_node.runner import PreparedRead
from fx_node.shell import NodeShell

if TYPE_CHECKING:
    from executor.answering import Answerer
    from executor.scheduler import Job

__all__ = ["CACHE_LIMIT", "CACHE_TTL_S", "WAIT_S", "Prepared", "SpeculationCache",
           "SpeculativeReader", "record_digest", "run_one"]

log = logging.getLogger("executor.service")

#: Prepared requests kept at most (the oldest leave first).
CACHE_LIMIT = 1024
#: How long a prepared request waits for its commit: Kafka's default transaction timeout
#: (a transaction still open after it is aborted by the coordinator).
CACHE_TTL_S = 60.0

#: How long a committed read waits for the preparation of its record under way.
WAIT_S = 2.0

Place = tuple[str, int, int]
#: a model's run for one request: (model hash, result, started_us, finished_us)
Ran = tuple[str, EngineResult | OutcomeError, int, int]


def record_digest(value: bytes | None, signature: bytes | None) -> bytes:
    """What must match between the record read uncommitted and the one read committed at the
    same place: its bytes and its holder signature header."""
    h = hashlib.sha256(value or b"")
    h.update(b"\x00" if signature is None else b"\x01" + signature)
    return h.digest()


@dataclass
class Prepared(PreparedRead):
    """A request prepared on its uncommitted read (:class:`fx_node.runner.PreparedRead`: the
    record, whether its workload was caught up after it, its holder check) and the model's
    result, when it was run: ``(model hash, result, started_us, finished_us)``."""

    digest: bytes = b""
    #: monotonic seconds when it was prepared
    at: float = 0.0
    ran: Ran | None = None
    #: a model of ms-scale runs: its run in the engine pool (started on the uncommitted read)
    running: asyncio.Future[Ran] | None = None


class SpeculationCache:
    """Prepared requests by place, bounded (``limit``, oldest first out) and expiring after
    ``ttl_s``. Pure: the caller passes the time in. ``expired`` counts the entries that left
    unused (their transaction aborted, or nobody read them committed in time)."""

    def __init__(self, limit: int = CACHE_LIMIT, ttl_s: float = CACHE_TTL_S) -> None:
        self.limit, self.ttl_s = limit, ttl_s
        self._entries: OrderedDict[Place, Prepared] = OrderedDict()
        self.expired = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, place: Place, entry: Prepared, now: float) -> None:
        """Keep ``entry`` for ``place`` (replacing an older one there)."""
        self._entries.pop(place, None)
        self._entries[place] = entry
        self.expire(now)
        while len(self._entries) > self.limit:
            self._entries.popitem(last=False)
            self.expired += 1

    def take(self, place: Place, digest: bytes, now: float) -> Prepared | None:
        """The entry for ``place`` if its bytes match ``digest`` and it has not expired (it
        leaves the cache either way)."""
        self.expire(now)
        entry = self._entries.pop(place, None)
        if entry is None:
            return None
        if entry.digest != digest:
            self.expired += 1
            return None
        return entry

    def expire(self, now: float) -> None:
        """Drop the entries older than ``ttl_s``."""
        while self._entries:
            place, oldest = next(iter(self._entries.items()))
            if now - oldest.at <= self.ttl_s:
                return
            del self._entries[place]
            self.expired += 1


class SpeculativeReader:
    """The ``read_uncommitted`` consumer and what it prepares (see the module docstring)."""

    def __init__(self, node: NodeShell, state: ExecutorState, engines: EnginePool,
                 metrics: ExecutorMetrics, kinds: frozenset[str], *,
                 threads: Executor | None = None, cache: SpeculationCache | None = None) -> None:
        self.node, self.state, self.engines, self.metrics = node, state, engines, metrics
        #: the engine pool a model of ms-scale runs runs in (the workers' own: speculation
        #: takes no more engine threads than ``workers``); None: only µs-scale models are run
        self.threads = threads
        #: the kinds speculated on: model kinds (never a kind handler)
        self.kinds = kinds
        self.cache = cache or SpeculationCache()
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned: frozenset[TopicPartition] = frozenset()
        self._expired_counted = 0
        #: records read uncommitted and being prepared: a committed read of one waits for it
        #: (up to :data:`WAIT_S`) rather than doing the same work again beside it
        self._pending: dict[Place, asyncio.Future[None]] = {}

    # ------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the consumer (assigned once the node's consumers own partitions)."""
        self._consumer = make_consumer(self.node.settings.bootstrap,
                                       isolation_level="read_uncommitted")
        await self._consumer.start()

    async def close(self) -> None:
        """Stop the consumer."""
        if self._consumer is not None:
            with contextlib.suppress(KafkaError):
                await self._consumer.stop()

    async def run(self) -> None:
        """Read and prepare until cancelled. A broker error is waited out (nothing depends on
        this loop: a request it did not prepare is simply done on its committed read)."""
        consumer = self._consumer
        assert consumer is not None
        failures = 0
        while True:
            try:
                if not await self._follow(consumer):
                    await asyncio.sleep(0.05)
                    continue
                batch = await consumer.getmany(timeout_ms=100, max_records=500)
                failures = 0
            except KafkaError as exc:
                failures += 1
                log.warning("speculative read failed: %r", exc)
                await asyncio.sleep(min(5.0, 0.1 * 2 ** min(failures, 6)))
                continue
            loop = asyncio.get_running_loop()
            places = [((m.topic, m.partition, m.offset), m) for msgs in batch.values()
                      for m in msgs]
            for place, _ in places:
                self._pending.setdefault(place, loop.create_future())
            try:
                for place, msg in places:
                    try:
                        await self._prepare(msg)
                    except Exception as exc:  # never fatal: the committed read does it all
                        log.warning("speculative read of %s/%d offset %d not prepared: %r",
                                    msg.topic, msg.partition, msg.offset, exc)
                    finally:
                        self._release(place)
            finally:
                for place, _ in places:
                    self._release(place)
            self._count_expired()

    def _release(self, place: Place) -> None:
        fut = self._pending.pop(place, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def _follow(self, consumer: AIOKafkaConsumer) -> bool:
        """Read the partitions the node's consumers of :attr:`kinds` own now; a partition new
        to this reader is read from its end (what is older was read committed already or is
        being read). False while there is none."""
        wanted = frozenset(tp for kind, c in self.node.consumers.items() if kind in self.kinds
                           for tp in c.assignment())
        if wanted != self._assigned:
            new = wanted - self._assigned
            consumer.assign(list(wanted))
            if new:
                await consumer.seek_to_end(*new)
            self._assigned = wanted
        return bool(wanted)

    # ------------------------------------------------------------------------------ preparing
    async def _prepare(self, msg: Any) -> None:
        """Prepare one record read uncommitted (the shell's checks, in its order)."""
        headers = getattr(msg, "headers", None)
        try:
            if mirror_header(headers, MIRROR_OFFSET_HEADER) is not None:
                return
            record = decode(msg.value, topic=msg.topic)
            workload_id, shadow = topics.request_topic(msg.topic)
        except (DecodeError, ValueError, MirrorCopyError):
            return  # the committed read records it
        if (not isinstance(record, EffectRequest) or record.effect_kind not in self.kinds
                or record.header.workload_id != workload_id or record.header.shadow != shadow):
            return
        signature = header_value(headers, HOLDER_SIG_HEADER)
        try:
            await asyncio.wait_for(self.node.sync_read(workload_id, shadow), 15.0)
            synced = True
        except (TimeoutError, KafkaError) as exc:
            log.debug("speculative catch-up of %s failed: %r", workload_id, exc)
            synced = False
        problem = holder_problem(self.state, record, msg.value, signature) if synced else None
        entry = Prepared(record=record, synced=synced, holder_problem=problem,
                         digest=record_digest(msg.value, signature), at=time.monotonic())
        if synced and problem is None:
            self._run(record, entry)
        self.cache.put((msg.topic, msg.partition, msg.offset), entry, entry.at)
        self.metrics.speculative.labels(
            "prepared" if entry.ran is None and entry.running is None else "ran").inc()

    def _run(self, record: EffectRequest, entry: Prepared) -> None:
        """Run the model for ``record`` when its input is inline and the model loaded (and its
        engine binds no request context: an integer receipt is signed only for a committed
        request): a µs-scale one here (``entry.ran``), as the committed path would in the
        consumer loop (:meth:`executor.answering.Answerer.answer_now`); another in the engine
        pool (``entry.running``), when there is one."""
        body, model_hash = record.input, record.model
        if model_hash is None or not (body is None or isinstance(body, InlineBody)):
            return
        try:
            loaded = self.engines.already_loaded(model_hash)
        except (OutcomeError, OSError, ValueError):
            return
        if loaded is None or getattr(loaded[0], "binds_request_context", False):
            return
        engine = loaded[0]
        item = (record.params, b"" if body is None else body.raw())
        if self.engines.runs_inline(engine, model_hash):
            entry.ran = run_one(engine, model_hash, item)
            self._note_cost(entry.ran)
        elif self.threads is not None:
            running = asyncio.get_running_loop().run_in_executor(
                self.threads, run_one, engine, model_hash, item)
            running.add_done_callback(
                lambda f: None if f.cancelled() else self._note_cost(f.result()))
            entry.running = running

    def _note_cost(self, ran: Ran) -> None:
        """A run's cost counts as the workers' do (:meth:`EnginePool.runs_inline` decides on
        it): a model that runs in microseconds here is answered in the consumer loop."""
        model_hash, _, started_us, finished_us = ran
        self.engines.note_run_cost(model_hash, (finished_us - started_us) / 1e6)

    async def answer_running(self, j: Job, running: asyncio.Future[Ran],
                             answerer: Answerer) -> None:
        """Answer the admitted ``j`` with the run its uncommitted read started and that is
        still running (a worker's answer: ``accepted`` acknowledged first, a batch of one), in
        place of queueing it. A run already done is answered as a µs-scale one is
        (:meth:`executor.answering.Answerer.answer_now`: the response right behind
        ``accepted``, one produce request)."""
        await answerer.accepted_written(j)
        model_hash, result, started_us, finished_us = await running
        loaded = self.engines.already_loaded(model_hash, file_checked=True)
        if loaded is None:  # unloaded meanwhile: run again the usual way
            body = j.job.request.input
            j.data = body.raw() if isinstance(body, InlineBody) else b""
            await answerer.scheduler.put(j)
            return
        engine, manifest = loaded
        self.metrics.compute_seconds.labels(model_hash).observe(
            (finished_us - started_us) / 1e6)
        self.metrics.batch_size.labels(model_hash).observe(1)
        self.metrics.exec_count.labels(model_hash).inc()
        answerer.answer_job(j, self.engines.executor_info(engine, model_hash), model_hash,
                            result, started_us=started_us, finished_us=finished_us,
                            receipt_base={
                                "batch_size": 1,
                                "manifest_hash": self.engines.store.manifest_hash(model_hash,
                                                                                  stat=False),
                                "preprocessing_version": manifest.preprocessing_version})

    @staticmethod
    def finished(entry: Prepared) -> Ran | None:
        """``entry``'s model run when it is done (on the event loop, or in the pool by now)."""
        if entry.ran is not None:
            return entry.ran
        running = entry.running
        if running is not None and running.done() and not running.cancelled():
            return running.result()
        return None

    # ------------------------------------------------------------------------------ taking
    async def take(self, kind: str, msg: Any) -> Prepared | None:
        """What was prepared for ``msg`` (read committed by ``kind``'s consumer), or None;
        when it is being prepared now, once that is done (up to :data:`WAIT_S`)."""
        if kind not in self.kinds:
            return None
        pending = self._pending.get((msg.topic, msg.partition, msg.offset))
        if pending is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pending), WAIT_S)
        signature = header_value(getattr(msg, "headers", None), HOLDER_SIG_HEADER)
        entry = self.cache.take((msg.topic, msg.partition, msg.offset),
                                record_digest(msg.value, signature), time.monotonic())
        self._count_expired()
        return entry

    def _count_expired(self) -> None:
        n = self.cache.expired - self._expired_counted
        if n:
            self.metrics.speculative.labels("expired").inc(n)
            self._expired_counted = self.cache.expired


def run_one(engine: Engine, model_hash: str, item: tuple[Any, bytes]) -> Ran:
    """``engine``'s result for one request (an engine's exception is its ``engine_error``, as
    on the committed path), with its start and end (µs since the epoch)."""
    started_us = time.time_ns() // 1000
    result: EngineResult | OutcomeError
    try:
        result = engine.run_batch(model_hash, [item])[0]
    except Exception as exc:  # an engine bug: the same error the committed run would give
        result = EngineError("engine_error", f"{type(exc).__name__}: {exc}")
    return model_hash, result, started_us, time.time_ns() // 1000
