"""``fx audit``: check every invariant the design promises on a workload's recorded log. Pure.

:func:`audit` reads an already-read :class:`~fx_kafka.workload_log.WorkloadLog` (its streams and
the ``sys.facts`` records in ``log.facts``), optionally a fleet-certified key history and the
workload's module, and returns an :class:`AuditReport` with one :class:`InvariantResult` per
invariant. Each says what it checked (``counts``), and lists the records that break it (a
:class:`Finding` with topic, offset and message; at most ``max_listed`` are listed, all are
counted). What each invariant checks, exactly:

``one_answer``
    Every request on ``.out`` (the first record of its slot) has exactly one *delivered* answer
    in the merge log: a ``deliver`` entry on ``.merge`` naming a ``response`` on ``.resp`` of that
    effect id, whose outcome is ``ok``, ``error`` or ``backpressure`` (from an executor), or a
    ``timeout``/``unknown`` written by a lease holder (``written_by`` is a holder id of a claim,
    no signature, no executor block). ``accepted`` records (one or many per effect: executors
    renew their lease by writing it again) and passed-over responses are not answers. Two
    deliveries for one effect id, a delivery whose entry names another effect id than the
    response it names, a delivery of an answer no request on ``.out`` asks for (and whose request
    offset is not trimmed), a delivered ``timeout``/``unknown`` not written by a lease holder:
    violations. A request with no delivery is *pending* (the fold is still waiting for its
    answer: not a violation); one older than the earliest retained snapshot of a trimmed
    ``.merge`` and not pending in it was answered before the trim point.
``out_once``
    No slot ``(input_offset, index)`` appears twice among the committed records on ``.out``
    (the log is read ``read_committed``, so an aborted transaction's records are not there), and
    ``.out`` holds only ``output`` and ``request`` records.
``epochs``
    Claims on ``.claims`` have strictly increasing epochs in offset order (a spec adoption, a claim
    with ``from_seq`` of the current epoch by its own holder, is the one repeat allowed); every
    record a lease holder commits names a claimed epoch (merge entries and snapshots, outputs and
    requests on ``.out`` by their header, ticks on ``.resp``); the epochs of ``.merge`` records
    never decrease in offset order; and nothing of epoch E was committed after the claim of a later
    epoch. "After" is by broker append time (``LogAppendTime``): a record of epoch E whose append
    time is later than that of the first claim with a higher epoch (plus ``clock_skew_ms``). A
    holder's transaction appends its records before it commits, and a successor's claim is appended
    only after its ``InitProducerId`` fenced (aborted) every open transaction of the older holder,
    so every committed record of epoch E is appended no later than that claim; an equal millisecond
    is not a violation. Across brokers (a cluster), append times come from different clocks:
    ``clock_skew_ms`` says how far they may differ. One exception, by design: a resuming holder
    writes an output slot that replay computed and ``.out`` lacks with the epoch of the step that
    computed it; such an output (its step's deliver entry has that epoch and was appended before the
    claim) is counted as ``rewritten``, not a violation. ``signatures`` Every signed ``response`` on
    ``.resp`` verifies (:func:`broker_schema.key_history.response_key_problem`, the one rule):
    against the key its executor node published on ``sys.facts``, or, given a key history
    (``--fleet-key``), against the keys the fleet key certified for that node. An invalid signature
    is a violation; a key no facts record publishes is counted ``unchecked``. Unsigned responses are
    counted: ``unsigned_holder`` for the lease holder's ``timeout``/``unknown`` (unsigned by design:
    the holder has no node key), ``unsigned`` for the rest (nothing vouches for them; listed in the
    notes). ``merge_order`` The merge log is a total order the fold can follow: each source
    (``.in``, ``.resp``) is merged in offset order, each record at most once; deliveries number the
    steps 0, 1, 2, ... (from the first retained record on a trimmed ``.merge``) without a gap or a
    repeat; a pass-over and a snapshot carry the seq of the next delivery; ``.merge`` holds only
    merge entries and snapshots. ``replay`` With the workload's module: replay from the start (``fx
    replay --from-start``) and from each snapshot on ``.merge`` reproduces the merge decisions and
    every output on ``.out`` byte for byte (:func:`workload_sdk._replay.replay`,
    :func:`~workload_sdk._replay.compare_outputs`). From each snapshot, replay runs to the next one
    and must arrive at exactly what that snapshot records (seq, state hash, pending effects, ids
    that ended in ``timeout``/``unknown``); the fold is deterministic, so this is replay from each
    snapshot to the end, in linear time. The last one must end where replay from the start ends.
    Every output slot on ``.out`` must come from a replayed step (an output of a step the fold does
    not output, or of a step no merge entry delivers, is a violation; a live log whose ``.merge``
    grew while it was read leaves the latter unjudged). Without a module: ``skipped``, and said so.
    On a trimmed ``.merge`` replay from the start is not possible; replay starts from the earliest
    retained snapshot.

A record that a check needs and that is trimmed, missing or undecodable where the design says it
must be there (:class:`~fx_kafka.workload_log.LogGap`) is a *gap*: the invariant could not be
checked in full. :attr:`AuditReport.result` is ``violated`` when any invariant is violated, else
``gap`` when any has a gap, else ``ok``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from broker_schema import (
    HOLDER_OUTCOMES,
    ChunkRef,
    ClaimRecord,
    DecodeError,
    EffectRequest,
    MergeEntry,
    OutputRecord,
    Record,
    ResponseRecord,
    SnapshotRecord,
    SpecRecord,
    TickRecord,
    decode,
    encode,
    topics,
)
from broker_schema.binding import claim_problem
from fx_kafka.workload_log import LogGap, LogRecord, Redacted, TopicView, WorkloadLog
from workload_sdk._api import Workload, WorkloadError, module_hash
from workload_sdk._code import Code, ModuleUnavailable
from workload_sdk._core import Core
from workload_sdk._replay import ReplayError, ReplayResult, compare_outputs, out_slots, replay
from workload_sdk._signature_tally import ReadResponse, check_signatures, holder_written

if TYPE_CHECKING:
    from broker_schema.key_history import KeyHistory

__all__ = [
    "INVARIANTS",
    "AuditReport",
    "Finding",
    "InvariantResult",
    "audit",
    "render_report",
]

#: The invariants, in report order, with what each checks (one line, for the table and JSON).
INVARIANTS: dict[str, str] = {
    "one_answer": "every request on .out has exactly one delivered answer on .merge",
    "out_once": "no .out slot (input_offset, index) is written twice",
    "epochs": "claim epochs strictly increase; nothing of an older epoch committed after a "
              "successor's claim",
    "signatures": "every response signature verifies (sys.facts, or the fleet key history)",
    "merge_order": "each source merged once, in offset order; steps numbered without gaps",
    "replay": "replay from the start and from each snapshot reproduces every output byte for "
              "byte",
}

#: How many findings each invariant lists by default (all are counted).
MAX_LISTED = 20

Status = Literal["ok", "violated", "gap", "skipped"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One record that breaks an invariant (or that a check needed and could not read).
    ``offset`` is None when the finding is about no single record."""

    topic: str
    offset: int | None
    message: str

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {"topic": self.topic, "offset": self.offset, "message": self.message}

    def __str__(self) -> str:
        where = self.topic if self.offset is None else f"{self.topic}@{self.offset}"
        return f"{where}: {self.message}"


