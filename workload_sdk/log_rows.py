"""A workload's records as rows: what ``fx log`` lists and the console's timeline shows. Pure.

:func:`row_of` makes the row of one record (its stream, offset, broker append time, kind,
outcome, effect, step, model...); :class:`LogIndex` joins rows across streams, so each row carries
the offset on ``.out`` that ``fx why ID --output N`` takes to explain it (:attr:`Row.why`) and the
model of its effect as asked and as answered. The console (``console.views``) lists the same rows,
and its filters are ``fx log`` queries (:func:`workload_sdk.log_command`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, get_args

from broker_schema import (
    AcceptedRecord,
    ClaimRecord,
    DecodeError,
    EffectRequest,
    InlineBody,
    InputRecord,
    MergeEntry,
    Outcome,
    OutputRecord,
    ResponseRecord,
    SnapshotRecord,
    SpecRecord,
    TickRecord,
    decode,
    streams,
    topics,
)

__all__ = ["KINDS", "OUTCOMES", "STREAM_ORDER", "LogIndex", "Row", "row_of", "short"]

#: The workload streams in the order a timeline lists records appended in the same millisecond.
STREAM_ORDER = topics.STREAMS
#: Record kinds a timeline can filter on (``undecodable``: bytes that are not a record).
KINDS = (*(kind for s in topics.STREAMS
           for kind in streams.stream_kinds(streams.STREAM_RECORDS[s])), "undecodable")
#: Outcomes a timeline can filter on: a response's outcome, ``accepted``, and a merge entry's
#: ``delivered`` or ``passed_over``.
OUTCOMES = (*get_args(Outcome), "accepted", "delivered", "passed_over", "undecodable")


def short(value: Any, limit: int = 80) -> str:
    """``value`` as compact JSON, cut at ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True,
                                                           separators=(",", ":"))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _body_text(body: Any) -> str:
    if isinstance(body, InlineBody):
        if body.encoding == "base64":
            return f"{len(body.raw())} bytes (base64)"
        return short(body.data)
    return f"{getattr(body, 'type', '?')} ref"


@dataclass(frozen=True, slots=True)
class Row:
    """One record of a workload as ``fx log`` and the timeline list it."""

    stream: str
    offset: int
    time_ms: int
    kind: str
    #: a response's outcome, ``accepted``, ``delivered``/``passed_over`` for a merge entry, or ""
    outcome: str = ""
    effect_id: str | None = None
    effect_kind: str | None = None
    #: the step it belongs to (a request's or output's input offset, a merge entry's seq)
    seq: int | None = None
    epoch: int | None = None
    #: who wrote it or whom it names: holder, executor node, input source
    who: str | None = None
    summary: str = ""
    #: the model its effect asked for (a bound name or a hash), once joined with the request
    model: str | None = None
    #: the model hash its effect was answered with, once joined with the response
    model_hash: str | None = None
    #: the registry name (``name@version``) a spec recorded for that model when it was
    #: written (``SpecRecord.model_names``), once joined; never resolved again
    model_name: str | None = None
    #: on a spec row: the names it records, ``(hash, name@version)`` pairs (for the join)
    names: tuple[tuple[str, str], ...] = ()
    #: the record this one names: a merge entry's source, an answer's request (stream, offset)
    ref: tuple[str, int] | None = None
    #: the offset on ``.out`` that ``fx why ID --output N`` walks back from to explain this row
    #: (the record itself on ``.out``; an answer's request, when that is its effect's; the first
    #: output of the step an input or a merge entry fed), once joined (:class:`LogIndex`); None
    #: where nothing explains it
    why: int | None = None

    @property
    def order(self) -> tuple[int, int, int]:
        """Where the row sits on the timeline: broker append time, then stream, then offset."""
        return (self.time_ms, STREAM_ORDER.index(self.stream), self.offset)


