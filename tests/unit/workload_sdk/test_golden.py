"""Golden logs checked in beside this test, replayed, diffed and audited without a broker."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from broker_schema import MergeEntry, ResponseRecord, Signature, canonical_json, decode
from tests.unit.workload_sdk.sim import Asker
from workload_sdk import (
    EffectResult,
    InputEvent,
    LogGap,
    Output,
    State,
    WorkloadLog,
    diff,
    emit,
    infer,
    replay,
    why,
)
from workload_sdk._replay import ReplayError, compare_outputs
from workload_sdk._why import render_tree, verify_signature

GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture
def log() -> WorkloadLog:
    return WorkloadLog.from_jsonl(GOLDEN / "asker_failover.jsonl")


def test_golden_replays_to_the_recorded_state_and_outputs(log: WorkloadLog) -> None:
    expected = json.loads((GOLDEN / "asker_failover.expected.json").read_text())
    for use_snapshots in (False, True):
        result = replay(Asker(), log, use_snapshots=use_snapshots)
        assert result.core.state_hash == expected["state_hash"]
        assert result.core.seq == expected["seq"]
        assert compare_outputs(result, log) == []
    snap = replay(Asker(), log)
    assert snap.snapshot_seq is not None and snap.entries < replay(
        Asker(), log, use_snapshots=False).entries
    assert len(replay(Asker(), log, use_snapshots=False).outputs) == expected["outputs"]
    epochs = {decode(r.value).epoch for r in log["claims"]}  # type: ignore[union-attr]
    assert epochs == {1, 2}


def test_golden_replays_the_same_with_trust_log() -> None:
    expected = json.loads((GOLDEN / "asker_failover.expected.json").read_text())
    for use_snapshots in (False, True):
        strict = replay(Asker(), WorkloadLog.from_jsonl(GOLDEN / "asker_failover.jsonl"),
                        use_snapshots=use_snapshots)
        fresh = WorkloadLog.from_jsonl(GOLDEN / "asker_failover.jsonl")
        trusted = replay(Asker(), fresh, use_snapshots=use_snapshots, trust_log=True)
        assert trusted.core.state_hash == strict.core.state_hash == expected["state_hash"]
        assert (trusted.outputs, trusted.entries, trusted.steps, trusted.core.pending) == (
            strict.outputs, strict.entries, strict.steps, strict.core.pending)
        assert compare_outputs(trusted, fresh) == []


def test_trust_log_keeps_the_folds_own_checks(log: WorkloadLog) -> None:
    # a merge entry that records another decision than the fold takes is still found
    view = log["merge"]
    offset, rec = next((o, r) for o, r in sorted(view.records.items())
                       if isinstance(decode(r.value), MergeEntry)
                       and decode(r.value).action == "deliver")  # type: ignore[union-attr]
    entry = decode(rec.value)
    assert isinstance(entry, MergeEntry)
    wrong = entry.model_copy(update={"action": "pass_over", "reason": "duplicate"})
    view.records[offset] = type(rec)(offset, rec.time_ms, canonical_json(
        wrong.model_dump(mode="json")))
    with pytest.raises(ReplayError, match="the fold decides deliver"):
        replay(Asker(), log, use_snapshots=False, trust_log=True)


def test_golden_round_trips_through_jsonl(log: WorkloadLog, tmp_path: Path) -> None:
    path = tmp_path / "copy.jsonl"
    log.to_jsonl(path)
    again = WorkloadLog.from_jsonl(path)
    for stream, view in log.views.items():
        assert [(r.offset, r.time_ms, r.value) for r in view] == [
            (r.offset, r.time_ms, r.value) for r in again[stream]]
    assert again.facts == log.facts


def test_trimmed_and_missing_records_stop_replay(log: WorkloadLog) -> None:
    first_in = min(log["in"].records)
    del log["in"].records[first_in]
    log["in"].start = first_in + 1
    with pytest.raises(LogGap) as err:
        replay(Asker(), log, use_snapshots=False)
    assert err.value.why == "trimmed" and err.value.offset == first_in
    resp_offsets = sorted(log["resp"].records)
    del log["resp"].records[resp_offsets[-2]]
    with pytest.raises(LogGap, match="missing"):
        replay(Asker(), log)  # from the last snapshot: the trimmed input is not needed


def _answer_output(log: WorkloadLog) -> int:
    """The .out offset of an output emitted when a signed ok answer was delivered."""
    for rec in log["out"]:
        out = decode(rec.value)
        body = getattr(out, "body", None)
        if body is not None and isinstance(body.data, dict) and body.data.get("outcome") == "ok":
            return rec.offset
    raise AssertionError("no answer output in the golden log")


def test_why_walks_from_an_output_to_the_input_bytes(log: WorkloadLog) -> None:
    offset = _answer_output(log)
    tree = why(log, out_offset=offset)
    step = tree["step"]
    assert step["merge"]["source"] == "resp"
    resp = step["response"]
    assert resp["outcome"] == "ok" and resp["model_matches_request"] is True
    assert resp["signature"]["valid"] is True
    asking = resp["request"]["step"]
    assert asking["merge"]["source"] == "in"
    raw = log["in"].records[asking["input"]["offset"]].value
    assert canonical_json(json.loads(raw)["body"]["data"]) == canonical_json(
        asking["input"]["body"]["data"])
    assert asking["spec"]["models"]["m"] == resp["request"]["model"]
    assert asking["claim"]["spec_offset"] == asking["spec"]["offset"]
    assert tree["snapshot_before"]["seq"] <= asking["seq"]
    text = render_tree(tree)
    assert "signature valid" in text and f"out@{offset}" in text
    by_time = why(log, at_ms=log["out"].records[offset].time_ms)
    assert by_time["output"]["offset"] >= offset


def test_a_tampered_response_fails_signature_verification(log: WorkloadLog) -> None:
    signed = [r for r in (decode(x.value) for x in log["resp"])
              if isinstance(r, ResponseRecord) and r.signature is not None]
    assert signed
    good = signed[0]
    assert verify_signature(good, log.facts)["valid"] is True
    tampered = good.model_copy(update={"model_hash": "sha256:" + "00" * 32})
    assert verify_signature(tampered, log.facts)["valid"] is False
    assert good.signature is not None
    unknown_key = good.model_copy(update={"signature": Signature(
        key_id="sha256:" + "11" * 32, value=base64.b64encode(b"x" * 64).decode())})
    assert verify_signature(unknown_key, log.facts)["valid"] is None
    assert verify_signature(good.model_copy(update={"signature": None}), [])["signed"] is False


# --------------------------------------------------------------------------------- diff


class AskerNewWording(Asker):
    """Same requests, different plain outputs."""

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        new, outs = super().step(state, event)
        return new, [emit({"v2": True}) if i == 0 else o for i, o in enumerate(outs)]


class AskerNewPrompt(Asker):
    """Asks with different parameters: a request that was never recorded."""

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        new, outs = super().step(state, event)
        if isinstance(event, InputEvent) and len(outs) > 1:
            outs = [outs[0], infer(model="m", params={"v": -1}, input=0, deadline_ms=50)]
        return new, outs


class AskerNewModel(Asker):
    """Asks the same thing of another bound model."""

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        new, outs = super().step(state, event)
        if isinstance(event, InputEvent) and len(outs) > 1:
            value = int(event.json())
            outs = [outs[0], infer(model="m2", params={"v": value}, input=value, deadline_ms=50)]
        return new, outs


def test_diff_same_code_reports_no_difference(log: WorkloadLog) -> None:
    report = diff(Asker(), log)
    assert report.kind == "same" and report.count == 0 and report.steps == 10


def test_diff_reports_the_first_differing_output(log: WorkloadLog) -> None:
    report = diff(AskerNewWording(), log)
    assert report.kind == "output_differs" and report.first is not None
    assert report.first["seq"] == 0 and report.first["index"] == 0
    assert '"v2":true' in report.first["new"]
    delivered = sum(1 for r in log["merge"] if isinstance(e := decode(r.value), MergeEntry)
                    and e.action == "deliver")
    assert report.count == delivered == report.steps  # every step's first output changed


def test_diff_stops_at_a_request_never_recorded(log: WorkloadLog) -> None:
    report = diff(AskerNewPrompt(), log)
    assert report.kind == "request_divergence" and report.first is not None
    assert report.first["seq"] == 0 and report.first["index"] == 1
    assert "calls no executor" in report.detail


def test_diff_points_a_model_change_to_shadow_evaluation(log: WorkloadLog) -> None:
    report = diff(AskerNewModel(), log)
    assert report.kind == "model_changed"
    assert "shadow evaluation" in report.detail


def test_replay_json_of_state_is_stable(log: WorkloadLog) -> None:
    a: Any = replay(Asker(), log).core.state
    b: Any = replay(Asker(), log, use_snapshots=False).core.state
    assert canonical_json(a) == canonical_json(b)


def test_why_with_a_key_history_trusts_certificates_not_facts(log: WorkloadLog) -> None:
    from broker_schema.key_history import build_history
    from broker_schema.signatures import SigningKey, public_key_from_text
    from fx_kafka.keys import certify

    good = next(r for r in (decode(x.value) for x in log["resp"])
                if isinstance(r, ResponseRecord) and r.signature is not None)
    node = good.executor.node_id if good.executor is not None else good.written_by
    (fact,) = [f for f in log.facts if f.key_id == good.signature.key_id]  # type: ignore[union-attr]
    raw = public_key_from_text(fact.public_key)
    fleet = SigningKey.generate()
    history = build_history([(0, certify(fleet, node, raw))], [fleet.public_key])
    facts_only = verify_signature(good, log.facts)
    assert facts_only["valid"] is True and facts_only["authenticated"] is False
    certified = verify_signature(good, [], history)  # no facts needed
    assert certified["valid"] is True and certified["authenticated"] is True
    assert "fleet key certified" in certified["reason"]
    other = build_history([(0, certify(fleet, "someone-else", raw))], [fleet.public_key])
    refused = verify_signature(good, log.facts, other)
    assert refused["valid"] is False and refused["authenticated"] is False
    tampered = good.model_copy(update={"model_hash": "sha256:" + "00" * 32})
    assert verify_signature(tampered, [], history)["valid"] is False
    sig = why(log, out_offset=_answer_output(log), key_history=history)["step"]["response"][
        "signature"]
    assert sig["valid"] is True and sig["authenticated"] is True
