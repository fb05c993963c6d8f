"""The parity gate in the executor's integer engine (real SmolLM2 artifact, no broker): the g++
build of the CUDA source as the gated backend serves; a deliberately broken build of the same
source (``-DNL_PARITY_FAULT=1``) is refused, and then the model is served on the oracle
(``fallback``: receipts say backend oracle and bind the refusal) or not at all (``refuse``:
``parity_gate_refused``, the gate not run again); the facts and metrics carry the refusal. Also
the accelerator facts (a pure function of the probe's result)."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import JsonValue

from broker_schema.records import AcceleratorDevice, FactsRecord, ParityGateFact
from executor import accelerators
from executor.engines import EngineOptions, EngineResult
from executor.engines.integer import IntegerEngineAdapter, import_artifact
from executor.metrics import ExecutorMetrics
from executor.models import ModelManifest, ModelStore
from executor.parity import gate_fact, serving_backend
from fx_integer import cpu_kernel, parity_gate
from fx_integer.engine import IntegerEngine
from fx_integer.verifier import verify
from fx_node.errors import EngineError
from fx_node.facts import build_facts
from fx_node.identity import NodeIdentity
from tests.unit.integer.real_model import real_artifact

PROMPT: dict[str, JsonValue] = {"prompt": "The capital of France is", "max_tokens": 3}


@pytest.fixture(scope="module")
def real_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelStore, ModelManifest]:
    root = tmp_path_factory.mktemp("models")
    m = import_artifact(root, real_artifact(), name="smollm2", source="test")
    return ModelStore(root), m


@pytest.fixture(scope="module")
def oracle_answer() -> dict[str, Any]:
    out: dict[str, Any] = IntegerEngine.cached(real_artifact()).run(PROMPT)
    return out


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(cpu_kernel.DEFINES_ENV, "NL_PARITY_FAULT=1")
    yield


class Seen:
    def __init__(self) -> None:
        self.facts: list[ParityGateFact] = []
        self.metrics = ExecutorMetrics()

    def __call__(self, fact: ParityGateFact) -> None:
        self.facts.append(fact)
        self.metrics.observe_parity_gate(fact)


def adapter(tmp_path: Path, seen: Seen, policy: str = "fallback") -> IntegerEngineAdapter:
    return IntegerEngineAdapter(EngineOptions(
        node_id="gate-node", identity=NodeIdentity.generate(),
        receipt_chain_file=tmp_path / "chain.json", integer_backend="cpu-kernel",
        parity_failure=policy, on_parity_gate=seen))  # type: ignore[arg-type]


def run1(a: IntegerEngineAdapter, h: str) -> EngineResult | EngineError:
    (res,) = a.run_batch(h, [(PROMPT, b"")])
    return res


def _metric(seen: Seen, name: str, **labels: str) -> float | None:
    return seen.metrics.registry.get_sample_value(name, labels)


def test_gpp_build_passes_and_serves(real_store: tuple[ModelStore, ModelManifest],
                                     oracle_answer: dict[str, Any], tmp_path: Path) -> None:
    store, m = real_store
    seen = Seen()
    a = adapter(tmp_path, seen)
    a.load(m, store.read_verified(m.hash))
    (fact,) = a.parity_gates()
    assert fact == seen.facts[0]
    assert (fact.model, fact.backend, fact.result, fact.serving, fact.mismatch) == (
        m.hash, "cpu-kernel", "passed", "cpu-kernel", None)
    assert fact.canary_set_hash == "sha256:" + parity_gate.load_canaries().sha256
    res = run1(a, m.hash)
    assert isinstance(res, EngineResult) and res.receipt is not None
    r: Any = res.receipt["integer"]
    assert isinstance(r, dict)
    assert r["engine"]["backend"] == "cpu-kernel" and r["receipt_version"] == 3
    assert r["parity_gate"] == {"backend": "cpu-kernel", "result": "passed",
                                "canary_set_hash": fact.canary_set_hash}
    assert r["output_tokens"] == oracle_answer["output_tokens"]
    assert r["logits_digest"] == oracle_answer["receipt"]["logits_digest"]
    assert verify(r, artifact_path=real_artifact()).ok
    assert _metric(seen, "fx_executor_parity_gate_checks_total", model=m.hash,
                   backend="cpu-kernel", result="passed") == 1
    assert _metric(seen, "fx_executor_parity_gate_refused", model=m.hash,
                   backend="cpu-kernel") == 0


def test_broken_build_falls_back_to_the_oracle(real_store: tuple[ModelStore, ModelManifest],
                                               oracle_answer: dict[str, Any], tmp_path: Path,
                                               broken: None, caplog: pytest.LogCaptureFixture
                                               ) -> None:
    store, m = real_store
    seen = Seen()
    a = adapter(tmp_path, seen, "fallback")
    with caplog.at_level("ERROR", logger="executor.parity"):
        a.load(m, store.read_verified(m.hash))
    (fact,) = a.parity_gates()
    assert (fact.backend, fact.result, fact.serving) == ("cpu-kernel", "refused", "oracle")
    first = parity_gate.load_canaries().canaries[0].name
    assert fact.mismatch is not None and fact.mismatch.startswith(f"canary {first} step 0: logits")
    line = next(r.getMessage() for r in caplog.records if "REFUSED" in r.getMessage())
    assert m.hash in line and "cpu-kernel" in line and first in line
    res = run1(a, m.hash)
    assert isinstance(res, EngineResult) and res.receipt is not None
    r: Any = res.receipt["integer"]
    assert isinstance(r, dict)
    assert r["engine"]["backend"] == "oracle"  # never a byte of the refused backend
    # the response's executor.device_class follows the engine that serves the model (on a
    # CuPy node after a fallback: cpu), not the configured backend
    a.device_class = "cuda"
    assert a.device_class_of(m.hash) == "cpu"
    assert a.device_class_of("sha256:" + "0" * 64) == "cuda"  # not loaded: the engine's own
    assert r["parity_gate"] == {"backend": "cpu-kernel", "result": "refused",
                                "canary_set_hash": fact.canary_set_hash}
    assert r["output_tokens"] == oracle_answer["output_tokens"]
    assert r["logits_digest"] == oracle_answer["receipt"]["logits_digest"]
    assert verify(r, artifact_path=real_artifact()).ok
    assert _metric(seen, "fx_executor_parity_gate_checks_total", model=m.hash,
                   backend="cpu-kernel", result="refused") == 1
    assert _metric(seen, "fx_executor_parity_gate_refused", model=m.hash,
                   backend="cpu-kernel") == 1
    facts = build_facts(node_id="gate-node", queue_limits={}, models_present=[m.hash],
                        models_loaded=a.loaded(), engines={}, accelerators=[],
                        public_key_b64="AAAA", key_id="sha256:" + "1" * 64, now_us=1,
                        parity_gates=a.parity_gates())
    assert facts.parity_gates == (fact,)
    assert FactsRecord.model_validate_json(facts.model_dump_json()) == facts


def test_broken_build_refuses_to_serve(real_store: tuple[ModelStore, ModelManifest],
                                       tmp_path: Path, broken: None) -> None:
    store, m = real_store
    seen = Seen()
    a = adapter(tmp_path, seen, "refuse")
    with pytest.raises(EngineError) as ei:
        a.load(m, store.read_verified(m.hash))
    assert ei.value.code == "parity_gate_refused" and ei.value.retriable
    assert a.loaded() == frozenset()
    (fact,) = a.parity_gates()
    assert (fact.result, fact.serving) == ("refused", None)
    # later loads answer at once, without running the gate again
    with pytest.raises(EngineError) as again:
        a.load(m, store.read_verified(m.hash))
    assert again.value.code == "parity_gate_refused" and len(seen.facts) == 1
    res = run1(a, m.hash)
    assert isinstance(res, EngineError) and res.code == "engine_error"  # not loaded: no bytes


def test_a_backend_that_cannot_start_is_refused(real_store: tuple[ModelStore, ModelManifest],
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store, m = real_store
    monkeypatch.setattr(cpu_kernel, "compiler", lambda: None)  # no g++ on this node
    monkeypatch.setattr(cpu_kernel, "_libs", {})
    seen = Seen()
    a = adapter(tmp_path, seen, "fallback")
    a.load(m, store.read_verified(m.hash))
    (fact,) = a.parity_gates()
    assert (fact.result, fact.serving) == ("refused", "oracle")
    assert fact.mismatch is not None and "no C++ compiler" in fact.mismatch


# ------------------------------------------------------------------------------ pure parts
def test_serving_backend_and_fact() -> None:
    ok = parity_gate.GateResult(model_hash="ab" * 32, backend="cupy", result="passed",
                                canary_set_sha256="cd" * 32, canaries=4)
    bad = parity_gate.GateResult(
        model_hash="ab" * 32, backend="cupy", result="refused", canary_set_sha256="cd" * 32,
        canaries=4, mismatch=parity_gate.Mismatch("long", 1, "token", "token [5] != [6]"))
    assert serving_backend(ok, "refuse") == "cupy"
    assert (serving_backend(bad, "fallback"), serving_backend(bad, "refuse")) == ("oracle", None)
    f = gate_fact(bad, "refuse", now_us=7)
    assert f == ParityGateFact(model="sha256:" + "ab" * 32, backend="cupy", result="refused",
                               canary_set_hash="sha256:" + "cd" * 32, serving=None,
                               mismatch="canary long step 1: token: token [5] != [6]",
                               checked_us=7)


H200_PROBE = {"driver_version": 13000, "runtime_version": 12090, "devices": [
    {"index": 1, "name": b"NVIDIA H200\x00\x00junk", "total_memory": 150_110_011_392, "major": 9,
     "minor": 0, "multi_processor_count": 132},
    {"index": 0, "name": "NVIDIA H200", "total_memory": 150_110_011_392, "major": 9, "minor": 0,
     "multi_processor_count": 132}]}


def test_accelerator_devices_from_a_probe() -> None:
    devs = accelerators.accelerator_devices(H200_PROBE)
    assert [d.index for d in devs] == [0, 1]
    assert devs[1] == AcceleratorDevice(
        kind="cuda", index=1, name="NVIDIA H200", memory_bytes=150_110_011_392,
        compute_capability="9.0", multiprocessors=132, driver_version="13.0",
        runtime_version="12.9")
    partial = accelerators.accelerator_devices({"devices": [{"name": "X"}]})
    assert partial == (AcceleratorDevice(kind="cuda", index=0, name="X"),)
    assert accelerators.accelerator_devices(None) == ()
    assert accelerators.cuda_version_text(12040) == "12.4"
    assert accelerators.cuda_version_text(None) is None
    facts = build_facts(node_id="n", queue_limits={}, models_present=[], models_loaded=[],
                        engines={}, accelerators=["cuda"], public_key_b64="AAAA",
                        key_id="sha256:" + "1" * 64, now_us=1, accelerator_devices=devs)
    assert facts.accelerators == ("cuda",) and facts.accelerator_devices == devs


def test_no_cupy_reports_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_cupy(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] == "cupy":
            raise ImportError("No module named 'cupy'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    assert accelerators.probe_cuda() is None
    accelerators.node_devices.cache_clear()
    try:
        assert accelerators.node_devices("auto") == ()
    finally:
        accelerators.node_devices.cache_clear()
    assert accelerators.node_devices("cpu") == ()
