"""The actuator gateway's pure core: which commands to run, refuse or leave alone, what to
remember before and after a device write, and which records say so. No I/O, no clock reads.

A request of a kind this gateway serves is first judged by the executor's own rules
(:func:`fx_node.admission.decide` with the model status ``ready`` when it names no model: the same
``stale_epoch``, ``no_spec``, ``kind_unbound``, ``input_forbidden``, ``deadline_passed`` and
backpressure refusals, the same ``accepted`` record and in-flight table), then by the gateway's,
in this order:

1. a **shadow** request (an evaluation's re-issue): ``kind_unsupported``: a shadow never acts;
2. ``guarantee_mismatch``: the spec in force at the request's step declares another guarantee
   for the kind (or none) than this gateway serves it with;
3. ``params_invalid``: the command is not an absolute set-point of a device the kind may set
   (:func:`command_of`);
4. the guarantee's memory (:func:`memory_verdict`), judged again under the device's lock just
   before the write, since another command may have changed it meanwhile (and for the very
   at-most-once request read again after a restart, judged *first*, before rule 1 and every
   executor rule: a refusal such as ``deadline_passed`` would say nothing was done):

   - ``at-most-once``: the memory holds the request's original id (``reissue_of``, else its
     own). The same request read again after a restart: ``done`` is answered again from memory
     (the device is not touched), ``attempt`` (it may have acted, nobody knows) is left alone,
     so the lease lapses and the holder writes ``unknown`` and an alarm. Any other request with
     that id (a reissue): ``duplicate_effect``.
   - ``fenced``: ``stale_epoch`` when the device has executed a higher epoch of the workload.
   - ``idempotent``: the memory holds the device's recent effect ids (``recent``, a window of
     :attr:`actuator.config.GatewayConfig.idempotent_window` per device). The same request read
     again after a restart is answered again from memory (the device is not touched; judged
     first, like at-most-once's ``done``); any other request with that original id (a reissue,
     a copy) is refused ``duplicate_effect``. An id older than the window is forgotten: its
     repeat is written again, which an idempotent set-point allows.

Then the command runs (:mod:`actuator.runner`): ``accepted``; what :func:`remember_before`
says (an ``attempt``, or a raised ``epoch``), acknowledged *before* the device write; the write
and its read-back; what :func:`remember_after` says (``done``, or forgetting an attempt that
changed nothing; an idempotent command's ``recent``, and ``cleared`` for the ids it pushes out of
the window); the signed response (:func:`written_response`).
"""

from __future__ import annotations

import importlib.metadata
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import JsonValue

from actuator.config import DeviceConfig, GatewayConfig, KindConfig
from broker_schema.records import (
    ActuatorMemoryRecord,
    EffectRequest,
    ErrorCode,
    ExecutorInfo,
    Guarantee,
    InlineBody,
    ResponseRecord,
    SpecRecord,
    Timing,
)
from fx_node.admission import (
    Admit,
    ExecutorState,
    Ignore,
    InFlight,
    Refuse,
    error_response,
    ok_response,
    refusal,
)
from fx_node.admission import decide as decide_request

__all__ = ["Command", "Execute", "GatewayDecision", "GatewayState", "Leave", "Memory",
           "Reanswer",
           "command_of", "decide", "device_error", "memory_verdict", "remember_after",
           "remember_before", "remembered_response", "written_response"]

#: Params a set-point command takes; any other is ``params_invalid`` (absolute commands only).
COMMAND_PARAMS = frozenset({"device", "set_point"})


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


@dataclass(frozen=True)
class Command:
    """An absolute set-point for one device: write ``value`` to holding ``register``."""

    device: str
    register: int
    value: int
    #: the set-point as the request named it (a name of the device's ``values``, or a number)
    set_point: JsonValue


@dataclass
class Memory:
    """What the gateway remembers (its ``sys.actuator.<node>``, read back on start).

    ``attempts``: original effect id -> its latest ``attempt``, ``done`` or ``recent`` entry;
    ``epochs``: (device, workload) -> the highest epoch executed; ``recent``: device -> the
    original ids of its ``recent`` entries, oldest first (``window`` of them are kept: see
    :func:`remember_after`). Changed only by :meth:`observe`, on the event-loop thread, for
    every record read back or acknowledged."""

    attempts: dict[str, ActuatorMemoryRecord] = field(default_factory=dict)
    epochs: dict[tuple[str, str], int] = field(default_factory=dict)
    recent: dict[str, OrderedDict[str, None]] = field(default_factory=dict)
    window: int = 4096

    def observe(self, record: ActuatorMemoryRecord) -> None:
        """Take in one memory record (read back on start, or just acknowledged)."""
        if record.entry == "cleared":
            if record.effect_id is not None:
                self.attempts.pop(record.effect_id, None)
                self.recent.get(record.device, OrderedDict()).pop(record.effect_id, None)
        elif record.entry == "recent" and record.effect_id is not None:
            self.attempts[record.effect_id] = record
            ids = self.recent.setdefault(record.device, OrderedDict())
            ids[record.effect_id] = None
            ids.move_to_end(record.effect_id)
        elif record.entry == "epoch":
            where = (record.device, record.workload_id)
            self.epochs[where] = max(self.epochs.get(where, 0), record.epoch)
        elif record.effect_id is not None:
            self.attempts[record.effect_id] = record

    def highest_epoch(self, device: str, workload_id: str) -> int:
        """The highest epoch of ``workload_id`` executed on ``device`` (0: none)."""
        return self.epochs.get((device, workload_id), 0)


