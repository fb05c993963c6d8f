"""The service's record handling without a broker: a fake producer, no claims/spec reads.

What is tested here is the glue around :func:`fx_node.admission.decide` that the pure core cannot
see: when an offset is settled (may be committed), and that a damaged model store or an engine
that cannot load a model yields a recorded error instead of stopping the service.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from broker_schema import decode, encode, topics
from broker_schema.records import INFERENCE_KIND, InlineBody, OutputRecord, ResponseRecord
from executor.config import load_config
from executor.models import ModelStore, file_sha256
from executor.service import ExecutorService
from fx_node.errors import EngineError
from fx_node.identity import NodeIdentity
from tests.unit.executor.helpers import claim, request, spec

WL = "svc1"


class FakeProducer:
    """Acknowledges every send at once and keeps what was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        self.sent.append((topic, value))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.sent.append((topic, value))

    def responses(self) -> list[ResponseRecord]:
        recs = [decode(v) for t, v in self.sent if t == topics.resp(WL)]
        return [r for r in recs if isinstance(r, ResponseRecord)]


class BrokenEngine:
    """An engine whose load fails with an error that is not an OutcomeError."""

    name = "broken"
    version = "0"
    device_class = "cpu"
    max_batch = 1

    def load(self, manifest: Any, model_bytes: bytes) -> None:
        raise RuntimeError("cannot map the weights")

    def loaded(self) -> frozenset[str]:
        return frozenset()

    def unload(self, model_hash: str) -> None:
        return None

    def run_batch(self, model_hash: str, items: Any) -> list[Any]:
        raise AssertionError("never loaded")


async def _service(tmp_path: Path, **engines: Any) -> tuple[ExecutorService, FakeProducer]:
    cfg = load_config(environ={}, node_id="n1", bootstrap="127.0.0.1:1",
                      model_dir=tmp_path / "models", key_file=tmp_path / "node.key",
                      chunk_dir=tmp_path / "chunks", http_port=None)
    svc = ExecutorService(cfg, identity=NodeIdentity.generate(), engines=engines or None)
    producer = FakeProducer()
    svc.node.producer.current = producer  # type: ignore[assignment]

    async def no_sync(workload_id: str, *, shadow: str | None = None) -> None:
        return None

    svc.node.sync_workload = no_sync  # type: ignore[method-assign]
    return svc, producer


def _msg(value: bytes, offset: int, headers: tuple[tuple[str, bytes], ...] = ()) -> Any:
    return SimpleNamespace(topic=topics.out(WL), partition=0, offset=offset, value=value,
                           timestamp=int(time.time() * 1000), headers=headers)


async def _handle(svc: ExecutorService, value: bytes, offset: int,
                  headers: tuple[tuple[str, bytes], ...] = ()) -> None:
    tracker = svc.node.trackers[INFERENCE_KIND]
    await svc.node.handle(INFERENCE_KIND, tracker, TopicPartition(topics.out(WL), 0),
                      _msg(value, offset, headers), set())
    await svc.node.await_background()


async def test_a_request_mirrored_from_a_site_is_never_answered(tmp_path: Path) -> None:
    """On the fleet, a site's .out copied by `fx mirror` carries the site offset header: the
    site answers its own requests, and the copy is read-only."""
    svc, producer = await _service(tmp_path)
    model = "sha256:" + "a" * 64
    svc.state.observe_spec(spec(WL, {"m": model}), offset=0)
    svc.state.observe_claim(claim(WL, 1))
    req = request(WL, model, epoch=1)
    await _handle(svc, encode(req), 4, headers=(("fx.mirror.offset", b"9"),))
    assert producer.sent == [] and not svc.state.in_flight
    assert svc.node.trackers[INFERENCE_KIND].committable() == {(topics.out(WL), 0): 5}
    assert 'fx_executor_ignored_total{reason="mirrored_copy"} 1.0' in svc.metrics_text().decode()


async def test_in_flight_record_read_again_after_a_rebalance_stays_unsettled(
        tmp_path: Path) -> None:
    svc, _ = await _service(tmp_path)
    model = "sha256:" + "a" * 64
    svc.state.observe_spec(spec(WL, {"m": model}), offset=0)
    svc.state.observe_claim(claim(WL, 1))

    async def ready(model_hash: str | None) -> str:
        return "ready"

    svc.runner.engines.model_status = ready  # type: ignore[method-assign,assignment]
    tracker = svc.node.trackers[INFERENCE_KIND]
    tp = (topics.out(WL), 0)
    req = request(WL, model, epoch=1)
    await _handle(svc, encode(req), 5)
    assert req.effect_id in svc.state.in_flight and tracker.committable() == {tp: 5}
    # the partition is revoked (the job outlived revoke_grace_s) and assigned back: the
    # consumer reads offset 5 again while the job is still running here
    tracker.forget([tp])
    await _handle(svc, encode(req), 5)
    assert tracker.committable() == {tp: 5}, "committed past a request not answered yet"
    # the same effect id at another offset (a duplicate record) is settled at once...
    await _handle(svc, encode(req), 7)
    assert tracker.pending_in([tp]) == 1 and tracker.committable() == {tp: 5}
    # ...and the job's answer settles the original
    svc.state.finish(req.effect_id)
    tracker.done(tp, 5)
    assert tracker.committable() == {tp: 8}


