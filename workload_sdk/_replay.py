"""Replay and diff: the same :class:`~workload_sdk._core.Core` fed from the recorded log.

Replay reads ``.merge`` (entries and snapshots), fetches each record an entry names from ``.in`` or
``.resp``, and applies it. It never contacts an executor or loads a model: a response is a record.
It checks, entry by entry, that the fold decides what the merge log recorded, and (when asked)
that every output it computes is byte for byte the record on ``.out``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from broker_schema import (
    ChunkRef,
    EffectRequest,
    MergeEntry,
    OutputRecord,
    SnapshotRecord,
    SpecRecord,
    decode,
    encode,
)
from broker_schema.binding import claim_in_force
from broker_schema.streams import OutRecord, SourceRecord
from fx_kafka.workload_log import LogGap, Redacted, RefGap, WorkloadLog
from workload_sdk._api import Workload, WorkloadError
from workload_sdk._code import Code, ModuleUnavailable
from workload_sdk._commands import replay_command
from workload_sdk._core import Applied, Core, Decision, Item

__all__ = [
    "DiffReport",
    "ReplayError",
    "ReplayResult",
    "compare_outputs",
    "diff",
    "missing_outputs",
    "out_slots",
    "recorded_skip",
    "replay",
    "resume_outputs",
]


class ReplayError(Exception):
    """The merge log and the fold disagree (the module or the log is not the one recorded)."""

    def __init__(self, merge_offset: int, message: str) -> None:
        super().__init__(f".merge offset {merge_offset}: {message}")
        self.merge_offset = merge_offset


@dataclass
class ReplayResult:
    """What replay rebuilt: the core (state, seq, pending effects), the outputs it computed by
    slot, where it started, and how many merge entries it applied."""

    core: Core
    outputs: dict[tuple[int, int], OutRecord] = field(default_factory=dict)
    snapshot_offset: int | None = None
    snapshot_seq: int | None = None
    entries: int = 0
    steps: int = 0
    last_epoch: int | None = None
    merge_end: int = 0


def out_slots(log: WorkloadLog, computed: Mapping[tuple[int, int], OutRecord] | None = None,
              ) -> dict[tuple[int, int], tuple[int, bytes]]:
    """Every output on ``.out`` by slot: ``(offset, value bytes)`` of the first record per slot,
    or, given the outputs replay ``computed``, of the first record per slot whose bytes are the
    computed output's when there is one. Anyone who may write ``.out`` can put a record in a
    slot before the holder does (issue 30, front-running): such a stray beside the holder's own
    record is not the slot's output."""
    slots: dict[tuple[int, int], tuple[int, bytes]] = {}
    view = log["out"]
    wanted = {slot: encode(out) for slot, out in (computed or {}).items()}
    for rec in view:
        record = rec.decode(view.topic)
        if isinstance(record, OutputRecord | EffectRequest):
            slot = record.header.slot
            have = slots.get(slot)
            if have is None or (have[1] != wanted.get(slot, have[1])
                                and rec.value == wanted[slot]):
                slots[slot] = (rec.offset, rec.value)
    return slots


def _merge_records(log: WorkloadLog, *,
                   trusted: bool = False) -> list[tuple[int, MergeEntry | SnapshotRecord]]:
    view = log["merge"]
    items: list[tuple[int, MergeEntry | SnapshotRecord]] = []
    for rec in view:
        record = rec.decode(view.topic, trusted=trusted)
        if isinstance(record, MergeEntry | SnapshotRecord):
            items.append((rec.offset, record))
    return items


def _check_from_start(log: WorkloadLog,
                      items: list[tuple[int, MergeEntry | SnapshotRecord]], what: str) -> None:
    """Raise :class:`LogGap` (``trimmed``) when ``.merge`` no longer starts at offset 0: a fold
    from the initial state needs every merge entry from the first one."""
    view = log["merge"]
    if view.start <= 0:
        return
    snaps = [(o, r) for o, r in items if isinstance(r, SnapshotRecord)]
    hint = (f"the earliest snapshot retained is seq {snaps[0][1].seq} at .merge@{snaps[0][0]}, "
            f"so replay reaches the state after step {snaps[0][1].seq - 1} and later "
            f"({replay_command(log.workload_id, max(snaps[0][1].seq - 1, 0))}, or --to any "
            "step above)"
            if snaps else "no snapshot is retained")
    raise LogGap(view.topic, 0, "trimmed",
                 f"{what} needs .merge from offset 0 and the log starts at {view.start} "
                 f"(trimmed by the audit horizon); {hint}")


