"""An executor SIGKILLed after ``accepted`` and restarted answers again under the same effect id;
SIGTERM answers what is still in flight with ``shutdown`` and exits cleanly."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from broker_schema import topics
from broker_schema.records import AcceptedRecord, ResponseRecord
from executor.models import ModelStore
from fx_node.identity import NodeIdentity, verify_response
from tests.integration.executor.harness import Subprocess, by_effect, executor_config, workload
from tests.integration.executor.slow_engine import import_slow_model
from tests.unit.executor.helpers import request, silence_wav

pytestmark = pytest.mark.integration

SLOW = {"slow-onnx": "tests.integration.executor.slow_engine:SlowEngine"}


async def test_sigkill_after_accepted_then_restart_answers_same_effect_id(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore
) -> None:
    slow = import_slow_model(store)
    async with workload(kafka_bootstrap, "kill") as wl:
        await wl.setup({"slow": slow.hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              engines=SLOW, session_timeout_ms=6000)
        first = Subprocess(cfg, tmp_path, "first")
        first.start()
        try:
            await first.wait_log("partitions assigned")
            req = request(wl.workload_id, slow.hash, silence_wav(0.5),
                          params={"delay_s": 4.0})
            await wl.send(req)
            await wl.read(
                topics.resp(wl.workload_id),
                until=lambda rs: any(isinstance(r, AcceptedRecord) for r in rs),
            )
            first.kill(signal.SIGKILL)
            assert await first.wait() == -signal.SIGKILL
        finally:
            first.kill(signal.SIGKILL)
        before = await wl.read(topics.resp(wl.workload_id), until=lambda rs: len(rs) >= 1)
        assert not any(isinstance(r, ResponseRecord) for r in before)

        second = Subprocess(cfg, tmp_path, "second")
        second.start()
        try:
            recs = await wl.responses([req.effect_id], timeout=60)
            second.kill(signal.SIGTERM)
            assert await second.wait() == 0
        finally:
            second.kill(signal.SIGKILL)
    accepts = [r for r in recs if isinstance(r, AcceptedRecord)]
    (resp,) = by_effect(recs)[req.effect_id]
    assert len(accepts) == 2 and {a.effect_id for a in accepts} == {req.effect_id}
    assert resp.outcome == "ok" and resp.request_offset == wl.offsets[req.effect_id]
    key = NodeIdentity.load_or_create(cfg.key_file)  # same node, same key across the restart
    assert verify_response(resp, key.public_key)
    assert "partitions assigned" in second.log()


async def test_sigterm_answers_in_flight_with_shutdown(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore
) -> None:
    slow = import_slow_model(store)
    async with workload(kafka_bootstrap, "term") as wl:
        await wl.setup({"slow": slow.hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              engines=SLOW, shutdown_grace_s=0.5)
        proc = Subprocess(cfg, tmp_path, "term")
        proc.start()
        try:
            await proc.wait_log("partitions assigned")
            req = request(wl.workload_id, slow.hash, silence_wav(0.5), params={"delay_s": 3.0})
            await wl.send(req)
            await wl.read(
                topics.resp(wl.workload_id),
                until=lambda rs: any(isinstance(r, AcceptedRecord) for r in rs),
            )
            proc.kill(signal.SIGTERM)
            recs = await wl.responses([req.effect_id], timeout=30)
            assert await proc.wait() == 0
        finally:
            proc.kill(signal.SIGKILL)
    (resp,) = by_effect(recs)[req.effect_id]
    assert resp.outcome == "error" and resp.error is not None
    assert resp.error.code == "shutdown" and resp.error.retriable
