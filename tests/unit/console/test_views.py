"""The console's view models over a recorded log (the golden failover log of the workload SDK
tests: two epochs, an answer passed over, an error, a timeout, snapshots, signed answers)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from broker_schema import (
    AlarmAckRecord,
    AlarmRecord,
    ClaimRecord,
    FactsRecord,
    KindServed,
    decode,
    encode,
    sha256_hex,
)
from console import views
from console.views import BadInput, Filter, NotFound, ReceiptRow
from fx_kafka.workload_log import WorkloadLog
from workload_sdk import why

GOLDEN = Path(__file__).resolve().parents[1] / "workload_sdk" / "golden" / "asker_failover.jsonl"


@pytest.fixture
def log() -> WorkloadLog:
    return WorkloadLog.from_jsonl(GOLDEN)


def rows_of(log: WorkloadLog) -> list[views.Row]:
    return sorted((views.row_of(s, r.offset, r.time_ms, r.value)
                   for s in views.STREAM_ORDER for r in log[s]), key=lambda r: r.order)


def test_every_record_is_a_row_with_its_kind_and_outcome(log: WorkloadLog) -> None:
    rows = rows_of(log)
    assert len(rows) == sum(len(log[s]) for s in views.STREAM_ORDER)
    for row in rows:
        assert row.kind == decode(log[row.stream].records[row.offset].value).kind
    kinds = {(r.kind, r.outcome) for r in rows}
    assert {("merge", "passed_over"), ("merge", "delivered"), ("response", "timeout"),
            ("response", "error"), ("response", "ok"), ("accepted", "accepted")} <= kinds
    passed = [r for r in rows if r.outcome == "passed_over"]
    assert all("passed over" in r.summary for r in passed)
    # timeline order: broker time, then stream, then offset
    assert [r.order for r in rows] == sorted(r.order for r in rows)


def test_bytes_that_are_not_a_record_are_a_row_too() -> None:
    row = views.row_of("resp", 7, 5, b"{not json")
    assert (row.kind, row.outcome, row.offset) == ("undecodable", "undecodable", 7)


def test_the_holder_comes_from_accepted_claims_on_claims_only() -> None:
    """Issue 30, attack 5: a claim written to ``.in`` (the producer role may) made the
    workloads page show holder ``mallory-on-in``, epoch 9999. A record of a kind that does not
    belong on its stream is a ``wrong_stream`` row; a claim far ahead is refused as every
    reader refuses it."""
    def claim(epoch: int, holder: str) -> bytes:
        return encode(ClaimRecord(workload_id="w", epoch=epoch, holder_id=holder,
                                  spec_hash="sha256:" + "0" * 64, spec_offset=0))

    rows = [views.row_of("claims", 0, 1, claim(1, "h-real")),
            views.row_of("in", 0, 2, claim(9999, "mallory-on-in")),
            views.row_of("claims", 1, 3, claim(2**53 - 1, "mallory-far")),
            views.row_of("claims", 2, 4, claim(2, "h-next"))]
    assert rows[1].outcome == "wrong_stream" and "does not belong on .in" in rows[1].summary
    summary = views.summarize("w", rows)
    assert (summary.holder, summary.epoch) == ("h-next", 2)


def test_the_summary_names_the_latest_holder_and_counts_outcomes(log: WorkloadLog) -> None:
    rows = rows_of(log)
    claims = log.claims()
    s = views.summarize(log.workload_id, rows)
    assert (s.holder, s.epoch) == (claims[-1].holder_id, claims[-1].epoch)
    assert s.records == len(rows) and s.last_ms == max(r.time_ms for r in rows)
    responses = [r for r in rows if r.kind == "response"]
    assert sum(sum(c.values()) for c in s.outcomes.values()) == len(responses)
    assert s.passed_over == sum(r.outcome == "passed_over" for r in rows)
    asked = {r.effect_id for r in rows if r.kind == "request"}
    answered = {r.effect_id for r in responses}
    assert s.outstanding == len(asked - answered)
    # a request without its response is outstanding
    unanswered = [r for r in rows if not (r.kind == "response" and r.effect_id in asked)]
    assert views.summarize(log.workload_id, unanswered).outstanding == len(asked)


def test_alarms_count_until_acknowledged(log: WorkloadLog) -> None:
    req = next(decode(r.value) for r in log["out"] if decode(r.value).kind == "request")
    alarm = AlarmRecord(alarm_id=req.header.effect_id, workload_id=log.workload_id,
                        header=req.header, effect_kind=req.effect_kind, guarantee="at-most-once",
                        request_offset=1, reason="lease lapsed", raised_by="h1", raised_us=1)
    ack = AlarmAckRecord(alarm_id=alarm.alarm_id, acked_by="op", acked_us=2)
    assert [a for _, a in views.open_alarms([(0, alarm)])] == [alarm]
    assert views.open_alarms([(0, alarm), (1, ack)]) == []
    s = views.summarize(log.workload_id, rows_of(log), [alarm])
    assert s.alarms == 1
    assert views.summarize("other", [], [alarm]).alarms == 0


def test_filters_and_pages(log: WorkloadLog) -> None:
    rows = rows_of(log)
    flt = views.parse_filter(["response"], ["ok", "timeout"], None, None, None)
    page = views.page_of(rows, flt, page=0)
    assert page.rows and {r.kind for r in page.rows} == {"response"}
    assert {r.outcome for r in page.rows} == {"ok", "timeout"}
    ranged = views.page_of(rows, views.parse_filter([], [], "out", "2", "4"), page=0)
    assert [(r.stream, r.offset) for r in ranged.rows] == [("out", 2), ("out", 3), ("out", 4)]
    # pages of 7: every row exactly once, the last page by default
    seen = []
    pages = views.page_of(rows, Filter(), size=7).pages
    for n in range(pages):
        seen.extend(views.page_of(rows, Filter(), page=n, size=7).rows)
    assert seen == rows and pages == -(-len(rows) // 7)
    assert views.page_of(rows, Filter(), size=7).number == pages - 1
    # a shared link: the page holding out@3
    at = views.page_of(rows, Filter(), size=7, at=("out", 3))
    assert ("out", 3) in [(r.stream, r.offset) for r in at.rows] and at.focus == ("out", 3)


@pytest.mark.parametrize(("args", "message"), [
    ((["bogus"], [], None, None, None), "unknown record kind"),
    (([], ["maybe"], None, None, None), "unknown outcome"),
    (([], [], "nope", None, None), "not a workload stream"),
    (([], [], None, "x", None), "non-negative integer"),
    (([], [], None, "-1", None), "non-negative integer"),
    (([], [], None, "9", "1"), "empty"),
])
def test_bad_filters_are_bad_input(args: tuple, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(BadInput, match=message):
        views.parse_filter(*args)


def test_bad_pages_and_ids(log: WorkloadLog) -> None:
    rows = rows_of(log)
    with pytest.raises(BadInput, match="past the end"):
        views.page_of(rows, Filter(), page=99)
    with pytest.raises(BadInput, match="page size"):
        views.page_of(rows, Filter(), size=0)
    with pytest.raises(NotFound):
        views.page_of(rows, Filter(), at=("out", 999))
    with pytest.raises(BadInput):
        views.parse_workload_id("bad.id")
    assert views.parse_offset("") is None and views.parse_offset("12") == 12
    with pytest.raises(BadInput):
        views.parse_offset("١٢")  # digits, but not ASCII ones
    assert views.page_of([], Filter()).pages == 1  # an empty log is one empty page


def test_the_why_graph_runs_from_the_output_down_to_the_input_bytes(log: WorkloadLog) -> None:
    answer = next(r.offset for r in log["out"]
                  if isinstance(getattr(decode(r.value), "body", None), object)
                  and '"outcome":"ok"' in r.value.decode())
    tree = why(log, out_offset=answer)
    graph = views.why_graph(tree, lambda s, o: f"/r/{s}/{o}")
    ids = [b.id for b in graph.boxes]
    assert ids[0] == "output" and "resp0" in ids and "req0" in ids and "input1" in ids
    assert "exec0" in ids and "bind0" in ids and ids[-1].startswith(("bind", "exec"))
    (reached,) = graph.inputs
    raw = json.loads(log["in"].records[reached["offset"]].value)
    data = raw["body"]["data"]
    assert reached["sha256"] == sha256_hex(json.dumps(data).encode())
    boxes = {b.id: b for b in graph.boxes}
    assert boxes["input1"].href == f"/r/in/{reached['offset']}"
    assert boxes["exec0"].title == "signature valid" and boxes["exec0"].cls == "ok"
    assert boxes["resp0"].cls == "resp-ok"
    # every box inside the drawing, none overlapping in its column
    for b in graph.boxes:
        assert b.x >= 0 and b.y >= 0
        assert b.x + b.w <= graph.width and b.y + b.h <= graph.height
    for column in (views.PAD, views.PAD + views.MAIN_W + 3 * views.GAP):
        boxes_in = sorted((b for b in graph.boxes if b.x == column), key=lambda b: b.y)
        assert all(a.y + a.h < b.y for a, b in itertools.pairwise(boxes_in)), column
    assert len(graph.edges) == len(graph.boxes) - 1


def test_chains_show_gaps_and_forks() -> None:
    def row(offset: int, seq: int, node: str = "n1", h: str | None = None) -> ReceiptRow:
        return ReceiptRow(offset, f"w/{offset}/0@1", node, seq, None, None, "", True,
                          h or f"sha256:{offset}")

    cells = views.chains([row(0, 0), row(1, 1), row(2, 4), row(3, 4), row(4, 2, "n2"),
                          row(5, 1, h="sha256:1")])
    assert [(c.seq, c.last, c.offsets) for c in cells["n1"]] == [
        (0, 0, [0]), (1, 1, [1, 5]), (2, 3, []), (4, 4, [2, 3])]
    assert cells["n1"][2].gap and cells["n1"][3].fork
    assert not cells["n1"][1].fork  # one receipt on two responses: a copy, not a fork
    assert [(c.seq, c.last, c.gap) for c in cells["n2"]] == [(0, 1, True), (2, 2, False)]


def test_node_facts_keep_the_latest_per_node_and_tell_gateways(log: WorkloadLog) -> None:
    (fact,) = log.facts
    newer = fact.model_copy(update={"updated_us": fact.updated_us + 10})
    older = fact
    gateway = FactsRecord(node_id="gw", kinds=(KindServed(kind="acme:gate/set@1.0.0", queue_limit=4,
                                                          guarantee="at-most-once"),),
                          public_key=fact.public_key, key_id=fact.key_id, updated_us=5_000_000)
    nodes = views.node_facts([newer, older, gateway], now_us=7_000_000)
    assert [(n.node_id, n.role) for n in nodes] == [(fact.node_id, "executor"), ("gw", "gateway")]
    assert nodes[0].updated_us == newer.updated_us
    assert nodes[1].age_s == 2.0 and "at-most-once" in nodes[1].kinds[0]


def test_the_offset_strip_covers_each_stream_and_shows_the_worst(log: WorkloadLog) -> None:
    rows = rows_of(log)
    ends = {s: (log[s].start, log[s].end) for s in views.STREAM_ORDER}
    strip = views.offset_strip(rows, ends, buckets=4)
    for stream, buckets in strip.items():
        assert sum(b.count for b in buckets) == len(log[stream])
        assert len(buckets) <= 4
        start, end = ends[stream]
        assert all(start <= b.lo <= b.hi < max(end, start + 1) for b in buckets)
        for b in buckets:  # the worst outcome among the rows it holds
            inside = [r.outcome for r in rows if r.stream == stream and b.lo <= r.offset <= b.hi]
            assert len(inside) == b.count
            assert b.worst == min(inside, key=views.SEVERITY.index)
    worst_resp = {b.worst for b in strip["resp"]}
    assert worst_resp & {"error", "timeout"}


def test_the_why_graph_shows_the_recorded_model_names_beside_hashes(log: WorkloadLog) -> None:
    answer = next(r.offset for r in log["out"] if '"outcome":"ok"' in r.value.decode())
    tree = why(log, out_offset=answer)
    step = tree["step"]
    bound = sorted(step["spec"]["models"].values())[0]
    step["spec"]["model_names"] = {bound: "magika@prod=0.6.1"}
    step["response"]["model_name"] = "magika@prod=0.6.1"
    boxes = {b.id: b for b in views.why_graph(tree, lambda s, o: f"/r/{s}/{o}").boxes}
    assert any("magika@prod=0.6.1" in line for line in boxes["bind0"].lines)
    assert any(line.startswith("model magika@prod=0.6.1 sha256:")
               for line in boxes["resp0"].lines)
