"""Speculative reads (executor/speculation.py): the cache's rules (pure), and the glue without a
broker: what was prepared on a request's uncommitted read is what its committed read uses, the
model runs once, and a record whose bytes differ, a kind served without a model or a request
never read committed gets nothing of it."""

from __future__ import annotations

import asyncio
from typing import Any

from broker_schema import decode, encode, topics
from broker_schema.records import INFERENCE_KIND
from executor.speculation import (
    Prepared,
    SpeculationCache,
    SpeculativeReader,
    record_digest,
)
from tests.unit.executor.helpers import request
from tests.unit.executor.test_service_handle import WL, _echo_service, _handle, _msg

REQ = request(WL, "sha256:" + "ab" * 32, b"x")


def _entry(digest: bytes, at: float) -> Prepared:
    return Prepared(record=REQ, synced=True, holder_problem=None, digest=digest, at=at)


def test_an_entry_is_taken_once_and_only_with_the_same_bytes() -> None:
    cache = SpeculationCache(limit=8, ttl_s=10.0)
    d = record_digest(b"request", None)
    cache.put(("t", 0, 5), _entry(d, 0.0), 0.0)
    assert cache.take(("t", 0, 4), d, 1.0) is None  # another place
    got = cache.take(("t", 0, 5), d, 1.0)
    assert got is not None and got.record is REQ
    assert cache.take(("t", 0, 5), d, 1.0) is None  # taken: gone
    cache.put(("t", 0, 6), _entry(d, 0.0), 0.0)
    # the same place with other bytes (a topic deleted and made again): not used, dropped
    assert cache.take(("t", 0, 6), record_digest(b"other", None), 1.0) is None
    assert len(cache) == 0 and cache.expired == 1


def test_the_holder_signature_is_part_of_what_must_match() -> None:
    assert record_digest(b"r", None) != record_digest(b"r", b"")
    assert record_digest(b"r", b"sig1") != record_digest(b"r", b"sig2")
    assert record_digest(b"r", b"sig1") == record_digest(b"r", b"sig1")


def test_entries_expire_after_their_time_and_beyond_the_limit() -> None:
    cache = SpeculationCache(limit=3, ttl_s=10.0)
    d = record_digest(b"r", None)
    for offset in range(5):
        cache.put(("t", 0, offset), _entry(d, float(offset)), float(offset))
    # the limit: the two oldest left first (an aborted transaction's request is never taken)
    assert len(cache) == 3 and cache.expired == 2
    assert cache.take(("t", 0, 0), d, 5.0) is None
    # time: at 13.5 the entry made at 3 is 10.5 s old
    assert cache.take(("t", 0, 3), d, 13.5) is None
    assert cache.take(("t", 0, 4), d, 13.5) is not None
    assert cache.expired == 4 and len(cache) == 0


async def _reader(svc: Any) -> SpeculativeReader:
    reader = SpeculativeReader(svc.node, svc.state, svc.runner.engines, svc.metrics,
                               frozenset({INFERENCE_KIND}), threads=svc.runner.answerer.threads)

    async def no_sync(workload_id: str, shadow: str | None = None) -> None:
        return None

    svc.node.sync_read = no_sync  # type: ignore[method-assign]
    svc.runner.speculation = reader
    svc.node.prepared = reader.take
    return reader


async def test_a_prepared_request_is_run_once_and_answered_on_its_committed_read(
        tmp_path: Any) -> None:
    svc, producer, model = await _echo_service(tmp_path)
    engine: Any = svc.runner.engines.engine_list()[0]
    svc.runner.engines.note_run_cost(model, 20e-6)
    reader = await _reader(svc)
    req = request(WL, model, b"four", epoch=1)
    await reader._prepare(_msg(encode(req), 7))  # read uncommitted: prepared, model run
    assert engine.calls == 1 and not producer.sent  # nothing written
    await _handle(svc, encode(req), 7)  # read committed
    assert engine.calls == 1  # not run again
    (resp,) = producer.responses()
    assert resp.outcome == "ok" and resp.effect_id == req.effect_id
    assert resp.request_offset == 7
    metric = svc.metrics.speculative.labels
    assert metric("ran")._value.get() == 1 and metric("hit")._value.get() == 1
    assert svc.node.trackers[INFERENCE_KIND].committable() == {(topics.out(WL), 0): 8}