def _item(log: WorkloadLog, entry: MergeEntry, *, trusted: bool = False) -> Item:
    """The record ``entry`` names, with the bytes of its referenced body when the log reader
    resolved them (``log.resolved``)."""
    view = log[entry.source]
    raw = view.raw(entry.source_offset)
    record = raw.decode(view.topic, trusted=trusted)
    if not isinstance(record, SourceRecord):
        raise LogGap(view.topic, entry.source_offset, "missing",
                     f"the merge log names a {record.kind} record")
    return Item(entry.source, entry.source_offset, raw.time_ms, record,
                log.resolved.get((entry.source, entry.source_offset)))


def _apply(core: Core, log: WorkloadLog, item: Item, *, epoch: int, spec: SpecRecord,
           decision: Decision | None = None) -> Applied:
    """:meth:`Core.apply` (given the ``decision`` :meth:`Core.classify` just made, when one was
    asked), with a referenced body that could not be read reported as the :class:`RefGap` the
    log reader recorded (the chunk, and where it was looked for)."""
    try:
        return core.apply(item, epoch=epoch, spec=spec, decision=decision)
    except RefGap as exc:
        why = log.unresolved.get((item.source, item.offset))
        if why is None:
            raise
        if (item.source, item.offset) in log.redacted:
            raise Redacted(exc.topic, exc.offset, exc.ref,
                           f"its {exc.ref.type} reference cannot be read: {why}") from None
        raise RefGap(exc.topic, exc.offset, exc.ref,
                     f"its {exc.ref.type} reference cannot be read: {why}") from None


def recorded_skip(item: Item, record: MergeEntry) -> Item:
    """``item`` with the skip ``record`` recorded for it, when that skip is a fact of the log
    rather than of the fold (a reference the holder could not read by the policy's deadline,
    an operator's order): replay follows it and never reads the body. A ``step_raised`` skip
    is the fold's own decision: the step is run again and must raise again."""
    if record.skip is None or record.skip.cause == "step_raised":
        return item
    return replace(item, skip=record.skip)


def _skip_differs(record: MergeEntry, applied: Applied) -> str | None:
    """Why a fold of other code (diff, shadow) cannot go on: the recorded step raised on an
    input and this one steps it, or the other way round; None when both agree."""
    if record.source != "in" or (record.action == "pass_over"
                                  and record.reason != "quarantined"):
        return None
    skipped = applied.decision.reason == "quarantined"
    if skipped == (record.reason == "quarantined"):
        return None
    if skipped:
        note = applied.decision.skip
        return (f"at seq {record.seq} the step raises on in@{record.source_offset} "
                f"({note.detail if note else '?'}), where the recorded step did not")
    return (f"at seq {record.seq} the recorded step raised on in@{record.source_offset} "
            "(skipped on the record); this code steps it")


def _check_decision(offset: int, record: MergeEntry, decision: Decision) -> None:
    """:class:`ReplayError` unless the fold decided what ``record`` recorded (for a skipped
    input: its cause too)."""
    recorded = (record.action, record.reason, None if record.skip is None
                else record.skip.cause)
    decided = (decision.action, decision.reason, None if decision.skip is None
               else decision.skip.cause)
    if recorded != decided:
        def say(d: tuple[str, str | None, str | None]) -> str:
            return f"{d[0]}/{d[1] or '-'}" + (f" ({d[2]})" if d[2] else "")

        raise ReplayError(offset, f"the log recorded {say(recorded)} for {record.source}@"
                          f"{record.source_offset}, the fold decides {say(decided)}")


def _snapshot_core(workload: Workload, log: WorkloadLog, offset: int,
                   snap: SnapshotRecord) -> Core:
    """The core a snapshot restores; its chunk state from ``log.resolved`` (:class:`RefGap`
    naming the chunk when it could not be read)."""
    data = None
    if isinstance(snap.state, ChunkRef):
        data = log.resolved.get(("merge", offset))
        if data is None:
            why = log.unresolved.get(("merge", offset), "it was not read")
            raise RefGap(log["merge"].topic, offset, snap.state,
                         f"the snapshot at seq {snap.seq} keeps its state in chunk "
                         f"{snap.state.hash} ({snap.state.size} B), which cannot be read: {why} "
                         "(replay from an earlier snapshot with --to, or --from-start)")
    try:
        return Core.from_snapshot(workload, snap, resolved=data)
    except (ValueError, TypeError) as exc:  # a malformed snapshot: the log is not sound
        raise ReplayError(offset, f"snapshot at seq {snap.seq} cannot be restored: "
                          f"{exc}") from exc


