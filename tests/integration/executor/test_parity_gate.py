"""The integer engine's parity gate on a real broker with the real SmolLM2 artifact: an executor
started with a deliberately broken build of the CUDA source as its ``cpu-kernel`` backend
(``-DNL_PARITY_FAULT=1``, one accumulation off by one) publishes the refusal on ``sys.facts`` and
then answers with the numpy oracle (``parity_failure = "fallback"``: the same bytes as the oracle,
a receipt that says backend oracle and binds the refusal, and verifies) or not at all
(``"refuse"``: the typed error ``parity_gate_refused``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker_schema import topics
from broker_schema.records import FactsRecord, InlineBody, ResponseRecord
from executor.engines.integer import import_artifact
from executor.models import ModelManifest, ModelStore
from fx_integer import cpu_kernel, parity_gate
from fx_integer.engine import IntegerEngine
from fx_integer.verifier import verify
from tests.integration.executor.harness import by_effect, executor_config, running, workload
from tests.unit.executor.helpers import request
from tests.unit.integer.real_model import real_artifact

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = {"prompt": "The capital of France is", "max_tokens": 4}


@pytest.fixture(scope="module")
def int_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelStore, ModelManifest]:
    art = real_artifact()  # skipped without the model wheel, a failure in CI
    root = tmp_path_factory.mktemp("gate-models")
    return ModelStore(root), import_artifact(root, art)


async def _refusal_fact(wl: Any, node_id: str) -> FactsRecord:
    def has(rs: list[Any]) -> bool:
        return any(isinstance(r, FactsRecord) and r.node_id == node_id and r.parity_gates
                   for r in rs)

    facts = await wl.read(topics.FACTS, until=has, timeout=60)
    last: FactsRecord = [f for f in facts if isinstance(f, FactsRecord)
                         and f.node_id == node_id and f.parity_gates][-1]
    return last


@pytest.mark.parametrize("policy", ["fallback", "refuse"])
async def test_broken_backend_is_refused_on_sys_facts(
        kafka_bootstrap: str, tmp_path: Path, int_store: tuple[ModelStore, ModelManifest],
        monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    store, manifest = int_store
    monkeypatch.setenv(cpu_kernel.DEFINES_ENV, "NL_PARITY_FAULT=1")
    async with workload(kafka_bootstrap, f"gate-{policy}") as wl:
        await wl.setup({"llm": manifest.hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              integer_backend="cpu-kernel", parity_failure=policy)
        req = request(wl.workload_id, manifest.hash, b"", index=0, params=PROMPT)
        async with running(cfg) as svc:  # preloads the model: the gate runs at start
            fact = await _refusal_fact(wl, cfg.node_id)
            await wl.send(req)
            recs = await wl.responses([req.effect_id], timeout=120)
            metrics = svc.metrics.render().decode()
        (gate,) = fact.parity_gates
        first = parity_gate.load_canaries().canaries[0].name
        assert (gate.model, gate.backend, gate.result) == (manifest.hash, "cpu-kernel", "refused")
        assert gate.serving == ("oracle" if policy == "fallback" else None)
        assert gate.canary_set_hash == "sha256:" + parity_gate.load_canaries().sha256
        assert gate.mismatch is not None and gate.mismatch.startswith(f"canary {first} step 0")
        assert (f'fx_executor_parity_gate_refused{{backend="cpu-kernel",model="{manifest.hash}"}}'
                ' 1.0') in metrics
        (resp,) = [r for r in by_effect(recs)[req.effect_id] if isinstance(r, ResponseRecord)]
        if policy == "refuse":
            assert manifest.hash not in fact.models_loaded
            assert resp.outcome == "error" and resp.error is not None
            assert resp.error.code == "parity_gate_refused"
            assert resp.output is None
            return
        assert manifest.hash in fact.models_loaded
        assert resp.outcome == "ok", resp.error
        want = IntegerEngine.cached(real_artifact()).run(PROMPT)
        assert isinstance(resp.output, InlineBody) and isinstance(resp.output.data, dict)
        assert resp.output.data["output_tokens"] == want["output_tokens"]
        assert resp.receipt is not None
        r: Any = resp.receipt["integer"]
        assert isinstance(r, dict)
        assert r["engine"]["backend"] == "oracle" and r["receipt_version"] == 3
        assert r["parity_gate"] == {"backend": "cpu-kernel", "result": "refused",
                                    "canary_set_hash": gate.canary_set_hash}
        assert r["logits_digest"] == want["receipt"]["logits_digest"]
        assert verify(r, artifact_path=real_artifact()).ok
