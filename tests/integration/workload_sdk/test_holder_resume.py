"""A resuming lease holder reads ``.in``/``.resp``/``.out`` only from the positions its latest
snapshot recorded, still answers an effect issued before that snapshot, and counts snapshots
whose state no longer fits inline (they name a chunk). Holders run in-process; the executor's part
is played by the test (real ``accepted``/``response`` records on the real broker)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from broker_schema import INFERENCE_KIND, EffectRequest, OutputRecord, decode, topics
from workload_sdk import (
    EffectResult,
    HolderConfig,
    InputEvent,
    LeaseHolder,
    Output,
    State,
    Workload,
    WorkloadLog,
    emit,
    infer,
    replay,
)
from workload_sdk._replay import compare_outputs
from workload_sdk.testing import WorkloadHarness

pytestmark = pytest.mark.integration

MODULE = "tests.integration.workload_sdk.test_holder_resume:Grower"
MODEL = "sha256:" + "6a" * 32


class Grower(Workload):
    """``{"ask": n}`` asks the model (with a long deadline); ``{"grow": n}`` pads the state with
    ``n`` bytes; anything else is noted. Every step emits what it saw."""

    def initial_state(self) -> State:
        return {"n": 0, "pad": ""}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        new = dict(state, n=state["n"] + 1)
        if isinstance(event, EffectResult):
            return new, [emit({"answered": event.effect_id, "outcome": event.outcome})]
        value = event.json()
        outs: list[Output] = [emit({"saw": value})]
        if "ask" in value:
            outs.append(infer(model="m", params={"n": value["ask"]}, input=value["ask"],
                              deadline_ms=600_000))
        if "grow" in value:
            new["pad"] = "x" * int(value["grow"])
        return new, outs


def _outputs(log: WorkloadLog) -> list[object]:
    return [o.body.data for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord)]


async def _start(h: WorkloadHarness, holder_id: str) -> tuple[LeaseHolder, asyncio.Event,
                                                              asyncio.Task[None]]:
    holder = LeaseHolder(Grower(), HolderConfig(bootstrap=h.bootstrap, workload_id=h.workload_id,
                                                holder_id=holder_id, force_placement=True))
    stop = asyncio.Event()
    task = asyncio.create_task(holder.run(stop))
    ready = asyncio.create_task(holder.ready.wait())
    done, _ = await asyncio.wait({task, ready}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # raises what the holder raised
    assert ready in done, "holder not ready after 60 s"
    return holder, stop, task


async def test_resume_reads_from_the_snapshot_positions_and_counts_chunk_snapshots(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    async with WorkloadHarness(kafka_bootstrap, unique_workload_id, MODULE,
                               effect_kinds=(INFERENCE_KIND,), models={"m": MODEL},
                               snapshot_every=1) as h:
        a, stop_a, task_a = await _start(h, "resume-a")
        for value in ({"note": 0}, {"note": 1}, {"ask": 7}, {"note": 2}):
            await h.send_input(value)
        await h.wait_for(lambda log: len(_outputs(log)) == 4, what="4 outputs")
        stop_a.set()
        await asyncio.wait_for(task_a, 30)
        assert a.stats.snapshots == 4 and a.stats.snapshots_skipped == 0
        log = await h.read_log()
        ((req_offset, req),) = h.requests(log, INFERENCE_KIND)
        assert req_offset > 0

        b, stop_b, task_b = await _start(h, "resume-b")
        try:
            # the effect still pending at the latest snapshot bounds where .out is read from;
            # inputs and responses are read from past everything already merged
            # (the request's own transaction may have started the bound a little earlier)
            positions = b.stats.resumed_from
            assert positions["in"] == 4 and positions["resp"] == 0
            assert 0 < positions["out"] <= req_offset
            assert b.core is not None and list(b.core.pending) == [req.effect_id]
            assert b.stats.rewritten_outputs == 0
            await h.answer(req_offset, req, output={"label": "seven"})
            await h.wait_for(lambda log: {"answered": req.effect_id, "outcome": "ok"}
                             in _outputs(log), what="the answer merged by the new holder")
            # a state over the 64 KiB inline limit: its snapshot names a chunk (counted)
            await h.send_input({"grow": 70_000})
            await h.send_input({"note": 3})
            await h.wait_for(lambda log: {"saw": {"note": 3}} in _outputs(log), what="note 3")
            assert b.stats.chunk_snapshots == 2 and b.stats.snapshots_skipped == 0
        finally:
            stop_b.set()
            await asyncio.wait_for(task_b, 30)

    log = await h.read_log()
    full = replay(Grower(), log, use_snapshots=False)
    assert compare_outputs(full, log) == []
    assert replay(Grower(), log).core.state_hash == full.core.state_hash
    assert all(isinstance(decode(r.value), EffectRequest | OutputRecord) for r in log["out"])


async def test_an_input_buffered_behind_the_limit_survives_a_skipped_record_and_a_resume(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    """An input waiting on the outstanding limit, then garbage on ``.in``: the snapshot's read
    position must not pass the waiting input, or a resuming holder never merges it."""
    async with WorkloadHarness(kafka_bootstrap, unique_workload_id, MODULE,
                               effect_kinds=(INFERENCE_KIND,), models={"m": MODEL},
                               snapshot_every=1, outstanding_limit=1) as h:
        await h.send_input({"ask": 1})
        await h.send_input({"note": 1})  # waits: one request is outstanding
        await h.append(topics.inputs(unique_workload_id), b"not a record")
        a, stop_a, task_a = await _start(h, "limit-a")
        try:
            await h.wait_for(lambda log: len(h.requests(log, INFERENCE_KIND)) == 1,
                             what="the request")
            await asyncio.sleep(0.5)  # the holder has read all three inputs by now
        finally:
            stop_a.set()
            await asyncio.wait_for(task_a, 30)
        assert a.stats.snapshots == 1
        log = await h.read_log()
        assert {"saw": {"note": 1}} not in _outputs(log)
        ((req_offset, req),) = h.requests(log, INFERENCE_KIND)

        b, stop_b, task_b = await _start(h, "limit-b")
        try:
            assert b.stats.resumed_from["in"] == 1
            await h.answer(req_offset, req, output={"label": "one"})
            await h.wait_for(lambda log: {"saw": {"note": 1}} in _outputs(log),
                             what="the waiting input merged after the answer")
        finally:
            stop_b.set()
            await asyncio.wait_for(task_b, 30)
