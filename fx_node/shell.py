"""The node's shell: what the executor and the actuator gateway run alike, around a runner
(:class:`fx_node.runner.Runner`) that decides and acts.

Per effect kind served, one consumer in group ``<group_prefix>.<kind>`` subscribed by pattern to
``wl.*.out`` (narrowed by ``topic_pattern``); one partition per workload topic, spread by round
robin. For every record read the shell

1. tracks its offset; passes over (the runner counts it, records it on ``sys.rejects``...) a
   site's request mirrored here by ``fx mirror`` (the site answers it), a record that does not
   decode or does not belong on ``.out`` (``wrong_stream``: a claim, a response...), a record that
   is no request, a request of another kind, one naming another workload than its topic's;
2. catches up on the workload's ``.claims`` and ``.spec`` (:mod:`fx_node.sync`: a side consumer
   reads both up to their end offsets at reading time, retried until it succeeds, the request
   unsettled meanwhile) and passes over a request its epoch's holder did not sign
   (:func:`fx_node.admission.holder_problem`: front-running);
3. hands the request to the runner (:meth:`~fx_node.runner.Runner.handle`), which decides
   (:mod:`fx_node.admission`) and acts; a request is settled once the runner's answer is
   acknowledged, and after each poll the consumer commits the lowest unsettled offset of each
   partition it still owns. On a rebalance, a revoked partition's requests in flight get
   ``revoke_grace_s`` to finish; what is settled is committed, the rest forgotten (the next owner
   reads it again).

While a request is in flight, its ``accepted`` is written again each third of its lease
(:func:`fx_node.admission.renewal_due`); the node's facts go to ``sys.facts`` at start, on change
and every ``facts_interval_s``; HTTP (:mod:`fx_node.http`) answers liveness, readiness, facts and
metrics.

Restart semantics: a request whose response was not committed past is read again by whichever
member owns the partition next and handed to its runner again under the same effect id.

Broker restarts: the node rides them out in the same process and loses nothing. aiokafka
reconnects by itself (the idempotent producer never expires a batch, fetches and commits retry,
the group consumer re-joins when its session expired meanwhile); what still fails while the broker
is away (:func:`fx_kafka.retry.broker_unavailable`: a send that timed out waiting for metadata, a
lost ``accepted`` ack, a commit, a poll, a stream read) is retried with backoff, counted in
``<prefix>_broker_retries_total{op}`` and logged as ``broker unavailable``
(:mod:`fx_node.producer`). A retried send may put a record on the log twice (the holder merges
the first answer). A commit that fails is left to the next poll: the offset is settled, only its
commit waits, and a request whose commit was lost is read again.

Shutdown (SIGTERM): stop reading, let the runner finish what is in flight within
``shutdown_grace_s`` (:meth:`~fx_node.runner.Runner.drain`), commit, close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from broker_schema import DecodeError, topics
from broker_schema.codec import encode
from broker_schema.fast_codec import decode as decode_fast
from broker_schema.fast_codec import encode as encode_fast
from broker_schema.records import AcceptedRecord, EffectRequest, FactsRecord
from broker_schema.signatures import HOLDER_SIG_HEADER
from fx_kafka.client import (
    MIRROR_OFFSET_HEADER,
    header_value,
    make_consumer,
    mirror_header,
    wait_ready,
)
from fx_kafka.retry import broker_unavailable
from fx_kafka.workload import ensure_system_topics
from fx_node.admission import OffsetTracker, holder_problem, renewal_due, renewed
from fx_node.facts import facts_changed
from fx_node.identity import NodeIdentity
from fx_node.producer import BrokerWait, ResilientProducer
from fx_node.routing import ROUTING_CHECK_S, routing_for
from fx_node.runner import NodeMetrics, NodeSettings, PreparedRead, Read, Runner
from fx_node.sync import ClaimsSpecReader, catch_up

__all__ = ["NodeShell", "finish"]


class NodeShell:
    """One node's shell. :meth:`attach` a runner, then ``await run()`` until
    :meth:`request_stop` (or SIGTERM in the CLI)."""

    def __init__(self, settings: NodeSettings, *, identity: NodeIdentity, metrics: NodeMetrics,
                 log: logging.Logger) -> None:
        self.settings = settings
        self.identity = identity
        self.metrics = metrics
        self.log = log
        self.wait = BrokerWait(metrics.broker_retries, log)
        self.producer = ResilientProducer(settings.bootstrap, wait=self.wait,
                                          grace_s=settings.shutdown_grace_s,
                                          max_batch_size=settings.producer_batch_bytes)
        self.trackers = {kind: OffsetTracker() for kind in settings.kinds}
        self.consumers: dict[str, AIOKafkaConsumer] = {}
        #: Offset look-ups go through a consumer that fetches nothing: on a consumer with an
        #: assignment, a ListOffsets request queues behind the in-flight long-poll fetch on the
        #: same connection and waits up to fetch_max_wait_ms (500 ms) for it.
        self.probe: AIOKafkaConsumer | None = None
        self._side: AIOKafkaConsumer | None = None
        self._sync: ClaimsSpecReader | None = None
        #: the latest ``accepted`` of each request in flight (renewed by _lease_renewer)
        self.leases: dict[str, AcceptedRecord] = {}
        #: how often the renewer looks: often enough for the shortest lease in sight
        self.renew_check_s = 0.2
        #: how often the facts are built again to see whether they changed (_facts_ticker)
        self.facts_check_s = 1.0
        self._runner: Runner | None = None
        #: ``prepared(kind, msg)``: what the runner prepared for a record before it was read
        #: committed (the executor's speculative reads), or None; set by the runner
        self.prepared: Callable[[str, Any], Awaitable[PreparedRead | None]] | None = None
        self._consume_tasks: list[asyncio.Task[Any]] = []
        self._misc_tasks: list[asyncio.Task[Any]] = []
        self.background: set[asyncio.Task[Any]] = set()
        self._http_task: asyncio.Task[Any] | None = None
        self._http: Any = None  # fx_node.http.UvicornServer, imported with HTTP only
        self._stop = asyncio.Event()
        self.stopping = False
        self.fatal: BaseException | None = None
        #: the last published facts
        self.facts: FactsRecord | None = None
        self._started = False

    def attach(self, runner: Runner) -> None:
        """The runner this shell serves with (before :meth:`start`)."""
        self._runner = runner

    @property
    def runner(self) -> Runner:
        """The attached runner."""
        assert self._runner is not None, "NodeShell.attach(runner) first"
        return self._runner

    # ------------------------------------------------------------------------------ lifecycle
    @property
    def http_port(self) -> int | None:
        """The bound HTTP port (after start), or None without HTTP."""
        return self._http.port if self._http else None

    async def start(self) -> None:
        """Connect, create system topics, start the runner, publish facts, start consuming."""
        cfg = self.settings
        await wait_ready(cfg.bootstrap, 30.0)
        await ensure_system_topics(cfg.bootstrap)
        await self.producer.start()
        self.probe = make_consumer(cfg.bootstrap, isolation_level="read_uncommitted")
        await self.probe.start()
        self._side = make_consumer(cfg.bootstrap, isolation_level="read_uncommitted")
        await self._side.start()
        runner = self.runner
        self._sync = ClaimsSpecReader(runner.state, self._side, self.probe,
                                      on_undecodable=runner.claim_undecodable,
                                      on_rejected=runner.claim_refused)
        await runner.start()
        await self.publish_facts(force=True)
        for kind in cfg.kinds:
            strategy, routing = routing_for(self, kind)  # by model, or round robin
            consumer = make_consumer(
                cfg.bootstrap, group_id=cfg.group_ids[kind],
                metadata_max_age_ms=cfg.metadata_max_age_ms,
                session_timeout_ms=cfg.session_timeout_ms,
                heartbeat_interval_ms=cfg.heartbeat_interval_ms, max_poll_interval_ms=300_000,
                client_id=f"{cfg.node_id}.{kind}", partition_assignment_strategy=strategy)
            await consumer.start()
            consumer.subscribe(pattern=cfg.topic_pattern, listener=_Listener(self, kind, consumer))
            self.consumers[kind] = consumer
            self._consume_tasks.append(asyncio.create_task(self._consume(kind, consumer)))
            if routing is not None:
                self._misc_tasks.append(asyncio.create_task(routing.watch(consumer,
                                                                          ROUTING_CHECK_S)))
        self._misc_tasks.append(asyncio.create_task(self._facts_ticker()))
        self._misc_tasks.append(asyncio.create_task(self._lease_renewer()))
        if cfg.http_port is not None:
            from fx_node.http import UvicornServer, create_app

            self._http = UvicornServer(create_app(self, title=cfg.http_title), cfg.http_host,
                                       cfg.http_port)
            self._http_task = asyncio.create_task(self._http.server.serve())
            for _ in range(100):
                if self._http.server.started:
                    break
                await asyncio.sleep(0.02)
        self._started = True
        runner.started()

    def request_stop(self) -> None:
        """Ask :meth:`run` to shut down gracefully (safe from a signal handler)."""
        self._stop.set()

    async def run(self) -> None:
        """Start, serve until :meth:`request_stop` or a fatal error, then shut down."""
        try:
            await self.start()
            watch = asyncio.create_task(self._stop.wait())
            tasks = [*self._consume_tasks, *self.runner.tasks(), *self._misc_tasks]
            await asyncio.wait([watch, *tasks], return_when=asyncio.FIRST_COMPLETED)
            watch.cancel()
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    self.fatal = self.fatal or task.exception()
        finally:
            await self.stop()
        if self.fatal is not None:
            raise self.fatal

    async def stop(self) -> None:
        """Graceful shutdown (see the module docstring). Idempotent."""
        if self.stopping:
            return
        self.stopping = self.producer.stopping = True
        await finish(self._consume_tasks, timeout=5.0)
        if self._runner is not None:
            await self._runner.drain()
        await finish(self._misc_tasks, timeout=0.0)
        for kind, consumer in self.consumers.items():
            with contextlib.suppress(KafkaError, IllegalStateError, CommitFailedError):
                await self._commit(kind, consumer)
            await consumer.stop()
        for c in (self._side, self.probe):
            if c is not None:
                with contextlib.suppress(KafkaError):
                    await c.stop()
        if self._runner is not None:
            await self._runner.close()
        await self.producer.close(self.settings.producer_close_s)
        if self._http is not None and self._http_task is not None:
            self._http.server.should_exit = True
            await finish([self._http_task], timeout=5.0)
        self.log.info("%s %s stopped", self.settings.name, self.settings.node_id)

    async def await_background(self) -> None:
        """Wait for every task :meth:`spawn` started."""
        if self.background:
            await asyncio.gather(*self.background, return_exceptions=True)

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        """Run ``coro`` as a tracked task: its failure is fatal (the node stops)."""
        task = asyncio.ensure_future(coro)
        self.background.add(task)

        def _done(t: asyncio.Future[Any]) -> None:
            self.background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self.log.error("%s task failed: %r", self.settings.task_label, t.exception())
                self.fatal = self.fatal or t.exception()
                self._stop.set()

        task.add_done_callback(_done)
        return task

    # ------------------------------------------------------------------------------ consuming
    async def _consume(self, kind: str, consumer: AIOKafkaConsumer) -> None:
        tracker = self.trackers[kind]
        failures = 0
        while not self.stopping:
            try:
                batch = await consumer.getmany(timeout_ms=200,
                                               max_records=self.settings.max_records)
                failures = 0
            except KafkaError as exc:
                if not broker_unavailable(exc):
                    raise
                failures += 1
                await self.wait("poll", kind, exc, failures)
                continue
            synced: set[str] = set()
            for tp, msgs in batch.items():
                for msg in msgs:
                    if self.stopping:
                        break
                    await self.handle(kind, tracker, tp, msg, synced)
            await self._commit(kind, consumer)

    async def _commit(self, kind: str, consumer: AIOKafkaConsumer) -> None:
        tracker = self.trackers[kind]
        owned = {(tp.topic, tp.partition): tp for tp in consumer.assignment()}
        todo = {k: v for k, v in tracker.committable().items() if k in owned}
        if not todo:
            return
        try:
            await consumer.commit({owned[k]: v for k, v in todo.items()})
        except (CommitFailedError, IllegalStateError) as exc:
            self.log.warning("commit of %s failed (rebalance?): %s", todo, exc)
            return
        except KafkaError as exc:
            if not broker_unavailable(exc):
                raise
            # the offsets stay unsettled-but-answered; the next poll commits them (or, after a
            # crash, their requests are read and handled again)
            self.metrics.broker_retries.labels("commit").inc()
            self.log.warning("broker unavailable committing %s: %r; the next poll retries",
                             todo, exc)
            return
        tracker.mark_committed(todo)

    async def handle(self, kind: str, tracker: OffsetTracker, tp: TopicPartition, msg: Any,
                     synced: set[str]) -> None:
        """One record read on ``.out`` (steps 1 to 3 of the module docstring)."""
        key = (tp.topic, tp.partition)
        tracker.track(key, msg.offset)
        runner = self.runner
        if mirror_header(getattr(msg, "headers", None), MIRROR_OFFSET_HEADER) is not None:
            # a site's request copied to this cluster by `fx mirror`: the site answered it (or
            # will); an answer here would be written into the read-only copy
            await runner.skipped(kind, msg, "mirrored_copy", "")
            tracker.done(key, msg.offset)
            return
        pre = await self.prepared(kind, msg) if self.prepared is not None else None
        try:
            # topic: a record of a kind that does not belong on .out (a claim, a response...) is
            # refused as ``wrong_stream``, recorded and counted like an undecodable one
            # (the msgspec fast path: the codec's record or error, broker_schema.fast_codec)
            record = pre.record if pre is not None else decode_fast(msg.value, topic=msg.topic)
        except DecodeError as exc:
            await runner.skipped(kind, msg, "undecodable", exc.detail, code=exc.code)
            tracker.done(key, msg.offset)
            return
        if not isinstance(record, EffectRequest):
            await runner.skipped(kind, msg, "not_a_request", record.kind)
            tracker.done(key, msg.offset)
            return
        if record.effect_kind != kind:
            await runner.skipped(kind, msg, "other_kind", record.effect_kind, request=record)
            tracker.done(key, msg.offset)
            return
        try:
            workload_id, shadow = topics.request_topic(msg.topic)
        except ValueError:
            tracker.done(key, msg.offset)
            return
        if record.header.workload_id != workload_id or record.header.shadow != shadow:
            what = (f"shadow evaluation {record.header.shadow} of " if record.header.shadow
                    else "")
            await runner.skipped(
                kind, msg, "wrong_workload",
                f"request for {what}workload {record.header.workload_id} on {msg.topic}",
                request=record)
            tracker.done(key, msg.offset)
            return
        sync_key = workload_id if shadow is None else f"{workload_id}/{shadow}"
        if pre is not None and pre.synced:
            # caught up after this request was appended (while its transaction was open: no
            # later epoch can be claimed before it ends), and its holder checked then
            not_holders = pre.holder_problem
        else:
            if sync_key not in synced:
                await self.sync_workload(workload_id, shadow=shadow)
                synced.add(sync_key)
            not_holders = holder_problem(runner.state, record, msg.value,
                                         header_value(getattr(msg, "headers", None),
                                                      HOLDER_SIG_HEADER))
        if not_holders is not None:
            # a request its epoch's holder did not sign (front-running): never run, recorded
            await runner.skipped(kind, msg, "not_holder", not_holders, request=record)
            tracker.done(key, msg.offset)
            return
        await runner.handle(Read(kind, msg, record, workload_id, shadow, tracker, pre))

    # ------------------------------------------------------------------------------ claims, spec
    async def sync_workload(self, workload_id: str, *, shadow: str | None = None,
                            attempt_s: float = 15.0, max_backoff_s: float = 10.0) -> None:
        """Read ``.claims`` and ``.spec`` of ``workload_id`` (and the ``.eval`` of its shadow
        evaluation ``shadow``) up to their end offsets now, retried until it succeeds
        (:func:`fx_node.sync.catch_up`): while it retries, this partition's request stays
        unsettled (never committed), so a restart reads it again."""
        await catch_up(self.sync_read, workload_id, shadow,
                       on_failure=self.metrics.sync_failures.inc, attempt_s=attempt_s,
                       max_backoff_s=max_backoff_s)

    async def sync_read(self, workload_id: str, shadow: str | None = None) -> None:
        """One catch-up attempt (:meth:`fx_node.sync.ClaimsSpecReader.read`)."""
        assert self._sync is not None
        await self._sync.read(workload_id, shadow)

    # ------------------------------------------------------------------------------ writing
    async def accept(self, accepted: AcceptedRecord) -> tuple[
            asyncio.Future[Any], int, tuple[str, bytes, bytes]]:
        """Put ``accepted`` on the producer (to the request's ``.resp``) and keep its lease:
        ``(ack, producer generation, (topic, value, key))`` (see
        :meth:`fx_node.producer.ResilientProducer.written`)."""
        record = (topics.resp_for(accepted.header.workload_id, accepted.header.shadow),
                  encode_fast(accepted), accepted.effect_id.encode())
        gen = self.producer.gen
        ack = await self.producer.send_accepted(*record)
        self.leases[accepted.effect_id] = accepted
        return ack, gen, record

    async def _lease_renewer(self) -> None:
        """Keep the requests in flight alive: while one is accepted and not yet answered, its
        ``accepted`` is written again each third of its lease
        (:func:`fx_node.admission.renewal_due`), so a long request (an LLM generation on a busy
        node) is not written ``unknown`` by the holder while it still runs. A renewal the broker
        refuses is retried on the next round."""
        while True:
            await asyncio.sleep(self.renew_check_s)
            now_us = time.time_ns() // 1000
            in_flight = self.runner.state.in_flight
            for effect_id, accepted in list(self.leases.items()):
                if effect_id not in in_flight:
                    self.leases.pop(effect_id, None)
                    continue
                if not renewal_due(accepted, now_us):
                    continue
                fresh = renewed(accepted, now_us)
                try:
                    topic = topics.resp_for(fresh.header.workload_id, fresh.header.shadow)
                    await self.producer.produce("accepted", topic, encode_fast(fresh),
                                                effect_id.encode())
                except KafkaError as exc:
                    self.log.warning("lease renewal of %s not written: %r", effect_id, exc)
                    continue
                if effect_id in in_flight:
                    self.leases[effect_id] = fresh
                self.metrics.lease_renewals.inc()
                self.log.debug("%s lease renewed", effect_id)

    # ------------------------------------------------------------------------------ facts
    async def publish_facts(self, *, force: bool = False) -> None:
        """Write the runner's facts to ``sys.facts`` when they changed (always with ``force``)."""
        facts = self.runner.facts()
        if not force and not facts_changed(self.facts, facts):
            return
        self.facts = facts
        await self.producer.produce("facts", topics.FACTS, encode(facts),
                                    self.settings.node_id.encode())

    async def _facts_ticker(self) -> None:
        """Facts on change: every ``facts_check_s`` the runner's facts are built again and
        written when they changed (a model imported into the store with ``fx models import``
        is on ``sys.facts`` within about a second, for holders and spec writers to see); and
        every ``facts_interval_s`` (0: never) written anyway, so a live node stays live."""
        interval = self.settings.facts_interval_s
        loop = asyncio.get_running_loop()
        due = loop.time() + interval
        while True:
            await asyncio.sleep(self.facts_check_s)
            forced = interval > 0 and loop.time() >= due
            if forced:
                due = loop.time() + interval
            await self.publish_facts(force=forced)

    # ------------------------------------------------------------------------------ HTTP view
    def is_live(self) -> bool:
        """The loops run and nothing fatal happened."""
        return self._started and not self.stopping and self.fatal is None

    async def readiness(self) -> dict[str, Any]:
        """Ready: started, the broker answers a metadata request, and the runner is ready."""
        broker_ok = False
        if not self.stopping:
            broker_ok = await self.producer.broker_answers()
        runner_ok, reasons = self.runner.readiness()
        return {"ready": self._started and broker_ok and runner_ok, "broker": broker_ok,
                **reasons}

    def current_facts(self) -> dict[str, Any] | None:
        """The last published facts as JSON."""
        return None if self.facts is None else self.facts.model_dump(mode="json")

    def metrics_text(self) -> bytes:
        """Prometheus text (the runner's gauges refreshed first)."""
        self.runner.refresh_gauges()
        return self.metrics.render()


async def finish(tasks: list[asyncio.Task[Any]], *, timeout: float) -> None:
    """Let ``tasks`` end by themselves for ``timeout`` seconds, then cancel what is left."""
    if not tasks:
        return
    if timeout > 0:
        await asyncio.wait(tasks, timeout=timeout)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """On revoke: wait (bounded) for in-flight requests of the revoked partitions, commit them,
    then forget them, so the next owner starts after what this member answered."""

    def __init__(self, node: NodeShell, kind: str, consumer: AIOKafkaConsumer) -> None:
        self.node, self.kind, self.consumer = node, kind, consumer

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in revoked]
        if not keys:
            return
        tracker = self.node.trackers[self.kind]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.node.settings.revoke_grace_s
        while tracker.pending_in(keys) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        todo = {k: v for k, v in tracker.committable().items() if k in set(keys)}
        if todo:
            try:
                await self.consumer.commit(
                    {TopicPartition(t, p): off for (t, p), off in todo.items()}
                )
                tracker.mark_committed(todo)
            except (CommitFailedError, IllegalStateError, KafkaError) as exc:
                self.node.log.warning("commit on revoke failed: %s", exc)
        tracker.forget(keys)
        self.node.log.info("%s: partitions revoked: %s", self.kind, sorted(keys))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self.node.log.info("%s: partitions assigned: %s", self.kind, sorted(
            (tp.topic, tp.partition) for tp in assigned))
