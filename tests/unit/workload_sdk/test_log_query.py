"""``fx log``'s pure part on the golden log: rows joined across streams (each row's ``why`` is an
offset ``fx why`` walks from), every filter, the parse errors, the printed forms, and the
console's timeline filters as ``fx log`` commands that keep exactly the console's rows."""

from __future__ import annotations

import json
import shlex
from collections import Counter
from dataclasses import fields
from pathlib import Path

import pytest

from broker_schema import BindingSwitch, EffectRequest, MergeEntry, OutputRecord, SpecRecord, decode
from console import views
from fx_cli.main import build_parser
from fx_kafka.workload_log import WorkloadLog
from workload_sdk import log_command, why, why_command
from workload_sdk._log_query import (
    DECISION_KINDS,
    LogQuery,
    QueryError,
    bound_models,
    log_records,
    parse_query,
    record_fields,
    render_row,
    row_json,
    rows_of,
    table_header,
    with_model_names,
)
from workload_sdk.log_rows import LogIndex, Row

GOLDEN = Path(__file__).resolve().parent / "golden" / "asker_failover.jsonl"


@pytest.fixture(scope="module")
def log() -> WorkloadLog:
    return WorkloadLog.from_jsonl(GOLDEN)


@pytest.fixture(scope="module")
def rows(log: WorkloadLog) -> list[Row]:
    return rows_of(log_records(log), LogIndex())


def _keep(rows: list[Row], log: WorkloadLog, query: LogQuery) -> list[tuple[str, int]]:
    values = {(s, r.offset): r.value for s, r in log_records(log)}
    return [(r.stream, r.offset) for r in rows
            if query.matches(r, record_fields(values[(r.stream, r.offset)]))]


def test_every_row_in_timeline_order_and_every_why_walks(log: WorkloadLog,
                                                         rows: list[Row]) -> None:
    assert len(rows) == sum(len(log[s]) for s in views.STREAM_ORDER)
    assert [r.order for r in rows] == sorted(r.order for r in rows)
    walked: dict[int, dict[str, object]] = {}
    for row in rows:
        if row.why is None:
            continue
        tree = walked.setdefault(row.why, why(log, out_offset=row.why))
        assert tree["output"]["offset"] == row.why  # type: ignore[index]
    # what has a why: everything on .out, every answer, every delivery, every input merged
    for row in rows:
        if row.kind in ("request", "output"):
            assert row.why == row.offset, row
        if row.kind == "merge" and row.outcome == "delivered":
            assert row.why is not None, row
        if row.kind in ("spec", "claim", "snapshot", "tick"):
            assert row.why is None, row
    merged_inputs = {e.source_offset for e in (decode(r.value) for r in log["merge"])
                     if isinstance(e, MergeEntry) and e.source == "in"
                     and e.action == "deliver"}
    for row in rows:
        if row.kind == "input" and row.offset in merged_inputs:
            out = decode(log["out"].raw(row.why).value)  # type: ignore[arg-type]
            assert isinstance(out, EffectRequest | OutputRecord)


def test_an_answer_row_points_at_its_request_and_carries_the_model(rows: list[Row]) -> None:
    requests = {r.effect_id: r for r in rows if r.kind == "request"}
    answers = [r for r in rows if r.kind == "response"]
    assert answers
    stray = [a for a in answers if a.effect_id not in requests]
    assert all(a.why is None for a in stray)  # answers an effect this workload never asked
    for answer in answers:
        if answer in stray:
            continue
        request = requests[answer.effect_id]
        assert answer.why == request.offset and answer.ref == ("out", request.offset)
        assert answer.model == request.model and answer.effect_kind == request.effect_kind
        if answer.model_hash:
            assert request.model_hash is not None


def test_following_batch_by_batch_gives_the_same_rows_as_one_read(log: WorkloadLog,
                                                                  rows: list[Row]) -> None:
    # in timeline order (what a follower reads commits in): broker time, stream, offset
    records = sorted(log_records(log), key=lambda sr: (
        sr[1].time_ms, views.STREAM_ORDER.index(sr[0]), sr[1].offset))
    index = LogIndex()
    followed: list[Row] = []
    for i in range(0, len(records), 4):
        followed += rows_of(records[i:i + 4], index)
    by_key = {(r.stream, r.offset): r for r in rows}
    assert len(followed) == len(rows)
    for row in followed:
        whole = by_key[(row.stream, row.offset)]
        # a row printed before the record it joins with is read (an input before its merge
        # entry, a request before its answer) lacks only what that record says
        for f in fields(Row):
            assert getattr(row, f.name) in (None, getattr(whole, f.name)), (f.name, row)
        assert (row.kind, row.outcome, row.summary) == (whole.kind, whole.outcome, whole.summary)
        if row.stream == "out" or row.kind == "response":
            assert row.why == whole.why