def row_of(stream: str, offset: int, time_ms: int, value: bytes) -> Row:
    """The row of the record ``value`` at ``offset`` on ``stream`` (nothing joined yet)."""
    try:
        rec = decode(value)
    except DecodeError as exc:
        return Row(stream, offset, time_ms, "undecodable", outcome="undecodable",
                   summary=short(str(exc), 120))
    allowed = streams.STREAM_KINDS.get(stream)
    if allowed is not None and rec.kind not in allowed:
        # every reader reads only its own stream's kinds: a claim on .in names no holder
        return Row(stream, offset, time_ms, rec.kind, outcome="wrong_stream",
                   summary=f"a {rec.kind} record does not belong on .{stream} (it holds "
                   f"{', '.join(sorted(allowed))}): ignored by every reader")
    base = (stream, offset, time_ms)
    if isinstance(rec, InputRecord):
        return Row(*base, "input", who=rec.source, summary=_body_text(rec.body))
    if isinstance(rec, SpecRecord):
        names = tuple(sorted((h, n.text()) for h, n in rec.model_names.items()))
        return Row(*base, "spec", names=names,
                   summary=f"module {rec.module_hash[:19]}… kinds {', '.join(rec.effect_kinds)}"
                   + "".join(f"; code {sw.module_hash[:19]}… ({sw.workload_class}) from step "
                             f"{sw.at_step}" for sw in rec.module_switches)
                   + "".join(f"; model {n} = {h[:19]}…" for h, n in names))
    if isinstance(rec, ClaimRecord):
        adopted = "" if rec.from_seq is None else f", adopted from step {rec.from_seq}"
        return Row(*base, "claim", epoch=rec.epoch, who=rec.holder_id,
                   summary=f"epoch {rec.epoch} by {rec.holder_id}, spec "
                   f"@{rec.spec_offset}{adopted}")
    if isinstance(rec, EffectRequest):
        return Row(*base, "request", effect_id=rec.effect_id, effect_kind=rec.effect_kind,
                   seq=rec.header.input_offset, epoch=rec.header.epoch, model=rec.model,
                   summary=f"{rec.effect_kind} params {short(dict(rec.params), 60)}",
                   why=offset)
    if isinstance(rec, OutputRecord):
        return Row(*base, "output", effect_id=rec.header.effect_id,
                   seq=rec.header.input_offset, epoch=rec.header.epoch,
                   summary=_body_text(rec.body), why=offset)
    if isinstance(rec, AcceptedRecord):
        return Row(*base, "accepted", outcome="accepted", effect_id=rec.effect_id,
                   epoch=rec.header.epoch, who=rec.node_id, ref=("out", rec.request_offset),
                   summary=f"by {rec.node_id}, lease {rec.lease_ms} ms, request "
                   f"@{rec.request_offset}")
    if isinstance(rec, ResponseRecord):
        what = (short(rec.error.model_dump(mode="json"), 60) if rec.error is not None
                else _body_text(rec.output) if rec.output is not None else "")
        return Row(*base, "response", outcome=rec.outcome, effect_id=rec.effect_id,
                   epoch=rec.header.epoch, who=rec.written_by, model_hash=rec.model_hash,
                   ref=("out", rec.request_offset),
                   summary=f"{rec.outcome} by {rec.written_by} {what}".strip())
    if isinstance(rec, TickRecord):
        return Row(*base, "tick", epoch=rec.epoch, who=rec.holder_id,
                   summary=f"clock tick by {rec.holder_id}")
    if isinstance(rec, MergeEntry):
        passed = rec.action == "pass_over"
        return Row(*base, "merge", outcome="passed_over" if passed else "delivered",
                   effect_id=rec.effect_id, seq=rec.seq, epoch=rec.epoch,
                   ref=(rec.source, rec.source_offset),
                   summary=(f"seq {rec.seq}: {rec.source}@{rec.source_offset}"
                            + (f" passed over ({rec.reason})" if passed else " delivered")))
    if isinstance(rec, SnapshotRecord):
        return Row(*base, "snapshot", seq=rec.seq, epoch=rec.epoch,
                   summary=f"state before seq {rec.seq}: {rec.state_hash[:19]}…")
    return Row(*base, rec.kind, summary=f"a record that does not belong on {stream}")


