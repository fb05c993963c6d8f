"""Backpressure, bad records on .out, and two executors sharing one group."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path

import pytest

from broker_schema import encode, topics
from broker_schema.limits import MAX_RECORD_BYTES
from broker_schema.records import AcceptedRecord
from executor.models import ModelStore
from executor.service import ExecutorService
from tests.integration.executor.harness import (
    by_effect,
    executor_config,
    rejects_for,
    running,
    workload,
)
from tests.unit.executor.helpers import request

pytestmark = pytest.mark.integration

PY = b"import os\n\ndef main():\n    print(os.getcwd())\n\nmain()\n"


async def test_queue_full_is_backpressure_and_nothing_is_lost(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str
) -> None:
    n = 40
    async with workload(kafka_bootstrap, "bp") as wl:
        await wl.setup({"magika": magika_hash})
        reqs = [request(wl.workload_id, magika_hash, PY * (i + 1), index=i) for i in range(n)]
        for r in reqs:  # all written before the executor starts: it reads them in one burst
            await wl.send(r)
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              kinds={"ninelives:inference/run@0.1.0": 2}, workers=1,
                              max_batch=1, backpressure_wait_s=0)  # refuse at once
        async with running(cfg) as svc:
            recs = await wl.responses([r.effect_id for r in reqs], settle=0.5)
            metrics = svc.metrics_text().decode()
    answers = by_effect(recs)
    outcomes = {eid: [r.outcome for r in rs] for eid, rs in answers.items()}
    assert set(outcomes) == {r.effect_id for r in reqs}  # every request answered...
    assert all(len(v) == 1 for v in outcomes.values())  # ...exactly once
    flat = [v[0] for v in outcomes.values()]
    assert flat.count("backpressure") >= 1 and flat.count("ok") >= 2
    assert flat.count("ok") + flat.count("backpressure") == n
    accepted = {r.effect_id for r in recs if isinstance(r, AcceptedRecord)}
    for eid, (resp,) in answers.items():
        # backpressure is written at once, with no accepted; ok always after an accepted
        assert (eid in accepted) == (resp.outcome == "ok")
        assert resp.error is None
    assert 'outcome="backpressure"' in metrics


async def test_a_backlog_waits_for_room_instead_of_a_storm_of_backpressure(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str
) -> None:
    """The backlog a restarted executor meets (issue 11: 131 of 200 used to end backpressure):
    with the default ``backpressure_wait_s`` a request that finds the queue full waits unread
    for room, and every one is answered ok."""
    n = 60
    async with workload(kafka_bootstrap, "backlog") as wl:
        await wl.setup({"magika": magika_hash})
        reqs = [request(wl.workload_id, magika_hash, PY * (i + 1), index=i) for i in range(n)]
        for r in reqs:
            await wl.send(r)
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              kinds={"ninelives:inference/run@0.1.0": 2}, workers=1,
                              max_batch=1)
        assert cfg.backpressure_wait_s > 0
        async with running(cfg) as svc:
            recs = await wl.responses([r.effect_id for r in reqs], settle=0.5, timeout=120)
            metrics = svc.metrics_text().decode()
    outcomes = [rs[0].outcome for rs in by_effect(recs).values()]
    assert len(outcomes) == n and outcomes.count("ok") == n, sorted(set(outcomes))
    waits = [line for line in metrics.splitlines()
             if line.startswith("fx_executor_queue_full_waits_total{")]
    assert waits and float(waits[0].rsplit(" ", 1)[1]) >= 1


async def test_bad_records_are_counted_logged_rejected_and_passed(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with workload(kafka_bootstrap, "bad") as wl:
        wid = wl.workload_id
        await wl.setup({"magika": magika_hash})
        out = topics.out(wid)
        garbage = await wl.write(out, b"\x00\xff garbage \x13\x37")
        good = request(wid, magika_hash, PY, index=1)
        doc = json.loads(encode(good))
        doc["v"] = 2
        wrong_version = await wl.write(out, json.dumps(doc).encode())
        oversize = await wl.write(out, b"{" + b" " * (MAX_RECORD_BYTES + 10) + b"}")
        await wl.send(good)
        cfg = executor_config(kafka_bootstrap, wid, tmp_path, store.root)
        with caplog.at_level(logging.WARNING, logger="executor.service"):
            async with running(cfg) as svc:
                recs = await wl.responses([good.effect_id])
                rejects = await rejects_for(kafka_bootstrap, out, 3)
                metrics = svc.metrics_text().decode()
                # the consumer moved on: its committed offset is past all four records
                consumer = next(iter(svc.node.consumers.values()))
                for _ in range(100):
                    committed = await consumer.committed(next(iter(consumer.assignment())))
                    if committed == wl.offsets[good.effect_id] + 1:
                        break
                    await asyncio.sleep(0.05)
    assert by_effect(recs)[good.effect_id][0].outcome == "ok"
    assert committed == wl.offsets[good.effect_id] + 1
    by_offset = {r.offset: r for r in rejects}
    assert by_offset[garbage].code == "not_json"
    assert by_offset[wrong_version].code == "unsupported_version"
    assert by_offset[oversize].code == "oversize" and by_offset[oversize].size > MAX_RECORD_BYTES
    assert all(r.seen_by == cfg.node_id and r.topic == out for r in rejects)
    for code in ("not_json", "unsupported_version", "oversize"):
        assert f'fx_executor_rejected_records_total{{code="{code}"}} 1.0' in metrics
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for offset in (garbage, wrong_version, oversize):
        assert f"{out}/0 offset {offset} " in logged


async def test_two_executors_share_the_load_and_hand_over(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str
) -> None:
    prefix = f"share{uuid.uuid4().hex[:8]}"
    async with workload(kafka_bootstrap, prefix) as w1, \
            workload(kafka_bootstrap, prefix) as w2, \
            workload(kafka_bootstrap, prefix) as w3, \
            workload(kafka_bootstrap, prefix) as w4:
        wls = [w1, w2, w3, w4]
        for w in wls:
            await w.setup({"magika": magika_hash})
        pattern = rf"^wl\.{prefix}-[0-9a-f]+\.out$"
        common = dict(topic_pattern=pattern, group_prefix=f"fx-test-{prefix}")
        cfg_a = executor_config(kafka_bootstrap, w1.workload_id, tmp_path / "a", store.root,
                                **common)
        cfg_b = executor_config(kafka_bootstrap, w1.workload_id, tmp_path / "b", store.root,
                                **common)
        async with running(cfg_a) as a:
            async with running(cfg_b) as b:
                await _until(lambda: len(a.node.consumers[_kind(a)].assignment()) == 2
                             and len(b.node.consumers[_kind(b)].assignment()) == 2)
                first = [request(w.workload_id, magika_hash, PY, index=0) for w in wls]
                for w, r in zip(wls, first, strict=True):
                    await w.send(r)
                writers_1 = {by_effect(await w.responses([r.effect_id]))[r.effect_id][0].written_by
                             for w, r in zip(wls, first, strict=True)}
            # b stopped gracefully: a takes over all four partitions
            await _until(lambda: len(a.node.consumers[_kind(a)].assignment()) == 4)
            second = [request(w.workload_id, magika_hash, PY, index=1) for w in wls]
            for w, r in zip(wls, second, strict=True):
                await w.send(r)
            answers_2 = [by_effect(await w.responses([r.effect_id]))[r.effect_id]
                         for w, r in zip(wls, second, strict=True)]
    assert writers_1 == {cfg_a.node_id, cfg_b.node_id}
    assert all(len(a2) == 1 and a2[0].written_by == cfg_a.node_id and a2[0].outcome == "ok"
               for a2 in answers_2)


def _kind(svc: ExecutorService) -> str:
    return next(iter(svc.node.consumers))


async def _until(cond: object, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():  # type: ignore[operator]
        if loop.time() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.1)

