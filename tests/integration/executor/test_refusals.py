"""Refusals on a real broker: each is one signed ``error`` response with its code, no accepted."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from broker_schema import encode, topics
from broker_schema.records import INFERENCE_KIND, AcceptedRecord, InlineBody, OutputRecord
from executor.models import ModelStore
from fx_node.identity import verify_response
from tests.integration.executor.harness import by_effect, executor_config, running, workload
from tests.unit.executor.helpers import claim, request, silence_wav

pytestmark = pytest.mark.integration

OTHER_KIND = "acme:other/run@1.0.0"
UNSERVED_KIND = "acme:valve/set@1.0.0"


async def test_documented_refusals(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str, silero_hash: str
) -> None:
    async with workload(kafka_bootstrap, "refuse") as wl:
        wid = wl.workload_id
        unknown = "sha256:" + "e" * 64
        # the spec binds magika, silero and a hash this executor does not hold
        await wl.setup({"magika": magika_hash, "vad": silero_hash, "ghost": unknown}, epoch=1)
        await wl.write(topics.claims(wid), encode(claim(wid, 3)))  # a new holder at epoch 3
        cases = {
            "stale_epoch": request(wid, magika_hash, b"x" * 64, index=0, epoch=2),
            "model_unbound": request(wid, "sha256:" + "f" * 64, index=1, epoch=3),
            "model_unknown": request(wid, unknown, index=2, epoch=3),
            "kind_unbound": request(wid, magika_hash, index=3, epoch=3, kind=OTHER_KIND),
            "deadline_passed": request(wid, magika_hash, index=4, epoch=3, deadline_ms=1),
        }
        ignored = request(wid, magika_hash, index=5, epoch=3, kind=UNSERVED_KIND)
        fine = request(wid, magika_hash, b"print('still fine')\n" * 10, index=6, epoch=3)
        for req in cases.values():
            await wl.send(req)
        await wl.send(ignored)
        # a plain output on .out is not a request: ignored
        await wl.write(topics.out(wid), encode(OutputRecord(header=fine.header.model_copy(
            update={"index": 7}), body=InlineBody.of_text("log line"))))
        await wl.send(fine)
        await asyncio.sleep(0.05)  # past the 1 ms deadline before any executor reads it

        cfg = executor_config(kafka_bootstrap, wid, tmp_path, store.root,
                              kinds={INFERENCE_KIND: 8, OTHER_KIND: 4})
        async with running(cfg) as svc:
            recs = await wl.responses([r.effect_id for r in [*cases.values(), fine]],
                                      settle=1.0)
            public_key = svc.identity.public_key_b64
            metrics = svc.metrics_text().decode()

    answers = by_effect(recs)
    accepted = {r.effect_id for r in recs if isinstance(r, AcceptedRecord)}
    for code, req in cases.items():
        (resp,) = answers[req.effect_id]
        assert resp.outcome == "error" and resp.error is not None
        assert resp.error.code == code, (code, resp.error)
        assert resp.request_offset == wl.offsets[req.effect_id]
        assert resp.model_hash is None and resp.output is None
        assert resp.written_by == cfg.node_id and resp.timing is not None
        assert verify_response(resp, public_key)
        assert req.effect_id not in accepted  # refused without an accept
    assert ignored.effect_id not in answers  # a kind nobody here serves: left for others
    (ok,) = answers[fine.effect_id]
    assert ok.outcome == "ok" and fine.effect_id in accepted
    assert 'code="stale_epoch"' in metrics and 'code="deadline_passed"' in metrics


async def test_no_spec(kafka_bootstrap: str, tmp_path: Path, store: ModelStore,
                       magika_hash: str) -> None:
    async with workload(kafka_bootstrap, "nospec") as wl:
        req = request(wl.workload_id, magika_hash)
        await wl.send(req)
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root)
        async with running(cfg):
            recs = await wl.responses([req.effect_id])
    (resp,) = by_effect(recs)[req.effect_id]
    assert resp.error is not None and resp.error.code == "no_spec"


async def test_tampered_model_is_refused_and_service_keeps_running(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str, silero_hash: str
) -> None:
    async with workload(kafka_bootstrap, "tamper") as wl:
        wid = wl.workload_id
        await wl.setup({"magika": magika_hash, "vad": silero_hash})
        cfg = executor_config(kafka_bootstrap, wid, tmp_path, store.root)
        async with running(cfg) as svc:
            before = request(wid, magika_hash, b"#!/bin/sh\necho hello world\n" * 4, index=0)
            await wl.send(before)
            await wl.responses([before.effect_id])
            assert magika_hash in svc.runner.engines.loaded_models()
            # flip one byte of the stored (and already loaded) model file
            path = store.path(magika_hash)
            os.chmod(path, 0o644)
            data = bytearray(path.read_bytes())
            data[1000] ^= 0xFF
            path.write_bytes(bytes(data))
            after = request(wid, magika_hash, b"#!/bin/sh\necho hello world\n" * 4, index=1)
            other = request(wid, silero_hash, silence_wav(0.5), index=2)
            await wl.send(after)
            await wl.send(other)
            recs = await wl.responses([after.effect_id, other.effect_id])
            assert svc.is_live()
            assert magika_hash not in svc.runner.engines.loaded_models()
            ready = await svc.readiness()
            metrics = svc.metrics_text().decode()
    answers = by_effect(recs)
    assert answers[before.effect_id][0].outcome == "ok"
    (refused,) = answers[after.effect_id]
    assert refused.error is not None and refused.error.code == "model_hash_mismatch"
    assert answers[other.effect_id][0].outcome == "ok"
    assert ready["ready"] is False and magika_hash in ready["models_missing"]
    assert 'fx_executor_model_load_failures_total{code="model_hash_mismatch"}' in metrics