class _Specs:
    """The spec in force at each step (:meth:`WorkloadLog.spec_for_step`), the claims read
    once."""

    def __init__(self, log: WorkloadLog) -> None:
        self._log = log
        self._claims = log.claims()
        self._cache: dict[int, SpecRecord] = {}

    def __call__(self, epoch: int, seq: int) -> SpecRecord:
        claim = claim_in_force(self._claims, epoch, seq)
        if claim is None:
            return self._log.spec_for_step(epoch, seq)[1]  # raises the LogGap
        spec = self._cache.get(claim.spec_offset)
        if spec is None:
            spec = self._cache[claim.spec_offset] = self._log.spec_for_step(epoch, seq)[1]
        return spec


def first_workload(workload: Workload | None, code: Code | None, log: WorkloadLog,
                   items: list[tuple[int, MergeEntry | SnapshotRecord]]) -> Workload:
    """The workload whose ``initial_state`` a fold from the start begins with: with ``code``,
    the code of step 0 under the spec in force for it (the first merge entry's epoch; with no
    entry, the latest claim's spec); else ``workload``."""
    if code is not None:
        first = next((r for _o, r in items if isinstance(r, MergeEntry)), None)
        if first is not None:
            return code.at(_Specs(log)(first.epoch, 0), 0)
        claims = log.claims()
        if claims:  # no step yet: the code of step 0 under the latest claim's spec
            try:
                return code.at(_Specs(log)(claims[-1].epoch, 0), 0)
            except ModuleUnavailable:
                if workload is None:
                    raise
        return _CodeOnly() if workload is None else workload
    if workload is None:
        raise ValueError("no workload and no code to fold with")
    return workload


class _CodeOnly(Workload):
    """Stands for the workload of a core whose every step runs the code :class:`Code` picks
    (``Core.code``): a log without a step or a claim, or a core restored from a snapshot."""

    def initial_state(self) -> Any:
        return None

    def step(self, state: Any, event: Any) -> Any:
        raise AssertionError("a core with code runs each step with Core.code")


def replay(
    workload: Workload | None,
    log: WorkloadLog,
    *,
    to_seq: int | None = None,
    use_snapshots: bool = True,
    trust_log: bool = False,
    code: Code | None = None,
) -> ReplayResult:
    """Rebuild the fold from the nearest snapshot and the merge log.

    ``code``: run each step with the module its spec names for it
    (:class:`~workload_sdk._code.Code`; ``fx workload deploy``); None: ``workload`` runs
    every step (it may then be None only with ``code``).

    ``trust_log``: read the merge entries and the records they name without validating them
    again (:func:`broker_schema.decode_trusted`): for a log whose records a lease holder of
    this project decoded strictly when it merged them, read from a broker the caller trusts.
    The fold's own checks stay (the seq of each entry, the decision the log recorded, snapshot
    state hashes, everything a step does); what is skipped is each record's schema validation
    and canonical-form check, so a record that was altered on the log after it was merged may
    go unnoticed or fail later with a less precise error. The default, strict, reads every
    record as :func:`broker_schema.decode` does. Both give the same result on a sound log
    (tested side by side).

    ``to_seq``: stop after the step at that merge position (None: the end of the log). Raises
    :class:`LogGap` for a trimmed, missing or undecodable record (replay stops there: on a
    trimmed ``.merge``, when no retained snapshot is at or before ``to_seq + 1``, or with
    ``use_snapshots=False``), :class:`RefGap` for a chunk or stream record a step or the chosen
    snapshot needs that ``log.resolved`` lacks (deleted, never written), and
    :class:`ReplayError` when the fold decides differently from the merge log.
    """
    items = _merge_records(log, trusted=trust_log)
    start_index = 0
    core: Core | None = None
    result_snapshot: tuple[int, int] | None = None
    if use_snapshots:
        limit = None if to_seq is None else to_seq + 1
        chosen: tuple[int, int, SnapshotRecord] | None = None
        for i, (offset, record) in enumerate(items):
            if isinstance(record, SnapshotRecord) and (limit is None or record.seq <= limit):
                chosen = (i, offset, record)
        if chosen is not None:
            i, offset, snap = chosen
            restored = (workload if workload is not None
                        else _CodeOnly() if code is not None
                        else first_workload(None, None, log, items))  # raises: nothing to run
            core = _snapshot_core(restored, log, offset, snap)
            start_index = i + 1
            result_snapshot = (offset, snap.seq)
    if core is None:
        _check_from_start(log, items, "replay to seq " + str(to_seq) if to_seq is not None
                          else "replay from the start" if not use_snapshots else "replay")
        core = Core.initial(first_workload(workload, code, log, items), log.workload_id)
    core.code = code
    result = ReplayResult(core=core)
    if result_snapshot is not None:
        result.snapshot_offset, result.snapshot_seq = result_snapshot
    specs = _Specs(log)
    for offset, record in items[start_index:]:
        if isinstance(record, SnapshotRecord):
            if record.seq == core.seq and record.state_hash != core.state_hash:
                raise ReplayError(offset, f"snapshot at seq {record.seq} has state hash "
                                  f"{record.state_hash}, the fold has {core.state_hash}")
            continue
        if to_seq is not None and record.seq > to_seq:
            break
        if record.seq != core.seq:
            raise ReplayError(offset, f"entry has seq {record.seq}, the fold is at {core.seq}")
        item = recorded_skip(_item(log, record, trusted=trust_log), record)
        spec = specs(record.epoch, core.seq)
        decision = core.classify(item, spec)
        # an input the fold delivers may still be skipped: its step raises (step_raised)
        steps_input = decision.action == "deliver" and record.source == "in"
        if not steps_input:
            _check_decision(offset, record, decision)
        applied = _apply(core, log, item, epoch=record.epoch, spec=spec, decision=decision)
        if steps_input:
            _check_decision(offset, record, applied.decision)
        result.entries += 1
        result.last_epoch = record.epoch
        if applied.decision.action == "deliver":
            result.steps += 1
            for out in applied.outputs:
                result.outputs[out.header.slot] = out
    result.merge_end = log["merge"].end
    return result