async def test_plain_output_on_out_is_ignored_and_settled(tmp_path: Path) -> None:
    svc, producer = await _service(tmp_path)
    out = OutputRecord(header=request(WL, None).header, body=InlineBody.of_text("log line"))
    await _handle(svc, encode(out), 3)
    assert producer.sent == [] and not svc.state.in_flight
    assert svc.node.trackers[INFERENCE_KIND].committable() == {(topics.out(WL), 0): 4}
    assert 'fx_executor_ignored_total{reason="not_a_request"} 1.0' in svc.metrics_text().decode()


async def test_a_record_that_does_not_belong_on_out_is_rejected_visibly(tmp_path: Path) -> None:
    """A claim (or a response, a spec...) written to .out is neither dropped silently nor acted
    on: it is recorded on sys.rejects as ``wrong_stream``, counted, and its offset settled."""
    from broker_schema.records import RejectedRecord

    svc, producer = await _service(tmp_path)
    stray = [encode(claim(WL, 9)), encode(spec(WL, {}))]
    for offset, value in enumerate(stray):
        await _handle(svc, value, offset)
    rejects = [decode(v) for t, v in producer.sent if t == topics.REJECTS]
    assert [type(r) for r in rejects] == [RejectedRecord, RejectedRecord]
    assert all(isinstance(r, RejectedRecord) and r.code == "wrong_stream"
               and r.topic == topics.out(WL) for r in rejects)
    assert not svc.state.in_flight and svc.state.workload(WL).highest_epoch != 9
    assert svc.node.trackers[INFERENCE_KIND].committable() == {(topics.out(WL), 0): 2}
    metrics = svc.metrics_text().decode()
    assert 'fx_executor_rejected_records_total{code="wrong_stream"} 2.0' in metrics


def _store_file(store: ModelStore, data: bytes) -> str:
    src = store.root.parent / "model.bin"
    src.write_bytes(data)
    return file_sha256(src)


async def test_damaged_manifest_is_a_recorded_refusal_not_a_crash(tmp_path: Path) -> None:
    svc, producer = await _service(tmp_path)
    store = svc.store
    _store_file(store, b"weights")
    model = store.add(store.root.parent / "model.bin",
                      {"name": "m", "engine": "onnxruntime", "interface": "onnx-tensors",
                       "preprocessing_version": "x/1"}).hash
    other = _store_file(store, b"other weights")
    svc.state.observe_spec(spec(WL, {"m": model, "o": other}), offset=0)
    svc.state.observe_claim(claim(WL, 1))
    mpath = store.path(model).with_suffix(".json")
    for damaged in (b"{not json", json.dumps({"format": "fx-model-manifest/1"}).encode(),
                    mpath.read_bytes().replace(model.encode(), other.encode())):
        mpath.write_bytes(damaged)
        req = request(WL, model, epoch=1, index=len(producer.sent))
        await _handle(svc, encode(req), len(producer.sent))
        (resp,) = [r for r in producer.responses() if r.effect_id == req.effect_id]
        assert resp.error is not None and resp.error.code == "model_unknown", resp.error
    assert svc.node.fatal is None and not svc.state.in_flight


async def test_engine_that_cannot_load_gives_engine_error(tmp_path: Path) -> None:
    svc, _ = await _service(tmp_path, broken=BrokenEngine())
    store = svc.store
    src = store.root.parent / "w.bin"
    src.write_bytes(b"not loadable")
    m = store.add(src, {"name": "b", "engine": "broken", "interface": "x",
                        "preprocessing_version": "x/1"})
    with pytest.raises(EngineError) as exc:
        await asyncio.to_thread(svc.runner.engines.ensure_loaded, m.hash)
    assert exc.value.code == "engine_error" and "RuntimeError" in exc.value.message
    metrics = svc.metrics_text().decode()
    assert 'fx_executor_model_load_failures_total{code="engine_error"} 1.0' in metrics


async def test_unreadable_chunk_is_input_missing_not_a_worker_crash(tmp_path: Path) -> None:
    from broker_schema.canonical import sha256_hex
    from broker_schema.records import ChunkRef
    from fx_node.errors import OutcomeError

    svc, _ = await _service(tmp_path)
    ref = ChunkRef(hash=sha256_hex(b"x" * 10), size=10)
    path = svc.chunks.path(ref.hash, WL)  # type: ignore[attr-defined]
    path.mkdir(parents=True)  # reading it raises IsADirectoryError, an OSError
    with pytest.raises(OutcomeError) as exc:
        await svc.runner.inputs.resolve(ref, reader=WL)
    assert exc.value.code == "input_missing"


