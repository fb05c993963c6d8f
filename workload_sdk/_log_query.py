"""``fx log``'s decisions, pure: which rows a query keeps, and how they are printed.

A :class:`LogQuery` (from the command line: :func:`parse_query`) keeps a row when it passes every
filter that is set: streams, record kinds, outcomes (the console's: a response's outcome,
``accepted``, a merge entry's ``delivered``/``passed_over``), models (a hash, as the request
asked or the response answered; or a name a spec binds: every hash bound to it,
:func:`with_model_names`), effect ids, an offset range, and ``FIELD=VALUE`` tests on the row's
columns or the record's own JSON (dotted paths: ``params.set_point=0``, ``header.epoch=2``,
``reason=deadline``). Rows come from
:mod:`workload_sdk.log_rows` (joined by :class:`~workload_sdk.log_rows.LogIndex`, so each carries
the ``.out`` offset ``fx why`` takes). The reading (and ``--follow``) is the shell's:
:mod:`workload_sdk._log_cli`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime
from typing import Any

from broker_schema import SpecRecord, topics
from broker_schema.canonical import HASH_PREFIX
from fx_kafka.workload_log import LogRecord, WorkloadLog
from workload_sdk._commands import why_command
from workload_sdk.log_rows import KINDS, OUTCOMES, STREAM_ORDER, LogIndex, Row, row_of

__all__ = ["DECISION_KINDS", "LogQuery", "QueryError", "bound_models", "parse_query",
           "record_fields", "render_row", "row_json", "rows_of", "table_header",
           "with_model_names"]

#: What ``--decisions`` keeps: what the holder decided (requests and outputs on ``.out``, the
#: merge order's deliveries and pass-overs).
DECISION_KINDS = ("request", "output", "merge")
#: The row's own columns a ``FIELD=VALUE`` test reads before the record's JSON.
ROW_COLUMNS = frozenset(f.name for f in fields(Row))
#: A value no JSON document holds (a path that is not there).
_ABSENT = object()


class QueryError(ValueError):
    """A filter ``fx log`` does not know: the message is the one line to print."""


@dataclass(frozen=True)
class LogQuery:
    """What ``fx log`` keeps (an empty set: no filter on that column)."""

    streams: frozenset[str] = frozenset()
    kinds: frozenset[str] = frozenset()
    outcomes: frozenset[str] = frozenset()
    models: frozenset[str] = frozenset()
    effects: frozenset[str] = frozenset()
    #: ``(path, value)``: the row's column or the record's JSON at ``path`` equals ``value``
    fields: tuple[tuple[str, str], ...] = ()
    lo: int | None = None
    hi: int | None = None

    @property
    def reads_records(self) -> bool:
        """Whether a field test reads the record's JSON (not only the row's columns)."""
        return any(path.split(".")[0] not in ROW_COLUMNS for path, _ in self.fields)

    def matches(self, row: Row, record: Mapping[str, Any] | None = None) -> bool:
        """Does ``row`` (with its record's JSON, for field tests) pass every filter set?"""
        return ((not self.streams or row.stream in self.streams)
                and (not self.kinds or row.kind in self.kinds)
                and (not self.outcomes or row.outcome in self.outcomes)
                and (not self.models or bool({row.model, row.model_hash} & self.models))
                and (not self.effects or row.effect_id in self.effects)
                and (self.lo is None or row.offset >= self.lo)
                and (self.hi is None or row.offset <= self.hi)
                and all(_equals(_lookup(row, record, path), value)
                        for path, value in self.fields))


def _choices(name: str, given: Iterable[str], known: Sequence[str]) -> frozenset[str]:
    values = frozenset(given)
    bad = sorted(values - set(known))
    if bad:
        raise QueryError(f"unknown {name} {bad[0][:40]!r} (one of {', '.join(known)})")
    return values


def parse_query(*, streams: Iterable[str] = (), kinds: Iterable[str] = (),
                outcomes: Iterable[str] = (), models: Iterable[str] = (),
                effects: Iterable[str] = (), fields: Iterable[str] = (),
                lo: int | None = None, hi: int | None = None,
                decisions: bool = False) -> LogQuery:
    """A :class:`LogQuery` from ``fx log``'s arguments; :class:`QueryError` for a stream, kind or
    outcome it does not know, a field test that is not ``FIELD=VALUE``, or an empty range.
    ``decisions``: only :data:`DECISION_KINDS` (with ``kinds``: those of them)."""
    kind_set = _choices("record kind", kinds, KINDS)
    if decisions:
        kind_set = (kind_set & frozenset(DECISION_KINDS)) if kind_set else \
            frozenset(DECISION_KINDS)
        if not kind_set:
            raise QueryError(f"--decisions keeps only {', '.join(DECISION_KINDS)}, and --kind "
                             "named none of them")
    tests = []
    for text in fields:
        path, sep, value = text.partition("=")
        if not sep or not path or any(not part for part in path.split(".")):
            raise QueryError(f"a field test is FIELD=VALUE (FIELD a column or a dotted path in "
                             f"the record, e.g. params.set_point=0), not {text[:60]!r}")
        tests.append((path, value))
    for name, bound in (("--from", lo), ("--to", hi)):
        if bound is not None and bound < 0:
            raise QueryError(f"{name} is an offset (0 or more), not {bound}")
    if lo is not None and hi is not None and lo > hi:
        raise QueryError(f"the offset range is empty: --from {lo} > --to {hi}")
    return LogQuery(streams=_choices("stream", streams, STREAM_ORDER), kinds=kind_set,
                    outcomes=_choices("outcome", outcomes, OUTCOMES),
                    models=frozenset(models), effects=frozenset(effects),
                    fields=tuple(tests), lo=lo, hi=hi)


def bound_models(specs: Iterable[SpecRecord]) -> dict[str, frozenset[str]]:
    """Each model name the workload's ``specs`` bind (in ``models`` or a binding switch) and
    every hash they ever bound it to."""
    names: dict[str, set[str]] = {}
    for spec in specs:
        for models in (spec.models, *(s.models for s in spec.binding_switches)):
            for name, model_hash in models.items():
                names.setdefault(name, set()).add(model_hash)
    return {name: frozenset(hashes) for name, hashes in names.items()}


def with_model_names(query: LogQuery, bindings: Mapping[str, frozenset[str]]) -> LogQuery:
    """``query`` with each model given by a bound name (not ``sha256:...``) widened to the
    hashes the specs bound it to (:func:`bound_models`): requests name the hash, not the name.
    :class:`QueryError` for a name no spec binds."""
    names = sorted(m for m in query.models if not m.startswith(HASH_PREFIX))
    if not names:
        return query
    unknown = [n for n in names if n not in bindings]
    if unknown:
        known = ", ".join(sorted(bindings)) or "none"
        raise QueryError(f"--model {unknown[0]!r}: no spec of the workload binds a model of "
                         f"that name (bound: {known}); or give a sha256: hash")
    widened = set(query.models) - set(names)
    for name in names:
        widened |= bindings[name]
    return replace(query, models=frozenset(widened))


def _lookup(row: Row, record: Mapping[str, Any] | None, path: str) -> Any:
    head, *rest = path.split(".")
    value: Any
    if head in ROW_COLUMNS:
        value = getattr(row, head)
    elif record is not None and head in record:
        value = record[head]
    else:
        return _ABSENT
    for part in rest:
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list | tuple) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _ABSENT
    return value


