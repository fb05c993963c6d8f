"""A workload's recorded log: what replay, diff, why, audit, verify and the console read.

A :class:`WorkloadLog` holds one :class:`TopicView` per workload stream (and the executors' facts):
the one in-memory log of the project. It comes from the broker (:func:`read_topic`,
:func:`read_facts`; with the referenced bodies resolved: ``workload_sdk.read_workload_log``) or
from a JSONL file (golden logs beside the tests), one line per record:
``{"topic": "in", "offset": 3, "ts": 1796000000000, "value": {...record...}}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from broker_schema import (
    ChunkRef,
    ClaimRecord,
    DecodeError,
    EncodeError,
    FactsRecord,
    Record,
    SpecRecord,
    StreamRef,
    canonical_json,
    decode,
    decode_trusted,
    topics,
)
from broker_schema.binding import accepted_claims, claim_in_force
from broker_schema.topics import check_workload_id
from fx_kafka.client import check_authorized, make_consumer, read_partition


class LogGap(Exception):
    """A record that replay needs is gone: ``trimmed`` (below the log start) or ``missing``
    (not there, or not committed), or ``undecodable``. Replay stops and reports it."""

    def __init__(self, topic: str, offset: int, why: str, detail: str = "") -> None:
        text = f"{topic} offset {offset} is {why}"
        super().__init__(text + (f": {detail}" if detail else ""))
        self.topic = topic
        self.offset = offset
        self.why = why


class RefGap(LogGap):
    """A record replay (or the holder) needs names a chunk or stream record whose bytes cannot
    be read (``why`` is ``unresolved``): deleted, never written, or not what the reference's hash
    says. ``ref`` is the reference; the message names it and where it was looked for."""

    def __init__(self, topic: str, offset: int, ref: ChunkRef | StreamRef, detail: str) -> None:
        super().__init__(topic, offset, "unresolved", detail)
        self.ref = ref


class Redacted(RefGap):
    """The chunk a record names was redacted (``fx redact``: its data key, or its tenant key,
    was destroyed; ``why`` is ``redacted``): replay, ``fx why``, the audit, shadow and the
    console stop there, as at a trimmed record, and say so (``fx replay`` / ``fx why`` exit
    :data:`workload_sdk.cli.EXIT_REDACTED`)."""

    def __init__(self, topic: str, offset: int, ref: ChunkRef | StreamRef, detail: str) -> None:
        super().__init__(topic, offset, ref, detail)
        self.why = "redacted"
        self.args = (f"{topic} offset {offset} is redacted: {detail}",)


class LogFileError(ValueError):
    """A JSONL log file that is not a log: a line that is not JSON, a row without its fields, a
    topic that is not a stream, a value that has no canonical bytes. ``line`` is 1-based."""

    def __init__(self, line: int, detail: str) -> None:
        super().__init__(f"line {line}: {detail}")
        self.line = line
        self.detail = detail


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record as it sits on the log: offset, broker append time, raw value bytes."""

    offset: int
    time_ms: int
    value: bytes
    #: The decoded record, once :meth:`decode` has parsed it (records are immutable, so each is
    #: parsed once however often replay, diff, audit and why read it).
    _record: Record | None = field(default=None, compare=False, repr=False)
    #: Whether :attr:`_record` was decoded strictly (False: by a trusted read, which a strict
    #: read does not reuse).
    _strict: bool = field(default=False, compare=False, repr=False)

    def decode(self, topic: str = "", *, trusted: bool = False) -> Record:
        """The decoded record (parsed once, then kept); :class:`LogGap` (``undecodable``) if
        it is not a valid record. ``trusted``: built without validation
        (:func:`broker_schema.decode_trusted`, for ``replay(..., trust_log=True)``); a record
        decoded strictly is reused by either kind of read, a trusted one only by trusted
        reads."""
        record = self._record
        if record is None or not (trusted or self._strict):
            try:
                record = decode_trusted(self.value) if trusted else decode(self.value)
            except DecodeError as exc:
                raise LogGap(topic, self.offset, "undecodable", str(exc)) from None
            object.__setattr__(self, "_record", record)
            object.__setattr__(self, "_strict", not trusted)
        return record


@dataclass
class TopicView:
    """The records of one topic partition that were read, by offset.

    ``start`` is the log start offset (records below it were trimmed), ``end`` the offset after
    the last record read. ``mirrored``: read from a fleet's copy made by ``fx mirror`` (the
    offsets are the site's: :func:`fx_kafka.client.read_partition`).
    """

    topic: str
    start: int = 0
    end: int = 0
    records: dict[int, LogRecord] = field(default_factory=dict)
    mirrored: bool = False

    def add(self, rec: LogRecord) -> None:
        """Add a record (the view's ``end`` follows)."""
        self.records[rec.offset] = rec
        self.end = max(self.end, rec.offset + 1)

    def raw(self, offset: int) -> LogRecord:
        """The record at ``offset``, or :class:`LogGap` saying whether it was trimmed or is
        missing."""
        rec = self.records.get(offset)
        if rec is not None:
            return rec
        if offset < self.start:
            raise LogGap(self.topic, offset, "trimmed", f"log starts at {self.start}")
        raise LogGap(self.topic, offset, "missing", f"read up to {self.end}")

    def get(self, offset: int) -> Record:
        """The decoded record at ``offset`` (:class:`LogGap` if trimmed, missing, undecodable)."""
        return self.raw(offset).decode(self.topic)

    def __iter__(self) -> Iterator[LogRecord]:
        return iter(sorted(self.records.values(), key=lambda r: r.offset))

    def __len__(self) -> int:
        return len(self.records)