def missing_outputs(result: ReplayResult, log: WorkloadLog) -> list[OutRecord]:
    """Outputs replay computed whose slot ``(input_offset, index)`` is not on ``.out``: what a new
    holder writes (slots already written are skipped, so no output is written twice)."""
    recorded = out_slots(log, result.outputs)
    return [out for slot, out in sorted(result.outputs.items()) if slot not in recorded]


def resume_outputs(result: ReplayResult, log: WorkloadLog) -> list[OutRecord]:
    """What a new holder writes after replaying the log: the outputs whose slot is not on
    ``.out`` yet. Raises :class:`ReplayError` when a slot that *is* on ``.out`` holds other bytes
    than replay computed: the module (or the log) is not the one that wrote them, and carrying on
    would fold from a state the recorded outputs do not come from."""
    recorded = out_slots(log, result.outputs)
    missing: list[OutRecord] = []
    for slot, out in sorted(result.outputs.items()):
        have = recorded.get(slot)
        if have is None:
            missing.append(out)
        elif have[1] != encode(out):
            raise ReplayError(log["merge"].end, f"the output at seq {slot[0]} index {slot[1]} "
                              f"on .out@{have[0]} differs from what replay computes: the "
                              "recorded outputs do not come from this module")
    return missing


def compare_outputs(result: ReplayResult, log: WorkloadLog) -> list[dict[str, Any]]:
    """Outputs replay computed that differ from (or are absent on) ``.out``, as plain dicts."""
    recorded = out_slots(log, result.outputs)
    problems: list[dict[str, Any]] = []
    for slot, out in sorted(result.outputs.items()):
        got = encode(out)
        have = recorded.get(slot)
        if have is None:
            problems.append({"slot": list(slot), "problem": "not on .out"})
        elif have[1] != got:
            problems.append({"slot": list(slot), "problem": "differs", "out_offset": have[0]})
    return problems


# ------------------------------------------------------------------------------------- diff


DiffKind = Literal["same", "output_differs", "request_divergence", "model_changed", "error"]


