"""A lease holder whose producer epoch is bumped by someone who never claims the workload (what
the transaction coordinator does when it aborts a transaction left open across a long broker
outage) restarts itself from the log at the same epoch and goes on; one that finds a higher claim
stays down. Holders run in-process; the executor's part is played by the test (real records on
the real broker, no model ran)."""

from __future__ import annotations

import asyncio

import pytest

from broker_schema import INFERENCE_KIND, ClaimRecord, encode, topics
from fx_kafka.client import make_producer
from workload_sdk import HolderConfig, LeaseHolder, replay
from workload_sdk._holder import Fenced, transactional_id_for
from workload_sdk._replay import compare_outputs
from workload_sdk.testing import WorkloadHarness

from .test_holder_resume import MODEL, MODULE, Grower, _outputs

pytestmark = pytest.mark.integration


async def _bump_producer_epoch(bootstrap: str, workload_id: str) -> None:
    """InitProducerId on the holder's transactional id, then go away without writing."""
    intruder = make_producer(bootstrap, transactional_id=transactional_id_for(workload_id))
    await intruder.start()
    await intruder.stop()


async def test_a_fence_without_a_newer_claim_rejoins_at_the_same_epoch(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    async with WorkloadHarness(kafka_bootstrap, unique_workload_id, MODULE,
                               effect_kinds=(INFERENCE_KIND,), models={"m": MODEL},
                               snapshot_every=2) as h:
        holder = LeaseHolder(Grower(), HolderConfig(bootstrap=h.bootstrap,
                                                    workload_id=h.workload_id, holder_id="a",
                                                    force_placement=True))
        stop = asyncio.Event()
        task = asyncio.create_task(holder.run(stop))
        try:
            await asyncio.wait_for(holder.ready.wait(), 60)
            await h.send_input({"ask": 1})
            log = await h.wait_for(lambda log: len(h.requests(log, INFERENCE_KIND)) == 1,
                                   what="the request")
            ((req_offset, req),) = h.requests(log, INFERENCE_KIND)
            await _bump_producer_epoch(h.bootstrap, h.workload_id)
            await h.send_input({"note": 1})  # its transaction is fenced: the holder restarts
            await h.answer(req_offset, req, output={"label": "one"})
            await h.wait_for(lambda log: {"answered": req.effect_id, "outcome": "ok"}
                             in _outputs(log) and {"saw": {"note": 1}} in _outputs(log),
                             timeout=60, what="the answer and the note after the rejoin")
            assert holder.stats.broker_restarts >= 1 and holder.epoch == 1
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
        log = await h.read_log()
    assert h.epochs(log) == [1]  # no second claim: its own pending request stays valid
    full = replay(Grower(), log, use_snapshots=False)
    assert compare_outputs(full, log) == []
    assert sum(1 for o in _outputs(log) if o == {"saw": {"note": 1}}) == 1


async def test_a_fence_after_a_newer_claim_stays_down(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    async with WorkloadHarness(kafka_bootstrap, unique_workload_id, MODULE,
                               effect_kinds=(INFERENCE_KIND,), models={"m": MODEL}) as h:
        holder = LeaseHolder(Grower(), HolderConfig(bootstrap=h.bootstrap,
                                                    workload_id=h.workload_id, holder_id="a",
                                                    force_placement=True))
        task = asyncio.create_task(holder.run(asyncio.Event()))
        await asyncio.wait_for(holder.ready.wait(), 60)
        await _bump_producer_epoch(h.bootstrap, h.workload_id)
        claim = ClaimRecord(workload_id=h.workload_id, epoch=2, holder_id="b",
                            spec_hash="sha256:" + "00" * 32, spec_offset=0)
        await h.append(topics.claims(h.workload_id), encode(claim))
        await h.send_input({"note": 1})
        with pytest.raises(Fenced):
            await asyncio.wait_for(task, 60)
