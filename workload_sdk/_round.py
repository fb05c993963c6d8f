"""The lease holder's decisions, one round at a time: pure functions, no I/O.

The live holder (:mod:`workload_sdk._holder`) and the test simulator
(``tests/unit/workload_sdk/sim.py``, from which the golden logs are generated) both call these,
so what the golden logs show is what the holder does, not what a copy of it does; replay
(:mod:`workload_sdk._replay`) drives the same :class:`~workload_sdk._core.Core`:

- :func:`merge_batch`: what goes into one transaction: which buffered record is merged next
  (:func:`~workload_sdk._core.choose_next`, with the outstanding limit and the backpressure
  pause), the merge entries, the step's outputs, and where snapshots go (inline, or as a chunk
  the holder stores before committing);
- :func:`outcomes_due`: the ``timeout``/``unknown`` records to write for pending effects, judged
  against the broker time of the latest ``.resp`` record merged;
- :func:`alarms_for`: the alarm to write with each ``unknown`` of an ``at-most-once`` kind and
  each ``timeout`` of an actuation kind, in the same transaction;
- :func:`skip_alarms`: the alarm to write with each input skipped on the record (``quarantined``),
  in the transaction of its merge entry;
- :func:`tick_due`: whether to append a tick (a clock marker) so that broker time moves when a
  deadline, a lease end or a backpressure pause is passed and nothing else would show it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from broker_schema import (
    HOLDER_OUTCOMES,
    AlarmRecord,
    ChunkRef,
    EffectRequest,
    EncodeError,
    MergeEntry,
    ResponseRecord,
    SkipAlarmRecord,
    SnapshotRecord,
    SpecRecord,
    TickRecord,
    skip_alarm_id,
)
from broker_schema.streams import OutRecord
from workload_sdk._api import WorkloadError
from workload_sdk._core import (
    Core,
    Item,
    choose_next,
    due_outcomes,
    holder_outcome,
    next_due_ms,
)

__all__ = ["Answer", "MergedBatch", "alarms_for", "merge_batch", "outcomes_due", "skip_alarms",
           "tick_due"]


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer a step saw: its effect, the effect's kind, and the outcome."""

    effect_id: str
    effect_kind: str
    outcome: str


@dataclass
class MergedBatch:
    """One transaction's worth of merging: ``records`` in write order, as ``(stream, record)``
    with stream ``merge`` (merge entries and snapshots) or ``out`` (the step's outputs)."""

    records: list[tuple[str, Any]] = field(default_factory=list)
    #: the step outputs among ``records`` (their indexes in ``records``, in order)
    output_at: list[int] = field(default_factory=list)
    #: effect ids whose answer a step saw in this batch
    delivered: list[str] = field(default_factory=list)
    #: the answers a step saw in this batch, in order (for the holder's metrics)
    answers: list[Answer] = field(default_factory=list)
    #: records on ``.resp`` passed over in this batch, by reason (``not_an_answer``: an
    #: ``accepted``, bookkeeping; the rest are answers no step will see); skipped inputs are
    #: in ``skipped``
    passed_over_by: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    passed_over: int = 0
    #: the inputs skipped on the record in this batch (their ``quarantined`` merge entries)
    skipped: list[MergeEntry] = field(default_factory=list)
    snapshots: int = 0
    #: chunks to store before the transaction that holds ``records`` commits: the bodies of
    #: snapshots over the inline limit (64 KiB), whose ``state`` is the reference, with their bytes
    chunks: list[tuple[ChunkRef, bytes]] = field(default_factory=list)
    #: snapshots that could not be made, with why (a state that has no canonical bytes)
    snapshots_skipped: list[str] = field(default_factory=list)
    #: broker time of the latest ``.resp`` record merged (the clock outcomes are judged on)
    now_resp_ms: int | None = None
    #: a tick was merged (the holder's own clock marker came back)
    tick_merged: bool = False
    #: the step broke a rule: the records before it are still to be written, then it goes up
    failure: WorkloadError | None = None

    @property
    def outputs(self) -> list[OutRecord]:
        """The step outputs of the batch, in order."""
        return [self.records[i][1] for i in self.output_at]

    def drop_snapshot(self, ref: ChunkRef, why: str) -> None:
        """Leave out the snapshot whose state is chunk ``ref`` (the holder could not store the
        chunk): resume and replay start from an earlier snapshot, as correct and slower."""
        self.records = [(stream, r) for stream, r in self.records
                        if not (isinstance(r, SnapshotRecord) and r.state == ref)]
        self.output_at = [i for i, (stream, _) in enumerate(self.records) if stream == "out"]
        self.chunks = [(c, data) for c, data in self.chunks if c != ref]
        self.snapshots -= 1
        self.snapshots_skipped.append(why)