@dataclass
class DiffReport:
    """The result of running a new module over the recorded inputs and answers.

    ``kind``: ``same``; ``output_differs`` (``first`` is the first differing output, ``count``
    how many differ); ``request_divergence`` (the new code issues a request never recorded, or
    stops issuing one that was: replay stops there, no executor is called); ``model_changed``
    (a request names a different model hash: no recorded response applies; compare models with a
    shadow evaluation); ``error`` (the new code raised).
    """

    kind: DiffKind
    steps: int = 0
    count: int = 0
    first: dict[str, Any] | None = None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the report."""
        return {"kind": self.kind, "steps": self.steps, "count": self.count,
                "first": self.first, "detail": self.detail}


class _NewFrom:
    """The code of a diff from a step: the recorded code before ``from_step``, ``new`` after."""

    def __init__(self, code: Code, new: Workload, from_step: int) -> None:
        self._code, self._new, self._from = code, new, from_step

    def at(self, spec: SpecRecord, seq: int) -> Workload:
        return self._new if seq >= self._from else self._code.at(spec, seq)


def _slot_dict(seq: int, index: int, old: bytes | None, new: bytes | None,
               out_offset: int | None) -> dict[str, Any]:
    return {"seq": seq, "index": index, "out_offset": out_offset,
            "recorded": None if old is None else old.decode(),
            "new": None if new is None else new.decode()}


def diff(new_workload: Workload, log: WorkloadLog, *, code: Code | None = None,
         from_step: int = 0) -> DiffReport:
    """Run ``new_workload`` over the recorded merge log from seq 0; report the first difference.

    ``from_step`` (with ``code``): the steps before it run the code recorded for them (each
    range its module, :meth:`SpecRecord.module_at`) and ``new_workload`` runs from it on: what
    deploying ``new_workload`` at that step would have done.

    Recorded answers are reused as they are; a request the new code issues that differs from the
    recorded one in anything but the model stops the diff as a divergence of requests; one that
    differs only in the model hash stops it as ``model_changed``. Raises :class:`LogGap`
    (``trimmed``) when ``.merge`` was trimmed: a diff runs from seq 0.
    """
    recorded = out_slots(log)
    items = _merge_records(log)
    _check_from_start(log, items, "diff")
    if code is not None and from_step > 0:
        core = Core.initial(first_workload(None, code, log, items), log.workload_id)
        core.code = _NewFrom(code, new_workload, from_step)
    else:
        core = Core.initial(new_workload, log.workload_id)
    specs = _Specs(log)
    report = DiffReport(kind="same")
    for _offset, record in items:
        if isinstance(record, SnapshotRecord):
            continue
        item = recorded_skip(_item(log, record), record)
        decision = core.classify(item, specs(record.epoch, core.seq))
        input_step = decision.action == "deliver" and record.source == "in"
        if decision.action == "deliver" and record.action != "deliver" and not input_step:
            report.kind = "request_divergence"
            report.detail = (f"at seq {record.seq} the recorded fold passed over "
                             f"{record.effect_id} ({record.reason}); the new code has it pending")
            return report
        if record.action == "deliver" and decision.action != "deliver":
            report.kind = "request_divergence"
            report.detail = (f"at seq {record.seq} the log delivers the answer to "
                             f"{record.effect_id}, a request the new code never issued")
            return report
        try:
            applied = _apply(core, log, item, epoch=record.epoch,
                             spec=specs(record.epoch, core.seq))
        except WorkloadError as exc:
            report.kind = "error"
            report.detail = str(exc)
            return report
        differs = _skip_differs(record, applied)
        if differs is not None:
            report.kind = "error"
            report.detail = differs
            return report
        if applied.decision.action != "deliver":
            continue
        report.steps += 1
        new_slots = {out.header.slot: out for out in applied.outputs}
        old_slots = {s: v for s, v in recorded.items() if s[0] == record.seq}
        for slot in sorted(set(new_slots) | set(old_slots)):
            new = new_slots.get(slot)
            new_bytes = None if new is None else encode(new)
            old = old_slots.get(slot)
            old_bytes = None if old is None else old[1]
            if new_bytes == old_bytes:
                continue
            old_rec = None if old_bytes is None else decode(old_bytes)
            where = _slot_dict(slot[0], slot[1], old_bytes, new_bytes,
                               None if old is None else old[0])
            if isinstance(new, EffectRequest) or isinstance(old_rec, EffectRequest):
                if (isinstance(new, EffectRequest) and isinstance(old_rec, EffectRequest)
                        and new.model != old_rec.model
                        and new.model_copy(update={"model": old_rec.model}) == old_rec):
                    report.kind = "model_changed"
                    report.detail = (f"the request at seq {slot[0]} index {slot[1]} names model "
                                     f"{new.model}, the recorded one {old_rec.model}: no recorded "
                                     "response applies. Comparing models is a shadow evaluation "
                                     "(send the recorded requests with the new model to an "
                                     "executor on a separate stream), not a replay.")
                else:
                    report.kind = "request_divergence"
                    report.detail = (f"the new code's request at seq {slot[0]} index {slot[1]} "
                                     "was never recorded (or a recorded one is no longer "
                                     "issued): replay stops here and calls no executor")
                report.first = where
                report.count += 1
                return report
            report.count += 1
            if report.first is None:
                report.kind = "output_differs"
                report.first = where
    return report
