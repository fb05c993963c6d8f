"""Issue 30, attack 5 (ticks): the holder took a tick on ``.resp`` from any writer as its clock,
without a word. A tick that the holder of its epoch did not write is now rejected visibly: the
holder logs it, counts it and writes it to ``sys.rejects`` (``foreign_tick``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from broker_schema import INFERENCE_KIND, RejectedRecord, TickRecord, decode, encode, topics
from fx_kafka.workload_log import read_topic
from workload_sdk.examples.filetype_gate import GATE_KIND
from workload_sdk.testing import WorkloadHarness

MODULE = "workload_sdk.examples.filetype_gate:FiletypeGate"


async def test_a_tick_not_written_by_the_holder_is_rejected(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path,
) -> None:
    wid = unique_workload_id
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE,
                               effect_kinds=(INFERENCE_KIND, GATE_KIND),
                               models={"filetype": "sha256:" + "f" * 64}, log_dir=tmp_path) as h:
        holder = h.start_holder("tick-holder")
        log = await h.wait_for(lambda lg: bool(h.epochs(lg)), timeout=60, what="claim")
        epoch = h.epochs(log)[-1]
        forged = [await h.append(topics.resp(wid), encode(TickRecord(
                      workload_id=wid, epoch=epoch, holder_id="mallory"))),
                  await h.append(topics.resp(wid), encode(TickRecord(
                      workload_id=wid, epoch=epoch + 5, holder_id="tick-holder")))]
        deadline = time.monotonic() + 60
        while True:
            rejects = [r for r in (decode(x.value) for x in await read_topic(
                kafka_bootstrap, topics.REJECTS, timeout=30))
                if isinstance(r, RejectedRecord) and r.topic == topics.resp(wid)]
            if len(rejects) >= 2:
                break
            assert holder.poll() is None, (tmp_path / "holder-tick-holder.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "holder-tick-holder.log").read_text(
            )[-3000:]
            await asyncio.sleep(0.5)
        assert h.stop(holder) == 0
    assert sorted((r.offset, r.code, r.seen_by) for r in rejects) == [
        (forged[0], "foreign_tick", "tick-holder"), (forged[1], "foreign_tick", "tick-holder")]
    assert "names holder 'mallory'" in rejects[0].detail or "mallory" in rejects[1].detail
    text = (tmp_path / "holder-tick-holder.log").read_text()
    assert text.count("rejected tick at") == 2, text[-3000:]