async def test_other_bytes_at_the_same_place_and_unread_requests_get_nothing(
        tmp_path: Any) -> None:
    svc, producer, model = await _echo_service(tmp_path)
    engine: Any = svc.runner.engines.engine_list()[0]
    svc.runner.engines.note_run_cost(model, 20e-6)
    reader = await _reader(svc)
    first = request(WL, model, b"four", epoch=1, index=0)
    other = request(WL, model, b"seven!!", epoch=1, index=1)
    aborted = request(WL, model, b"never", epoch=1, index=2)
    await reader._prepare(_msg(encode(first), 1))
    await reader._prepare(_msg(encode(aborted), 2))  # its transaction aborts: never read again
    await _handle(svc, encode(other), 1)  # another record at offset 1: run for itself
    (resp,) = producer.responses()
    assert resp.effect_id == other.effect_id and resp.output is not None
    assert resp.output.raw() == b'{"n":7}'
    assert engine.calls == 3
    metric = svc.metrics.speculative.labels
    assert metric("miss")._value.get() == 1 and metric("hit")._value.get() == 0
    assert len(reader.cache) == 1  # the aborted one waits for its expiry, answered by no one
    assert all(r.effect_id != aborted.effect_id for r in producer.responses())


async def test_a_kind_served_without_a_model_is_never_prepared(tmp_path: Any) -> None:
    svc, _producer, _model = await _echo_service(tmp_path)
    reader = await _reader(svc)
    req = request(WL, None, b"x", kind="acme:digest/run@1.0.0")
    await reader._prepare(_msg(encode(req), 3))
    assert len(reader.cache) == 0
    assert await reader.take("acme:digest/run@1.0.0", _msg(encode(req), 3)) is None


async def test_a_model_of_ms_scale_runs_in_the_pool_from_its_uncommitted_read(
        tmp_path: Any) -> None:
    """A model too slow for the consumer loop runs in the engine pool from the uncommitted
    read; the committed read answers with that run (accepted first), without queueing it."""
    from broker_schema.records import AcceptedRecord, ResponseRecord

    svc, producer, model = await _echo_service(tmp_path)
    engine: Any = svc.runner.engines.engine_list()[0]
    svc.runner.engines.note_run_cost(model, 0.05)
    reader = await _reader(svc)
    req = request(WL, model, b"twelve bytes", epoch=1)
    await reader._prepare(_msg(encode(req), 9))
    entry = reader.cache._entries[(topics.out(WL), 0, 9)]
    assert entry.running is not None and entry.ran is None
    await entry.running
    assert engine.calls == 1 and not producer.sent
    await _handle(svc, encode(req), 9)
    for _ in range(100):
        if producer.responses():
            break
        await asyncio.sleep(0.01)
    await svc.node.await_background()
    assert engine.calls == 1 and not svc.runner.scheduler.queues.get(model)
    sent = [decode(v) for t, v in producer.sent if t == topics.resp(WL)]
    assert [type(r) for r in sent] == [AcceptedRecord, ResponseRecord]
    resp = sent[1]
    assert resp.outcome == "ok" and resp.output is not None
    assert resp.output.raw() == b'{"n":12}' and resp.receipt["batch_size"] == 1
    assert resp.receipt["manifest_hash"] == svc.store.manifest(model).manifest_hash()
    assert svc.node.trackers[INFERENCE_KIND].committable() == {(topics.out(WL), 0): 10}


async def test_what_the_shell_would_refuse_is_not_prepared(tmp_path: Any) -> None:
    """A mirrored copy (or a damaged mirror header), an undecodable record, a plain output and a
    request naming another workload than its topic's: nothing prepared, nothing raised (the
    committed read records them as without speculation)."""
    from fx_kafka.client import MIRROR_OFFSET_HEADER

    svc, _producer, model = await _echo_service(tmp_path)
    reader = await _reader(svc)
    req = encode(request(WL, model, b"x"))
    await reader._prepare(_msg(req, 1, ((MIRROR_OFFSET_HEADER, b"12"),)))
    await reader._prepare(_msg(req, 2, ((MIRROR_OFFSET_HEADER, b"not a number"),)))
    await reader._prepare(_msg(b"{not json", 3))
    await reader._prepare(_msg(encode(request("other-workload", model, b"x")), 4))
    assert len(reader.cache) == 0


def test_the_option_from_the_command_line_and_the_environment(
        capsys: Any, tmp_path: Any) -> None:
    from executor.config import load_config
    from fx_cli.main import main

    assert load_config(environ={}).speculative_reads is False
    assert load_config(environ={"FX_EXECUTOR_SPECULATIVE_READS": "true"}).speculative_reads
    assert main(["executor", "run", "--speculative-reads", "--print-config"]) == 0
    assert "speculative_reads = true" in capsys.readouterr().out
