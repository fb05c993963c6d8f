"""The lease holder's signature checks, their pure part (``workload_sdk._observe``
``check_signatures``, the rule of ``fx why``/``fx audit``) and their counters, on the golden log."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker_schema import ClaimRecord, ResponseRecord, Signature, decode, signatures
from broker_schema.key_history import build_history
from fx_kafka.keys import certify
from workload_sdk import WorkloadLog, audit
from workload_sdk._holder_metrics import HolderMetrics
from workload_sdk._signature_tally import (
    SIGNATURE_FAILURE_REASONS,
    ReadResponse,
    check_signatures,
    holder_written,
    latest_keys,
)

GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture
def log() -> WorkloadLog:
    return WorkloadLog.from_jsonl(GOLDEN / "asker_failover.jsonl")


def _responses(log: WorkloadLog) -> list[ReadResponse]:
    out: list[ReadResponse] = []
    for rec in log["resp"]:
        record = decode(rec.value)
        if isinstance(record, ResponseRecord):
            out.append((rec.offset, record, rec.time_ms * 1000))
    return out


def _holders(log: WorkloadLog) -> set[str]:
    return {r.holder_id for r in (decode(x.value) for x in log["claims"])
            if isinstance(r, ClaimRecord)}


def test_the_golden_log_counts_as_fx_audit_does(log: WorkloadLog) -> None:
    responses = _responses(log)
    tally = check_signatures(responses, log.facts, holder_ids=_holders(log), final=True)
    counts = audit(log)["signatures"].counts
    # the holder's own timeout (h2) is neither checked nor failed; the two unsigned responses
    # not written by a holder (exec-1's error@3 and x's ok@9) are, as fx audit notes them
    assert counts["unsigned_holder"] == 1 and counts["valid"] == 5 and counts["unsigned"] == 2
    assert tally.checked == counts["valid"] + counts["unsigned"] == 7
    assert [(f.offset, f.node_id, f.reason) for f in tally.failures] == [
        (3, "exec-1", "unsigned"), (9, "x", "unsigned")]
    assert tally.retry == []
    (timeout,) = [r for _, r, _ in responses if r.outcome == "timeout"]
    assert holder_written(timeout, {"h2"}) and not holder_written(timeout, {"h1"})
    # a timeout by someone who holds no claim is not the holder's: an unsigned failure
    other = check_signatures([(6, timeout, None)], log.facts, holder_ids={"h1"}, final=True)
    assert [f.reason for f in other.failures] == ["unsigned"]


def test_an_altered_or_foreign_signature_is_retried_once_then_counted(log: WorkloadLog) -> None:
    signed = [item for item in _responses(log) if item[1].signature is not None]
    offset, good, _ = signed[0]
    assert good.signature is not None
    altered = good.model_copy(update={"model_hash": "sha256:" + "00" * 32})
    stranger = signatures.SigningKey.generate()
    unsigned = good.model_copy(update={"signature": None})
    own_key = Signature(key_id=stranger.key_id, value=base64.b64encode(
        stranger.sign(unsigned.signing_bytes())).decode())
    by_stranger = good.model_copy(update={"signature": own_key})
    # a stranger's signature naming the node's key id: it does not verify with that key
    posing = good.model_copy(update={"signature": own_key.model_copy(
        update={"key_id": good.signature.key_id})})
    batch: list[ReadResponse] = [(offset, good, None), (20, altered, None),
                                 (21, by_stranger, None), (22, posing, None)]
    first = check_signatures(batch, log.facts, holder_ids=set(), final=False)
    assert first.checked == 1 and first.failures == []
    assert [o for o, _, _ in first.retry] == [20, 21, 22]
    final = check_signatures(first.retry, log.facts, holder_ids=set(), final=True)
    assert final.checked == 3 and final.retry == []
    assert [(f.offset, f.effect_id, f.node_id, f.reason) for f in final.failures] == [
        (20, good.effect_id, "exec-1", "invalid"), (21, good.effect_id, "exec-1", "unknown_key"),
        (22, good.effect_id, "exec-1", "invalid")]
    assert "does not verify" in final.failures[0].detail
    assert "no facts record" in final.failures[1].detail
    # once the stranger's key is on sys.facts as exec-1's, its signature verifies (facts are
    # unsigned: who writes sys.facts decides, as fx why says)
    (fact,) = log.facts
    published = fact.model_copy(update={
        "public_key": signatures.public_key_text(stranger.public_key),
        "key_id": stranger.key_id})
    later = check_signatures([(21, by_stranger, None)], [*log.facts, published], holder_ids=set(),
                             final=True)
    assert later.checked == 1 and later.failures == []


def test_with_a_fleet_key_history_only_certified_keys_verify(log: WorkloadLog) -> None:
    (fact,) = log.facts
    raw = signatures.public_key_from_text(fact.public_key)
    fleet = signatures.SigningKey.generate()
    history = build_history([(0, certify(fleet, "exec-1", raw))], [fleet.public_key])
    signed = [item for item in _responses(log) if item[1].signature is not None]
    ok = check_signatures(signed, [], history, holder_ids=set(), final=True)
    assert ok.checked == 5 and ok.failures == []
    other = build_history([(0, certify(fleet, "someone-else", raw))], [fleet.public_key])
    refused = check_signatures(signed, log.facts, other, holder_ids=set(), final=True)
    assert [f.reason for f in refused.failures] == ["invalid"] * 5


def test_latest_keys_keeps_one_record_per_key_and_the_same_verdicts(log: WorkloadLog) -> None:
    (fact,) = log.facts
    beats = [fact.model_copy(update={"updated_us": fact.updated_us + i}) for i in range(50)]
    kept = latest_keys(beats)
    assert kept == [beats[-1]]
    responses = _responses(log)
    assert (check_signatures(responses, kept, holder_ids=_holders(log), final=True)
            == check_signatures(responses, beats, holder_ids=_holders(log), final=True))
    other = fact.model_copy(update={"node_id": "exec-2"})
    assert latest_keys([fact, other, beats[3]]) == [other, beats[3]]


def test_the_counters_start_at_zero_and_count_by_reason() -> None:
    m = HolderMetrics()
    m.signatures_on("w")

    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(m.render().decode())
                for s in f.samples}

    zero = samples()
    assert zero[("fx_holder_signatures_checked_total", (("workload", "w"),))] == 0
    for reason in SIGNATURE_FAILURE_REASONS:
        assert zero[("fx_holder_signature_failures_total",
                     (("reason", reason), ("workload", "w")))] == 0
    m.signatures("w", 4, {"invalid": 2, "unknown_key": 0})
    m.signatures("w", 1, {"invalid": 1})
    after = samples()
    assert after[("fx_holder_signatures_checked_total", (("workload", "w"),))] == 5
    assert after[("fx_holder_signature_failures_total",
                  (("reason", "invalid"), ("workload", "w")))] == 3
    assert after[("fx_holder_signature_failures_total",
                  (("reason", "unknown_key"), ("workload", "w")))] == 0


class _Built(BaseException):  # passes fx's last guard (fx_kafka.cli_errors), as Ctrl-C would
    pass


@pytest.mark.parametrize(("flags", "check", "fleet"), [
    ((), True, ()),
    (("--no-signature-check",), False, ()),
    (("--fleet-key", "ab" * 32), True, (bytes.fromhex("ab" * 32),)),
])
def test_fx_workload_run_checks_signatures_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], check: bool,
    fleet: tuple[bytes, ...],
) -> None:
    from workload_sdk import cli

    built: dict[str, object] = {}

    def capture(**kw: object) -> None:
        built.update(kw)
        raise _Built

    monkeypatch.delenv("FX_FLEET_PUBLIC_KEY", raising=False)
    monkeypatch.setattr(cli, "HolderConfig", capture)
    with pytest.raises(_Built):
        cli.main(["workload", "run", "workload_sdk.examples.filetype_gate:FiletypeGate",
                  "--id", "w", "--bootstrap", "127.0.0.1:1", *flags])
    assert built["check_signatures"] is check and built["fleet_keys"] == fleet


def test_a_bad_fleet_key_is_refused_before_anything_runs(
        capsys: pytest.CaptureFixture[str]) -> None:
    from workload_sdk import cli

    code = cli.main(["workload", "run", "workload_sdk.examples.filetype_gate:FiletypeGate",
                     "--id", "w", "--bootstrap", "127.0.0.1:1", "--fleet-key", "not a key"])
    assert code == cli.EXIT_MISMATCH
    assert "cannot run: --fleet-key" in capsys.readouterr().err
