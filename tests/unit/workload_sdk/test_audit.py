"""``fx audit``'s pure checks (workload_sdk._audit) on the golden log and simulated logs.

A clean log passes every invariant; each tampered copy breaks exactly the invariant it targets,
with a message naming the record (where a tamper necessarily breaks replay too, the test says so).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_schema import (
    ClaimRecord,
    MergeEntry,
    OutputRecord,
    Record,
    ResponseRecord,
    SnapshotRecord,
    TickRecord,
    decode,
    encode,
)
from fx_kafka.workload_log import LogRecord
from tests.unit.workload_sdk.sim import WID, Asker, Sim, make_spec
from tests.unit.workload_sdk.test_merge import _run, actions
from workload_sdk import AuditReport, WorkloadLog, audit, replay
from workload_sdk._audit import INVARIANTS, render_report
from workload_sdk._replay import missing_outputs

GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture
def log() -> WorkloadLog:
    return WorkloadLog.from_jsonl(GOLDEN / "asker_failover.jsonl")


def _edit(log: WorkloadLog, stream: str, offset: int, change: Callable[[Any], Any]) -> None:
    """Replace the record at ``stream@offset`` with ``change(record)`` (same offset and time)."""
    rec = log[stream].records[offset]
    log[stream].records[offset] = LogRecord(offset, rec.time_ms, encode(change(decode(rec.value))))


def _append(log: WorkloadLog, stream: str, record: Record | bytes, time_ms: int) -> int:
    view = log[stream]
    offset = view.end
    view.add(LogRecord(offset, time_ms, record if isinstance(record, bytes) else encode(record)))
    return offset


def _messages(report: AuditReport, name: str) -> str:
    return "\n".join(str(v) for v in report[name].violations)


def _only(report: AuditReport, *names: str) -> None:
    """Exactly ``names`` are violated; every other invariant holds."""
    assert report.failed == list(names), render_report(report)
    for inv in report.invariants:
        if inv.name not in names:
            assert inv.status in ("ok", "skipped"), render_report(report)


# ----------------------------------------------------------------------------- clean logs


def test_the_golden_log_passes_every_invariant(log: WorkloadLog) -> None:
    report = audit(log, Asker())
    assert report.ok and report.result == "ok", render_report(report)
    assert [i.name for i in report.invariants] == list(INVARIANTS)
    assert all(i.status == "ok" and i.ok is True for i in report.invariants)
    answers = report["one_answer"].counts
    assert answers["requests"] == answers["answered"] == 5 and answers["pending"] == 0
    assert answers["timeout"] == 1  # the holder's timeout is the answer of its effect
    sigs = report["signatures"].counts
    assert sigs["valid"] == sigs["signed"] == 5 and sigs["invalid"] == 0
    assert sigs["unsigned_holder"] == 1  # the holder's timeout: unsigned by design
    assert sigs["unsigned"] == 2  # the simulated executor's unsigned error, a stray answer
    assert any("carry no signature" in n for n in report["signatures"].notes)
    replayed = report["replay"].counts
    assert replayed["snapshots"] == 2 and replayed["replays"] == 4  # start, 3 segments
    assert replayed["steps"] == 10
    assert report.module_hash is not None


def test_without_a_module_replay_is_skipped_and_says_so(log: WorkloadLog) -> None:
    report = audit(log)
    assert report.ok and report["replay"].status == "skipped" and report["replay"].ok is None
    assert report.as_dict()["skipped"] == ["replay"]
    text = render_report(report)
    assert "skipped" in text and "every invariant checked holds (skipped: replay)" in text


def test_several_accepted_records_per_effect_are_lease_renewals_not_answers() -> None:
    sim = Sim(spec=make_spec())
    sim.start()
    holder = sim.holder
    assert holder is not None
    sim.input(1)
    holder.pump()
    sim.accept(0)
    sim.now += 1
    sim.accept(0)  # the executor renews its lease: accepted again, a later accepted_us
    holder.pump()
    sim.answer(0, "ok")
    holder.drain()
    renewals = [e for e in (decode(r.value) for r in sim.log["merge"])
                if isinstance(e, MergeEntry) and e.reason == "not_an_answer"]
    assert len(renewals) == 2 and len({e.effect_id for e in renewals}) == 1
    report = audit(sim.log, Asker())
    assert report.ok, render_report(report)
    assert report["one_answer"].counts["answered"] == report["one_answer"].counts[
        "requests"] == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=actions, limit=st.integers(1, 4), snap=st.integers(1, 5))
def test_any_simulated_interleaving_audits_clean(steps: list[tuple[Any, ...]], limit: int,
                                                  snap: int) -> None:
    sim = Sim(spec=make_spec(limit=limit, snapshot_every=snap))
    _run(sim, steps)
    report = audit(sim.log, Asker())
    assert report.ok, render_report(report)
    assert report["one_answer"].counts["pending"] == 0


# ------------------------------------------------------------- one tamper per invariant


def test_a_second_answer_delivered_breaks_one_answer(log: WorkloadLog) -> None:
    # merge@7 passed over a duplicate answer of sim-1/0/1@1; make the holder deliver it as a
    # step of its own (and number the later steps on, as such a holder would)
    def renumber(record: Any) -> Any:
        return record.model_copy(update={"seq": record.seq + 1})

    _edit(log, "merge", 7, lambda e: e.model_copy(update={"action": "deliver", "reason": None}))
    for offset in [o for o in log["merge"].records if o > 7]:
        _edit(log, "merge", offset, renumber)
    report = audit(log)
    _only(report, "one_answer")
    text = _messages(report, "one_answer")
    assert "sim-1/0/1@1" in text and "2 delivered answers" in text
    assert "wl.sim-1.merge@5" in text and "wl.sim-1.merge@7" in text
    # replay re-decides every merge entry, so it refuses the same log (a duplicate)
    _only(audit(log, Asker()), "one_answer", "replay")


def test_an_answer_to_no_request_delivered_breaks_one_answer(log: WorkloadLog) -> None:
    # merge@15 passed over a stray answer (sim-1/1000000/0@1): deliver it instead
    _edit(log, "merge", 15, lambda e: e.model_copy(update={"action": "deliver", "reason": None}))
    for offset in [o for o in log["merge"].records if o > 15]:
        _edit(log, "merge", offset, lambda r: r.model_copy(update={"seq": r.seq + 1}))
    report = audit(log)
    _only(report, "one_answer")
    assert "which no request on wl.sim-1.out asks" in _messages(report, "one_answer")


def test_an_out_slot_written_twice_breaks_out_once(log: WorkloadLog) -> None:
    # the request of slot (6, 1) again, byte for byte, and another output for slot (8, 0)
    _append(log, "out", log["out"].records[13].value, 1090)
    _edit(log, "out", _append(log, "out", log["out"].records[18].value, 1090),
          lambda o: o.model_copy(update={"body": o.body.of_json({"forged": True})}))
    report = audit(log, Asker())
    _only(report, "out_once")
    text = _messages(report, "out_once")
    assert report["out_once"].violation_count == 2
    assert ("wl.sim-1.out@21: slot (input_offset 6, index 1) is written again (sim-1/6/1@2, "
            "the same bytes); first at wl.sim-1.out@13") in text
    # other bytes than the step's output: a stray beside the holder's record (issue 30), not
    # blamed on the holder
    assert ("wl.sim-1.out@22: a stray record in slot (input_offset 8, index 0): not the step's "
            "output (the lease holder's is at wl.sim-1.out@18); another writer of wl.sim-1.out "
            "put it there, not the holder") in text
    # without the module, which of the two is the holder's is not known
    blind = _messages(audit(log), "out_once")
    assert "slot (input_offset 8, index 0) is written again (other bytes)" in blind
    assert report["one_answer"].counts["requests"] == 5  # the copy is not a second request


def test_a_claim_epoch_going_back_breaks_epochs(log: WorkloadLog) -> None:
    claim = decode(log["claims"].records[2].value)
    assert isinstance(claim, ClaimRecord) and claim.epoch == 2
    _append(log, "claims", claim.model_copy(update={"epoch": 1, "holder_id": "h9"}), 1090)
    report = audit(log, Asker())
    _only(report, "epochs")
    assert ("claim of epoch 1 (holder 'h9') is not above epoch 2 claimed at "
            "wl.sim-1.claims@2") in _messages(report, "epochs")


def test_an_old_epoch_record_after_the_new_claim_breaks_epochs(log: WorkloadLog) -> None:
    # a zombie holder of epoch 1 ticks after epoch 2 was claimed (at 1007 ms)
    _append(log, "resp", TickRecord(workload_id=WID, epoch=1, holder_id="h1"), 1090)
    report = audit(log, Asker())
    _only(report, "epochs")
    assert ("tick of epoch 1 appended at 1090 ms, after the claim of epoch 2 "
            "(wl.sim-1.claims@2, 1007 ms)") in _messages(report, "epochs")


def test_an_old_epoch_snapshot_on_merge_breaks_epochs(log: WorkloadLog) -> None:
    snap = decode(log["merge"].records[17].value)
    assert isinstance(snap, SnapshotRecord) and snap.epoch == 2
    _edit(log, "merge", 17, lambda s: s.model_copy(update={"epoch": 1}))
    report = audit(log, Asker())
    _only(report, "epochs")
    text = _messages(report, "epochs")
    assert "wl.sim-1.merge@17: snapshot of epoch 1 after one of epoch 2" in text
    assert "snapshot of epoch 1 appended at 1089 ms, after the claim of epoch 2" in text


def test_a_resume_rewrite_of_an_old_epoch_slot_is_not_a_violation() -> None:
    # an output of epoch 1 lost from .out: the holder of epoch 2 writes it on resume, with the
    # epoch of the step that computed it, a few ms after its claim
    sim = Sim(spec=make_spec())
    sim.start()
    assert sim.holder is not None
    sim.input(2)
    sim.holder.pump()
    (lost,) = list(sim.log["out"].records)
    del sim.log["out"].records[lost]
    sim.now += 5
    sim.start()
    (rewritten,) = [r for r in sim.log["out"] if r.offset > lost]
    sim.log["out"].records[rewritten.offset] = LogRecord(rewritten.offset, sim.now + 3,
                                                         rewritten.value)
    out = decode(rewritten.value)
    assert isinstance(out, OutputRecord) and out.header.epoch == 1
    report = audit(sim.log, Asker())
    assert report.ok, render_report(report)
    assert report["epochs"].counts["rewritten"] == 1
    assert "written after a successor's claim by the resuming holder" in " ".join(
        report["epochs"].notes)


def test_a_record_of_an_unclaimed_epoch_breaks_epochs(log: WorkloadLog) -> None:
    _append(log, "resp", TickRecord(workload_id=WID, epoch=7, holder_id="h7"), 1090)
    report = audit(log, Asker())
    _only(report, "epochs")
    assert "tick of epoch 7, which no claim on wl.sim-1.claims names" in _messages(
        report, "epochs")


def test_a_bad_signature_breaks_signatures(log: WorkloadLog) -> None:
    # resp@1 (signed, delivered): its executor block changes after signing (the fold never
    # sees that block, so only the signature notices)
    def retime(resp: Any) -> Record:
        assert isinstance(resp, ResponseRecord) and resp.signature is not None
        assert resp.executor is not None
        return resp.model_copy(update={"executor": resp.executor.model_copy(
            update={"engine_version": "1"})})

    _edit(log, "resp", 1, retime)
    report = audit(log, Asker())
    _only(report, "signatures")
    assert report["signatures"].counts["invalid"] == 1
    assert ("wl.sim-1.resp@1: the signature of sim-1/0/1@1 (ok, node 'exec-1') is INVALID: "
            "the signature does not verify with the published key") in _messages(
        report, "signatures")


def test_a_changed_output_byte_breaks_replay(log: WorkloadLog) -> None:
    raw = log["out"].records[0]
    assert b'"sum":1,' in raw.value
    log["out"].records[0] = LogRecord(0, raw.time_ms, raw.value.replace(b'"sum":1,',
                                                                        b'"sum":2,'))
    report = audit(log, Asker())
    _only(report, "replay")
    text = _messages(report, "replay")
    assert report["replay"].violation_count == 1  # one slot, found by two replays
    assert ("wl.sim-1.out@0: the output of seq 0 index 0 differs from what the fold computes "
            "(replay from the start, from the start to snapshot seq 4)") in text
    assert audit(log).ok  # without the module nothing else notices


def test_an_output_no_step_delivers_breaks_replay(log: WorkloadLog) -> None:
    out = decode(log["out"].records[19].value)
    assert isinstance(out, OutputRecord)
    _append(log, "out", out.model_copy(update={"header": out.header.model_copy(
        update={"input_offset": 10})}), 1090)
    report = audit(log, Asker())
    _only(report, "replay")
    assert ("an output of step 10, which no merge entry delivers (the merge log ends at "
            "step 9)") in _messages(report, "replay")
    live = audit(log, Asker(), merge_settled=False)  # read while the holder was writing
    assert live.ok and "still growing" in " ".join(live["replay"].notes)


def test_a_snapshot_that_does_not_record_the_fold_breaks_replay(log: WorkloadLog) -> None:
    def forget_pending(snap: Any) -> Any:
        body = dict(snap.state.data, pending=[])
        return snap.model_copy(update={"state": snap.state.of_json(body)})

    _edit(log, "merge", 6, forget_pending)  # seq 4: sim-1/2/1@1 was pending
    report = audit(log, Asker())
    _only(report, "replay")
    assert ("arrives at another fold than the snapshot at seq 4 records: pending "
            "['sim-1/2/1@1'] vs []") in _messages(report, "replay")


def test_an_input_merged_twice_breaks_merge_order(log: WorkloadLog) -> None:
    # in@4 merged again as step 10, and its outputs written as a resume would: replay agrees,
    # only the order of the merge log shows it
    _append(log, "merge", MergeEntry(workload_id=WID, seq=10, epoch=2, source="in",
                                     source_offset=4, action="deliver"), 1090)
    for out in missing_outputs(replay(Asker(), log), log):
        _append(log, "out", out, 1090)
    report = audit(log, Asker())
    _only(report, "merge_order")
    assert ("wl.sim-1.merge@22: merges wl.sim-1.in@4 again: wl.sim-1.in@4 was merged at "
            "wl.sim-1.merge@16") in _messages(report, "merge_order")
    assert report["one_answer"].counts["pending"] == 1  # its request: pending, not a violation
    assert "pending at the end of the log" in " ".join(report["one_answer"].notes)


# ----------------------------------------------------------------- trims, gaps, keys, output


def test_a_trimmed_log_audits_from_the_earliest_retained_snapshot(log: WorkloadLog) -> None:
    snap = decode(log["merge"].records[6].value)
    assert isinstance(snap, SnapshotRecord)
    for stream, start in (("merge", 6), ("in", snap.positions["in"]),
                          ("resp", snap.positions["resp"])):
        view = log[stream]
        view.records = {o: r for o, r in view.records.items() if o >= start}
        view.start = start
    report = audit(log, Asker())
    assert report.ok, render_report(report)
    assert report["one_answer"].counts["answered_before_trim"] == 1  # sim-1/0/1@1
    assert any("from the start is not possible" in n for n in report["replay"].notes)


def test_a_missing_record_is_a_gap_not_a_pass(log: WorkloadLog) -> None:
    del log["resp"].records[11]  # merge@20 delivers it
    report = audit(log, Asker())
    assert report.result == "gap" and not report.ok and report.failed == []
    assert report["one_answer"].status == "gap" and report["replay"].status == "gap"
    assert "wl.sim-1.resp offset 11 is missing" in str(report["replay"].gaps[0])
    assert "delivers wl.sim-1.resp@11, which is missing" in str(report["one_answer"].gaps[0])


def test_signatures_against_a_fleet_key_history(log: WorkloadLog) -> None:
    from broker_schema.key_history import build_history
    from broker_schema.signatures import SigningKey, public_key_from_text
    from fx_kafka.keys import certify

    (fact,) = log.facts
    raw = public_key_from_text(fact.public_key)
    fleet = SigningKey.generate()
    history = build_history([(0, certify(fleet, "exec-1", raw))], [fleet.public_key])
    report = audit(log, Asker(), key_history=history)
    assert report.ok and report["signatures"].counts["valid"] == 5 and report.key_history
    other = build_history([(0, certify(fleet, "someone-else", raw))], [fleet.public_key])
    refused = audit(log, key_history=other)
    _only(refused, "signatures")
    assert refused["signatures"].counts["invalid"] == 5
    assert "no fleet certificate on sys.keys gives node 'exec-1'" in _messages(
        refused, "signatures")


def test_violations_are_listed_up_to_the_cap_and_all_counted(log: WorkloadLog) -> None:
    for offset in sorted(log["out"].records):
        _append(log, "out", log["out"].records[offset].value, 1090)
    report = audit(log, max_listed=3)
    assert report["out_once"].violation_count == 15 and len(report["out_once"].violations) == 3
    assert "(12 more not listed)" in render_report(report)


def test_json_and_table(log: WorkloadLog) -> None:
    _append(log, "resp", TickRecord(workload_id=WID, epoch=1, holder_id="h1"), 1090)
    report = audit(log, Asker())
    doc = json.loads(json.dumps(report.as_dict()))
    assert doc["result"] == "violated" and doc["ok"] is False and doc["violated"] == ["epochs"]
    (epochs,) = [i for i in doc["invariants"] if i["name"] == "epochs"]
    assert epochs["status"] == "violated" and epochs["violation_count"] == 1
    assert epochs["violations"][0]["topic"] == "wl.sim-1.resp"
    assert epochs["violations"][0]["offset"] == 12
    assert set(epochs) == {"name", "what", "status", "ok", "counts", "violation_count",
                           "violations", "gap_count", "gaps", "notes"}
    text = render_report(report)
    assert text.splitlines()[0] == "fx audit sim-1: 1 invariant(s) violated: epochs"
    assert "  epochs       VIOLATED           1  claims 2" in text
    assert "wl.sim-1.resp@12: tick of epoch 1" in text


def test_a_spec_adoption_is_the_one_claim_that_repeats_an_epoch() -> None:
    from broker_schema import ClaimRecord, decode, encode
    from fx_kafka.workload_log import LogRecord
    from tests.unit.workload_sdk.sim import Asker, Sim, make_spec
    from workload_sdk import audit

    sim = Sim(make_spec())
    sim.start()
    assert sim.holder is not None
    for v in (1, 3):
        sim.input(v)
    sim.holder.pump()
    view = sim.log["claims"]
    first = decode(view.records[0].value)
    assert isinstance(first, ClaimRecord)
    adoption = first.model_copy(update={"from_seq": 1})
    view.add(LogRecord(view.end, sim.now, encode(adoption)))
    view.end += 2
    epochs = next(i for i in audit(sim.log, workload=Asker()).invariants if i.name == "epochs")
    assert epochs.ok and epochs.counts.get("adoptions") == 1, epochs
    stranger = adoption.model_copy(update={"holder_id": "someone-else"})
    view.add(LogRecord(view.end, sim.now, encode(stranger)))
    view.end += 2
    epochs = next(i for i in audit(sim.log, workload=Asker()).invariants if i.name == "epochs")
    assert not epochs.ok


def test_a_malformed_snapshot_is_a_replay_error_not_a_crash() -> None:
    import pytest

    from broker_schema import InlineBody, SnapshotRecord, decode, encode
    from fx_kafka.workload_log import LogRecord
    from tests.unit.workload_sdk.sim import Asker, Sim, make_spec
    from workload_sdk import ReplayError, replay

    sim = Sim(make_spec(snapshot_every=1))
    sim.start()
    assert sim.holder is not None
    sim.input(2)
    sim.holder.pump()
    view = sim.log["merge"]
    (offset,) = [o for o, r in view.records.items()
                 if isinstance(decode(r.value), SnapshotRecord)][-1:]
    snap = decode(view.records[offset].value)
    assert isinstance(snap, SnapshotRecord)
    bad = snap.model_copy(update={"state": InlineBody.of_json({"state": {"x": 1}})})
    view.records[offset] = LogRecord(offset, view.records[offset].time_ms, encode(bad))
    with pytest.raises(ReplayError, match="cannot be restored"):
        replay(Asker(), sim.log)
