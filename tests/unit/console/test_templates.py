"""Every template renders what its view models give it, the branches the browser tests do not
reach included (a shadow report, an open alarm, a ledger with problems, a why walk stopped by
a gap, a verify result that failed): a template error would be a 500."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker_schema import AlarmRecord, ShadowReportRecord, decode, sha256_hex
from console import views
from console.app import make_templates
from executor.verify_workload import ReceiptCheck, WorkloadVerification
from fx_kafka.workload_log import WorkloadLog
from workload_sdk import why

GOLDEN = Path(__file__).resolve().parents[1] / "workload_sdk" / "golden" / "asker_failover.jsonl"


@pytest.fixture
def log() -> WorkloadLog:
    return WorkloadLog.from_jsonl(GOLDEN)


def render(name: str, **ctx: Any) -> str:
    return make_templates("b:9092").env.get_template(name).render(**ctx)


def _rows(log: WorkloadLog) -> list[views.Row]:
    return sorted((views.row_of(s, r.offset, r.time_ms, r.value)
                   for s in views.STREAM_ORDER for r in log[s]), key=lambda r: r.order)


def _alarm(log: WorkloadLog) -> AlarmRecord:
    req = next(decode(r.value) for r in log["out"] if decode(r.value).kind == "request")
    return AlarmRecord(alarm_id=req.header.effect_id, workload_id=log.workload_id,
                       header=req.header, effect_kind=req.effect_kind,
                       guarantee="at-most-once", request_offset=1, reason="lease lapsed <b>",
                       raised_by="h1", raised_us=1_000_000)


def test_executors_page_with_a_shadow_report_and_an_alarm(log: WorkloadLog) -> None:
    report = ShadowReportRecord(
        eval_id="e1", workload_id=log.workload_id, from_seq=0, to_seq=9, requests=4,
        answered=4, steps=10, decisions=5, decisions_differ=2, first_differing_seq=3,
        ends={"in": 5}, report_hash=sha256_hex(b"r"), written_ms=1)
    html = render("executors.html", nodes=views.node_facts(log.facts, 2_000_000),
                  reports=[views.shadow_report(log.workload_id, "e1", 1, "wl.x.shadow.e1.eval",
                                               report)],
                  alarms=[(0, _alarm(log))])
    assert "2 differ" in html and "first at step 3" in html
    # the command that runs (tests/integration/workload_sdk/test_mistakes.py runs it)
    assert f"fx shadow show e1 --workload {log.workload_id}</code>" in html
    assert 'class="alarm"' in html and "lease lapsed &lt;b&gt;" in html  # escaped
    assert log.facts[0].node_id in html


def test_workloads_timeline_record_and_effect_pages(log: WorkloadLog) -> None:
    rows = _rows(log)
    html = render("workloads.html", workloads=[views.summarize(log.workload_id, rows,
                                                               [_alarm(log)])], alarms=1)
    assert f'data-workload="{log.workload_id}"' in html
    ends = {s: (log[s].start, log[s].end) for s in views.STREAM_ORDER}
    flt = views.parse_filter([], ["timeout"], None, None, None)
    html = render("timeline.html", wid=log.workload_id, page=views.page_of(rows, flt),
                  flt=flt, kinds=views.KINDS, outcomes=views.OUTCOMES,
                  streams=views.STREAM_ORDER, base=[("outcome", "timeout")], ends=ends,
                  strip=views.offset_strip(rows, ends),
                  log_cmd=views.log_query(log.workload_id, flt))
    assert 'class="row k-response o-timeout' in html and 'id="strip"' in html
    # the same query as a command (tests/unit/workload_sdk/test_log_query.py: the same rows)
    assert (f'<code id="log-command">fx log {log.workload_id} --outcome timeout</code>'
            in html)
    effect = next(r.effect_id for r in rows if r.kind == "request")
    html = render("effect.html", wid=log.workload_id, effect_id=effect,
                  rows=views.effect_rows(rows, effect))
    assert html.count('class="row ') == len(views.effect_rows(rows, effect))
    html = render("record.html", wid=log.workload_id, row=rows[0], body="{}", topic="t",
                  size=2)
    assert 'id="record-body"' in html


def test_why_page_drawn_and_stopped(log: WorkloadLog) -> None:
    offset = next(r.offset for r in log["out"] if '"outcome":"ok"' in r.value.decode())
    tree = why(log, out_offset=offset)
    html = render("why.html", wid=log.workload_id, offset=offset, tree=tree,
                  graph=views.why_graph(tree, lambda s, o: f"/w/x/r/{s}/{o}"), gap=None,
                  tree_json="{}")
    assert 'id="box-input1"' in html and 'id="why-graph"' in html
    html = render("why.html", wid=log.workload_id, offset=offset, tree=None, graph=None,
                  gap="wl.x.in offset 0 is trimmed")
    assert 'id="why-gap"' in html and "trimmed" in html


def test_receipts_page_with_a_failed_result_and_ledger_problems() -> None:
    rows = [views.ReceiptRow(3, "w/0/0@1", "n1", 2, "ab" * 32, "sha256:" + "cd" * 32, "Paris",
                             True, "sha256:1")]
    check = ReceiptCheck(offset=3, effect_id="w/0/0@1", node_id="n1", seq=2, text="Paris",
                         reasons=["the signature does not verify"], checks=["input_hash"],
                         notes=["chain gap: seq 1 of node n1 is not in this workload"])
    result = WorkloadVerification("w", [check], {}, [])
    html = render("receipts.html", wid="w", rows=rows, chains=views.chains(rows),
                  ledgers={"n1": {"present": True, "leaves": 3, "checkpoints": 1, "pending": 2,
                                  "problems": [("gap", "leaf 1 missing")],
                                  "topic": "sys.ledger.n1"}},
                  result=result, result_offset=3, seconds=1.5)
    assert 'id="verify-result" class="verify-fail"' in html
    assert "FAIL the signature does not verify" in html and "seq 0..1: gap" in html
    assert "gap: leaf 1 missing" in html
