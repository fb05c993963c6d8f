"""Issue 30, attack 2: front-running. Anyone who can write ``.out`` (any client of a plain
broker) writes a request for the effect id the holder will use next, with their own input; the
real executor answers it; before, the holder merged that answer for its own request (the step
decided on the attacker's bytes). Now, two defences, each tested on its own:

- the holder signs what it writes on ``.out`` with a key its claim names, and the executor
  answers only requests their epoch's holder signed: the stray is never run, and is written to
  ``sys.rejects`` (``not_holder``);
- every executor answer names the hash of the request it read, and the holder passes an answer
  to another request over as ``foreign_request`` (tested with a holder that does not sign, so
  the executor answers the stray).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_schema import (
    INFERENCE_KIND,
    EffectHeader,
    EffectRequest,
    MergeEntry,
    OutputRecord,
    RejectedRecord,
    ResponseRecord,
    decode,
    encode,
    request_hash,
    topics,
)
from fx_kafka.workload_log import read_topic
from tests.integration.harness import ExecutorHarness
from workload_sdk import WorkloadLog, replay
from workload_sdk._api import body_of
from workload_sdk._audit import audit
from workload_sdk._replay import compare_outputs
from workload_sdk.examples.filetype_gate import FiletypeGate

pytestmark = pytest.mark.integration

PYTHON = b"import os\n\ndef main() -> None:\n    print(os.getcwd())\n\n" * 20
PDF = b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" * 20


def _labels(log: WorkloadLog) -> list[str]:
    return [str(o.body.data["label"]) for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
            and "label" in o.body.data]


@pytest.mark.parametrize("holder_signs", [True, False], ids=["signed", "unsigned-holder"])
async def test_an_answer_to_a_front_running_request_is_passed_over(
    kafka_bootstrap: str, unique_workload_id: str, magika_store: tuple[Path, str],
    holder_signs: bool, executor_harness: Callable[..., ExecutorHarness],
) -> None:
    store, model_hash = magika_store
    wid = unique_workload_id
    async with executor_harness(kafka_bootstrap, wid, store, models={"filetype": model_hash}) as h:
        holder = h.start_holder("fr-holder", *(() if holder_signs else ("--no-sign-requests",)))
        log = await h.wait_for(lambda lg: bool(h.epochs(lg)), timeout=60, what="claim")
        epoch = h.epochs(log)[-1]
        # the attacker: the next effect id is predictable (first input, first output, epoch)
        header = EffectHeader(workload_id=wid, input_offset=0, index=0, epoch=epoch)
        stray = EffectRequest(header=header, effect_kind=INFERENCE_KIND, model=model_hash,
                              input=body_of(PDF), deadline_ms=10_000)
        stray_offset = await h.append(topics.out(wid), encode(stray))
        await h.send_input(PYTHON, source="upload")
        log = await h.wait_for(lambda lg: len(h.requests(lg, INFERENCE_KIND)) >= 2,
                               timeout=60, what="the holder's own request")
        own_offset, own = h.requests(log, INFERENCE_KIND)[1]
        assert own.effect_id == stray.effect_id and own_offset > stray_offset
        executor = h.start_configured_executor()
        deadline = time.monotonic() + 90
        while True:
            log = await h.read_log()
            if _labels(log):
                break
            for name, proc in (("executor", executor), ("holder-fr-holder", holder)):
                assert proc.poll() is None, h.tail(name)
            assert time.monotonic() < deadline, h.tail("holder-fr-holder")
            await asyncio.sleep(0.3)
        assert h.stop(holder) == 0
        h.stop(executor)
        log = await h.read_log()
        rejects = await read_topic(kafka_bootstrap, topics.REJECTS, timeout=30)

    refused = [(r.offset, r.code) for r in (decode(x.value) for x in rejects)
               if isinstance(r, RejectedRecord) and r.topic == topics.out(wid)]
    if holder_signs:
        # the executor never ran the stray: no answer names it, it is on sys.rejects
        assert refused == [(stray_offset, "not_holder")], refused
        answers = [a for a in (decode(r.value) for r in log["resp"])
                   if isinstance(a, ResponseRecord) and a.written_by != "fr-holder"]
        assert answers and all(a.request_hash == request_hash(encode(own)) for a in answers)
        assert _labels(log) == ["python"], _labels(log)
        return
    assert refused == [], refused
    # the executor answered the stray, naming the stray's hash
    answers = [(r.offset, a) for r, a in ((r, decode(r.value)) for r in log["resp"])
               if isinstance(a, ResponseRecord) and a.effect_id == stray.effect_id
               and a.written_by != "fr-holder"]
    theirs = [off for off, a in answers if a.request_hash == request_hash(encode(stray))]
    assert theirs, answers
    # ... and the holder passed that answer over, and decided on the file it was given
    entries = [decode(r.value) for r in log["merge"]]
    passed = [e for e in entries if isinstance(e, MergeEntry) and e.source == "resp"
              and e.source_offset in theirs]
    assert passed and all(e.reason == "foreign_request" for e in passed), passed
    assert _labels(log) == ["python"], _labels(log)
    full = replay(FiletypeGate(), log, use_snapshots=False)
    # the stray in slot (0, 0) is not taken for the holder's output: replay (and a resuming
    # holder) find the holder's own request there
    assert compare_outputs(full, log) == []
    # fx audit names the stray on .out as another writer's, and blames the holder for nothing
    report = audit(log, FiletypeGate())
    found = {i.name: [f.message for f in i.violations] for i in report.invariants}
    assert found["out_once"] == [
        f"a stray record in slot (input_offset 0, index 0): not the step's output (the lease "
        f"holder's is at {topics.out(wid)}@{own_offset}); another writer of {topics.out(wid)} "
        "put it there, not the holder"], found
    assert all(not v for name, v in found.items() if name != "out_once"), found
