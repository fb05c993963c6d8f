"""Trimming by audit horizon without a broker: where :func:`plan_trim` puts each topic's start,
that replay and resume from the trim snapshot are unchanged after trimming, and that replay, diff
and why of a trimmed range stop with a ``trimmed`` LogGap naming the offset. Also the pure
retention check of ``fx_kafka.workload``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_schema import (
    INFERENCE_KIND,
    EffectHeader,
    EffectRequest,
    InlineBody,
    InputRecord,
    MergeEntry,
    ResponseRecord,
    SnapshotRecord,
    StreamRef,
    decode,
    encode,
    topics,
)
from fx_kafka.workload import HORIZON_UNKNOWN, retention_message, retention_problems
from fx_kafka.workload_log import LogRecord
from tests.unit.workload_sdk.sim import MODEL, WID, Asker, Sim, make_spec
from workload_sdk import LogGap, TrimPlan, WorkloadLog, diff, plan_trim, replay, why
from workload_sdk._replay import compare_outputs
from workload_sdk._trim import TRIMMED

GOLDEN = Path(__file__).resolve().parent / "golden"


def apply_trim(log: WorkloadLog, plan: TrimPlan) -> None:
    """What DeleteRecords does to the log: records below the new start are gone."""
    for stream, trim in plan.topics.items():
        view = log[stream]
        for offset in [o for o in view.records if o < trim.new_start]:
            del view.records[offset]
        view.start = max(view.start, trim.new_start)


def everything_older(log: WorkloadLog) -> dict[str, int]:
    """Horizon offsets when every record is older than the horizon: the ends."""
    return {s: log[s].end for s in TRIMMED}


def snapshots(log: WorkloadLog) -> list[tuple[int, SnapshotRecord]]:
    found = []
    for rec in log["merge"]:
        record = decode(rec.value)
        if isinstance(record, SnapshotRecord):
            found.append((rec.offset, record))
    return found


def run_sim(values: list[int], *, snapshot_every: int = 3) -> Sim:
    sim = Sim(spec=make_spec(snapshot_every=snapshot_every))
    sim.start()
    assert sim.holder is not None
    for i, v in enumerate(values):
        sim.input(v)
        sim.holder.pump()
        if i % 2:
            sim.answer(-1, "ok")
        sim.now += 10
        sim.holder.pump()
    sim.holder.drain()
    return sim


# ------------------------------------------------------------------------------- the rules


def test_a_forever_horizon_trims_nothing() -> None:
    sim = run_sim([1, 2, 3, 4, 5, 6, 7])
    plan = plan_trim(sim.log, None)
    assert plan.changes == {} and plan.snapshot is None
    assert "no audit_horizon_ms" in plan.note


def test_no_snapshot_older_than_the_horizon_trims_nothing() -> None:
    sim = run_sim([1, 2, 3, 4, 5, 6, 7])
    first_snapshot = snapshots(sim.log)[0][0]
    horizon = everything_older(sim.log) | {"merge": first_snapshot - 1}
    plan = plan_trim(sim.log, horizon)
    assert plan.changes == {} and plan.snapshot is None
    assert "no snapshot" in plan.note


def test_everything_older_trims_at_the_latest_snapshot_and_its_positions() -> None:
    sim = run_sim([1, 2, 3, 4, 5, 6, 7, 9, 11])
    offset, latest = snapshots(sim.log)[-1]
    plan = plan_trim(sim.log, everything_older(sim.log))
    assert plan.snapshot == (offset, latest.seq)
    assert plan.topics["merge"].new_start == offset
    assert plan.topics["in"].new_start == latest.positions["in"]
    assert plan.topics["resp"].new_start == latest.positions["resp"]
    # the simulated holder records no .out position: .out is kept whole
    assert plan.topics["out"].new_start == 0
    assert "no .out position" in plan.topics["out"].bound


def test_the_horizon_picks_an_earlier_snapshot_and_bounds_every_topic() -> None:
    sim = run_sim([1, 2, 3, 4, 5, 6, 7, 9, 11])
    snaps = snapshots(sim.log)
    assert len(snaps) >= 3
    (o1, s1), (o2, _s2) = snaps[0], snaps[1]
    # the horizon falls between the first and second snapshot on .merge, and low on .in
    horizon = everything_older(sim.log) | {"merge": o2 - 1, "in": 1}
    plan = plan_trim(sim.log, horizon)
    assert plan.snapshot == (o1, s1.seq)
    assert plan.topics["merge"].new_start == o1
    assert plan.topics["in"].new_start == min(1, s1.positions["in"])
    assert plan.topics["in"].bound == "the audit horizon"
    # every retained snapshot's positions bound the sources, not only the trim snapshot's
    assert plan.topics["resp"].new_start == min(s.positions["resp"] for o, s in snaps if o >= o1)


def test_a_trim_never_moves_a_start_backwards() -> None:
    sim = run_sim([1, 2, 3, 4, 5, 6, 7])
    plan = plan_trim(sim.log, everything_older(sim.log))
    apply_trim(sim.log, plan)
    sim.log["in"].start = sim.log["in"].end  # trimmed further by someone else
    again = plan_trim(sim.log, everything_older(sim.log))
    assert all(t.new_start >= t.start for t in again.topics.values())
    assert again.topics["in"].new_start == sim.log["in"].end
    assert again.changes == {}


# ------------------------------------------------------- records that name other records


def _hand_log() -> tuple[WorkloadLog, dict[str, int]]:
    """A log by hand: inputs 0..5, a request at .out@3 whose input is a stream reference to
    .in@1, still pending at the snapshot (its ``out`` position is 3); a late response at .resp@2
    naming a request at .out@0."""
    log = WorkloadLog.empty(WID)
    t = 1_000
    for i in range(6):
        log["in"].add(LogRecord(i, t + i, encode(InputRecord(workload_id=WID,
                                                             body=InlineBody.of_json(i)))))
    header0 = EffectHeader(workload_id=WID, input_offset=0, index=1, epoch=1)
    req0 = EffectRequest(header=header0, effect_kind=INFERENCE_KIND, model=MODEL,
                         input=InlineBody.of_json(0), deadline_ms=50)
    header = EffectHeader(workload_id=WID, input_offset=4, index=0, epoch=1)
    req = EffectRequest(header=header, effect_kind=INFERENCE_KIND, model=MODEL,
                        input=StreamRef(topic=topics.inputs(WID), offset=1), deadline_ms=50)
    log["out"].add(LogRecord(0, t, encode(req0)))
    log["out"].add(LogRecord(3, t + 4, encode(req)))
    log["out"].end = 8
    late = ResponseRecord(effect_id=req0.effect_id, header=header0, request_offset=0,
                          outcome="ok", output=InlineBody.of_json(None), written_by="x")
    log["resp"].add(LogRecord(0, t, encode(late)))
    log["resp"].add(LogRecord(2, t + 5, encode(late)))
    log["resp"].end = 4
    for i in range(5):
        log["merge"].add(LogRecord(i, t + i, encode(MergeEntry(
            workload_id=WID, seq=i, epoch=1, source="in", source_offset=i, action="deliver"))))
    snap = SnapshotRecord(workload_id=WID, seq=5, epoch=1, state_hash="sha256:" + "0" * 64,
                          state=InlineBody.of_json({}), positions={"in": 5, "resp": 4, "out": 3})
    log["merge"].add(LogRecord(5, t + 6, encode(snap)))
    log["merge"].add(LogRecord(6, t + 7, b"not a record"))  # ignored
    return log, {"in": 6, "out": 8, "resp": 4, "merge": 7}


def test_a_pending_requests_stream_input_and_a_responses_request_are_kept() -> None:
    log, horizon = _hand_log()
    plan = plan_trim(log, horizon)
    assert plan.snapshot == (5, 5)
    assert plan.topics["merge"].new_start == 5
    # .in would go to 5 (the snapshot's position); the retained request at .out@3 reads .in@1
    assert plan.topics["in"].new_start == 1
    assert plan.topics["in"].bound == "the input of the request at .out@3"
    # .resp goes to 4 (past everything merged): the late response at .resp@2 goes with it
    assert plan.topics["resp"].new_start == 4
    assert plan.topics["out"].new_start == 3


def test_a_retained_response_keeps_its_request_on_out() -> None:
    log, horizon = _hand_log()
    plan = plan_trim(log, horizon | {"resp": 1})  # the horizon keeps .resp@1 and later
    assert plan.topics["resp"].new_start == 1
    assert plan.topics["out"].new_start == 0
    assert plan.topics["out"].bound == "the request of the response at .resp@2"


def test_retained_merge_entries_keep_their_sources() -> None:
    log, horizon = _hand_log()
    # a later snapshot that claims a position past an entry after it (not what a holder
    # writes): the entry's source is kept all the same
    log["merge"].add(LogRecord(7, 2_000, encode(MergeEntry(
        workload_id=WID, seq=5, epoch=1, source="in", source_offset=0, action="deliver"))))
    log["merge"].end = 8
    plan = plan_trim(log, horizon | {"merge": 8})
    assert plan.topics["in"].new_start == 0
    assert plan.topics["in"].bound == "the merge entry at .merge@7"


# ------------------------------------------------- replay, resume and why after a trim


def test_replay_and_resume_after_a_trim_are_unchanged() -> None:
    values = [1, 2, 3, 4, 5, 6, 7, 9, 11, 13]
    kept, trimmed = run_sim(values), run_sim(values)
    plan = plan_trim(trimmed.log, everything_older(trimmed.log))
    assert plan.changes
    apply_trim(trimmed.log, plan)
    before = replay(Asker(), kept.log)
    after = replay(Asker(), trimmed.log)
    assert after.core.state_hash == before.core.state_hash and after.core.seq == before.core.seq
    assert compare_outputs(after, trimmed.log) == []
    # a new holder on each log (it resumes by replay), then more traffic: the same bytes
    for sim in (kept, trimmed):
        sim.start()
        assert sim.holder is not None
        for v in (15, 16, 17):
            sim.input(v)
            sim.holder.pump()
            sim.answer(-1, "ok")
            sim.now += 10
        sim.holder.drain()
    for stream in ("in", "out", "resp", "merge", "spec", "claims"):
        start = trimmed.log[stream].start
        assert [(r.offset, r.time_ms, r.value) for r in trimmed.log[stream]] == [
            (r.offset, r.time_ms, r.value) for r in kept.log[stream] if r.offset >= start]


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.integers(0, 9), min_size=4, max_size=14),
       every=st.integers(1, 4), cut=st.floats(0.0, 1.0))
def test_replay_from_any_trim_matches_the_untrimmed_log(values: list[int], every: int,
                                                        cut: float) -> None:
    sim = run_sim(values, snapshot_every=every)
    full = replay(Asker(), sim.log, use_snapshots=False)
    horizon = {s: int(sim.log[s].end * cut) for s in TRIMMED}
    apply_trim(sim.log, plan_trim(sim.log, horizon))
    result = replay(Asker(), sim.log)
    assert result.core.state_hash == full.core.state_hash
    assert compare_outputs(result, sim.log) == []


def test_replay_diff_and_why_on_a_trimmed_range_name_the_offset() -> None:
    log = WorkloadLog.from_jsonl(GOLDEN / "asker_failover.jsonl")
    expected = json.loads((GOLDEN / "asker_failover.expected.json").read_text())
    outputs = [r.offset for r in log["out"]]
    plan = plan_trim(log, everything_older(log))
    apply_trim(log, plan)
    merge_start = log["merge"].start
    assert merge_start > 0
    # replay from the retained snapshot still reaches the recorded state
    assert replay(Asker(), log).core.state_hash == expected["state_hash"]
    with pytest.raises(LogGap) as gap:
        replay(Asker(), log, use_snapshots=False)
    assert gap.value.why == "trimmed" and gap.value.offset == 0
    assert f"log starts at {merge_start}" in str(gap.value)
    snap_seq = snapshots(log)[0][1].seq
    with pytest.raises(LogGap, match=f"--to {snap_seq - 1} --module MODULE:Class, or --to any "
                       "step above") as gap:
        replay(Asker(), log, to_seq=snap_seq - 2)
    assert gap.value.why == "trimmed"
    with pytest.raises(LogGap, match="trimmed"):
        diff(Asker(), log)
    # the simulated holder records no .out position, so .out is whole; drop its first record
    # as a holder's recorded position would allow
    assert log["out"].start == 0 and outputs[0] == 0
    log["out"].start = 1
    log["out"].records.pop(0)
    with pytest.raises(LogGap, match="offset 0 is trimmed") as gap:
        why(log, out_offset=0)
    # an output still on .out whose step was trimmed from .merge
    early = [r.offset for r in log["out"]
             if decode(r.value).header.input_offset < snap_seq]  # type: ignore[union-attr]
    with pytest.raises(LogGap, match=f"offset {merge_start - 1} is trimmed: no merge entry "
                       "delivers seq") as gap:
        why(log, out_offset=early[0])
    assert gap.value.why == "trimmed"
    with pytest.raises(LogGap, match="trimmed"):
        why(log, at_ms=0)


# ---------------------------------------------------------------------- retention check


def _cfg(ms: str = "-1", size: str = "-1") -> dict[str, str]:
    return {"retention.ms": ms, "retention.bytes": size,
            "message.timestamp.type": "LogAppendTime"}


def test_retention_shorter_than_the_horizon_is_a_problem() -> None:
    names = {s: topics.stream(WID, s) for s in topics.STREAMS}
    ok = {n: _cfg() for n in names.values()}
    assert retention_problems(WID, ok, None) == []
    assert retention_problems(WID, ok, 5_000) == []
    short = ok | {names["resp"]: _cfg("60000")}
    assert retention_problems(WID, short, None) == [(names["resp"], "retention.ms", 60000)]
    assert retention_problems(WID, short, 120_000) == [(names["resp"], "retention.ms", 60000)]
    assert retention_problems(WID, short, 60_000) == []
    assert retention_problems(WID, short, HORIZON_UNKNOWN) == []
    sized = ok | {names["in"]: _cfg(size="1000000")}
    assert retention_problems(WID, sized, 5_000) == [(names["in"], "retention.bytes", 1000000)]
    # .spec and .claims are never trimmed: any retention is refused, horizon known or not
    claims = ok | {names["claims"]: _cfg("999999999999")}
    for horizon in (None, 5_000, HORIZON_UNKNOWN):
        assert retention_problems(WID, claims, horizon) == [
            (names["claims"], "retention.ms", 999999999999)]
    text = retention_message(retention_problems(WID, short, None), None)
    assert names["resp"] in text and "retention.ms=60000" in text and "forever" in text
    assert "retention.ms=-1" in text and "fx trim" in text


def test_the_cli_has_the_trim_options() -> None:
    import argparse

    from workload_sdk import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["workload", "run", "m:C", "--id", "x", "--trim-every", "5"])
    assert args.trim_every == 5.0
    assert parser.parse_args(["workload", "run", "m:C", "--id", "x"]).trim_every is None
    args = parser.parse_args(["workload", "spec", "x", "--module", "m:C",
                              "--audit-horizon-ms", "3000"])
    assert args.audit_horizon_ms == 3000
    assert parser.parse_args(["workload", "spec", "x", "--module", "m:C"]).audit_horizon_ms is None
    args = parser.parse_args(["trim", "x", "--dry-run"])
    # registered behind the workload check (fx_kafka.workloads.needs_workload)
    assert args.dry_run and args.func.__wrapped__ is cli._trim