class GatewayState:
    """The gateway's state: the executor's (claims, specs, in-flight table) and its memory.

    Touched only by the service's event-loop thread (see :class:`fx_node.admission.ExecutorState`).
    """

    def __init__(self, config: GatewayConfig) -> None:
        self.node_id = config.node_id
        self.kinds: Mapping[str, KindConfig] = config.kinds
        self.devices: Mapping[str, DeviceConfig] = config.devices
        self.base = ExecutorState(
            node_id=config.node_id, kinds=config.queue_limits,
            engine_info=ExecutorInfo(node_id=config.node_id, engine="fx-actuator",
                                     engine_version=_version("ninelives-fx"),
                                     device_class="modbus"))
        #: what a response of a command that reached a device names as its executor
        self.device_info = ExecutorInfo(node_id=config.node_id, engine="pymodbus",
                                        engine_version=_version("pymodbus"),
                                        device_class="modbus-tcp")
        self.memory = Memory(window=config.idempotent_window)


@dataclass(frozen=True)
class Execute:
    """Write ``accepted``, then run ``command`` on its device under ``guarantee``."""

    accepted: Admit
    command: Command
    guarantee: Guarantee

    @property
    def job(self) -> InFlight:
        """The admitted job (in the in-flight table)."""
        return self.accepted.job


@dataclass(frozen=True)
class Reanswer:
    """Write ``response`` (no ``accepted``, no device write): an at-most-once command done
    before a restart, read again, answered from memory."""

    response: ResponseRecord


@dataclass(frozen=True)
class Leave:
    """Write nothing and settle the offset: an at-most-once command attempted before a restart
    whose outcome is not known. Its lease lapses and the holder writes ``unknown`` (and an
    alarm); writing it again could act twice, answering anything would be a guess."""

    reason: str


GatewayDecision = Ignore | Leave | Refuse | Reanswer | Execute


def command_of(request: EffectRequest, served: KindConfig,
               devices: Mapping[str, DeviceConfig]) -> Command | str:
    """The absolute set-point ``request`` asks for, or why it is not one (``params_invalid``).

    ``params``: ``set_point`` (required: a name of the device's ``values``, or an integer in
    ``[minimum, maximum]``; never a delta), ``device`` (optional: one of the kind's devices, the
    first by default). Nothing else."""
    params = request.params
    unknown = sorted(set(params) - COMMAND_PARAMS)
    if unknown:
        return f"unknown params {unknown}: a set-point command takes {sorted(COMMAND_PARAMS)}"
    name = params.get("device", served.devices[0])
    if not isinstance(name, str) or name not in served.devices:
        return f"device {name!r} is not one this kind sets ({served.devices})"
    device = devices[name]
    if "set_point" not in params:
        return "no set_point: an actuation command is an absolute set-point"
    point = params["set_point"]
    if isinstance(point, str):
        if point not in device.values:
            return f"set_point {point!r} is not one of {sorted(device.values)} of {name}"
        value = device.values[point]
    elif isinstance(point, int) and not isinstance(point, bool):
        if not device.minimum <= point <= device.maximum:
            return (f"set_point {point} is outside [{device.minimum}, {device.maximum}] "
                    f"of {name}")
        value = point
    else:
        return f"set_point must be a name or an integer, not {type(point).__name__}"
    return Command(device=name, register=device.address, value=value, set_point=point)


MemoryVerdict = (tuple[Literal["run"]] | tuple[Literal["refuse"], ErrorCode, str]
                 | tuple[Literal["reanswer"], ActuatorMemoryRecord]
                 | tuple[Literal["leave"], str])


def _in_doubt(request: EffectRequest) -> str:
    return (f"{request.effect_id} was attempted before a restart and its outcome is not known: "
            "at-most-once, so it is not written again (the holder writes unknown and an alarm "
            "when its lease lapses)")