def test_filters(log: WorkloadLog, rows: list[Row]) -> None:
    def keep(**kw: object) -> list[tuple[str, int]]:
        return _keep(rows, log, parse_query(**kw))  # type: ignore[arg-type]

    assert keep() == [(r.stream, r.offset) for r in rows]
    assert {s for s, _ in keep(streams=["out", "merge"])} == {"out", "merge"}
    assert all(r.kind in DECISION_KINDS for r in rows
               if (r.stream, r.offset) in set(keep(decisions=True)))
    assert keep(decisions=True, kinds=["merge"]) == keep(kinds=["merge"])
    timeouts = keep(outcomes=["timeout"])
    assert timeouts and all(r.outcome == "timeout" for r in rows
                            if (r.stream, r.offset) in set(timeouts))
    effect = next(r.effect_id for r in rows if r.kind == "request")
    kinds = Counter(r.kind for r in rows if (r.stream, r.offset) in set(keep(effects=[effect])))
    assert kinds["request"] == 1 and kinds["response"] >= 1
    model = next(r.model for r in rows if r.kind == "request")
    assert model and keep(models=[model]) == [(r.stream, r.offset) for r in rows
                                             if r.model == model or r.model_hash == model]
    assert keep(streams=["in"], lo=1, hi=2) == [("in", 1), ("in", 2)]
    # field tests: row columns and the record's JSON, values read as JSON or as text
    assert keep(fields=["kind=input", "body.data=2"]) == [("in", 1)]
    assert keep(fields=["seq=0", "kind=merge"]) == [(r.stream, r.offset) for r in rows
                                                     if r.kind == "merge" and r.seq == 0]
    assert keep(fields=['seq="0"']) == []  # a JSON string is not the number
    assert keep(fields=["stream=in"]) == keep(streams=["in"])
    assert keep(fields=["body.data=true"]) == []  # 1 is not true
    assert keep(fields=["no.such.field=1"]) == []
    passed = keep(fields=["action=pass_over"])
    assert passed == keep(outcomes=["passed_over"])


@pytest.mark.parametrize(("kw", "says"), [
    ({"kinds": ["bogus"]}, "unknown record kind 'bogus' (one of input, spec"),
    ({"outcomes": ["late"]}, "unknown outcome 'late' (one of ok, error"),
    ({"streams": ["log"]}, "unknown stream 'log' (one of in, spec, claims"),
    ({"fields": ["kind"]}, "a field test is FIELD=VALUE"),
    ({"fields": ["a..b=1"]}, "a field test is FIELD=VALUE"),
    ({"lo": 5, "hi": 2}, "the offset range is empty: --from 5 > --to 2"),
    ({"lo": -1}, "--from is an offset"),
    ({"decisions": True, "kinds": ["spec"]}, "--decisions keeps only request, output, merge"),
])
def test_a_filter_it_does_not_know_is_one_line(kw: dict[str, object], says: str) -> None:
    with pytest.raises(QueryError) as exc:
        parse_query(**kw)  # type: ignore[arg-type]
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_table_and_json_lines(log: WorkloadLog, rows: list[Row]) -> None:
    header = table_header()
    assert header.startswith("time") and header.endswith("summary") and " why " in header
    for row in rows:
        line = render_row(row, log.workload_id)
        assert f".{row.stream}@{row.offset}" in line and "\n" not in line
        data = json.loads(json.dumps(row_json(log.workload_id, row)))
        assert (data["stream"], data["offset"], data["why"]) == (row.stream, row.offset,
                                                                 row.why)
        assert data["why_command"] == (None if row.why is None
                                       else why_command(log.workload_id, row.why))


@pytest.mark.parametrize(("kinds", "outcomes", "stream", "lo", "hi"), [
    ([], [], None, None, None),
    ([], ["timeout"], None, None, None),
    (["request", "output"], [], "out", "1", "6"),
    (["merge"], ["passed_over", "delivered"], None, "2", None),
    ([], [], "in", "1", "1"),
])
def test_the_consoles_filter_as_a_command_keeps_the_consoles_rows(
        log: WorkloadLog, rows: list[Row], kinds: list[str], outcomes: list[str],
        stream: str | None, lo: str | None, hi: str | None) -> None:
    flt = views.parse_filter(kinds, outcomes, stream, lo, hi)
    console = [(r.stream, r.offset) for r in views.page_of(rows, flt, size=1000).rows]
    command = views.log_query(log.workload_id, flt)
    assert command == log_command(log.workload_id, streams=[stream] if stream else [],
                                  kinds=kinds, outcomes=outcomes,
                                  lo=None if lo is None else int(lo),
                                  hi=None if hi is None else int(hi))
    argv = shlex.split(command)
    assert argv[:3] == ["fx", "log", log.workload_id]
    args = build_parser().parse_args(argv[1:])
    query = parse_query(streams=args.stream or (), kinds=args.kind or (),
                        outcomes=args.outcome or (), models=args.model or (),
                        effects=args.effect or (), fields=args.where or (), lo=args.lo,
                        hi=args.hi, decisions=args.decisions)
    assert _keep(rows, log, query) == console


def test_a_model_name_is_every_hash_the_specs_bound_to_it(log: WorkloadLog,
                                                           rows: list[Row]) -> None:
    specs = [s for s in (decode(r.value) for r in log["spec"]) if isinstance(s, SpecRecord)]
    spec = specs[0]
    h1, h2 = "sha256:" + "11" * 32, "sha256:" + "22" * 32
    switched = spec.model_copy(update={"models": {"m": h1}, "binding_switches": (
        BindingSwitch(at_input_offset=5, models={"m": h2, "other": h1}),)})
    bindings = bound_models([switched])
    assert bindings == {"m": frozenset({h1, h2}), "other": frozenset({h1})}
    query = with_model_names(parse_query(models=["m", "sha256:" + "33" * 32]), bindings)
    assert query.models == {h1, h2, "sha256:" + "33" * 32}
    assert with_model_names(parse_query(), bindings) == parse_query()
    with pytest.raises(QueryError, match=r"--model 'x': no spec of the workload binds a model "
                       r"of that name \(bound: m, other\)"):
        with_model_names(parse_query(models=["x"]), bindings)
    # on the golden log: the name keeps exactly the rows of the hashes bound to it
    golden = bound_models(specs)
    for name, hashes in golden.items():
        by_name = _keep(rows, log, with_model_names(parse_query(models=[name]), golden))
        assert by_name == _keep(rows, log, parse_query(models=sorted(hashes)))