def merge_batch(
    core: Core,
    spec: SpecRecord,
    bufs: Mapping[str, deque[Item]],
    *,
    epoch: int,
    now_resp_ms: int | None,
    max_batch: int,
    skipped: Mapping[str, deque[int]] | None = None,
    snapshot_out_position: Callable[[Set[str]], int | None] | None = None,
) -> MergedBatch:
    """Merge buffered records into ``core`` until ``max_batch`` records are to be written or
    nothing can be merged (``bufs`` are consumed from the left; ``core`` advances).

    ``skipped`` (holder): offsets of undecodable records behind records still buffered; the read
    position passes them once everything before them is merged. ``snapshot_out_position``
    (holder): the lowest ``.out`` offset a resume from a snapshot taken now needs, given the
    requests issued in this batch (see :meth:`Core.snapshot`); None records no ``out``
    position."""
    batch = MergedBatch(now_resp_ms=now_resp_ms)
    while len(batch.records) < max_batch:
        source = choose_next(bufs["in"][0] if bufs["in"] else None,
                             bufs["resp"][0] if bufs["resp"] else None,
                             input_allowed=core.input_allowed(spec, batch.now_resp_ms))
        if source is None:
            break
        item = bufs[source].popleft()
        record = item.record
        delivered = (record.effect_id if isinstance(record, ResponseRecord)
                     and record.effect_id in core.pending else None)
        answer = (None if delivered is None or not isinstance(record, ResponseRecord) else
                  Answer(delivered, core.pending[delivered].effect_kind, record.outcome))
        try:
            applied = core.apply(item, epoch=epoch, spec=spec)
        except WorkloadError as exc:
            batch.failure = exc
            break
        if skipped is not None:
            waiting, left = skipped[source], bufs[source]
            while waiting and (not left or waiting[0] < left[0].offset):
                core.positions[source] = max(core.positions[source], waiting.popleft() + 1)
        if source == "resp":
            batch.now_resp_ms = item.time_ms
            if isinstance(record, TickRecord):
                batch.tick_merged = True
        if applied.entry is None:
            continue
        batch.records.append(("merge", applied.entry))
        if applied.decision.action == "deliver":
            batch.steps += 1
            if delivered is not None:
                batch.delivered.append(delivered)
            if answer is not None:
                batch.answers.append(answer)
        else:
            batch.passed_over += 1
            if applied.entry.skip is not None:
                batch.skipped.append(applied.entry)
            else:
                reason = applied.decision.reason or "unknown"
                batch.passed_over_by[reason] = batch.passed_over_by.get(reason, 0) + 1
        for out in applied.outputs:
            batch.output_at.append(len(batch.records))
            batch.records.append(("out", out))
        if applied.snapshot_due:
            issued = {o.effect_id for o in batch.outputs if isinstance(o, EffectRequest)}
            position = None if snapshot_out_position is None else snapshot_out_position(issued)
            try:
                snap, chunk = core.snapshot_record(epoch, out_position=position)
            except (ValueError, EncodeError) as exc:
                batch.snapshots_skipped.append(f"snapshot at seq {core.seq} skipped: {exc}")
                continue
            if chunk is not None:
                # over the inline limit (64 KiB): the snapshot names a chunk, stored first
                # (docs/workloads.md, "Snapshots")
                assert isinstance(snap.state, ChunkRef)
                batch.chunks.append((snap.state, chunk))
            batch.records.append(("merge", snap))
            batch.snapshots += 1
    return batch