async def test_failed_claims_catch_up_is_retried_never_decided_on_stale_state(
        tmp_path: Path) -> None:
    from aiokafka.errors import KafkaConnectionError

    svc, _ = await _service(tmp_path)
    del svc.node.sync_workload  # the real retrying method again, over a failing inner read
    attempts: list[int] = []

    async def flaky(workload_id: str, shadow: str | None = None) -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise KafkaConnectionError("broker away")
        svc.state.observe_claim(claim(WL, 4))

    svc.node.sync_read = flaky  # type: ignore[method-assign]
    await svc.node.sync_workload(WL, attempt_s=1.0, max_backoff_s=0.01)
    assert len(attempts) == 3
    assert svc.state.workload(WL).highest_epoch == 4
    assert 'fx_executor_sync_failures_total 2.0' in svc.metrics_text().decode()


class EchoEngine:
    """A real, µs-scale engine: answers each request with its input's length."""

    name = "echo"
    version = "1"
    device_class = "cpu"
    max_batch = 8

    def __init__(self) -> None:
        self._loaded: set[str] = set()
        self.calls = 0

    def load(self, manifest: Any, model_bytes: bytes) -> None:
        self._loaded.add(manifest.hash)

    def loaded(self) -> frozenset[str]:
        return frozenset(self._loaded)

    def unload(self, model_hash: str) -> None:
        self._loaded.discard(model_hash)

    def run_batch(self, model_hash: str, items: Any) -> list[Any]:
        from executor.engines import EngineResult

        self.calls += 1
        return [EngineResult(output={"n": len(data)}) for _params, data in items]


async def _echo_service(tmp_path: Path) -> tuple[ExecutorService, FakeProducer, str]:
    svc, producer = await _service(tmp_path, echo=EchoEngine())
    src = svc.store.root.parent / "echo.bin"
    src.write_bytes(b"echo weights")
    model = svc.store.add(src, {"name": "echo", "engine": "echo", "interface": "x",
                                "preprocessing_version": "x/1"}).hash
    await asyncio.to_thread(svc.runner.engines.ensure_loaded, model)
    svc.state.observe_spec(spec(WL, {"m": model}), offset=0)
    svc.state.observe_claim(claim(WL, 1))
    return svc, producer, model


async def test_a_microsecond_model_is_answered_in_the_consumer_loop(tmp_path: Path) -> None:
    """Once a model is known to run in microseconds, a request for it is answered while it is
    read: its ``accepted`` and its response are put on the producer back to back (one produce
    request), no queue, no thread; its offset is settled once both are acknowledged."""
    from broker_schema.records import AcceptedRecord

    svc, producer, model = await _echo_service(tmp_path)
    svc.runner.engines.note_run_cost(model, 20e-6)  # as measured by an earlier batch of this model
    req = request(WL, model, b"four", epoch=1)
    await _handle(svc, encode(req), 3)
    sent = [decode(v) for t, v in producer.sent if t == topics.resp(WL)]
    assert [type(r) for r in sent] == [AcceptedRecord, ResponseRecord]
    (resp,) = producer.responses()
    assert resp.outcome == "ok" and resp.effect_id == req.effect_id
    assert isinstance(resp.output, InlineBody) and json.loads(resp.output.raw()) == {"n": 4}
    assert resp.receipt is not None
    assert resp.receipt["manifest_hash"] == svc.store.manifest(model).manifest_hash()
    assert resp.signature is not None
    assert not svc.state.in_flight and not svc.runner.scheduler.queues.get(model)
    assert svc.node.trackers[INFERENCE_KIND].committable() == {(topics.out(WL), 0): 4}


async def test_a_model_of_unknown_or_slow_cost_goes_to_the_workers(tmp_path: Path) -> None:
    """The first request of a model (cost unknown), and any of a model slower than the inline
    bound, is queued for a worker: only its ``accepted`` is written while it is read."""
    from broker_schema.records import AcceptedRecord

    svc, producer, model = await _echo_service(tmp_path)
    for offset, cost in ((0, None), (1, 0.05)):
        if cost is not None:
            svc.runner.engines.note_run_cost(model, cost)
        req = request(WL, model, b"x", epoch=1, index=offset)
        await _handle(svc, encode(req), offset)
        assert req.effect_id in svc.state.in_flight
    assert [type(decode(v)) for _t, v in producer.sent] == [AcceptedRecord, AcceptedRecord]
    assert len(svc.runner.scheduler.queues[model]) == 2
    assert svc.state.queue_depth(INFERENCE_KIND) == 2