@dataclass
class WorkloadLog:
    """Every stream of one workload, plus the facts executors published (for signatures).

    ``resolved``: the bytes of referenced bodies, read and hash-checked when the log was read
    from the broker (``workload_sdk.read_workload_log``), by ``(stream, offset)``
    of the record holding the reference: an input's body (``in``), an answer's output
    (``resp``), a snapshot's chunk state (``merge``). ``unresolved``: why the others could not be
    read (a chunk deleted or never written...): replay raises :class:`RefGap` with it when it
    needs one. JSONL logs carry neither (golden logs hold inline bodies only)."""

    workload_id: str
    views: dict[str, TopicView]
    facts: list[FactsRecord] = field(default_factory=list)
    resolved: dict[tuple[str, int], bytes] = field(default_factory=dict, repr=False)
    unresolved: dict[tuple[str, int], str] = field(default_factory=dict)
    #: the keys of ``unresolved`` whose chunk was redacted
    redacted: set[tuple[str, int]] = field(default_factory=set)

    @classmethod
    def empty(cls, workload_id: str) -> WorkloadLog:
        """A log with no records."""
        return cls(workload_id,
                   {s: TopicView(topics.stream(workload_id, s)) for s in topics.STREAMS})

    def __getitem__(self, stream: str) -> TopicView:
        return self.views[stream]

    def claim_for_epoch(self, epoch: int) -> tuple[int, ClaimRecord]:
        """The claim record (and its offset on ``.claims``) of ``epoch``."""
        for rec in self.views["claims"]:
            claim = rec.decode(self.views["claims"].topic)
            if isinstance(claim, ClaimRecord) and claim.epoch == epoch:
                return rec.offset, claim
        raise LogGap(self.views["claims"].topic, -1, "missing", f"no claim for epoch {epoch}")

    def spec_for_epoch(self, epoch: int) -> tuple[int, SpecRecord]:
        """The spec record the claim of ``epoch`` names (and its offset on ``.spec``)."""
        _, claim = self.claim_for_epoch(epoch)
        spec = self.views["spec"].get(claim.spec_offset)
        if not isinstance(spec, SpecRecord):
            raise LogGap(self.views["spec"].topic, claim.spec_offset, "missing",
                         "the claim names a record that is not a spec")
        return claim.spec_offset, spec

    def claims(self) -> list[ClaimRecord]:
        """Every claim on ``.claims`` that readers go by, in log order: one too far above the
        highest before it is left out (:func:`broker_schema.binding.accepted_claims`)."""
        view = self.views["claims"]
        out = []
        for rec in view:
            claim = rec.decode(view.topic)
            if isinstance(claim, ClaimRecord):
                out.append(claim)
        return accepted_claims(out)

    def spec_for_step(self, epoch: int, seq: int) -> tuple[int, SpecRecord, ClaimRecord]:
        """The spec binding step ``seq`` of ``epoch`` (:func:`broker_schema.binding.claim_in_force`:
        the epoch's last claim or spec adoption from a step at or before ``seq``), its offset on
        ``.spec``, and the claim that put it in force."""
        claim = claim_in_force(self.claims(), epoch, seq)
        if claim is None:
            raise LogGap(self.views["claims"].topic, -1, "missing", f"no claim for epoch {epoch}")
        spec = self.views["spec"].get(claim.spec_offset)
        if not isinstance(spec, SpecRecord):
            raise LogGap(self.views["spec"].topic, claim.spec_offset, "missing",
                         "the claim names a record that is not a spec")
        return claim.spec_offset, spec, claim

    def model_names(self) -> dict[str, str]:
        """Model hash -> the registry name (``name@version``, ``name@alias=version``) the specs
        on ``.spec`` recorded for it when they were written (``SpecRecord.model_names``; a later
        spec's name wins). Never the registry read now: names are resolved at write time."""
        names: dict[str, str] = {}
        view = self.views["spec"]
        for rec in view:
            try:
                spec = rec.decode(view.topic)
            except LogGap:  # an undecodable record names nothing
                continue
            if isinstance(spec, SpecRecord):
                names.update({h: n.text() for h, n in spec.model_names.items()})
        return names

    # -- JSONL ---------------------------------------------------------------------------------
    def to_jsonl(self, path: Path) -> None:
        """Write the log as JSONL (sorted by stream, then offset)."""
        lines = []
        for stream in topics.STREAMS:
            view = self.views[stream]
            lines.append(json.dumps({"topic": stream, "start": view.start, "end": view.end},
                                    sort_keys=True))
            for rec in view:
                lines.append(json.dumps({"topic": stream, "offset": rec.offset, "ts": rec.time_ms,
                                         "value": json.loads(rec.value)}, sort_keys=True))
        for fact in self.facts:
            lines.append(json.dumps({"topic": "facts", "value": fact.model_dump(mode="json")},
                                    sort_keys=True))
        path.write_text("\n".join(lines) + "\n")

    @classmethod
    def from_jsonl(cls, path: Path, workload_id: str | None = None) -> WorkloadLog:
        """Read a log written by :meth:`to_jsonl` (or by hand: ``start``/``end`` lines are
        optional). Values are stored as their canonical bytes; a value that is not a valid record
        is kept (replay reports it as ``undecodable`` where it needs it). Anything that is not a
        log line raises :class:`LogFileError`, and nothing else does."""
        rows: list[tuple[int, dict[str, Any]]] = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line, parse_constant=_no_constant)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                raise LogFileError(number, f"not JSON: {type(exc).__name__}: "
                                   f"{str(exc)[:200]}") from None
            if not isinstance(row, dict):
                raise LogFileError(number, f"a log line is an object, not {type(row).__name__}")
            rows.append((number, row))
        try:
            wid = workload_id or _guess_workload_id([row for _, row in rows])
            log = cls.empty(check_workload_id(wid))
        except ValueError as exc:
            raise LogFileError(0, str(exc)) from None
        for number, row in rows:
            try:
                log._add_row(row)
            except LogFileError:
                raise
            except (KeyError, TypeError, ValueError, OverflowError, RecursionError,
                    EncodeError) as exc:
                raise LogFileError(number, f"{type(exc).__name__}: {str(exc)[:200]}") from None
        return log

    def _add_row(self, row: dict[str, Any]) -> None:
        topic = row["topic"]
        if topic == "facts":
            try:
                fact = decode(canonical_json(row["value"]))
            except DecodeError as exc:
                raise ValueError(f"facts value is not a record: {exc}") from None
            if isinstance(fact, FactsRecord):
                self.facts.append(fact)
            return
        if not isinstance(topic, str) or topic not in self.views:
            raise ValueError(f"topic {str(topic)[:60]!r} is not one of {list(topics.STREAMS)}")
        view = self.views[topic]
        if "value" not in row:
            view.start = _offset(row.get("start", 0), "start")
            view.end = max(view.end, _offset(row.get("end", 0), "end"))
            return
        view.add(LogRecord(_offset(row["offset"], "offset"), _offset(row["ts"], "ts"),
                           canonical_json(row["value"])))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _offset(value: Any, name: str) -> int:
    """A non-negative JSON integer (offsets, times): not a float, a string or a boolean."""
    if type(value) is not int or not 0 <= value < 2**63:
        raise ValueError(f"{name} must be a non-negative integer, not {str(value)[:40]!r}")
    return value


