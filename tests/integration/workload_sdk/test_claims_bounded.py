"""Issue 30, attack 4: one claim with epoch 2^53 - 1, written by anyone who may write
``.claims``, stopped a workload for good: the running holder kept saying leader while every
request came back ``stale_epoch``, and a restarted holder crashed (a pydantic ValidationError:
it claimed 2^53). A claim more than ``MAX_EPOCH_STEP`` above the highest accepted before it is
now refused by every reader: the executor writes it to ``sys.rejects`` (``epoch_jump``) and
keeps answering, and a new holder claims the next epoch above the accepted ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_schema import (
    ClaimRecord,
    OutputRecord,
    RejectedRecord,
    ResponseRecord,
    decode,
    encode,
    topics,
)
from broker_schema.binding import MAX_EPOCH
from fx_kafka.workload_log import read_topic
from tests.integration.harness import ExecutorHarness
from workload_sdk import WorkloadLog
from workload_sdk._audit import audit
from workload_sdk.examples.filetype_gate import FiletypeGate

pytestmark = pytest.mark.integration

FILES = [b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" * 20,
         b"import os\n\ndef main() -> None:\n    print(os.getcwd())\n\n" * 20,
         b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog >>\nendobj\n" * 20]


def _labels(log: WorkloadLog) -> list[str]:
    return [str(o.body.data["label"]) for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
            and "label" in o.body.data]


async def test_a_claim_far_ahead_is_refused_and_the_workload_goes_on(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path,
    magika_store: tuple[Path, str], executor_harness: Callable[..., ExecutorHarness],
) -> None:
    store, model_hash = magika_store
    wid = unique_workload_id
    async with executor_harness(kafka_bootstrap, wid, store, models={"filetype": model_hash}) as h:
        executor, holder = h.start_nodes("cb-holder-1")

        async def labelled(n: int) -> WorkloadLog:
            deadline = time.monotonic() + 90
            while True:
                log = await h.read_log()
                if len(_labels(log)) >= n:
                    return log
                for name, proc in (("executor", executor), ("holder", holder)):
                    assert proc.poll() is None, (name, proc.args)
                assert time.monotonic() < deadline, h.tail()
                await asyncio.sleep(0.3)

        await h.send_input(FILES[0], source="upload")
        log = await labelled(1)
        (first,) = [c for c in (decode(r.value) for r in log["claims"])
                    if isinstance(c, ClaimRecord)]
        giant = first.model_copy(update={"epoch": MAX_EPOCH, "holder_id": "mallory"})
        giant_offset = await h.append(topics.claims(wid), encode(giant))
        await h.send_input(FILES[1], source="upload")
        log = await labelled(2)
        # a new holder (the first one gone) claims the next epoch above the accepted ones
        assert h.stop(holder) == 0
        holder = h.start_holder("cb-holder-2")
        await h.send_input(FILES[2], source="upload")
        log = await labelled(3)
        assert holder.poll() is None
        assert h.stop(holder) == 0
        h.stop(executor)
        rejects = await read_topic(kafka_bootstrap, topics.REJECTS, timeout=30)

    assert _labels(log) == ["pdf", "python", "pdf"], _labels(log)
    errors = [a.error.code for a in (decode(r.value) for r in log["resp"])
              if isinstance(a, ResponseRecord) and a.error is not None]
    assert "stale_epoch" not in errors, errors
    epochs = [c.epoch for c in (decode(r.value) for r in log["claims"])
              if isinstance(c, ClaimRecord)]
    assert epochs == [first.epoch, MAX_EPOCH, first.epoch + 1], epochs
    refused = [r for r in (decode(rec.value) for rec in rejects)
               if isinstance(r, RejectedRecord) and r.topic == topics.claims(wid)]
    assert [(r.offset, r.code) for r in refused] == [(giant_offset, "epoch_jump")], refused
    # fx audit names the refused claim, and blames no holder for writing after it
    report = audit(log, FiletypeGate())
    found = [f.message for f in report["epochs"].violations]
    assert len(found) == 1 and found[0].startswith("refused claim"), found
    holder_log = (tmp_path / "holder-cb-holder-2.log").read_text()
    assert "ValidationError" not in holder_log and "refused claim" in holder_log