def outcomes_due(core: Core, request_times: Mapping[str, int],
                 request_offsets: Mapping[str, int], *, already_written: Set[str],
                 now_resp_ms: int | None, holder_id: str,
                 workload_id: str) -> list[ResponseRecord]:
    """The ``timeout``/``unknown`` records due for ``core``'s pending effects at broker time
    ``now_resp_ms`` (none before any ``.resp`` record was merged), not already written."""
    if now_resp_ms is None or not core.pending:
        return []
    due = due_outcomes(core.pending.values(), request_times, now_resp_ms,
                       already_written=already_written)
    return [holder_outcome(core.pending[d.effect_id], request_offset=request_offsets[d.effect_id],
                           outcome=d.outcome, holder_id=holder_id, workload_id=workload_id)
            for d in due]


def alarms_for(outcomes: Iterable[ResponseRecord], core: Core, spec: SpecRecord, *,
               reissues: Mapping[str, str], accepted_by: Mapping[str, str], holder_id: str,
               now_us: int) -> list[AlarmRecord]:
    """The alarms to write with ``outcomes`` (before they are merged: their effects are still
    pending in ``core``): one per ``unknown`` of a kind the spec declares ``at-most-once``, and
    one per ``timeout`` of any kind the spec declares a guarantee for (an actuation that no
    gateway took by its deadline: the device was not set). The holder writes them to
    ``sys.alarms`` in the transaction of the outcome records, so an alarm exists exactly when
    its outcome does (a successor that re-judges an uncommitted outcome writes both again,
    once). ``reissues``: effect id -> the original it re-asks; ``accepted_by``: effect id -> the
    node of its latest ``accepted`` (people only)."""
    alarms: list[AlarmRecord] = []
    for response in outcomes:
        pending = core.pending.get(response.effect_id)
        if pending is None or response.outcome not in HOLDER_OUTCOMES:
            continue
        guarantee = spec.guarantees.get(pending.effect_kind)
        if guarantee is None:
            continue
        node = accepted_by.get(response.effect_id)
        if response.outcome == "unknown":
            if guarantee != "at-most-once":
                continue
            reason = (f"accepted by {node or 'a gateway'}, and no response within its lease of "
                      f"{pending.lease_ms} ms: the command may have acted. "
                      f"{pending.effect_kind} is at-most-once, so nothing retries it: a person "
                      "must look")
        else:
            reason = (f"no gateway accepted it by its deadline ({pending.deadline_ms} ms after "
                      f"the request): the device was not set by it. {pending.effect_kind} is "
                      f"{guarantee}; check the gateway serving it and the device")
        alarms.append(AlarmRecord(
            alarm_id=response.effect_id, workload_id=response.header.workload_id,
            header=response.header,
            effect_kind=pending.effect_kind, guarantee=guarantee,
            request_offset=response.request_offset,
            reissue_of=reissues.get(response.effect_id), accepted_by=node, reason=reason,
            raised_by=holder_id, raised_us=now_us,
            cause="unknown" if response.outcome == "unknown" else "timeout"))
    return alarms


def skip_alarms(skipped: Iterable[MergeEntry], *, holder_id: str,
                now_us: int) -> list[SkipAlarmRecord]:
    """One alarm per input skipped on the record (``skipped``: the ``quarantined`` entries of a
    batch), for the holder to write to ``sys.alarms`` in the transaction of those entries: an
    alarm exists exactly when its skip does."""
    alarms: list[SkipAlarmRecord] = []
    for entry in skipped:
        assert entry.skip is not None
        alarms.append(SkipAlarmRecord(
            alarm_id=skip_alarm_id(entry.workload_id, entry.source_offset),
            workload_id=entry.workload_id, input_offset=entry.source_offset, seq=entry.seq,
            skip=entry.skip, raised_by=holder_id, raised_us=now_us))
    return alarms


def tick_due(core: Core, request_times: Mapping[str, int], *, already_written: Set[str],
             inputs_waiting: bool, now_resp_ms: int | None, broker_now_ms: float,
             tick_in_flight: bool) -> bool:
    """Whether to append a tick: broker time (``broker_now_ms``, the holder's estimate) is past
    the next due time (:func:`~workload_sdk._core.next_due_ms`), and no tick of ours is still on
    its way back."""
    nxt = next_due_ms(core.pending, request_times, already_written=already_written,
                      pacing=core.pacing, inputs_waiting=inputs_waiting,
                      now_resp_ms=now_resp_ms)
    return nxt is not None and broker_now_ms > nxt and not tick_in_flight