def _guess_workload_id(rows: list[dict[str, Any]]) -> str:
    for row in rows:
        value = row.get("value")
        if isinstance(value, dict):
            if "workload_id" in value:
                return str(value["workload_id"])
            header = value.get("header")
            if isinstance(header, dict) and "workload_id" in header:
                return str(header["workload_id"])
    raise ValueError("cannot tell the workload id from the log; pass it")


# ------------------------------------------------------------------------ from the broker
async def read_topic(bootstrap: str, topic: str, *, start: int | None = None,
                     timeout: float = 30.0) -> TopicView:
    """Every committed record of partition 0 of ``topic`` from ``start`` (default: the log start)
    up to its last stable offset at the time of the call."""
    consumer = make_consumer(bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await check_authorized(consumer, [topic])  # a denied topic: said at once
        read = await read_partition(consumer, topic, start=start, timeout=timeout)
    finally:
        await consumer.stop()
    view = TopicView(topic=topic, start=read.begin, end=read.begin, mirrored=read.mirrored)
    for offset, time_ms, value in read.records:
        view.add(LogRecord(offset, time_ms, value))
    view.end = max(view.end, read.end)
    return view


async def read_facts(bootstrap: str, timeout: float = 30.0) -> list[FactsRecord]:
    """The facts records on ``sys.facts`` (all of them, latest last); empty if the topic is
    absent."""
    return (await read_facts_since(bootstrap, None, timeout=timeout))[0]


async def read_facts_since(bootstrap: str, start: int | None, *, timeout: float = 30.0
                           ) -> tuple[list[FactsRecord], int | None]:
    """The facts records on ``sys.facts`` from offset ``start`` (None: the log start), latest
    last, and the offset to read from next time (``start`` again, and no records, if the topic
    is absent)."""
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        present = topics.FACTS in await consumer.topics()
    finally:
        await consumer.stop()
    if not present:
        return [], start
    facts: list[FactsRecord] = []
    view = await read_topic(bootstrap, topics.FACTS, start=start, timeout=timeout)
    for rec in view:
        try:
            record = decode(rec.value)
        except DecodeError:
            continue
        if isinstance(record, FactsRecord):
            facts.append(record)
    return facts, view.end