def memory_verdict(memory: Memory, request: EffectRequest, command: Command,
                   guarantee: Guarantee) -> MemoryVerdict:
    """What the guarantee's memory says of ``request`` (see the module docstring, rule 4)."""
    if guarantee == "at-most-once":
        seen = memory.attempts.get(request.original_id)
        if seen is None:
            return ("run",)
        same = seen.request_effect_id == request.effect_id
        if same and seen.entry == "done":
            return ("reanswer", seen)
        if same:
            return ("leave", _in_doubt(request))
        what = ("was done" if seen.entry == "done"
                else "was attempted and its outcome is not known")
        return ("refuse", "duplicate_effect",
                f"{request.original_id} {what} (as {seen.request_effect_id}): an at-most-once "
                "command is not repeated")
    if guarantee == "idempotent":
        seen = memory.attempts.get(request.original_id)
        if seen is None or seen.entry != "recent":
            return ("run",)
        if seen.request_effect_id == request.effect_id:
            return ("reanswer", seen)
        return ("refuse", "duplicate_effect",
                f"{request.original_id} was written to {seen.device} (as "
                f"{seen.request_effect_id}) and is among its recent idempotent commands: a "
                "repeat is not sent to the device again")
    if guarantee == "fenced":
        highest = memory.highest_epoch(command.device, request.header.workload_id)
        if request.header.epoch < highest:
            return ("refuse", "stale_epoch",
                    f"device {command.device} executed epoch {highest} of workload "
                    f"{request.header.workload_id}; this command is of epoch "
                    f"{request.header.epoch}")
    return ("run",)


def _spec_of(state: GatewayState, request: EffectRequest) -> SpecRecord | None:
    view = state.base.workload(request.header.workload_id)
    bound = view.binding(request.header.epoch, request.header.input_offset)
    return None if bound is None else bound[1]


def decide(state: GatewayState, request: EffectRequest, *, topic: str, partition: int,
           offset: int, append_ms: int, now_ms: int, now_us: int,
           request_hash: str | None = None) -> GatewayDecision:
    """Judge one request read at ``offset`` (the rules of the module docstring). On
    :class:`Execute` the job is in the in-flight table; on anything else it is not.
    ``request_hash``: of the request's bytes, carried by every record written for it."""
    kind = request.effect_kind
    served = state.kinds.get(kind)
    if served is None:
        return Ignore(f"kind {kind} is not served here")
    if served.guarantee in ("at-most-once", "idempotent") and \
            request.effect_id not in state.base.in_flight:
        seen = state.memory.attempts.get(request.original_id)
        ours = ("recent",) if served.guarantee == "idempotent" else ("attempt", "done")
        if seen is not None and seen.request_effect_id == request.effect_id and \
                seen.entry in ours:
            # The very request, read again after a restart: what the memory knows comes before
            # every other rule, since any refusal now (deadline_passed, stale_epoch...) would
            # say that nothing was done, and the command may have acted.
            if seen.entry in ("done", "recent"):
                return Reanswer(remembered_response(state, request, offset, seen, now_us,
                                                    request_hash=request_hash))
            return Leave(_in_doubt(request))
    base = decide_request(state.base, request, topic=topic, partition=partition, offset=offset,
                          append_ms=append_ms, now_ms=now_ms, now_us=now_us,
                          model_status="absent" if request.model else "ready",
                          request_hash=request_hash)
    if not isinstance(base, Admit):
        return base

    def refuse(code: ErrorCode, message: str) -> Refuse:
        state.base.finish(request.effect_id)
        return refusal(state.base, request, offset, now_us, code=code, message=message,
                       request_hash=request_hash)

    if request.header.shadow is not None:
        return refuse("kind_unsupported", "a shadow evaluation never acts on a device")
    spec = _spec_of(state, request)
    declared = None if spec is None else spec.guarantees.get(kind)
    if declared != served.guarantee:
        return refuse("guarantee_mismatch",
                      f"the spec declares {declared or 'no guarantee'} for {kind}; this "
                      f"gateway serves it {served.guarantee}")
    command = command_of(request, served, state.devices)
    if isinstance(command, str):
        return refuse("params_invalid", command)
    verdict = memory_verdict(state.memory, request, command, served.guarantee)
    if verdict[0] == "refuse":
        return refuse(verdict[1], verdict[2])
    if verdict[0] == "leave":
        state.base.finish(request.effect_id)
        return Leave(verdict[1])
    if verdict[0] == "reanswer":
        state.base.finish(request.effect_id)
        return Reanswer(remembered_response(state, request, offset, verdict[1], now_us,
                                            request_hash=request_hash))
    return Execute(accepted=base, command=command, guarantee=served.guarantee)


