"""Trimming by audit horizon: where each workload topic may start. Pure: reads a WorkloadLog.

The spec's ``audit_horizon_ms`` says how long records are kept at least (None: forever). A record
is *older than the horizon* when its broker append time is before ``now - audit_horizon_ms``; per
topic, the caller finds the first offset that is not (Kafka ListOffsets by timestamp) and passes
those offsets as ``horizon_offsets``. :func:`plan_trim` then decides, per topic, the new log start
offset (everything below it is deleted with DeleteRecords):

``.merge``
    trimmed at a snapshot: the latest snapshot on ``.merge`` that is itself older than the
    horizon (the *trim snapshot*; it is the latest snapshot, the resume floor, or an earlier
    one). The retained ``.merge`` starts with that snapshot, so replay and resume from it (or any
    later snapshot) still work. No snapshot older than the horizon: nothing is trimmed anywhere.
``.in``, ``.resp``, ``.out``
    below the lower of the positions every retained snapshot records for that source (``in``,
    ``resp``: past everything merged; ``out``: the lowest ``.out`` offset a resume still needs,
    the requests of pending effects and every later output; a snapshot without ``out`` keeps
    all of ``.out``) and the topic's own horizon offset.
then every retained record keeps what it names
    a retained merge entry keeps its source record on ``.in``/``.resp``; a retained
    ``accepted``/``response`` keeps its request on ``.out`` (``request_offset``); a retained
    request whose input is a stream reference to one of this workload's topics keeps that
    record (an executor reads a pending request's input by stream+offset). These only lower the
    trim points; they are applied until nothing changes.
``.spec``, ``.claims``
    never trimmed: every claim and the spec it names stay, for every epoch.

A trim point never moves a log start backwards and never passes a topic's end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker_schema import (
    AcceptedRecord,
    DecodeError,
    EffectRequest,
    MergeEntry,
    ResponseRecord,
    SnapshotRecord,
    SpecRecord,
    StreamRef,
    decode,
    topics,
)
from fx_kafka.workload_log import WorkloadLog

__all__ = [
    "NEVER_TRIMMED",
    "TRIMMED",
    "TopicTrim",
    "TrimPlan",
    "horizon_cutoff_ms",
    "latest_spec",
    "plan_trim",
]

#: The streams :func:`plan_trim` may trim, in the order plans are printed (one home:
#: :data:`broker_schema.topics.TRIMMED`, which ``fx acl apply`` grants DELETE on).
TRIMMED = topics.TRIMMED
#: The streams never trimmed.
NEVER_TRIMMED = ("spec", "claims")


@dataclass(frozen=True)
class TopicTrim:
    """One topic's trim: its log start now (``start``), where it will start (``new_start``),
    its end offset, and what set ``new_start`` (``bound``)."""

    stream: str
    topic: str
    start: int
    end: int
    new_start: int
    bound: str

    @property
    def deleted(self) -> int:
        """How many offsets the trim removes (commit markers included)."""
        return self.new_start - self.start

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {"stream": self.stream, "topic": self.topic, "start": self.start,
                "end": self.end, "new_start": self.new_start, "deleted": self.deleted,
                "bound": self.bound}


@dataclass
class TrimPlan:
    """Where each trimmable topic of a workload will start, and why (see the module docstring).

    ``snapshot`` is ``(merge offset, seq)`` of the trim snapshot, None when nothing can be
    trimmed (``note`` says why). ``applied`` is set by the I/O shell once DeleteRecords ran.
    """

    workload_id: str
    audit_horizon_ms: int | None
    cutoff_ms: int | None
    snapshot: tuple[int, int] | None
    topics: dict[str, TopicTrim]
    note: str = ""
    applied: bool = False
    #: The log start offsets the broker reported after DeleteRecords (by stream).
    low_watermarks: dict[str, int] = field(default_factory=dict)

    @property
    def changes(self) -> dict[str, TopicTrim]:
        """The topics whose start moves."""
        return {s: t for s, t in self.topics.items() if t.new_start > t.start}

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {"workload_id": self.workload_id, "audit_horizon_ms": self.audit_horizon_ms,
                "cutoff_ms": self.cutoff_ms,
                "snapshot": None if self.snapshot is None else {
                    "merge_offset": self.snapshot[0], "seq": self.snapshot[1]},
                "topics": {s: t.as_dict() for s, t in self.topics.items()},
                "never_trimmed": list(NEVER_TRIMMED), "note": self.note,
                "applied": self.applied, "low_watermarks": dict(self.low_watermarks)}


def latest_spec(log: WorkloadLog) -> tuple[int, SpecRecord] | None:
    """The latest spec of the workload on ``.spec`` (its offset and record), None if none.

    Its ``audit_horizon_ms`` is the horizon a trim honours: the spec the next holder claims."""
    found: tuple[int, SpecRecord] | None = None
    for rec in log["spec"]:
        record = _decode(rec.value)
        if isinstance(record, SpecRecord) and record.workload_id == log.workload_id:
            found = (rec.offset, record)
    return found


def horizon_cutoff_ms(audit_horizon_ms: int | None, now_ms: int) -> int | None:
    """Records appended before this time are older than the horizon (None: keep forever)."""
    if audit_horizon_ms is None:
        return None
    return max(0, now_ms - audit_horizon_ms)


def _decode(value: bytes) -> Any:
    try:
        return decode(value)
    except DecodeError:
        return None  # not ours to judge here: replay reports it if it needs it


def plan_trim(log: WorkloadLog, horizon_offsets: Mapping[str, int] | None, *,
              audit_horizon_ms: int | None = None, cutoff_ms: int | None = None) -> TrimPlan:
    """Decide the new log start of ``.in``, ``.out``, ``.resp`` and ``.merge`` (module docstring).

    ``log`` holds the workload's ``.merge``, ``.resp`` and ``.out`` records from their log starts
    (``.in`` needs only its ``start``/``end``: no ``.in`` record names another); each view's
    ``start`` is the topic's current log start. ``horizon_offsets``: per stream, the first offset
    whose append time is not older than the horizon (the end offset when every record is older);
    None when the horizon is forever (nothing is trimmed). ``audit_horizon_ms`` and
    ``cutoff_ms`` are only reported.
    """
    views = {s: log[s] for s in TRIMMED}
    starts = {s: views[s].start for s in TRIMMED}
    ends = {s: max(views[s].end, views[s].start) for s in TRIMMED}
    new = dict(starts)
    bound = dict.fromkeys(TRIMMED, "nothing to trim")

    def plan(snapshot: tuple[int, int] | None, note: str) -> TrimPlan:
        return TrimPlan(
            workload_id=log.workload_id, audit_horizon_ms=audit_horizon_ms, cutoff_ms=cutoff_ms,
            snapshot=snapshot, note=note,
            topics={s: TopicTrim(s, views[s].topic, starts[s], ends[s], new[s], bound[s])
                    for s in TRIMMED})

    if horizon_offsets is None:
        bound = dict.fromkeys(TRIMMED, "the audit horizon is forever")
        return plan(None, "the spec sets no audit_horizon_ms: every record is kept")
    horizon = {s: max(starts[s], min(int(horizon_offsets.get(s, starts[s])), ends[s]))
               for s in TRIMMED}

    snapshots: list[tuple[int, SnapshotRecord]] = []
    for rec in views["merge"]:
        record = _decode(rec.value)
        if isinstance(record, SnapshotRecord):
            snapshots.append((rec.offset, record))
    older = [(o, s) for o, s in snapshots if o <= horizon["merge"]]
    if not older:
        bound = dict.fromkeys(TRIMMED, "no snapshot older than the horizon")
        return plan(None, "no snapshot on .merge is older than the audit horizon: replay would "
                    "need the log from its start, so nothing is trimmed")
    trim_offset, trim_snap = older[-1]
    retained = [s for o, s in snapshots if o >= trim_offset]

    candidates: dict[str, dict[str, int]] = {
        "merge": {f"the snapshot seq {trim_snap.seq} at .merge@{trim_offset}": trim_offset,
                  "the audit horizon": horizon["merge"]},
    }
    for s in ("in", "resp", "out"):
        floor = min(snap.positions.get(s, 0) for snap in retained)
        what = ("the position the retained snapshots record" if s != "out" or floor
                else "a retained snapshot that records no .out position")
        candidates[s] = {what: floor, "the audit horizon": horizon[s]}
    for s in TRIMMED:
        what, value = min(candidates[s].items(), key=lambda kv: kv[1])
        new[s] = max(starts[s], min(value, ends[s]))
        bound[s] = what

    # what retained records name: lower the trim points until nothing changes
    ours = {views[s].topic: s for s in TRIMMED}

    def keep(stream: str, offset: int, why: str) -> bool:
        if offset < new[stream]:
            lowered = max(starts[stream], offset)
            if lowered < new[stream]:
                new[stream], bound[stream] = lowered, why
                return True
        return False

    changed = True
    while changed:
        changed = False
        for rec in views["merge"]:
            if rec.offset < new["merge"]:
                continue
            entry = _decode(rec.value)
            if isinstance(entry, MergeEntry):
                changed |= keep(entry.source, entry.source_offset,
                                f"the merge entry at .merge@{rec.offset}")
        for rec in views["resp"]:
            if rec.offset < new["resp"]:
                continue
            answer = _decode(rec.value)
            if isinstance(answer, AcceptedRecord | ResponseRecord):
                changed |= keep("out", answer.request_offset,
                                f"the request of the {answer.kind} at .resp@{rec.offset}")
        for rec in views["out"]:
            if rec.offset < new["out"]:
                continue
            req = _decode(rec.value)
            if isinstance(req, EffectRequest) and isinstance(req.input, StreamRef):
                ref = req.input
                if ref.topic in ours and ref.partition == 0:
                    changed |= keep(ours[ref.topic], ref.offset,
                                    f"the input of the request at .out@{rec.offset}")
    return plan((trim_offset, trim_snap.seq), "")
