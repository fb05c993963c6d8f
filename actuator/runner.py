"""The actuator gateway's runner (:class:`DeviceRunner`): what the node's shell
(:mod:`fx_node.shell`) hands every request it read, and what the gateway decides and does with it
(:mod:`actuator.core`: the decisions; :mod:`actuator.device`: the Modbus device).

For every request the shell hands over (caught up on the workload's ``.claims`` and ``.spec``):
ask :func:`actuator.core.decide`, then

- a refusal (or a done at-most-once command read again): one signed response;
- a command: ``accepted`` (acks=all), then, under the device's lock, what the guarantee says to
  remember first (an at-most-once ``attempt``, a fenced device's raised epoch; acks=all, on
  ``sys.actuator.<node>``), the Modbus write and its read-back, what to remember after
  (``done`` / ``cleared``), and the signed response (acks=all). Only then is the request's offset
  settled and committed.

A restart (kill -9 at any point) reads every request whose offset was not committed again.
An idempotent command whose ``recent`` entry was remembered is answered again from memory without
touching the device; one without (killed before the device write, or after it and before the
entry) and fenced commands are run again (a set-point repeated is harmless; the epoch check
still applies). An at-most-once command is looked up in the memory read back at start:
``done`` is answered again from memory without touching the device, an ``attempt`` without ``done``
is left unanswered (the device may have acted and nobody knows): its lease lapses, the lease holder
writes ``unknown`` and, for an at-most-once kind, an alarm. A write whose answer never came (a
timeout, a dropped connection) is the same case for at-most-once; for idempotent and fenced kinds
it is written again (twice more at most) and then, still in doubt, left to the lease the same way.
Either way, a write the device did not confirm raises an alarm at once (``device_timeout``, on
``sys.alarms``) with the register read back from the device. The gateway never writes ``unknown``
itself: it answers only what it knows.

SIGTERM: the shell stops reading; commands in flight get ``shutdown_grace_s`` to finish (a
command is never abandoned half-way by the gateway itself), then the gateway stops; what is
still waiting for its device gets no answer and its lease decides.

Telemetry: each configured device's set-point register is appended to its workload's ``.in``
every ``interval_s``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Iterable
from typing import Any

from aiokafka.errors import KafkaError
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
    ActuatorMemoryRecord,
    AlarmRecord,
    DeviceReadBack,
    EffectRequest,
    FactsRecord,
    InlineBody,
    InputRecord,
    RejectCode,
    ResponseRecord,
)
from fx_kafka.client import create_topics, make_consumer, read_partition
from fx_kafka.retry import jittered_backoff_s
from fx_node.admission import ExecutorState, Ignore, Refuse
from fx_node.errors import OutcomeError
from fx_node.facts import build_facts
from fx_node.runner import Read, Skip
from fx_node.shell import NodeShell

__all__ = ["DEVICE_BACKOFF_CAP_S", "DEVICE_PROBE_S", "IN_DOUBT_WRITES", "DeviceRunner"]

log = logging.getLogger("actuator.service")

#: Writes of an idempotent or fenced set-point whose answer never came, before giving up (the
#: lease then decides).
IN_DOUBT_WRITES = 3
#: How often a reachable device is read to see that it still is (readiness), and the cap of
#: the backoff between reconnects to one that is not (:func:`fx_kafka.retry.jittered_backoff_s`,
#: from 0.5 s).
DEVICE_PROBE_S, DEVICE_BACKOFF_CAP_S = 2.0, 10.0


def _now_us() -> int:
    return time.time_ns() // 1000


class DeviceRunner:
    """The actuator gateway's :class:`fx_node.runner.Runner`: Modbus devices driven by the
    commands ``node`` reads, remembered on ``sys.actuator.<node>``."""

    def __init__(self, config: GatewayConfig, node: NodeShell, *,
                 metrics: GatewayMetrics) -> None:
        self.config = config
        self.node = node
        self.metrics = metrics
        self.gateway = GatewayState(config)
        self.devices = {name: ModbusDevice(name, cfg) for name, cfg in config.devices.items()}
        self._tasks: list[asyncio.Task[Any]] = []

    @property
    def state(self) -> ExecutorState:
        """The admission state under the gateway's (claims, specs, commands in flight)."""
        return self.gateway.base

    # ------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Create the memory topic, read the memory back, start the telemetry loops."""
        # pymodbus logs every frame at DEBUG (fx -v); its warnings and errors still show
        logging.getLogger("pymodbus").setLevel(max(logging.INFO, log.getEffectiveLevel()))
        await create_topics(self.config.bootstrap, [self.config.memory_topic], compacted=True)
        await self._load_memory()
        for name in self.devices:
            self._tasks.append(asyncio.create_task(self._watch_device(name)))
        for entry in self.config.telemetry:
            self._tasks.append(asyncio.create_task(
                self._telemetry(entry.device, entry.workload_id, entry.interval_s)))

    def tasks(self) -> list[asyncio.Task[Any]]:
        """The device watches and the telemetry loops."""
        return self._tasks

    def started(self) -> None:
        """Log the start line."""
        cfg = self.config
        log.info("actuator gateway %s serving %s on %s, devices %s, memory %s (%d effects), "
                 "http port %s", cfg.node_id, cfg.guarantees, cfg.bootstrap, sorted(self.devices),
                 cfg.memory_topic, len(self.gateway.memory.attempts), self.node.http_port)

    async def drain(self) -> None:
        """Let commands in flight finish (``shutdown_grace_s``), then cancel what is left."""
        commands = list(self.node.background)
        if commands:
            await asyncio.wait(commands, timeout=self.config.shutdown_grace_s)
        for task in [*self._tasks, *self.node.background]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self.node.background, return_exceptions=True)

    async def close(self) -> None:
        """Close the device connections."""
        for device in self.devices.values():
            device.close()

    def _crash(self, point: CrashPoint) -> None:
        """Fault injection (``crash_at``, tests only): SIGKILL this process at ``point``."""
        if self.config.crash_at == point:
            log.error("crash_at=%s: killing this gateway (SIGKILL)", point)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

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
                self.gateway.memory.observe(record)
        self.metrics.remembered.set(len(self.gateway.memory.attempts))

    async def _remember(self, records: Iterable[ActuatorMemoryRecord]) -> None:
        """Write ``records`` to the memory topic (acks=all), then take them in."""
        for record in records:
            await self.node.producer.produce("memory", self.config.memory_topic, encode(record),
                                record.key().encode())
            self.gateway.memory.observe(record)
            self.metrics.memory_writes.labels(record.entry).inc()
        self.metrics.remembered.set(len(self.gateway.memory.attempts))

    # ------------------------------------------------------------------------------ requests
    async def skipped(self, kind: str, msg: Any, why: Skip, detail: str, *,
                      code: RejectCode | None = None,
                      request: EffectRequest | None = None) -> None:
        """Count a record the shell passed over (the executors record the undecodable ones on
        ``sys.rejects``: nothing for a device)."""
        if why in ("mirrored_copy", "undecodable", "wrong_workload"):
            self.metrics.ignored.labels(why).inc()
        elif why == "not_holder":
            # a command its epoch's holder did not sign (front-running): never acted on
            assert request is not None
            log.warning("ignoring %s at %s@%d: not signed by its epoch's holder",
                        request.effect_id, msg.topic, msg.offset)
            self.metrics.ignored.labels("not_holder").inc()

    async def handle(self, read: Read) -> None:
        """Decide on a command and act (see the module docstring)."""
        kind, msg, record = read.kind, read.msg, read.request
        now_ns = time.time_ns()
        decision = decide(self.gateway, record, topic=msg.topic, partition=msg.partition,
                          offset=msg.offset, append_ms=msg.timestamp,
                          now_ms=now_ns // 1_000_000, now_us=now_ns // 1000,
                          request_hash=request_hash(msg.value))
        read_mono = time.monotonic()
        if isinstance(decision, Leave):  # in doubt since before a restart: its lease decides
            self.metrics.in_doubt.labels(kind).inc()
            log.warning("%s", decision.reason)
            read.done()
        elif isinstance(decision, Ignore):
            self.metrics.ignored.labels("in_flight" if record.effect_id in
                                        self.state.in_flight else "not_served").inc()
            read.done_unless_in_flight(self.state)
        elif isinstance(decision, Refuse | Reanswer):
            self.node.spawn(self._respond(decision.response, read, read_mono))
        elif isinstance(decision, Execute):
            self._crash("before_accept")
            ack, _gen, _record = await self.node.accept(decision.accepted.accepted)
            self.node.spawn(self._execute(decision, read, ack, read_mono))

    async def _respond(self, response: ResponseRecord, read: Read, read_mono: float) -> None:
        """Sign and write ``response`` (acks=all); then its request's offset is settled."""
        value = self.node.identity.sign_and_encode(response)
        topic = topics.resp_for(response.header.workload_id, response.header.shadow)
        await self.node.producer.produce("response", topic, value, response.effect_id.encode())
        code = response.error.code if response.error else ""
        self.metrics.requests.labels(read.kind, response.outcome, code).inc()
        self.metrics.command_seconds.labels(read.kind).observe(time.monotonic() - read_mono)
        log.info("%s %s %s", response.effect_id, response.outcome, code)
        self._crash("after_response")
        read.tracker.done(read.key, response.request_offset)

    def claim_undecodable(self, code: str) -> None:
        """Nothing to count: the executors record undecodable claims."""

    def claim_refused(self, msg: Any, code: RejectCode, detail: str) -> None:
        """Nothing to record: the executors write refused claims to ``sys.rejects``."""

    # ------------------------------------------------------------------------------ commands
    async def _execute(self, ex: Execute, read: Read, ack: asyncio.Future[Any],
                       read_mono: float) -> None:
        job, command = ex.job, ex.command
        device = self.devices[command.device]
        try:
            await ack  # accepted is acknowledged before anything reaches the device
        except KafkaError:
            self.state.finish(job.effect_id)
            raise
        self._crash("after_accept")
        async with device.lock:
            response, alarm = await self._run_command(ex, device)
        if alarm is not None:  # written once the device is free again
            await self._raise(alarm)
        if not self.state.finish(job.effect_id):
            return
        if response is None:  # in doubt: left to its lease (unknown, and an alarm)
            self.metrics.in_doubt.labels(read.kind).inc()
            read.tracker.done(read.key, job.request_offset)
            return
        await self._respond(response, read, read_mono)

    async def _run_command(self, ex: Execute, device: ModbusDevice
                           ) -> tuple[ResponseRecord | None, AlarmRecord | None]:
        """Under the device's lock: judge the memory again, remember, write, read back,
        remember. The response to write, or None when the device may have acted and nobody
        knows (no answer: the lease decides); and the alarm to raise when the device did not
        confirm the write (with its register read back)."""
        job, command, guarantee = ex.job, ex.command, ex.guarantee
        state = self.gateway
        started_us = _now_us()
        verdict = memory_verdict(state.memory, job.request, command, guarantee)
        if verdict[0] == "refuse":
            return device_error(state, job, verdict[1], verdict[2], started_us=started_us,
                                finished_us=_now_us()), None
        if verdict[0] == "reanswer":
            return remembered_response(state, job.request, job.request_offset, verdict[1],
                                       started_us, request_hash=job.request_hash), None
        if verdict[0] == "leave":
            log.warning("%s", verdict[1])
            return None, None
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
                return response, None
            except InDoubt as exc:
                self.metrics.device_writes.labels(command.device, "in_doubt").inc()
                log.warning("%s (%s, write %d of %d)", exc, guarantee, attempt, writes)
                if attempt == writes:
                    log.error("%s: left in doubt; its lease decides (unknown)", job.effect_id)
                    return None, await self._read_back_alarm(ex, device, str(exc))
                await asyncio.sleep(jittered_backoff_s(attempt))
        self.metrics.device_writes.labels(command.device, "ok").inc()
        read_back = await device.read(command.register)
        self._crash("after_write")
        response = written_response(state, job, command, read_back=read_back,
                                    started_us=started_us, finished_us=_now_us())
        await self._remember(remember_after(state, job, command, guarantee, response,
                                            changed=True, now_us=_now_us()))
        self._crash("after_remember")
        return response, None

    async def _read_back_alarm(self, ex: Execute, device: ModbusDevice,
                               detail: str) -> AlarmRecord:
        """The device did not confirm the write in time: read its register back (under the
        device's lock) and make the alarm that shows it (``device_timeout``; :meth:`_raise`
        writes it). The lease holder's ``unknown`` (and, for at-most-once, its alarm of the
        same id, which the first one written stands for) follows when the lease lapses."""
        job, command = ex.job, ex.command
        value = await device.read(command.register)
        self.metrics.read_backs.labels(command.device,
                                       "unreadable" if value is None else "ok").inc()
        request = job.request
        shown = ("could not be read" if value is None else
                 f"reads {value}" + (" (the set-point)" if value == command.value else
                                     f", not the set-point {command.value}"))
        return AlarmRecord(
            alarm_id=request.effect_id, workload_id=request.header.workload_id,
            header=request.header, effect_kind=request.effect_kind, guarantee=ex.guarantee,
            request_offset=job.request_offset, reissue_of=request.reissue_of,
            accepted_by=self.config.node_id,
            reason=(f"{command.device} did not confirm the write of {command.value} to "
                    f"register {command.register} in time ({detail}); read back, the register "
                    f"{shown}. Left to the lease (unknown): a person must look"),
            raised_by=self.config.node_id, raised_us=_now_us(), cause="device_timeout",
            read_back=DeviceReadBack(device=command.device, address=command.register,
                                     wanted=command.value, value=value))

    async def _raise(self, alarm: AlarmRecord) -> None:
        """Write ``alarm`` to ``sys.alarms`` (acks=all, retried while the broker is away)."""
        try:
            await self.node.producer.produce("alarm", topics.ALARMS, encode(alarm),
                                             alarm.alarm_id.encode())
        except KafkaError as exc:
            log.error("alarm for %s not written: %r", alarm.alarm_id, exc)
            return
        self.metrics.alarms.labels(alarm.effect_kind).inc()
        log.error("ALARM %s (%s): %s", alarm.alarm_id, alarm.effect_kind, alarm.reason)

    # ------------------------------------------------------------------------------ devices
    async def _watch_device(self, name: str) -> None:
        """Read ``name``'s register every :data:`DEVICE_PROBE_S` while it answers; while it does
        not, try again after a backoff that doubles from 0.5 s to :data:`DEVICE_BACKOFF_CAP_S`
        with jitter (bounded work while a device is away). What it finds is the device's part of
        the gateway's readiness and ``fx_actuator_device_up``."""
        device = self.devices[name]
        address = self.config.devices[name].address
        failures = 0
        while True:
            async with device.lock:
                value = await device.read(address)
            up = value is not None and device.reachable is not False
            self.metrics.device_up.labels(name).set(1 if up else 0)
            if up:
                if failures:
                    log.info("device %s answers again (after %d failed tries)", name, failures)
                failures = 0
                delay = DEVICE_PROBE_S
            else:
                failures += 1
                delay = jittered_backoff_s(failures, base_s=0.5, cap_s=DEVICE_BACKOFF_CAP_S)
                if failures == 1 or failures % 20 == 0:
                    log.warning("device %s does not answer (try %d); trying again in %.1f s",
                                name, failures, delay)
            await asyncio.sleep(delay)

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
            if device.reachable is False:  # the watch reconnects, with backoff
                value = None
            else:
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
                    await self.node.producer.produce("telemetry", topic, encode(record),
                                                     name.encode())
                    self.metrics.telemetry.labels(name, "ok").inc()
                except KafkaError as exc:
                    self.metrics.telemetry.labels(name, "not_written").inc()
                    log.warning("telemetry of %s to %s not written: %r", name, topic, exc)
            await asyncio.sleep(interval_s)

    # ------------------------------------------------------------------------------ facts, HTTP
    def facts(self) -> FactsRecord:
        """This gateway's facts: the kinds it serves, with their guarantees."""
        return build_facts(
            node_id=self.config.node_id, queue_limits=self.config.queue_limits,
            models_present=(), models_loaded=(),
            engines={"pymodbus": self.gateway.device_info.engine_version}, accelerators=(),
            public_key_b64=self.node.identity.public_key_b64, key_id=self.node.identity.key_id,
            now_us=_now_us(), guarantees=self.config.guarantees)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready while every configured device answers (the latest read or connect reached it:
        :meth:`_watch_device`); each device's state, and how many effects are remembered."""
        reachable = {name: d.reachable is True for name, d in sorted(self.devices.items())}
        return all(reachable.values()), {
            "devices": reachable, "remembered_effects": len(self.gateway.memory.attempts)}

    def refresh_gauges(self) -> None:
        """The queue gauges."""
        for kind in self.config.kinds:
            self.metrics.queue_depth.labels(kind).set(self.state.queue_depth(kind))
