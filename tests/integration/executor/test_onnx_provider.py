"""``onnx_provider = "cuda"`` on a node without CUDA (issue 27, part 6): the executor serves
magika on ONNX Runtime's CPU provider, and says so in every response's ``executor`` and in its
facts on ``sys.facts``, with the reason it logged. Real broker, real onnxruntime, real magika."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import onnxruntime as ort
import pytest

from broker_schema.records import FactsRecord, ResponseRecord
from executor.engines.onnx import CPU_PROVIDER, CUDA_PROVIDER
from executor.models import ModelStore
from tests.integration.executor.harness import REPO, by_effect, executor_config, running, workload
from tests.unit.executor.helpers import request

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(CUDA_PROVIDER in ort.get_available_providers(),
                                 reason="this onnxruntime has CUDA: no fallback to see")]


async def test_cuda_asked_falls_back_to_cpu_recorded_in_responses_and_facts(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with workload(kafka_bootstrap, "onnxprov") as wl:
        await wl.setup({"magika": magika_hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              http_port=0, onnx_provider="cuda")
        with caplog.at_level(logging.WARNING, logger="executor.engines.onnx"):
            async with running(cfg) as svc:
                reqs = [request(wl.workload_id, magika_hash,
                                (REPO / "fx_node" / "admission.py").read_bytes(), index=i)
                        for i in range(3)]
                for r in reqs:
                    await wl.send(r)
                recs = await wl.responses([r.effect_id for r in reqs])
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as c:
                    facts = FactsRecord.model_validate_json((await c.get("/facts")).content)
    answers = by_effect(recs)
    for r in reqs:
        (resp,) = answers[r.effect_id]
        assert isinstance(resp, ResponseRecord) and resp.outcome == "ok", resp
        assert resp.executor is not None
        assert (resp.executor.engine, resp.executor.device_class, resp.executor.provider) == (
            "onnxruntime", "cpu", CPU_PROVIDER)
    assert facts.onnx_provider is not None
    assert (facts.onnx_provider.asked, facts.onnx_provider.running) == ("cuda", CPU_PROVIDER)
    assert facts.onnx_provider.reason and "onnxruntime-gpu" in facts.onnx_provider.reason
    assert facts.accelerators == ()
    assert any("onnx_provider = cuda asked" in m for m in caplog.messages), caplog.text