def _equals(actual: Any, text: str) -> bool:
    """A field test: ``actual`` equals ``text`` read as JSON (``3``, ``true``, ``null``,
    ``"x"``, a booleans only equal to a boolean), or, for a string or number, ``text`` as
    written (``source=scanner-3``)."""
    if actual is _ABSENT:
        return False
    try:
        wanted = json.loads(text)
    except ValueError:
        wanted = _ABSENT
    if wanted is not _ABSENT:
        if isinstance(actual, bool) or isinstance(wanted, bool):
            if isinstance(actual, bool) and isinstance(wanted, bool):
                return actual == wanted
        elif actual == wanted:
            return True
    return (isinstance(actual, str | int | float) and not isinstance(actual, bool)
            and str(actual) == text)


def record_fields(value: bytes) -> dict[str, Any] | None:
    """The record's JSON, for field tests (None when it is not a JSON object)."""
    try:
        data = json.loads(value)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def rows_of(records: Iterable[tuple[str, LogRecord]], index: LogIndex) -> list[Row]:
    """The rows of ``records`` (stream, record), joined with what ``index`` knows once it has
    learnt from them all, in timeline order (broker time, stream, offset)."""
    rows = [row_of(stream, rec.offset, rec.time_ms, rec.value) for stream, rec in records]
    for row in rows:
        index.add(row)
    return sorted((index.joined(row) for row in rows), key=lambda r: r.order)


def log_records(log: WorkloadLog) -> list[tuple[str, LogRecord]]:
    """Every record of ``log``'s workload streams, as ``(stream, record)``."""
    return [(stream, rec) for stream in topics.STREAMS for rec in log[stream]]


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="milliseconds")


def row_json(workload_id: str, row: Row) -> dict[str, Any]:
    """``row`` as one JSON line of ``fx log --json`` (with ``why_command`` when it has one)."""
    data = asdict(row)
    data["ref"] = None if row.ref is None else {"stream": row.ref[0], "offset": row.ref[1]}
    data["time"] = _time(row.time_ms)
    data["why_command"] = None if row.why is None else why_command(workload_id, row.why)
    return data


#: ``fx log``'s table: (title, width) of each column but the last (the summary).
COLUMNS = (("time", 29), ("record", 12), ("kind", 10), ("outcome", 12), ("step", 5),
           ("effect", 14), ("model", 18), ("why", 5))


def table_header() -> str:
    """The table's header line."""
    return " ".join(title.ljust(width) for title, width in COLUMNS) + " summary"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def render_row(row: Row, workload_id: str) -> str:
    """One line of ``fx log``'s table (``why``: the offset to give ``fx why ID --output``; an
    effect id without the workload's own ``ID/`` in front)."""
    model = row.model_name or row.model or row.model_hash or ""  # the name, where recorded
    effect = row.effect_id or ""
    effect = effect.removeprefix(f"{workload_id}/")
    cells = (_time(row.time_ms), f".{row.stream}@{row.offset}", row.kind, row.outcome,
             "" if row.seq is None else str(row.seq), effect, model,
             "" if row.why is None else str(row.why))
    return " ".join(_cut(cell, width).ljust(width)
                    for cell, (_, width) in zip(cells, COLUMNS, strict=True)) + " " + row.summary
