"""Request -> accepted -> response on a real broker, with the real models."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest

from broker_schema import decode, encode, topics
from broker_schema.records import (
    INFERENCE_KIND,
    AcceptedRecord,
    FactsRecord,
    InlineBody,
    ResponseRecord,
)
from executor.chunks import FsChunkStore
from executor.models import ModelStore
from fx_node.identity import verify_response
from tests.integration.executor.harness import (
    REPO,
    by_effect,
    executor_config,
    running,
    workload,
)
from tests.unit.executor.helpers import request, silence_wav, speech_wav, tone_wav

pytestmark = pytest.mark.integration


async def test_magika_and_silero_answer_signed(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str, silero_hash: str
) -> None:
    async with workload(kafka_bootstrap, "flow") as wl:
        await wl.setup({"magika": magika_hash, "vad": silero_hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              http_port=0)
        async with running(cfg) as svc:
            speech = speech_wav()
            # over the inline limit: by chunk reference, through the executor's chunk store
            speech_ref = await FsChunkStore(cfg.chunk_dir).put(speech, workload=wl.workload_id,
                                                               media_type="audio/wav")
            reqs = [
                request(wl.workload_id, magika_hash,
                        (REPO / "fx_node" / "admission.py").read_bytes(), index=0),
                request(wl.workload_id, magika_hash, tone_wav(), index=1),
                request(wl.workload_id, silero_hash, speech_ref, index=2),
                request(wl.workload_id, silero_hash, silence_wav(1.0), index=3),
            ]
            for r in reqs:
                await wl.send(r)
            recs = await wl.responses([r.effect_id for r in reqs])
            port = svc.http_port
            assert port
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                live = await http.get("/v2/health/live")
                ready = await http.get("/v2/health/ready")
                facts = await http.get("/facts")
                metrics = (await http.get("/metrics")).text
            public_key = svc.identity.public_key_b64

    answers = by_effect(recs)
    accepted = {r.effect_id: r for r in recs if isinstance(r, AcceptedRecord)}
    for r in reqs:
        (resp,) = answers[r.effect_id]
        assert resp.outcome == "ok", resp.error
        # accepted came first, names the request offset on .out, and so does the response
        acc = accepted[r.effect_id]
        assert recs.index(acc) < recs.index(resp)
        assert acc.request_offset == resp.request_offset == wl.offsets[r.effect_id]
        assert resp.model_hash == r.model
        assert resp.executor is not None and resp.executor.engine == "onnxruntime"
        assert resp.executor.device_class == "cpu"
        assert resp.written_by == cfg.node_id
        assert resp.receipt is not None and resp.receipt["manifest_hash"]
        assert verify_response(resp, public_key)
    outputs = [answers[r.effect_id][0].output for r in reqs]
    assert all(isinstance(o, InlineBody) for o in outputs)
    data = [o.data for o in outputs if isinstance(o, InlineBody)]
    assert data[0]["label"] == "python"  # type: ignore[index,call-overload]
    assert data[1]["label"] == "wav"  # type: ignore[index,call-overload]
    assert data[2]["mean_probability"] > 0.5, data[2]  # type: ignore[index,call-overload,operator]
    assert data[3]["mean_probability"] < 0.1  # type: ignore[index,call-overload,operator]

    # a changed byte in the signed record fails verification
    first = answers[reqs[0].effect_id][0]
    wire = encode(first)
    tampered = decode(wire.replace(b'"python"', b'"pythoN"', 1))
    assert isinstance(tampered, ResponseRecord)
    assert not verify_response(tampered, public_key)

    assert live.status_code == 200 and ready.status_code == 200, ready.text
    f = FactsRecord.model_validate_json(facts.content)
    assert set(f.models_loaded) == {magika_hash, silero_hash}
    assert f.public_key == public_key
    assert base64.b64decode(f.public_key)
    ok_line = f'fx_executor_request_total{{code="",kind="{INFERENCE_KIND}",outcome="ok"}} 4.0'
    assert ok_line in metrics
    assert "fx_executor_compute_duration_seconds_bucket" in metrics
    assert "fx_executor_batch_size_bucket" in metrics

    # the node's facts are on sys.facts, keyed by node id
    facts_on_log = await wl.read(
        topics.FACTS,
        until=lambda rs: any(isinstance(x, FactsRecord) and x.node_id == cfg.node_id
                             for x in rs),
    )
    mine = [x for x in facts_on_log if isinstance(x, FactsRecord) and x.node_id == cfg.node_id]
    assert mine[-1].key_id == f.key_id