def remembered_response(state: GatewayState, request: EffectRequest, offset: int,
                        done: ActuatorMemoryRecord, now_us: int, *,
                        request_hash: str | None = None) -> ResponseRecord:
    """The ``ok`` response of an at-most-once (``done``) or idempotent (``recent``) command
    done before a restart (from memory)."""
    return ResponseRecord(
        effect_id=request.effect_id, header=request.header, request_offset=offset,
        outcome="ok", output=done.output, executor=state.device_info,
        timing=Timing(received_us=now_us), written_by=state.node_id,
        request_hash=request_hash)


def _entry(state: GatewayState, job: InFlight, command: Command,
           entry: Literal["attempt", "done", "cleared", "epoch", "recent"], now_us: int,
           output: InlineBody | None = None) -> ActuatorMemoryRecord:
    request = job.request
    return ActuatorMemoryRecord(
        node_id=state.node_id, entry=entry, device=command.device,
        workload_id=request.header.workload_id, epoch=request.header.epoch,
        effect_id=None if entry == "epoch" else request.original_id,
        request_effect_id=None if entry == "epoch" else request.effect_id,
        output=output, written_us=now_us)


def remember_before(state: GatewayState, job: InFlight, command: Command,
                    guarantee: Guarantee, now_us: int) -> list[ActuatorMemoryRecord]:
    """What to remember, acknowledged, before the device write: an at-most-once ``attempt``
    (a restarted gateway then never writes it again), a ``fenced`` device's raised epoch."""
    if guarantee == "at-most-once":
        return [_entry(state, job, command, "attempt", now_us)]
    if guarantee == "fenced" and job.request.header.epoch > state.memory.highest_epoch(
            command.device, job.request.header.workload_id):
        return [_entry(state, job, command, "epoch", now_us)]
    return []


def remember_after(state: GatewayState, job: InFlight, command: Command, guarantee: Guarantee,
                   response: ResponseRecord, *, changed: bool,
                   now_us: int) -> list[ActuatorMemoryRecord]:
    """What to remember once the device answered: for at-most-once, ``done`` with the
    response's output when the device took the write (``changed``), else ``cleared``, so that a
    command that never reached the device does not count as a repeat. For idempotent, when the
    device took it: ``recent`` with the output, and ``cleared`` for the device's oldest recent
    ids beyond the memory's window."""
    if guarantee == "idempotent":
        if not changed:
            return []
        output = response.output if isinstance(response.output, InlineBody) else None
        new = _entry(state, job, command, "recent", now_us, output=output)
        ids = [i for i in state.memory.recent.get(command.device, OrderedDict())
               if i != new.effect_id]
        excess = len(ids) + 1 - state.memory.window
        evicted = [state.memory.attempts[i] for i in ids[:max(0, excess)]
                   if i in state.memory.attempts]
        return [new, *(ActuatorMemoryRecord(
            node_id=state.node_id, entry="cleared", device=old.device,
            workload_id=old.workload_id, epoch=old.epoch, effect_id=old.effect_id,
            request_effect_id=old.request_effect_id, written_us=now_us) for old in evicted)]
    if guarantee != "at-most-once":
        return []
    if not changed:
        return [_entry(state, job, command, "cleared", now_us)]
    output = response.output if isinstance(response.output, InlineBody) else None
    return [_entry(state, job, command, "done", now_us, output=output)]


def written_response(state: GatewayState, job: InFlight, command: Command, *,
                     read_back: int | None, started_us: int, finished_us: int
                     ) -> ResponseRecord:
    """The response once the device acknowledged the write of ``command``: ``ok`` with what was
    written and read back, or ``readback_mismatch`` when the register reads another value
    (``read_back`` None: the read failed after the acknowledged write, still ``ok``)."""
    if read_back is not None and read_back != command.value:
        return error_response(
            state.base, job, code="readback_mismatch",
            message=f"wrote {command.value} to register {command.register} of "
                    f"{command.device}, read back {read_back}",
            model_hash=None, executor=state.device_info, started_us=started_us,
            finished_us=finished_us)
    output: dict[str, JsonValue] = {
        "device": command.device, "register": command.register, "value": command.value,
        "set_point": command.set_point, "read_back": read_back,
    }
    if job.request.reissue_of is not None:
        output["reissue_of"] = job.request.reissue_of
    return ok_response(state.base, job, output=InlineBody.of_json(output), model_hash=None,
                       executor=state.device_info, started_us=started_us,
                       finished_us=finished_us)


def device_error(state: GatewayState, job: InFlight, code: ErrorCode, message: str, *,
                 started_us: int | None, finished_us: int | None) -> ResponseRecord:
    """An ``error`` response for a command the device did not take (``device_unreachable``:
    nothing was sent; ``device_refused``: it answered with an exception) or that the memory
    refused at the last moment."""
    return error_response(state.base, job, code=code, message=message, model_hash=None,
                          executor=state.device_info, started_us=started_us,
                          finished_us=finished_us)