@dataclass
class InvariantResult:
    """The result of one invariant: what was checked (``counts``), what breaks it
    (``violations``, at most ``max_listed`` listed, ``violation_count`` all), what could not be
    read (``gaps``), and remarks that are not violations (``notes``)."""

    name: str
    what: str
    counts: dict[str, int] = field(default_factory=dict)
    violations: list[Finding] = field(default_factory=list)
    violation_count: int = 0
    gaps: list[Finding] = field(default_factory=list)
    gap_count: int = 0
    notes: list[str] = field(default_factory=list)
    skipped: bool = False
    max_listed: int = MAX_LISTED

    @property
    def status(self) -> Status:
        """``violated``, else ``gap``, else ``skipped``, else ``ok``."""
        if self.violation_count:
            return "violated"
        if self.gap_count:
            return "gap"
        return "skipped" if self.skipped else "ok"

    @property
    def ok(self) -> bool | None:
        """True when it holds, False when violated or not fully checked, None when skipped."""
        status = self.status
        return None if status == "skipped" else status == "ok"

    def violate(self, topic: str, offset: int | None, message: str) -> None:
        """Record a violation (listed while fewer than ``max_listed`` are)."""
        self.violation_count += 1
        if len(self.violations) < self.max_listed:
            self.violations.append(Finding(topic, offset, message))

    def gap(self, topic: str, offset: int | None, message: str) -> None:
        """Record a record the check needed and could not read."""
        self.gap_count += 1
        if len(self.gaps) < self.max_listed:
            self.gaps.append(Finding(topic, offset, message))

    def note(self, text: str) -> None:
        """Add a remark (not a violation)."""
        self.notes.append(text)

    def bump(self, counter: str, by: int = 1) -> None:
        """Add ``by`` to ``counts[counter]``."""
        self.counts[counter] = self.counts.get(counter, 0) + by

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {"name": self.name, "what": self.what, "status": self.status, "ok": self.ok,
                "counts": dict(self.counts), "violation_count": self.violation_count,
                "violations": [v.as_dict() for v in self.violations],
                "gap_count": self.gap_count, "gaps": [g.as_dict() for g in self.gaps],
                "notes": list(self.notes)}


@dataclass
class AuditReport:
    """The audit of one workload: one :class:`InvariantResult` per invariant, in the order of
    :data:`INVARIANTS`, and remarks about the audit itself (``notes``)."""

    workload_id: str
    invariants: list[InvariantResult]
    module_hash: str | None = None
    key_history: bool = False
    notes: list[str] = field(default_factory=list)
    #: model hash -> the registry name its spec recorded when written (``fx models``), for
    #: people reading hashes in the report; never resolved again
    model_names: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> InvariantResult:
        for inv in self.invariants:
            if inv.name == name:
                return inv
        raise KeyError(name)

    @property
    def result(self) -> Literal["ok", "violated", "gap"]:
        """``violated`` when any invariant is, else ``gap`` when any could not be fully checked,
        else ``ok`` (skipped invariants do not count either way; they are said)."""
        statuses = {inv.status for inv in self.invariants}
        if "violated" in statuses:
            return "violated"
        return "gap" if "gap" in statuses else "ok"

    @property
    def ok(self) -> bool:
        """True when no invariant is violated and none has a gap."""
        return self.result == "ok"

    @property
    def failed(self) -> list[str]:
        """Names of the violated invariants."""
        return [inv.name for inv in self.invariants if inv.status == "violated"]

    def as_dict(self) -> dict[str, Any]:
        """The ``fx audit --json`` document."""
        return {"workload_id": self.workload_id, "result": self.result, "ok": self.ok,
                "module_hash": self.module_hash, "key_history": self.key_history,
                "violated": self.failed,
                "skipped": [i.name for i in self.invariants if i.status == "skipped"],
                "invariants": [inv.as_dict() for inv in self.invariants],
                "notes": list(self.notes), "model_names": dict(self.model_names)}


# ------------------------------------------------------------------------------------ reading


