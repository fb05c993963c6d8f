"""The parity gate (fx_integer.parity_gate): the pure decision, the canary file, the gate on the
g++ build of the CUDA source (passes) and on a deliberately broken build of the same source
(``-DNL_PARITY_FAULT=1``: one accumulation off by one; refused), on the synthetic model and on the
real SmolLM2 artifact with the committed canaries; and version 3 receipts, which bind the gate's
verdict, next to version 2 ones."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from fx_integer import artifact, cpu_kernel, parity_gate
from fx_integer.engine import IntegerEngine
from fx_integer.parity_gate import CanaryRun, CanarySet, decide, parse_canaries
from fx_integer.receipt import RECEIPT_VERSION, RECEIPT_VERSION_GATED, ReceiptSigner
from fx_integer.verifier import check_static, verify
from tests.unit.integer.real_model import real_artifact

FAULT = ("NL_PARITY_FAULT=1",)
#: canaries the synthetic model (vocab 300, no real tokenizer text) can take
SYNTH_CANARIES = json.dumps({"format": "fx-parity-canaries/1", "canaries": [
    {"name": "one", "params": {"prompt_tokens": [5, 17, 250], "max_tokens": 3}},
    {"name": "two", "params": {"prompt_tokens": list(range(1, 40)), "max_tokens": 2,
                               "temperature": 0.7, "seed": 3, "stop_at_eos": False}},
]}).encode()


@pytest.fixture(scope="module")
def synth_canaries() -> CanarySet:
    return parse_canaries(SYNTH_CANARIES)


@pytest.fixture(scope="module")
def synth_oracle(synth: artifact.Artifact) -> IntegerEngine:
    return IntegerEngine.from_artifact(synth)


def _faulty(art: artifact.Artifact, monkeypatch: pytest.MonkeyPatch) -> IntegerEngine:
    monkeypatch.setenv(cpu_kernel.DEFINES_ENV, ",".join(FAULT))
    eng = IntegerEngine.from_artifact(art, backend="cpu-kernel")
    monkeypatch.delenv(cpu_kernel.DEFINES_ENV)
    assert eng.ops.defines == FAULT  # type: ignore[attr-defined]
    return eng


# ------------------------------------------------------------------------------ the decision
CS = CanarySet(canaries=(parity_gate.Canary("a", {}), parity_gate.Canary("b", {})),
               sha256="ab" * 32)
REF = [CanaryRun(tokens=(1, 2), step_digests=("d0", "d1")),
       CanaryRun(tokens=(3,), step_digests=("e0",))]


def _decide(gated: list[CanaryRun]) -> parity_gate.GateResult:
    return decide(model_hash="cd" * 32, backend="cupy", canary_set=CS, reference=REF,
                  gated=gated)


def test_equal_runs_pass() -> None:
    r = _decide(list(REF))
    assert (r.result, r.passed, r.mismatch, r.canaries) == ("passed", True, None, 2)
    assert (r.backend, r.canary_set_sha256, r.model_hash) == ("cupy", "ab" * 32, "cd" * 32)


@pytest.mark.parametrize(("gated", "where"), [
    ([REF[0], CanaryRun(tokens=(3,), step_digests=("e1",))], ("b", 0, "logits")),
    ([CanaryRun(tokens=(1, 9), step_digests=("d0", "d1")), REF[1]], ("a", 1, "token")),
    ([CanaryRun(tokens=(1,), step_digests=("d0",)), REF[1]], ("a", 1, "length")),
    ([CanaryRun(tokens=(1, 2, 5), step_digests=("d0", "d1", "d2")), REF[1]], ("a", 2, "length")),
    ([CanaryRun(error="FixedPointOverflow: residual"), REF[1]], ("a", None, "error")),
    # the first difference wins, canary order first
    ([CanaryRun(tokens=(1, 2), step_digests=("d0", "dX")), CanaryRun(error="boom")],
     ("a", 1, "logits")),
])
def test_any_difference_refuses(gated: list[CanaryRun], where: tuple[Any, ...]) -> None:
    r = _decide(gated)
    assert r.result == "refused" and not r.passed and r.mismatch is not None
    assert (r.mismatch.canary, r.mismatch.step, r.mismatch.what) == where


def test_reference_failure_is_not_a_verdict() -> None:
    with pytest.raises(RuntimeError, match="oracle failed on canary a"):
        decide(model_hash="cd" * 32, backend="cupy", canary_set=CS,
               reference=[CanaryRun(error="x"), REF[1]], gated=list(REF))
    with pytest.raises(ValueError, match="one run per canary"):
        _decide([REF[0]])


def test_refused_on_error_names_the_start() -> None:
    r = parity_gate.refused_on_error(model_hash="cd" * 32, backend="cupy", canary_set=CS,
                                     error=OSError("no libcuda"))
    assert r.result == "refused" and r.mismatch is not None
    assert (r.mismatch.canary, r.mismatch.what) == ("(backend start)", "error")
    assert "OSError: no libcuda" in r.mismatch.detail


# ------------------------------------------------------------------------------ the canary file
def test_committed_canaries() -> None:
    cs = parity_gate.load_canaries()
    assert len(cs.canaries) >= 3 and len(cs.sha256) == 64
    kinds = [c.params for c in cs.canaries]
    assert any(p.get("temperature", 0) for p in kinds)  # one sampled
    assert any(not p.get("temperature", 0) for p in kinds)  # greedy
    assert all(p["max_tokens"] <= 4 for p in kinds)  # seconds on a CPU
    # the hash is of the canonical JSON: reformatting the file does not change it
    doc = json.loads(parity_gate.CANARIES_PATH.read_bytes())
    assert parse_canaries(json.dumps(doc, indent=4).encode()).sha256 == cs.sha256
    doc["canaries"][0]["params"]["max_tokens"] += 1
    assert parse_canaries(json.dumps(doc).encode()).sha256 != cs.sha256
    assert parity_gate.receipt_field(parity_gate.GateResult(
        model_hash="cd" * 32, backend="cupy", result="passed", canary_set_sha256=cs.sha256,
        canaries=len(cs.canaries)))["canary_set_hash"] == "sha256:" + cs.sha256


@pytest.mark.parametrize(("data", "match"), [
    (b"nope", "not JSON"), (b'{"format": "x"}', "not fx-parity-canaries/1"),
    (b'{"format": "fx-parity-canaries/1", "canaries": []}', "no canaries"),
    (b'{"format": "fx-parity-canaries/1", "canaries": [{"name": 1}]}', "name, params"),
    (b'{"format": "fx-parity-canaries/1", "canaries": [{"name": "a", "params": {}},'
     b' {"name": "a", "params": {}}]}', "unique"),
])
def test_bad_canary_files(data: bytes, match: str) -> None:
    with pytest.raises(parity_gate.CanaryError, match=match):
        parse_canaries(data)


def test_kernel_defines_are_checked() -> None:
    with pytest.raises(ValueError, match="bad kernel define"):
        cpu_kernel.check_defines(("NL_X; rm -rf /",))
    assert cpu_kernel.check_defines(("B=1", "A", "B=1")) == ("A", "B=1")


# ------------------------------------------------------------------------------ synthetic model
def test_gpp_build_passes_on_synthetic(synth: artifact.Artifact, synth_oracle: IntegerEngine,
                                       synth_canaries: CanarySet) -> None:
    gated = IntegerEngine.from_artifact(synth, backend="cpu-kernel")
    r = parity_gate.run_gate(gated, oracle=synth_oracle, canary_set=synth_canaries)
    assert r.passed, r.mismatch


def test_oracle_native_is_gated_and_passes_on_synthetic(
        synth: artifact.Artifact, synth_oracle: IntegerEngine,
        synth_canaries: CanarySet) -> None:
    # the oracle's compiled twin is a backend other than the numpy oracle: it is gated too
    assert "oracle-native" in parity_gate.GATED_BACKENDS
    gated = IntegerEngine.from_artifact(synth, backend="oracle-native")
    r = parity_gate.run_gate(gated, oracle=synth_oracle, canary_set=synth_canaries)
    assert r.passed, r.mismatch


def test_broken_build_is_a_different_library_and_is_refused(
        synth: artifact.Artifact, synth_oracle: IntegerEngine, synth_canaries: CanarySet,
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert cpu_kernel.build(FAULT) != cpu_kernel.build()  # its own cached library
    bad = _faulty(synth, monkeypatch)
    r = parity_gate.run_gate(bad, oracle=synth_oracle, canary_set=synth_canaries)
    assert r.result == "refused" and r.mismatch is not None
    assert (r.mismatch.canary, r.mismatch.step, r.mismatch.what) == ("one", 0, "logits")


def test_backend_exception_refuses(synth: artifact.Artifact, synth_oracle: IntegerEngine,
                                   synth_canaries: CanarySet,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    gated = IntegerEngine.from_artifact(synth, backend="cpu-kernel")

    def overflow(*_: Any) -> None:
        from fx_integer.oracle import FixedPointOverflow

        raise FixedPointOverflow("residual exceeds the bound (injected)")

    monkeypatch.setattr(gated.ops, "launch", overflow)
    r = parity_gate.run_gate(gated, oracle=synth_oracle, canary_set=synth_canaries)
    assert r.result == "refused" and r.mismatch is not None
    assert r.mismatch.what == "error" and "FixedPointOverflow" in r.mismatch.detail


def test_canaries_that_do_not_fit_the_model_refuse(synth: artifact.Artifact,
                                                    synth_oracle: IntegerEngine) -> None:
    gated = IntegerEngine.from_artifact(synth, backend="cpu-kernel")
    # the committed canaries' token ids exceed the synthetic model's vocabulary of 300
    r = parity_gate.run_gate(gated, oracle=synth_oracle)
    assert r.result == "refused" and r.mismatch is not None
    assert (r.mismatch.canary, r.mismatch.what) == ("(canary set)", "error")
    assert "do not fit this model" in r.mismatch.detail


def test_the_oracle_is_not_gated(synth_oracle: IntegerEngine) -> None:
    with pytest.raises(ValueError, match="not gated"):
        parity_gate.run_gate(synth_oracle)


# ------------------------------------------------------------------------------ receipts v3
@pytest.fixture(scope="module")
def signer() -> ReceiptSigner:
    return ReceiptSigner.generate(node_id="gate-node")


def _gated_receipt(synth: artifact.Artifact, synth_path: Path, signer: ReceiptSigner,
                   backend: str, verdict: str) -> dict[str, Any]:
    eng = IntegerEngine.from_artifact(synth, backend=backend, signer=signer)
    eng.parity_gate = {"backend": "cpu-kernel", "result": verdict,
                       "canary_set_hash": "sha256:" + "ab" * 32}
    receipt: dict[str, Any] = eng.run({"prompt_tokens": [5, 6, 7], "max_tokens": 2})["receipt"]
    return receipt


def test_v3_receipt_binds_the_gate_and_verifies(synth: artifact.Artifact, synth_path: Path,
                                                signer: ReceiptSigner) -> None:
    r = _gated_receipt(synth, synth_path, signer, "cpu-kernel", "passed")
    assert r["receipt_version"] == RECEIPT_VERSION_GATED == 3
    assert r["parity_gate"]["result"] == "passed"
    res = verify(r, artifact_path=synth_path)
    assert res.ok, res.reasons
    assert any(c.startswith("parity_gate") for c in res.checks)
    fb = _gated_receipt(synth, synth_path, signer, "oracle", "refused")  # the fallback
    res = verify(fb, artifact_path=synth_path)
    assert res.ok, res.reasons
    # version 2 (no gate) still verifies, and carries no parity_gate
    v2 = IntegerEngine.from_artifact(synth, signer=signer).run(
        {"prompt_tokens": [5, 6, 7], "max_tokens": 2})["receipt"]
    assert v2["receipt_version"] == RECEIPT_VERSION == 2 and "parity_gate" not in v2
    assert verify(v2, artifact_path=synth_path).ok


def test_v3_receipt_tampering_fails(synth: artifact.Artifact, synth_path: Path,
                                    signer: ReceiptSigner) -> None:
    r = _gated_receipt(synth, synth_path, signer, "oracle", "refused")
    t = copy.deepcopy(r)
    t["parity_gate"]["result"] = "passed"  # claims the refused backend passed
    reasons, _ = check_static(t)
    assert any("signature does not verify" in x for x in reasons)
    assert any("produced by backend 'oracle' (expected 'cpu-kernel')" in x for x in reasons)
    t = copy.deepcopy(r)
    del t["parity_gate"]  # a v3 receipt must carry it
    assert check_static(t)[0][0].startswith("receipt lacks fields: parity_gate")
    t = copy.deepcopy(r)
    t["parity_gate"]["canary_set_hash"] = "ab" * 32
    assert any("canary_set_hash is not sha256:" in x for x in check_static(t)[0])
    # a v2 receipt with a parity_gate field is not a v2 receipt
    t = copy.deepcopy(r)
    t["receipt_version"] = 2
    assert any("unknown fields: parity_gate" in x for x in check_static(t)[0])
    # the refused backend cannot have signed a receipt that says so
    bad = _gated_receipt(synth, synth_path, signer, "cpu-kernel", "refused")
    assert any("expected 'oracle'" in x for x in check_static(bad)[0])


# ------------------------------------------------------------------------------ the real model
@pytest.fixture(scope="module")
def real_oracle_engine() -> IntegerEngine:
    return IntegerEngine(real_artifact())


def test_real_model_gpp_build_passes_the_committed_canaries(
        real_oracle_engine: IntegerEngine) -> None:
    gated = IntegerEngine.from_artifact(real_oracle_engine.artifact, backend="cpu-kernel")
    r = parity_gate.run_gate(gated, oracle=real_oracle_engine)
    assert r.passed, r.mismatch
    assert r.canary_set_sha256 == parity_gate.load_canaries().sha256


def test_real_model_oracle_native_passes_the_committed_canaries(
        real_oracle_engine: IntegerEngine) -> None:
    gated = IntegerEngine.from_artifact(real_oracle_engine.artifact, backend="oracle-native")
    r = parity_gate.run_gate(gated, oracle=real_oracle_engine)
    assert r.passed, r.mismatch


def test_real_model_broken_build_is_refused(real_oracle_engine: IntegerEngine,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    bad = _faulty(real_oracle_engine.artifact, monkeypatch)
    r = parity_gate.run_gate(bad, oracle=real_oracle_engine)
    assert r.result == "refused" and r.mismatch is not None
    first = parity_gate.load_canaries().canaries[0].name
    assert (r.mismatch.canary, r.mismatch.step, r.mismatch.what) == (first, 0, "logits")
