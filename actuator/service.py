"""The actuator gateway service: a thin aiokafka shell around :mod:`actuator.core`.

Per actuation kind served, one consumer in group ``<group_prefix>.<kind>`` subscribed by pattern
to ``wl.*.out`` (like the executor). For every request read: catch up on the workload's
``.claims`` and ``.spec`` (:mod:`fx_node.sync`), ask :func:`actuator.core.decide`, then

- a refusal (or a done at-most-once command read again): one signed response;
- a command: ``accepted`` (acks=all), then, under the device's lock, what the guarantee says to
  remember first (an at-most-once ``attempt``, a fenced device's raised epoch; acks=all, on
  ``sys.actuator.<node>``), the Modbus write and its read-back, what to remember after
  (``done`` / ``cleared``), and the signed response (acks=all). Only then is the request's offset
  settled and committed.

A restart (kill -9 at any point) reads every request whose offset was not committed again.
Idempotent and fenced commands are simply run again (a set-point repeated is harmless; the epoch
check still applies). An at-most-once command is looked up in the memory read back at start:
``done`` is answered again from memory without touching the device, an ``attempt`` without
``done`` is left unanswered (the device may have acted and nobody knows): its lease lapses, the
lease holder writes ``unknown`` and, for an at-most-once kind, an alarm. A write whose answer
never came (a timeout, a dropped connection) is the same case for at-most-once; for idempotent
and fenced kinds it is written again (twice more at most) and then, still in doubt, left to the
lease the same way. The gateway never writes ``unknown`` itself: it answers only what it knows.

SIGTERM: stop reading, let commands in flight finish for ``shutdown_grace_s`` (a command is never
abandoned half-way by the gateway itself), then stop; what is still waiting for its device
gets no answer and its lease decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from pydantic import JsonValue

from actuator.config import CrashPoint, GatewayConfig
from actuator.core import (
    Execute,
    GatewayState,
    Leave,
    Reanswer,
    decide,
    device_error,
    memory_verdict,
    remember_after,
    remember_before,
    remembered_response,
    written_response,
)
from actuator.device import InDoubt, ModbusDevice
from actuator.metrics import GatewayMetrics
from broker_schema import DecodeError, topics
from broker_schema.codec import decode, encode, request_hash
from broker_schema.records import (
    AcceptedRecord,
    ActuatorMemoryRecord,
    EffectRequest,
    InlineBody,
    InputRecord,
    ResponseRecord,
)
from broker_schema.signatures import HOLDER_SIG_HEADER
from fx_kafka.client import (
    create_topics,
    header_value,
    make_consumer,
    make_producer,
    read_partition,
    wait_ready,
)
from fx_kafka.retry import backoff_s, broker_unavailable
from fx_kafka.workload import ensure_system_topics
from fx_node.admission import (
    Ignore,
    OffsetTracker,
    Refuse,
    holder_problem,
    renewal_due,
    renewed,
)
from fx_node.errors import OutcomeError
from fx_node.facts import build_facts, facts_changed
from fx_node.identity import NodeIdentity
from fx_node.sync import ClaimsSpecReader, catch_up

__all__ = ["GatewayService"]

log = logging.getLogger(__name__)

#: Writes of an idempotent or fenced set-point whose answer never came, before giving up (the
#: lease then decides).
IN_DOUBT_WRITES = 3


def _now_us() -> int:
    return time.time_ns() // 1000


class GatewayService:
    """One actuator gateway node. ``await run()`` until :meth:`request_stop`."""

    def __init__(self, config: GatewayConfig, *, identity: NodeIdentity | None = None) -> None:
        self.config = config
        self.identity = identity or NodeIdentity.load_or_create(config.key_file,
                                                                config.key_type)
        self.state = GatewayState(config)
        self.devices = {name: ModbusDevice(name, cfg) for name, cfg in config.devices.items()}
        self.metrics = GatewayMetrics()
        self._trackers = {kind: OffsetTracker() for kind in config.kinds}
        self._consumers: dict[str, AIOKafkaConsumer] = {}
        self._producer: AIOKafkaProducer | None = None
        self._side: AIOKafkaConsumer | None = None
        self._probe: AIOKafkaConsumer | None = None
        self._sync: ClaimsSpecReader | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._commands: set[asyncio.Task[Any]] = set()
        self._leases: dict[str, AcceptedRecord] = {}
        self._stop = asyncio.Event()
        self._stopping = False
        self._started = False
        self._fatal: BaseException | None = None
        self._facts: Any = None
        self._http: Any = None
        self._http_task: asyncio.Task[Any] | None = None

    # ------------------------------------------------------------------------------ lifecycle
    @property
    def http_port(self) -> int | None:
        """The bound HTTP port (after start), or None without HTTP."""
        return self._http.port if self._http else None

    async def start(self) -> None:
        """Connect, read the memory back, publish facts, start consuming."""
        cfg = self.config
        # pymodbus logs every frame at DEBUG (fx -v); its warnings and errors still show
        logging.getLogger("pymodbus").setLevel(max(logging.INFO, log.getEffectiveLevel()))
        await wait_ready(cfg.bootstrap, 30.0)
        await ensure_system_topics(cfg.bootstrap)
        await create_topics(cfg.bootstrap, [cfg.memory_topic], compacted=True)
        self._producer = make_producer(cfg.bootstrap)
        await self._producer.start()
        self._probe = make_consumer(cfg.bootstrap, isolation_level="read_uncommitted")
        await self._probe.start()
        self._side = make_consumer(cfg.bootstrap, isolation_level="read_uncommitted")
        await self._side.start()
        self._sync = ClaimsSpecReader(self.state.base, self._side, self._probe,
                                      on_undecodable=lambda code: None)
        await self._load_memory()
        await self._publish_facts(force=True)
        for kind in cfg.kinds:
            consumer = make_consumer(
                cfg.bootstrap, group_id=cfg.group_id(kind),
                metadata_max_age_ms=cfg.metadata_max_age_ms,
                session_timeout_ms=cfg.session_timeout_ms,
                heartbeat_interval_ms=cfg.heartbeat_interval_ms,
                client_id=f"{cfg.node_id}.{kind}",
                partition_assignment_strategy=(RoundRobinPartitionAssignor,))
            await consumer.start()
            consumer.subscribe(pattern=cfg.topic_pattern, listener=_Listener(self, kind))
            self._consumers[kind] = consumer
            self._tasks.append(asyncio.create_task(self._consume(kind, consumer)))
        self._tasks.append(asyncio.create_task(self._lease_renewer()))
        if cfg.facts_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._facts_ticker()))
        for entry in cfg.telemetry:
            self._tasks.append(asyncio.create_task(
                self._telemetry(entry.device, entry.workload_id, entry.interval_s)))
        if cfg.http_port is not None:
            from fx_node.http import UvicornServer, create_app

            self._http = UvicornServer(create_app(self, title="ninelives-fx actuator gateway"),
                                       cfg.http_host, cfg.http_port)
            self._http_task = asyncio.create_task(self._http.server.serve())
            for _ in range(100):
                if self._http.server.started:
                    break
                await asyncio.sleep(0.02)
        self._started = True
        log.info("actuator gateway %s serving %s on %s, devices %s, memory %s (%d effects), "
                 "http port %s", cfg.node_id, cfg.guarantees, cfg.bootstrap, sorted(self.devices),
                 cfg.memory_topic, len(self.state.memory.attempts), self.http_port)

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop (safe from a signal handler)."""
        self._stop.set()

    async def run(self) -> None:
        """Start, serve until :meth:`request_stop` or a fatal error, then stop."""
        try:
            await self.start()
            watch = asyncio.create_task(self._stop.wait())
            await asyncio.wait([watch, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
            watch.cancel()
            for task in self._tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    self._fatal = self._fatal or task.exception()
        finally:
            await self.stop()
        if self._fatal is not None:
            raise self._fatal

    async def stop(self) -> None:
        """Stop reading, let commands in flight finish (``shutdown_grace_s``), close. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        if self._commands:
            await asyncio.wait(list(self._commands), timeout=self.config.shutdown_grace_s)
        for task in [*self._tasks, *self._commands]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._commands, return_exceptions=True)
        for kind, consumer in self._consumers.items():
            with contextlib.suppress(KafkaError, IllegalStateError, CommitFailedError):
                await self._commit(kind, consumer)
            await consumer.stop()
        for c in (self._side, self._probe):
            if c is not None:
                with contextlib.suppress(KafkaError):
                    await c.stop()
        for device in self.devices.values():
            device.close()
        if self._producer is not None:
            with contextlib.suppress(KafkaError, TimeoutError):
                await asyncio.wait_for(self._producer.stop(), 10.0)
        if self._http is not None and self._http_task is not None:
            self._http.server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._http_task, 5.0)
        log.info("actuator gateway %s stopped", self.config.node_id)

    def _crash(self, point: CrashPoint) -> None:
        """Fault injection (``crash_at``, tests only): SIGKILL this process at ``point``."""
        if self.config.crash_at == point:
            log.error("crash_at=%s: killing this gateway (SIGKILL)", point)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._commands.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._commands.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("gateway task failed: %r", t.exception())
                self._fatal = self._fatal or t.exception()
                self._stop.set()

        task.add_done_callback(done)

    # ------------------------------------------------------------------------------ producing
    async def _produce(self, op: str, topic: str, value: bytes | None, key: bytes) -> Any:
        """``send_and_wait`` (acks=all) that rides out a broker outage with backoff; any other
        failure goes up (the service stops rather than guess an outcome)."""
        assert self._producer is not None
        attempt = 0
        while True:
            try:
                return await self._producer.send_and_wait(topic, value=value, key=key)
            except KafkaError as exc:
                if not broker_unavailable(exc) or self._stopping:
                    raise
                attempt += 1
                self.metrics.broker_retries.labels(op).inc()
                log.warning("broker unavailable (%s to %s, retry %d): %r", op, topic, attempt,
                            exc)
                await asyncio.sleep(backoff_s(attempt))

    # ------------------------------------------------------------------------------ memory
    async def _load_memory(self) -> None:
        """Read ``sys.actuator.<node>`` back: every effect id attempted, every epoch."""
        consumer = make_consumer(self.config.bootstrap, isolation_level="read_uncommitted")
        await consumer.start()
        try:
            read = await read_partition(consumer, self.config.memory_topic, timeout=60.0)
        finally:
            await consumer.stop()
        for offset, _time_ms, value in read.records:
            try:
                record = decode(value, topic=self.config.memory_topic)
            except DecodeError as exc:
                log.error("undecodable memory record at %s@%d: %s", self.config.memory_topic,
                          offset, exc)
                continue
            if isinstance(record, ActuatorMemoryRecord):
                self.state.memory.observe(record)
        self.metrics.remembered.set(len(self.state.memory.attempts))

    async def _remember(self, records: Iterable[ActuatorMemoryRecord]) -> None:
        """Write ``records`` to the memory topic (acks=all), then take them in."""
        for record in records:
            await self._produce("memory", self.config.memory_topic, encode(record),
                                record.key().encode())
            self.state.memory.observe(record)
            self.metrics.memory_writes.labels(record.entry).inc()
        self.metrics.remembered.set(len(self.state.memory.attempts))

    # ------------------------------------------------------------------------------ consuming
    async def _consume(self, kind: str, consumer: AIOKafkaConsumer) -> None:
        tracker = self._trackers[kind]
        failures = 0
        while not self._stop.is_set():
            try:
                batch = await consumer.getmany(timeout_ms=200, max_records=100)
                failures = 0
            except KafkaError as exc:
                if not broker_unavailable(exc):
                    raise
                failures += 1
                await asyncio.sleep(backoff_s(failures))
                continue
            synced: set[str] = set()
            for tp, msgs in batch.items():
                for msg in msgs:
                    if self._stop.is_set():
                        break
                    await self._handle(kind, tracker, tp, msg, synced)
            await self._commit(kind, consumer)

    async def _commit(self, kind: str, consumer: AIOKafkaConsumer) -> None:
        tracker = self._trackers[kind]
        owned = {(tp.topic, tp.partition): tp for tp in consumer.assignment()}
        todo = {k: v for k, v in tracker.committable().items() if k in owned}
        if not todo:
            return
        try:
            await consumer.commit({owned[k]: v for k, v in todo.items()})
        except (CommitFailedError, IllegalStateError) as exc:
            log.warning("commit of %s failed (rebalance?): %s", todo, exc)
            return
        except KafkaError as exc:
            if not broker_unavailable(exc):
                raise
            self.metrics.broker_retries.labels("commit").inc()
            return
        tracker.mark_committed(todo)

    async def _handle(self, kind: str, tracker: OffsetTracker, tp: TopicPartition, msg: Any,
                      synced: set[str]) -> None:
        key = (tp.topic, tp.partition)
        tracker.track(key, msg.offset)
        try:
            record = decode(msg.value, topic=msg.topic)
        except DecodeError:  # the executors record it on sys.rejects; nothing for a device
            tracker.done(key, msg.offset)
            self.metrics.ignored.labels("undecodable").inc()
            return
        if not isinstance(record, EffectRequest) or record.effect_kind != kind:
            tracker.done(key, msg.offset)
            return
        try:
            workload_id, shadow = topics.request_topic(msg.topic)
        except ValueError:
            tracker.done(key, msg.offset)
            return
        if record.header.workload_id != workload_id or record.header.shadow != shadow:
            self.metrics.ignored.labels("wrong_workload").inc()
            tracker.done(key, msg.offset)
            return
        if workload_id not in synced:
            assert self._sync is not None
            await catch_up(self._sync.read, workload_id, shadow,
                           on_failure=self.metrics.sync_failures.inc)
            synced.add(workload_id)
        if holder_problem(self.state.base, record, msg.value,
                          header_value(getattr(msg, "headers", None),
                                       HOLDER_SIG_HEADER)) is not None:
            # a command its epoch's holder did not sign (front-running): never acted on
            log.warning("ignoring %s at %s@%d: not signed by its epoch's holder",
                        record.effect_id, msg.topic, msg.offset)
            self.metrics.ignored.labels("not_holder").inc()
            tracker.done(key, msg.offset)
            return
        now_ns = time.time_ns()
        decision = decide(self.state, record, topic=msg.topic, partition=msg.partition,
                          offset=msg.offset, append_ms=msg.timestamp,
                          now_ms=now_ns // 1_000_000, now_us=now_ns // 1000,
                          request_hash=request_hash(msg.value))
        read_mono = time.monotonic()
        if isinstance(decision, Leave):  # in doubt since before a restart: its lease decides
            self.metrics.in_doubt.labels(kind).inc()
            log.warning("%s", decision.reason)
            tracker.done(key, msg.offset)
        elif isinstance(decision, Ignore):
            self.metrics.ignored.labels("in_flight" if record.effect_id in
                                        self.state.base.in_flight else "not_served").inc()
            job = self.state.base.in_flight.get(record.effect_id)
            if job is None or (job.topic, job.partition, job.request_offset) != (
                    msg.topic, msg.partition, msg.offset):
                tracker.done(key, msg.offset)
        elif isinstance(decision, Refuse | Reanswer):
            self._spawn(self._respond(decision.response, kind, key, tracker, read_mono))
        elif isinstance(decision, Execute):
            self._crash("before_accept")
            accepted = decision.accepted.accepted
            topic = topics.resp(workload_id)
            assert self._producer is not None
            ack = await self._producer.send(topic, value=encode(accepted),
                                            key=accepted.effect_id.encode())
            self._leases[accepted.effect_id] = accepted
            self._spawn(self._execute(decision, kind, key, tracker, ack, read_mono))

    async def _respond(self, response: ResponseRecord, kind: str, key: tuple[str, int],
                       tracker: OffsetTracker, read_mono: float) -> None:
        """Sign and write ``response`` (acks=all); then its request's offset is settled."""
        value = self.identity.sign_and_encode(response)
        await self._produce("response", topics.resp(response.header.workload_id),
                            value, response.effect_id.encode())
        code = response.error.code if response.error else ""
        self.metrics.requests.labels(kind, response.outcome, code).inc()
        self.metrics.command_seconds.labels(kind).observe(time.monotonic() - read_mono)
        log.info("%s %s %s", response.effect_id, response.outcome, code)
        self._crash("after_response")
        tracker.done(key, response.request_offset)

    # ------------------------------------------------------------------------------ commands
    async def _execute(self, ex: Execute, kind: str, key: tuple[str, int],
                       tracker: OffsetTracker, ack: asyncio.Future[Any],
                       read_mono: float) -> None:
        job, command = ex.job, ex.command
        device = self.devices[command.device]
        try:
            await ack  # accepted is acknowledged before anything reaches the device
        except KafkaError:
            self.state.base.finish(job.effect_id)
            raise
        self._crash("after_accept")
        async with device.lock:
            response = await self._run_command(ex, device)
        if not self.state.base.finish(job.effect_id):
            return
        if response is None:  # in doubt: left to its lease (unknown, and an alarm)
            self.metrics.in_doubt.labels(kind).inc()
            tracker.done(key, job.request_offset)
            return
        await self._respond(response, kind, key, tracker, read_mono)

    async def _run_command(self, ex: Execute, device: ModbusDevice) -> ResponseRecord | None:
        """Under the device's lock: judge the memory again, remember, write, read back,
        remember. The response to write, or None when the device may have acted and nobody
        knows (no answer: the lease decides)."""
        job, command, guarantee = ex.job, ex.command, ex.guarantee
        state = self.state
        started_us = _now_us()
        verdict = memory_verdict(state.memory, job.request, command, guarantee)
        if verdict[0] == "refuse":
            return device_error(state, job, verdict[1], verdict[2], started_us=started_us,
                                finished_us=_now_us())
        if verdict[0] == "reanswer":
            return remembered_response(state, job.request, job.request_offset, verdict[1],
                                       started_us, request_hash=job.request_hash)
        if verdict[0] == "leave":
            log.warning("%s", verdict[1])
            return None
        await self._remember(remember_before(state, job, command, guarantee, started_us))
        self._crash("after_attempt")
        writes = 1 if guarantee == "at-most-once" else IN_DOUBT_WRITES
        for attempt in range(1, writes + 1):
            try:
                await device.write(command.register, command.value)
                break
            except OutcomeError as exc:  # unreachable or refused: the device did not change
                self.metrics.device_writes.labels(command.device, exc.code.removeprefix(
                    "device_")).inc()
                response = device_error(state, job, exc.code, exc.message,
                                        started_us=started_us, finished_us=_now_us())
                await self._remember(remember_after(state, job, command, guarantee, response,
                                                    changed=False, now_us=_now_us()))
                return response
            except InDoubt as exc:
                self.metrics.device_writes.labels(command.device, "in_doubt").inc()
                log.warning("%s (%s, write %d of %d)", exc, guarantee, attempt, writes)
                if attempt == writes:
                    log.error("%s: left in doubt; its lease decides (unknown%s)",
                              job.effect_id, ", alarm" if guarantee == "at-most-once" else "")
                    return None
                await asyncio.sleep(backoff_s(attempt))
        self.metrics.device_writes.labels(command.device, "ok").inc()
        read_back = await device.read(command.register)
        self._crash("after_write")
        response = written_response(state, job, command, read_back=read_back,
                                    started_us=started_us, finished_us=_now_us())
        await self._remember(remember_after(state, job, command, guarantee, response,
                                            changed=True, now_us=_now_us()))
        return response

    async def _lease_renewer(self) -> None:
        """While a command is in flight, write its ``accepted`` again each third of its lease
        (:func:`fx_node.admission.renewal_due`), as the executor does."""
        while True:
            await asyncio.sleep(0.2)
            now_us = _now_us()
            for effect_id, accepted in list(self._leases.items()):
                if effect_id not in self.state.base.in_flight:
                    self._leases.pop(effect_id, None)
                    continue
                if not renewal_due(accepted, now_us):
                    continue
                fresh = renewed(accepted, now_us)
                try:
                    await self._produce("accepted", topics.resp(fresh.header.workload_id),
                                        encode(fresh), effect_id.encode())
                except KafkaError as exc:
                    log.warning("lease renewal of %s not written: %r", effect_id, exc)
                    continue
                if effect_id in self.state.base.in_flight:
                    self._leases[effect_id] = fresh
                self.metrics.lease_renewals.inc()

    # ------------------------------------------------------------------------------ telemetry
    async def _telemetry(self, name: str, workload_id: str, interval_s: float) -> None:
        """Append the device's set-point register to ``wl.<workload_id>.in`` every
        ``interval_s``: ``{"telemetry": {"device", "register", "value", "set_point"}}``, source
        ``telemetry:<node>/<device>`` (the read-back pattern reads it; docs/actuation.md)."""
        device = self.devices[name]
        cfg = self.config.devices[name]
        names = {v: k for k, v in cfg.values.items()}
        topic = topics.inputs(workload_id)
        while True:
            async with device.lock:
                value = await device.read(cfg.address)
            if value is None:
                self.metrics.telemetry.labels(name, "unreadable").inc()
            else:
                point: JsonValue = names.get(value, value)
                body: JsonValue = {"telemetry": {"device": name, "register": cfg.address,
                                                 "value": value, "set_point": point}}
                record = InputRecord(workload_id=workload_id, body=InlineBody.of_json(body),
                                     source=f"telemetry:{self.config.node_id}/{name}")
                try:
                    await self._produce("telemetry", topic, encode(record), name.encode())
                    self.metrics.telemetry.labels(name, "ok").inc()
                except KafkaError as exc:
                    self.metrics.telemetry.labels(name, "not_written").inc()
                    log.warning("telemetry of %s to %s not written: %r", name, topic, exc)
            await asyncio.sleep(interval_s)

    # ------------------------------------------------------------------------------ facts
    def _build_facts(self) -> Any:
        return build_facts(
            node_id=self.config.node_id, queue_limits=self.config.queue_limits,
            models_present=(), models_loaded=(),
            engines={"pymodbus": self.state.device_info.engine_version}, accelerators=(),
            public_key_b64=self.identity.public_key_b64, key_id=self.identity.key_id,
            now_us=_now_us(), guarantees=self.config.guarantees)

    async def _publish_facts(self, *, force: bool = False) -> None:
        facts = self._build_facts()
        if not force and not facts_changed(self._facts, facts):
            return
        self._facts = facts
        await self._produce("facts", topics.FACTS, encode(facts), self.config.node_id.encode())

    async def _facts_ticker(self) -> None:
        while True:
            await asyncio.sleep(self.config.facts_interval_s)
            await self._publish_facts(force=True)

    # ------------------------------------------------------------------------------ HTTP view
    def is_live(self) -> bool:
        """The loops run and nothing fatal happened."""
        return self._started and not self._stopping and self._fatal is None

    async def readiness(self) -> dict[str, Any]:
        """Ready: started and the broker answers; each device's connection is reported."""
        broker_ok = False
        if self._producer is not None and not self._stopping:
            try:
                await asyncio.wait_for(self._producer.client.fetch_all_metadata(), 3.0)
                broker_ok = True
            except (KafkaError, OSError, TimeoutError):
                broker_ok = False
        return {"ready": self._started and broker_ok, "broker": broker_ok,
                "devices": {name: d.connected for name, d in sorted(self.devices.items())},
                "remembered_effects": len(self.state.memory.attempts)}

    def current_facts(self) -> dict[str, Any] | None:
        """The last published facts as JSON."""
        return None if self._facts is None else self._facts.model_dump(mode="json")

    def metrics_text(self) -> bytes:
        """Prometheus text (queue gauges refreshed first)."""
        for kind in self.config.kinds:
            self.metrics.queue_depth.labels(kind).set(self.state.base.queue_depth(kind))
        return self.metrics.render()


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """On revoke: wait (bounded) for commands of the revoked partitions, then forget them."""

    def __init__(self, service: GatewayService, kind: str) -> None:
        self.service, self.kind = service, kind

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in revoked]
        tracker = self.service._trackers[self.kind]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.service.config.shutdown_grace_s
        while keys and tracker.pending_in(keys) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        consumer = self.service._consumers.get(self.kind)
        if consumer is not None:
            with contextlib.suppress(KafkaError, IllegalStateError, CommitFailedError):
                await self.service._commit(self.kind, consumer)
        tracker.forget(keys)

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        log.info("%s: partitions assigned: %s", self.kind,
                 sorted((tp.topic, tp.partition) for tp in assigned))