class _Reader:
    """Decodes each record of the log once for all the checks (decoding is strict, and a
    record is read by several checks)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int], Record | DecodeError] = {}

    def records(self, view: TopicView) -> Iterator[tuple[LogRecord, Record | DecodeError]]:
        """Every record of ``view`` in offset order, decoded (or the decode error)."""
        for rec in view:
            key = (view.topic, rec.offset)
            found = self._cache.get(key)
            if found is None:
                try:
                    found = decode(rec.value)
                except DecodeError as exc:
                    found = exc
                self._cache[key] = found
            yield rec, found


@dataclass
class _Claims:
    """The claims on ``.claims`` in offset order: ``(offset, append time, claim)``."""

    claims: list[tuple[int, int, ClaimRecord]]

    @property
    def holder_ids(self) -> set[str]:
        return {c.holder_id for _, _, c in self.claims}

    @property
    def epochs(self) -> set[int]:
        return {c.epoch for _, _, c in self.claims}

    def holder_of(self, epoch: int) -> str | None:
        """The holder that claimed ``epoch`` (its first claim, not a spec adoption)."""
        return next((c.holder_id for _, _, c in self.claims
                     if c.epoch == epoch and c.from_seq is None), None)

    def successor(self, epoch: int) -> tuple[int, int, ClaimRecord] | None:
        """The first claim (in offset order) of an epoch above ``epoch``."""
        return next((c for c in self.claims if c[2].epoch > epoch), None)


def _read_claims(rd: _Reader, log: WorkloadLog) -> _Claims:
    """The claims every reader goes by: one too far above the highest before it
    (:func:`broker_schema.binding.claim_problem`) is left out (``epochs`` reports it)."""
    found = []
    highest = 0
    for rec, record in rd.records(log["claims"]):
        if isinstance(record, ClaimRecord) and claim_problem(record, highest) is None:
            found.append((rec.offset, rec.time_ms, record))
            highest = max(highest, record.epoch)
    return _Claims(found)


# ----------------------------------------------------------------------------------- one_answer


def _check_one_answer(rd: _Reader, log: WorkloadLog, claims: _Claims,
                      inv: InvariantResult) -> None:
    out, resp_view, merge = log["out"], log["resp"], log["merge"]
    requests: dict[str, tuple[int, EffectRequest]] = {}
    seen_slots: set[tuple[int, int]] = set()
    for rec, record in rd.records(out):
        if isinstance(record, OutputRecord | EffectRequest):
            if record.header.slot in seen_slots:
                continue  # a second write of a slot: out_once reports it; the first one counts
            seen_slots.add(record.header.slot)
            if isinstance(record, EffectRequest):
                requests[record.effect_id] = (rec.offset, record)
    inv.counts.update(requests=len(requests), answered=0, pending=0, deliveries=0)
    holders = claims.holder_ids
    deliveries: dict[str, list[tuple[int, int, ResponseRecord]]] = {}
    merged_resp: set[int] = set()
    first_snapshot: SnapshotRecord | None = None
    first_snapshot_bytes: bytes | None = None
    for rec, record in rd.records(merge):
        if isinstance(record, SnapshotRecord) and first_snapshot is None:
            first_snapshot = record
            first_snapshot_bytes = log.resolved.get(("merge", rec.offset))
        if not isinstance(record, MergeEntry) or record.source != "resp":
            continue
        merged_resp.add(record.source_offset)
        if record.action != "deliver":
            continue
        raw = resp_view.records.get(record.source_offset)
        if raw is None:
            why = "trimmed" if record.source_offset < resp_view.start else "missing"
            inv.gap(merge.topic, rec.offset, f"the entry delivers {resp_view.topic}@"
                    f"{record.source_offset}, which is {why}")
            continue
        try:
            answer = decode(raw.value)
        except DecodeError as exc:
            inv.violate(merge.topic, rec.offset, f"the entry delivers {resp_view.topic}@"
                        f"{record.source_offset} as an answer, which is undecodable ({exc.code})")
            continue
        if not isinstance(answer, ResponseRecord):
            inv.violate(merge.topic, rec.offset, f"the entry delivers {resp_view.topic}@"
                        f"{record.source_offset} as an answer, but it is a {answer.kind} record")
            continue
        if record.effect_id != answer.effect_id:
            inv.violate(merge.topic, rec.offset, f"the entry delivers {record.effect_id} but "
                        f"{resp_view.topic}@{record.source_offset} answers {answer.effect_id}")
        if answer.outcome in HOLDER_OUTCOMES and not holder_written(answer, holders):
            inv.violate(resp_view.topic, record.source_offset,
                        f"a delivered {answer.outcome} for {answer.effect_id} written by "
                        f"{answer.written_by!r}, who holds no claim: only the lease holder "
                        "writes timeout/unknown")
        deliveries.setdefault(answer.effect_id, []).append(
            (rec.offset, record.source_offset, answer))
    unmerged_answers = {
        record.effect_id for rec, record in rd.records(resp_view)
        if isinstance(record, ResponseRecord) and rec.offset not in merged_resp}
    pending: list[str] = []
    answered_on_resp = 0
    trimmed_pending = ({p["effect_id"] for p in _snapshot_pending(first_snapshot,
                                                                 first_snapshot_bytes)}
                       if merge.start > 0 and first_snapshot is not None else set())
    for eid, (offset, req) in requests.items():
        got = deliveries.get(eid, [])
        if len(got) == 1:
            inv.bump("answered")
            inv.bump(got[0][2].outcome)
        elif len(got) > 1:
            where = ", ".join(f"{merge.topic}@{m} ({resp_view.topic}@{r} {a.outcome})"
                              for m, r, a in got)
            inv.violate(merge.topic, got[1][0], f"{eid} (request {out.topic}@{offset}) has "
                        f"{len(got)} delivered answers: {where}")
        elif (merge.start > 0 and first_snapshot is not None
              and req.header.input_offset < first_snapshot.seq and eid not in trimmed_pending):
            inv.bump("answered_before_trim")
        elif merge.start > 0 and first_snapshot is None:
            inv.bump("unjudged_trimmed")
        else:
            pending.append(eid)
            answered_on_resp += eid in unmerged_answers
    for eid, got in deliveries.items():
        if eid in requests:
            continue
        merge_offset, resp_offset, answer = got[0]
        if answer.request_offset < out.start:
            inv.bump("request_trimmed")
            continue
        inv.violate(merge.topic, merge_offset, f"delivers {resp_view.topic}@{resp_offset}, an "
                    f"answer to {eid}, which no request on {out.topic} asks")
    inv.counts["pending"] = len(pending)
    inv.counts["deliveries"] = sum(len(g) for g in deliveries.values())
    if pending:
        shown = ", ".join(pending[:inv.max_listed]) + (" ..." if len(pending) > inv.max_listed
                                                        else "")
        inv.note(f"{len(pending)} request(s) pending at the end of the log (not violations): "
                 f"{shown}" + (f"; {answered_on_resp} of them have an answer on "
                               f"{resp_view.topic} not merged yet" if answered_on_resp else ""))


def _snapshot_pending(snap: SnapshotRecord | None,
                      chunk: bytes | None = None) -> list[dict[str, Any]]:
    """The pending effects a snapshot records (its chunk state's bytes, when it has one)."""
    if snap is None:
        return []
    data = getattr(snap.state, "data", None)
    if chunk is not None:
        try:
            data = json.loads(chunk)
        except ValueError:
            data = None
    pending = data.get("pending", []) if isinstance(data, dict) else []
    return [p for p in pending if isinstance(p, dict)] if isinstance(pending, list) else []


# ------------------------------------------------------------------------------------ out_once


Doubles = dict[tuple[int, int], list[tuple[int, bytes]]]


def _check_out_once(rd: _Reader, log: WorkloadLog, inv: InvariantResult) -> Doubles:
    """File the records that do not belong on ``.out`` and the slots written twice with the
    same bytes; return the slots that hold records with *other* bytes (every record of each),
    judged by :func:`_file_doubles` once replay says which one is the step's output."""
    out = log["out"]
    slots: dict[tuple[int, int], tuple[int, bytes]] = {}
    doubles: Doubles = {}
    for rec, record in rd.records(out):
        if isinstance(record, DecodeError):
            inv.violate(out.topic, rec.offset, f"not a record ({record.code}): {out.topic} "
                        "holds only the lease holder's outputs and requests")
            continue
        if not isinstance(record, OutputRecord | EffectRequest):
            inv.violate(out.topic, rec.offset, f"a {record.kind} record: {out.topic} holds only "
                        "outputs and requests")
            continue
        inv.bump("records")
        slot = record.header.slot
        first = slots.get(slot)
        if first is None:
            slots[slot] = (rec.offset, rec.value)
            continue
        if first[1] != rec.value:
            doubles.setdefault(slot, [first]).append((rec.offset, rec.value))
            continue
        inv.violate(out.topic, rec.offset, f"slot (input_offset {slot[0]}, index {slot[1]}) "
                    f"is written again ({record.header.effect_id}, the same bytes); first at "
                    f"{out.topic}@{first[0]}")
    inv.counts["slots"] = len(slots)
    return doubles


def _file_doubles(log: WorkloadLog, doubles: Doubles, computed: Mapping[tuple[int, int], Any],
                  inv: InvariantResult) -> None:
    """Slots of ``.out`` holding records with other bytes. Where replay computed the slot's
    output, the record with its bytes is the lease holder's and every other one is a stray
    another writer of ``.out`` put there (issue 30: front-running), named as such, not blamed on
    the holder; otherwise which one is the holder's is not known and the slot is filed as
    written twice."""
    out = log["out"]
    for slot, records in sorted(doubles.items()):
        want = encode(computed[slot]) if slot in computed else None
        holders = [o for o, v in records if v == want]
        where = f"slot (input_offset {slot[0]}, index {slot[1]})"
        if holders:
            for offset, _ in records:
                if offset not in holders:
                    inv.bump("strays")
                    inv.violate(out.topic, offset, f"a stray record in {where}: not the "
                                "step's output (the lease holder's is at "
                                f"{out.topic}@{holders[0]}); another writer of {out.topic} "
                                "put it there, not the holder")
            continue
        for offset, _ in records[1:]:
            inv.violate(out.topic, offset, f"{where} is written again (other bytes); first at "
                        f"{out.topic}@{records[0][0]}")

# -------------------------------------------------------------------------------------- epochs


def _check_epochs(rd: _Reader, log: WorkloadLog, claims: _Claims, inv: InvariantResult,
                  clock_skew_ms: int) -> None:
    claims_view = log["claims"]
    highest: tuple[int, int] | None = None  # (epoch, offset)
    for rec, record in rd.records(claims_view):
        if isinstance(record, DecodeError) or not isinstance(record, ClaimRecord):
            found = record.code if isinstance(record, DecodeError) else record.kind
            inv.violate(claims_view.topic, rec.offset, f"not a claim ({found})")
            continue
        refused = claim_problem(record, 0 if highest is None else highest[0])
        if refused is not None:
            # not the holder's doing: every reader refuses it and goes on (issue 30)
            inv.violate(claims_view.topic, rec.offset, f"refused claim, ignored by every "
                        f"reader: {refused}")
            continue
        if record.from_seq is not None:
            # a spec adoption (broker_schema.binding): a claim of the current epoch by its own
            # holder, naming a newer spec from a step on; legal only as exactly that
            holder = claims.holder_of(record.epoch)
            if highest is None or record.epoch != highest[0] or holder != record.holder_id:
                inv.violate(claims_view.topic, rec.offset, f"spec adoption of epoch "
                            f"{record.epoch} by {record.holder_id!r} is not by the holder of "
                            "the current epoch")
            inv.counts["adoptions"] = inv.counts.get("adoptions", 0) + 1
            continue
        if highest is not None and record.epoch <= highest[0]:
            inv.violate(claims_view.topic, rec.offset, f"claim of epoch {record.epoch} (holder "
                        f"{record.holder_id!r}) is not above epoch {highest[0]} claimed at "
                        f"{claims_view.topic}@{highest[1]}: claim epochs must strictly increase")
        if highest is None or record.epoch > highest[0]:
            highest = (record.epoch, rec.offset)
    epochs = claims.epochs
    inv.counts.update(claims=len(claims.claims), epochs=len(epochs), holder_records=0)
    successor_of: dict[int, tuple[int, int, int]] = {}  # epoch -> (offset, time, epoch)
    for e in epochs:
        succ = claims.successor(e)
        if succ is not None:
            successor_of[e] = (succ[0], succ[1], succ[2].epoch)

    def late(topic: str, rec: LogRecord, epoch: int, what: str) -> bool:
        """Whether the record is of an unclaimed epoch or appended after a later claim (both
        violations, filed here) -- False when it is in order."""
        inv.bump("holder_records")
        if epoch not in epochs:
            inv.violate(topic, rec.offset, f"{what} of epoch {epoch}, which no claim on "
                        f"{claims_view.topic} names")
            return False
        succ = successor_of.get(epoch)
        return succ is not None and rec.time_ms > succ[1] + clock_skew_ms

    def file_late(topic: str, rec: LogRecord, epoch: int, what: str) -> None:
        s_offset, s_time, s_epoch = successor_of[epoch]
        inv.violate(topic, rec.offset, f"{what} of epoch {epoch} appended at {rec.time_ms} ms, "
                    f"after the claim of epoch {s_epoch} ({claims_view.topic}@{s_offset}, "
                    f"{s_time} ms): an older holder committed after its successor's claim")

    merge = log["merge"]
    deliveries: dict[int, tuple[int, int]] = {}  # seq -> (epoch, append time) of its delivery
    last: tuple[int, int] | None = None  # (highest epoch so far, its offset) on .merge
    for rec, record in rd.records(merge):
        if not isinstance(record, MergeEntry | SnapshotRecord):
            continue  # merge_order reports it
        what = "merge entry" if isinstance(record, MergeEntry) else "snapshot"
        if isinstance(record, MergeEntry) and record.action == "deliver":
            deliveries.setdefault(record.seq, (record.epoch, rec.time_ms))
        if last is not None and record.epoch < last[0]:
            inv.violate(merge.topic, rec.offset, f"{what} of epoch {record.epoch} after one of "
                        f"epoch {last[0]} at {merge.topic}@{last[1]}: the epoch goes back")
        elif last is None or record.epoch > last[0]:
            last = (record.epoch, rec.offset)
        if late(merge.topic, rec, record.epoch, what):
            file_late(merge.topic, rec, record.epoch, what)
    out = log["out"]
    for rec, record in rd.records(out):
        if not isinstance(record, OutputRecord | EffectRequest):
            continue
        epoch = record.header.epoch
        if not late(out.topic, rec, epoch, record.kind):
            continue
        step = deliveries.get(record.header.input_offset)
        if (step is not None and step[0] == epoch
                and step[1] <= successor_of[epoch][1] + clock_skew_ms):
            inv.bump("rewritten")  # a resume rewrite of a slot replay computed (by design)
            continue
        file_late(out.topic, rec, epoch, record.kind)
    resp = log["resp"]
    for rec, record in rd.records(resp):
        if isinstance(record, TickRecord) and late(resp.topic, rec, record.epoch, "tick"):
            file_late(resp.topic, rec, record.epoch, "tick")
    if inv.counts.get("rewritten"):
        inv.note(f"{inv.counts['rewritten']} output(s) of an older epoch were written after a "
                 "successor's claim by the resuming holder (slots replay computed and .out "
                 "lacked: allowed)")


# ---------------------------------------------------------------------------------- signatures


def _check_signatures(rd: _Reader, log: WorkloadLog, claims: _Claims,
                      key_history: KeyHistory | None, inv: InvariantResult) -> None:
    resp, merge = log["resp"], log["merge"]
    holders = claims.holder_ids
    delivered = {record.source_offset for _, record in rd.records(merge)
                 if isinstance(record, MergeEntry) and record.source == "resp"
                 and record.action == "deliver"}
    for name in ("responses", "signed", "valid", "invalid", "unchecked", "unsigned_holder",
                 "unsigned"):
        inv.counts[name] = 0
    responses: list[ReadResponse] = [(rec.offset, record, rec.time_ms * 1000)
                                     for rec, record in rd.records(resp)
                                     if isinstance(record, ResponseRecord)]
    tally = check_signatures(responses, log.facts, key_history, holder_ids=holders, final=True)
    unsigned = [f.offset for f in tally.failures if f.reason == "unsigned"]
    unchecked = [f"{resp.topic}@{f.offset}" for f in tally.failures if f.reason == "unknown_key"]
    unsigned_delivered = sum(offset in delivered for offset in unsigned)
    outcome = {offset: record.outcome for offset, record, _ in responses}
    inv.counts["responses"] = len(responses)
    inv.counts["signed"] = tally.checked - len(unsigned)
    inv.counts["unsigned_holder"] = len(responses) - tally.checked
    inv.counts["unsigned"] = len(unsigned)
    inv.counts["unchecked"] = len(unchecked)
    for f in tally.failures:
        if f.reason == "invalid":
            inv.bump("invalid")
            inv.violate(resp.topic, f.offset, f"the signature of {f.effect_id} "
                        f"({outcome[f.offset]}, node {f.node_id!r}) is INVALID: {f.detail}")
    inv.counts["valid"] = inv.counts["signed"] - inv.counts["invalid"] - len(unchecked)
    inv.note("checked against the node keys the fleet key certified on sys.keys"
             if key_history is not None else
             f"checked against the keys published on sys.facts ({len(log.facts)} facts "
             "records): whoever can write sys.facts decides those keys; pass --fleet-key to "
             "authenticate")
    if unsigned:
        shown = ", ".join(str(o) for o in unsigned[:inv.max_listed])
        inv.note(f"{len(unsigned)} response(s) not written by a lease holder carry no signature "
                 f"({unsigned_delivered} of them delivered to the fold): {resp.topic} offsets "
                 f"{shown}{' ...' if len(unsigned) > inv.max_listed else ''}")
    if unchecked:
        inv.note(f"{len(unchecked)} signature(s) not checked: no facts record publishes their "
                 f"key ({', '.join(unchecked[:inv.max_listed])})")


# --------------------------------------------------------------------------------- merge_order


def _check_merge_order(rd: _Reader, log: WorkloadLog, inv: InvariantResult) -> None:
    merge = log["merge"]
    last: dict[str, tuple[int, int]] = {}  # source -> (source offset, merge offset)
    next_seq: int | None = None
    for name in ("entries", "deliveries", "pass_overs", "snapshots"):
        inv.counts[name] = 0
    for rec, record in rd.records(merge):
        if isinstance(record, DecodeError):
            inv.violate(merge.topic, rec.offset, f"not a record ({record.code}): {merge.topic} "
                        "holds only merge entries and snapshots")
            continue
        if isinstance(record, SnapshotRecord):
            inv.bump("snapshots")
            if next_seq is not None and record.seq != next_seq:
                inv.violate(merge.topic, rec.offset, f"snapshot at seq {record.seq}, but the "
                            f"next step is seq {next_seq}")
            next_seq = record.seq
            continue
        if not isinstance(record, MergeEntry):
            inv.violate(merge.topic, rec.offset, f"a {record.kind} record: {merge.topic} holds "
                        "only merge entries and snapshots")
            continue
        inv.bump("entries")
        inv.bump("deliveries" if record.action == "deliver" else "pass_overs")
        prev = last.get(record.source)
        source_topic = log[record.source].topic
        if prev is not None and record.source_offset <= prev[0]:
            again = "again" if record.source_offset == prev[0] else "out of order"
            inv.violate(merge.topic, rec.offset, f"merges {source_topic}@{record.source_offset} "
                        f"{again}: {source_topic}@{prev[0]} was merged at {merge.topic}@{prev[1]}"
                        "; each source is merged once, in offset order")
        if prev is None or record.source_offset > prev[0]:
            last[record.source] = (record.source_offset, rec.offset)
        if next_seq is not None and record.seq != next_seq:
            what = "delivers" if record.action == "deliver" else "passes over at"
            inv.violate(merge.topic, rec.offset, f"{what} seq {record.seq}, but the next step "
                        f"is seq {next_seq}: steps are numbered without a gap or a repeat")
        next_seq = record.seq + 1 if record.action == "deliver" else record.seq


# -------------------------------------------------------------------------------------- replay


def _merge_slice(log: WorkloadLog, lo: int, hi: int | None) -> WorkloadLog:
    """``log`` with ``.merge`` cut to the offsets ``[lo, hi)`` (the other streams shared)."""
    view = log["merge"]
    part = TopicView(view.topic, start=view.start, end=view.end if hi is None else hi,
                     records={o: r for o, r in view.records.items()
                              if o >= lo and (hi is None or o < hi)})
    return WorkloadLog(log.workload_id, {**log.views, "merge": part}, log.facts,
                       log.resolved, log.unresolved)


def _fold_state(core: Core) -> dict[str, Any]:
    """What a snapshot records of a core (the positions aside: they do not decide anything;
    a pending effect's ``request_hash`` aside too: it is the hash of the request the step
    issued, which the output comparison checks byte for byte, and snapshots written before the
    field existed do not record it)."""
    return {"seq": core.seq, "state_hash": core.state_hash,
            "pending": {eid: {k: v for k, v in asdict(p).items() if k != "request_hash"}
                        for eid, p in core.pending.items()},
            "guessed": dict(core.guessed)}


def _differences(a: dict[str, Any], b: dict[str, Any]) -> str:
    parts = []
    for key in ("seq", "state_hash", "pending", "guessed"):
        if a[key] != b[key]:
            if key == "pending":
                parts.append(f"pending {sorted(a[key])} vs {sorted(b[key])}"
                             if set(a[key]) != set(b[key]) else "pending effects' deadlines or "
                             "accept times")
            else:
                parts.append(f"{key} {a[key]} vs {b[key]}")
    return "; ".join(parts)


class _Replays:
    """Runs the replays and files what they find under the ``replay`` invariant."""

    def __init__(self, workload: Workload | None, log: WorkloadLog, inv: InvariantResult,
                 recorded: dict[tuple[int, int], tuple[int, bytes]],
                 code: Code | None = None) -> None:
        self.workload, self.log, self.inv, self.recorded = workload, log, inv, recorded
        self.code = code
        self.output_problems: dict[tuple[int, int, str], tuple[int | None, list[str]]] = {}
        self.computed: set[tuple[int, int]] = set()
        #: every output a replay computed, by slot
        self.outputs: dict[tuple[int, int], Any] = {}
        #: every record on .out by slot (a stray beside the holder's record among them)
        self.slot_offsets: dict[tuple[int, int], list[int]] = {}
        view = log["out"]
        for rec in view:
            with contextlib.suppress(DecodeError):
                record = decode(rec.value)
                if isinstance(record, OutputRecord | EffectRequest):
                    self.slot_offsets.setdefault(record.header.slot, []).append(rec.offset)

    def _outputs_of(self, result: ReplayResult) -> WorkloadLog:
        """``log`` with ``.out`` cut to the records of the slots ``result`` computed, so that
        comparing each replay's outputs reads each ``.out`` record once, not once per replay."""
        view = self.log["out"]
        offsets = {o for s in result.outputs for o in self.slot_offsets.get(s, ())}
        part = TopicView(view.topic, start=view.start, end=view.end,
                         records={o: view.records[o] for o in offsets})
        return WorkloadLog(self.log.workload_id, {**self.log.views, "out": part},
                           self.log.facts, self.log.resolved, self.log.unresolved)

    def run(self, label: str, log: WorkloadLog, *, use_snapshots: bool, to_seq: int | None,
            snapshot_offset: int | None = None) -> ReplayResult | None:
        """One replay; None (and a finding) when it stops."""
        merge = self.log["merge"]
        try:
            result = replay(self.workload, log, to_seq=to_seq, use_snapshots=use_snapshots,
                            code=self.code)
            problems = compare_outputs(result, self._outputs_of(result))
        except ModuleUnavailable as exc:
            self.inv.gap(topics.MODULES, None, f"replay {label} cannot run a step's code: {exc}")
            return None
        except Redacted as exc:  # by an operator, on the record: said, not a gap
            self.inv.note(f"replay {label} stopped at a redacted input: {exc}; the outputs "
                          "after it are not recomputed (their hashes, receipts and merge "
                          "entries are checked as for any step)")
            return None
        except LogGap as exc:
            self.inv.gap(exc.topic, exc.offset if exc.offset >= 0 else None,
                         f"replay {label} stopped: {exc}")
            return None
        except ReplayError as exc:
            self.inv.violate(merge.topic, exc.merge_offset,
                             f"replay {label}: the fold decides otherwise than the merge log: "
                             f"{str(exc).split(': ', 1)[-1]}")
            return None
        except WorkloadError as exc:
            self.inv.violate(merge.topic, None, f"replay {label}: the module raised {exc}, "
                             "which the recorded fold did not")
            return None
        except (ValueError, TypeError) as exc:  # Core.from_snapshot: a malformed snapshot
            self.inv.violate(merge.topic, snapshot_offset,
                             f"replay {label}: the snapshot cannot be restored: {exc}")
            return None
        self.inv.bump("replays")
        self.inv.bump("outputs_compared", len(result.outputs))
        self.computed.update(result.outputs)
        self.outputs.update(result.outputs)
        for p in problems:
            seq, index = p["slot"]
            key = (seq, index, p["problem"])
            offset = p.get("out_offset")
            self.output_problems.setdefault(key, (offset, []))[1].append(label)
        return result

    def file_output_problems(self) -> None:
        out = self.log["out"]
        for (seq, index, problem), (offset, labels) in sorted(self.output_problems.items()):
            text = ("differs from what the fold computes" if problem == "differs"
                    else f"is computed by the fold but is not on {out.topic}")
            self.inv.violate(out.topic, offset, f"the output of seq {seq} index {index} {text} "
                             f"(replay {', '.join(labels)})")


def _check_replay(rd: _Reader, log: WorkloadLog, workload: Workload | None,
                  inv: InvariantResult, *, merge_settled: bool,
                  code: Code | None = None) -> dict[tuple[int, int], Any]:
    """File what replay finds; return the outputs it computed, by slot."""
    if workload is None and code is None:
        inv.skipped = True
        inv.note("skipped: no module given (fx audit --module MODULE:Class): replay was not run")
        return {}
    merge, out = log["merge"], log["out"]
    snaps: list[tuple[int, SnapshotRecord]] = []
    for rec, record in rd.records(merge):
        if isinstance(record, SnapshotRecord):
            snaps.append((rec.offset, record))
    inv.counts["snapshots"] = len(snaps)
    try:
        recorded = out_slots(log)
    except LogGap as exc:  # an undecodable record on .out (out_once names it)
        inv.gap(exc.topic, exc.offset, f"outputs cannot be compared: {exc}")
        return {}
    runs = _Replays(workload, log, inv, recorded, code)
    trimmed = merge.start > 0
    full: ReplayResult | None = None
    covered_from: int | None = None  # the first seq every replayed step after it covers
    if trimmed:
        inv.note(f"replay from the start is not possible: {merge.topic} starts at {merge.start} "
                 "(trimmed by the audit horizon); replay starts from the earliest retained "
                 "snapshot" + ("" if snaps else ", and none is retained"))
        if not snaps:
            inv.gap(merge.topic, merge.start, "no snapshot is retained: the fold cannot be "
                    "replayed")
    else:
        full = runs.run("from the start", log, use_snapshots=False, to_seq=None)
        if full is not None:
            covered_from = 0
    # the start (unless trimmed) and each snapshot: replay to the next snapshot, and arrive at
    # exactly what it records; the last one to the end of the log
    segments: list[tuple[tuple[int, SnapshotRecord] | None, tuple[int, SnapshotRecord] | None]]
    segments = [] if trimmed or not snaps else [(None, snaps[0])]
    segments.extend((snap, snaps[i + 1] if i + 1 < len(snaps) else None)
                    for i, snap in enumerate(snaps))
    chain_ok = True
    last_end: ReplayResult | None = None
    for start, nxt in segments:
        hi = None if nxt is None else nxt[0]
        to_seq = None if nxt is None else nxt[1].seq - 1
        if start is None:
            assert nxt is not None
            label = f"from the start to snapshot seq {nxt[1].seq}"
            result = runs.run(label, _merge_slice(log, 0, hi), use_snapshots=False,
                              to_seq=to_seq)
        else:
            label = f"from snapshot seq {start[1].seq} ({merge.topic}@{start[0]})"
            result = runs.run(label, _merge_slice(log, start[0], hi), use_snapshots=True,
                              to_seq=to_seq, snapshot_offset=start[0])
        if result is None:
            chain_ok = False
            continue
        if nxt is None:
            last_end = result
            continue
        if isinstance(nxt[1].state, ChunkRef) and ("merge", nxt[0]) not in log.resolved:
            inv.gap(merge.topic, nxt[0], f"the snapshot at seq {nxt[1].seq} keeps its state in "
                    f"chunk {nxt[1].state.hash}, which cannot be read: "
                    f"{log.unresolved.get(('merge', nxt[0]), 'it was not read')}")
            chain_ok = False
            continue
        try:
            expected = _fold_state(Core.from_snapshot(
                result.core.workload, nxt[1], resolved=log.resolved.get(("merge", nxt[0]))))
        except (ValueError, TypeError) as exc:
            inv.violate(merge.topic, nxt[0], f"the snapshot at seq {nxt[1].seq} cannot be "
                        f"restored: {exc}")
            chain_ok = False
            continue
        got = _fold_state(result.core)
        if got != expected:
            chain_ok = False
            inv.violate(merge.topic, nxt[0], f"replay {label} arrives at another fold than the "
                        f"snapshot at seq {nxt[1].seq} records: {_differences(got, expected)}")
    if trimmed and chain_ok and snaps:
        covered_from = snaps[0][1].seq
    if full is not None and last_end is not None:
        a, b = _fold_state(full.core), _fold_state(last_end.core)
        if a != b:
            inv.violate(merge.topic, None, "replay from the start and from the last snapshot "
                        f"end in different folds: {_differences(a, b)}")
    end = full if full is not None else last_end
    runs.file_output_problems()
    if end is None or covered_from is None:
        inv.note("output slots on .out not computed by replay: not checked (replay did not "
                 "complete)")
        return runs.outputs
    inv.counts["steps"] = end.core.seq
    beyond = 0
    for slot, (offset, value) in sorted(recorded.items()):
        if slot in runs.computed:
            continue
        seq, index = slot
        if seq < covered_from:
            inv.bump("before_first_snapshot")
            continue
        if seq < end.core.seq:
            kind = decode(value).kind
            inv.violate(out.topic, offset, f"a {kind} at slot (seq {seq}, index {index}) that "
                        f"the fold does not output at step {seq}")
        elif merge_settled:
            inv.violate(out.topic, offset, f"an output of step {seq}, which no merge entry "
                        f"delivers (the merge log ends at step {end.core.seq - 1})")
        else:
            beyond += 1
    if beyond:
        inv.note(f"{beyond} output(s) on .out of steps past the end of the merge log as read: "
                 "the log was still growing (a live holder); audit again to judge them")
    return runs.outputs


# --------------------------------------------------------------------------------------- audit


def audit(log: WorkloadLog, workload: Workload | None = None, *,
          key_history: KeyHistory | None = None, clock_skew_ms: int = 0,
          merge_settled: bool = True, max_listed: int = MAX_LISTED,
          code: Code | None = None) -> AuditReport:
    """Check every invariant of the design on ``log`` (see the module docstring).

    ``workload``: the module to replay with (None: ``replay`` is skipped, and says so, unless
    ``code`` is given). ``code``: replay each step with the module its spec names for it
    (:class:`~workload_sdk._code.Code`: ``workload`` and the module store; ``fx workload
    deploy``).
    ``key_history``: check signatures against the fleet-certified node keys instead of
    ``log.facts``. ``clock_skew_ms``: how far broker clocks may differ (``epochs``).
    ``merge_settled``: False when ``.merge`` was still growing while the log was read (a live
    holder): outputs of steps past the end of the merge log are then not judged.
    """
    invs = {name: InvariantResult(name, what, max_listed=max_listed)
            for name, what in INVARIANTS.items()}
    rd = _Reader()
    claims = _read_claims(rd, log)
    _check_one_answer(rd, log, claims, invs["one_answer"])
    doubles = _check_out_once(rd, log, invs["out_once"])
    _check_epochs(rd, log, claims, invs["epochs"], clock_skew_ms)
    _check_signatures(rd, log, claims, key_history, invs["signatures"])
    _check_merge_order(rd, log, invs["merge_order"])
    computed = _check_replay(rd, log, workload, invs["replay"], merge_settled=merge_settled,
                             code=code)
    _file_doubles(log, doubles, computed, invs["out_once"])
    report = AuditReport(workload_id=log.workload_id, invariants=list(invs.values()),
                         module_hash=None if workload is None else module_hash(workload),
                         key_history=key_history is not None, model_names=log.model_names())
    if code is not None:
        _note_code(log, claims, report)
    elif workload is not None:
        _note_module(log, claims, report)
    return report


def _note_code(log: WorkloadLog, claims: _Claims, report: AuditReport) -> None:
    """Say which modules the claims' specs run (each range was replayed with its own)."""
    named: dict[str, None] = {}
    for _, _, claim in claims.claims:
        try:
            spec = log["spec"].get(claim.spec_offset)
        except LogGap:  # filed by the checks that need it
            continue
        if isinstance(spec, SpecRecord):
            named.update(dict.fromkeys(spec.module_hashes()))
    if len(named) > 1:
        report["replay"].note("each step was replayed with the module its spec names for it "
                              f"(SpecRecord.module_at): {', '.join(named)}")


def _note_module(log: WorkloadLog, claims: _Claims, report: AuditReport) -> None:
    """Say whether the module replayed is the one the claims' specs name."""
    named: dict[str, list[int]] = {}
    for _, _, claim in claims.claims:
        try:
            _, spec = log.spec_for_epoch(claim.epoch)
        except LogGap:
            continue
        named.setdefault(spec.module_hash, []).append(claim.epoch)
    if report.module_hash in named and len(named) == 1:
        return
    others = {h: e for h, e in named.items() if h != report.module_hash}
    if others:
        report["replay"].note(f"the module replayed hashes to {report.module_hash}; the specs "
                              "claimed name " + ", ".join(f"{h} (epochs {e})"
                                                           for h, e in others.items()))


# -------------------------------------------------------------------------------------- table


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def render_report(report: AuditReport) -> str:
    """The summary table, then every listed violation, gap and note, for a terminal."""
    width = max(len(i.name) for i in report.invariants)
    skipped = [i.name for i in report.invariants if i.status == "skipped"]
    head = {"ok": "every invariant checked holds" if skipped else "every invariant holds",
            "gap": "no violation, but some records could not be read",
            "violated": f"{len(report.failed)} invariant(s) violated: "
                        f"{', '.join(report.failed)}"}[report.result]
    if skipped:
        head += f" (skipped: {', '.join(skipped)})"
    lines = [f"fx audit {report.workload_id}: {head}"]
    if report.module_hash is not None:
        lines.append(f"replayed with module {report.module_hash}")
    for model_hash, name in sorted(report.model_names.items(), key=lambda kv: kv[1]):
        lines.append(f"model {name} = {model_hash} (named on the spec when written)")
    lines.append(f"  {'invariant'.ljust(width)}  {'result':9} {'violations':>10}  checked")
    for inv in report.invariants:
        status = {"ok": "ok", "violated": "VIOLATED", "gap": "GAP", "skipped": "skipped"}[
            inv.status]
        counts = _counts_text(inv.counts) if not inv.skipped else "replay not run (no --module)"
        lines.append(f"  {inv.name.ljust(width)}  {status:9} {inv.violation_count:>10}  "
                     f"{counts}")
    for inv in report.invariants:
        if inv.violations or inv.gaps:
            lines.append("")
        if inv.violations:
            more = inv.violation_count - len(inv.violations)
            lines.append(f"{inv.name}: {inv.violation_count} violation(s)"
                         + (f" ({more} more not listed)" if more else ""))
            lines.extend(f"  {v}" for v in inv.violations)
        if inv.gaps:
            lines.append(f"{inv.name}: {inv.gap_count} record(s) could not be read")
            lines.extend(f"  {g}" for g in inv.gaps)
    notes = [f"{inv.name}: {n}" for inv in report.invariants for n in inv.notes]
    notes.extend(report.notes)
    if notes:
        lines.append("")
        lines.append("notes:")
        lines.extend(f"  {n}" for n in notes)
    return "\n".join(lines)