def named(row: Row, names: dict[str, str]) -> Row:
    """``row`` with the registry name ``names`` (hash -> name, from the specs' ``model_names``)
    holds for its model, if any (the console's timeline, which joins nothing else)."""
    if row.model_name is not None:
        return row
    found = names.get(row.model_hash or "") or names.get(row.model or "")
    return row if found is None else replace(row, model_name=found)


@dataclass
class LogIndex:
    """What rows of one stream need from the others, gathered as rows are added (in any order;
    incremental, for ``fx log --follow``): requests by effect id, answers' model hashes, the
    first ``.out`` record of each step, the step each input was delivered at."""

    #: effect id -> (offset on ``.out``, model asked for, effect kind)
    requests: dict[str, tuple[int, str | None, str | None]] = field(default_factory=dict)
    #: effect id -> the model hash its (last) response names
    answered: dict[str, str] = field(default_factory=dict)
    #: step seq -> the lowest ``.out`` offset of a record that step wrote
    step_out: dict[int, int] = field(default_factory=dict)
    #: ``.in`` offset -> the seq it was delivered at
    input_seq: dict[int, int] = field(default_factory=dict)
    #: model hash -> the registry name the specs recorded for it (a later spec's wins)
    model_names: dict[str, str] = field(default_factory=dict)

    def add(self, row: Row) -> None:
        """Learn what ``row`` tells the others."""
        if (row.stream == "out" and row.seq is not None and row.outcome != "wrong_stream"
                and row.kind in streams.STREAM_KINDS["out"]):
            if row.kind == "request" and row.effect_id is not None:
                self.requests[row.effect_id] = (row.offset, row.model, row.effect_kind)
            known = self.step_out.get(row.seq)
            if known is None or row.offset < known:
                self.step_out[row.seq] = row.offset
        elif row.kind == "response" and row.effect_id and row.model_hash:
            self.answered[row.effect_id] = row.model_hash
        elif row.kind == "spec" and row.names:
            self.model_names.update(row.names)
        elif (row.kind == "merge" and row.outcome == "delivered" and row.ref is not None
              and row.ref[0] == "in" and row.seq is not None):
            self.input_seq[row.ref[1]] = row.seq

    def joined(self, row: Row) -> Row:
        """``row`` with what the other streams say: its effect's model (asked and answered),
        kind, and the ``.out`` offset ``fx why`` takes (:attr:`Row.why`)."""
        request = self.requests.get(row.effect_id) if row.effect_id else None
        updates: dict[str, Any] = {}
        if request is not None:
            if row.model is None and request[1] is not None:
                updates["model"] = request[1]
            if row.effect_kind is None and request[2] is not None:
                updates["effect_kind"] = request[2]
        if row.model_hash is None and row.effect_id in self.answered:
            updates["model_hash"] = self.answered[row.effect_id]
        if row.model_name is None:
            named = self.model_names.get(updates.get("model_hash") or row.model_hash or "") \
                or self.model_names.get(updates.get("model") or row.model or "")
            if named is not None:
                updates["model_name"] = named
        if row.why is None:
            why = self._why(row, request)
            if why is not None:
                updates["why"] = why
        return replace(row, **updates) if updates else row

    def _why(self, row: Row, request: tuple[int, str | None, str | None] | None) -> int | None:
        if row.ref is not None and row.ref[0] == "out":  # an answer (accepted, response)
            # its request, when the request it names is that effect's (a stray answer: none)
            return request[0] if request is not None and request[0] == row.ref[1] else None
        if row.kind == "input":
            seq = self.input_seq.get(row.offset)
            return None if seq is None else self.step_out.get(seq)
        if row.kind == "merge":
            if row.outcome == "delivered" and row.seq is not None and row.seq in self.step_out:
                return self.step_out[row.seq]
            return None if request is None else request[0]
        return None
