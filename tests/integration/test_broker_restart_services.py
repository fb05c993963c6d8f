"""The executor and the lease holder ride out broker restarts on the same address by themselves.

The test starts its own single-node Kafka (not the session broker: it is stopped twice here), a
real executor (``fx executor run``, magika) and a lease holder (``fx workload run``) as processes,
and feeds inputs that each ask the model once. Mid-run the broker is stopped cleanly (SIGTERM),
left down a few seconds and started again on the same data directory (same ports); later it is
killed (SIGKILL, no clean shutdown) and started again. Nobody touches the services.

Then: every input has exactly one merged answer, all ``ok``; no effect was merged twice; no
output slot was written twice; no ``timeout``/``unknown`` was written (deadlines and the
executor lease are 120 s of broker time, longer than a restart: a shorter one would legitimately
run out while the broker is down, which is the rule, not a loss); a replay from the start
reproduces every output byte for byte; and both services are the processes started at the
beginning. The time from the broker being ready again to the next merged answer is printed
(``-s`` shows it) and recorded in docs/benchmarks.md ("Broker restart").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaError

from broker_schema import (
    INFERENCE_KIND,
    EffectRequest,
    InputRecord,
    OutputRecord,
    ResponseRecord,
    decode,
    encode,
    topics,
)
from broker_schema.records import InlineBody, MergeEntry
from executor.models import ModelStore
from fx_kafka.client import make_producer
from fx_kafka.local import LocalKafka
from fx_kafka.retry import batch_lost
from tests.integration.harness import ExecutorHarness
from workload_sdk import (
    EffectResult,
    InputEvent,
    Output,
    State,
    Workload,
    WorkloadLog,
    body_of,
    compare_outputs,
    emit,
    infer,
    out_slots,
    replay,
)
from workload_sdk.examples.filetype_gate import label_of
from workload_sdk.testing import WorkloadHarness

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODULE = "tests.integration.test_broker_restart_services:AskEach"
DEADLINE_MS = 120_000
DOWN_S = float(os.environ.get("FX_TEST_BROKER_DOWN_S", "3"))
FILES = [
    b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" * 20,
    b"import os\n\ndef main() -> None:\n    print(os.getcwd())\n\n" * 20,
    b'{"a": [1, 2, 3], "b": {"c": "d"}}\n' * 30,
]


class AskEach(Workload):
    """Every input asks ``filetype`` about its bytes; every answer is emitted with its input."""

    def initial_state(self) -> State:
        return {"asked": 0, "answered": 0}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        if isinstance(event, InputEvent):
            return dict(state, asked=state["asked"] + 1), [
                infer(model="filetype", input=event.body, deadline_ms=DEADLINE_MS)]
        label = label_of(event.json()) if event.ok else None
        return dict(state, answered=state["answered"] + 1), [
            emit({"answer_for": event.input_offset, "outcome": event.outcome, "label": label})]


def _answers(log: WorkloadLog) -> list[tuple[int, dict[str, Any]]]:
    """``(append time ms, body)`` of every answer output on ``.out``."""
    found = []
    for rec in log["out"]:
        out = decode(rec.value)
        if isinstance(out, OutputRecord) and isinstance(out.body, InlineBody):
            data = out.body.data
            if isinstance(data, dict) and "answer_for" in data:
                found.append((rec.time_ms, data))
    return found


async def _feed(h: WorkloadHarness, stop: asyncio.Event, every_s: float = 0.2) -> int:
    """Append an input every ``every_s`` until ``stop``, through broker outages, as a client
    must: an idempotent producer whose batch was lost is replaced (see
    :func:`fx_kafka.retry.batch_lost`). Returns how many were acknowledged (a resent input may
    be on ``.in`` twice: the checks count what is on ``.in``)."""
    n = 0
    producer = make_producer(h.bootstrap)
    await producer.start()
    try:
        while not stop.is_set():
            record = InputRecord(workload_id=h.workload_id,
                                 body=body_of(FILES[n % len(FILES)]), source="restart-test")
            try:
                await producer.send_and_wait(topics.inputs(h.workload_id), value=encode(record),
                                             partition=0)
                n += 1
            except KafkaError as exc:
                assert batch_lost(exc), exc
                with contextlib.suppress(KafkaError, TimeoutError):
                    await asyncio.wait_for(producer.stop(), 10)
                producer = make_producer(h.bootstrap)
                while True:
                    try:
                        await producer.start()
                        break
                    except KafkaError:
                        await asyncio.sleep(0.5)
            await asyncio.sleep(every_s)
    finally:
        with contextlib.suppress(KafkaError, TimeoutError):
            await asyncio.wait_for(producer.stop(), 10)
    return n


async def _wait_answers(h: WorkloadHarness, procs: dict[str, Any], tmp: Path,
                        timeout: float = 60.0, after_ms: float = 0) -> WorkloadLog:
    """Until every input on ``.in`` has an answer on ``.out``, one of them appended at or after
    ``after_ms``."""
    deadline = time.monotonic() + timeout
    while True:
        log = await h.read_log()
        n = len(log["in"])
        answers = _answers(log)
        if n and len(answers) >= n and any(t >= after_ms for t, _ in answers):
            return log
        for name, proc in procs.items():
            assert proc.poll() is None, f"{name} exited {proc.returncode}:\n" + \
                (tmp / f"{name}.log").read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, (
            f"{len(_answers(log))} of {n} answers after {timeout} s\nexecutor:\n"
            + (tmp / "executor.log").read_text(errors="replace")[-3000:] + "\nholder:\n"
            + (tmp / "holder-restart-holder.log").read_text(errors="replace")[-3000:])
        await asyncio.sleep(0.1)


async def _restart(kafka: LocalKafka, how: str) -> tuple[float, float]:
    """Take the broker down (``term``: SIGTERM, ``kill``: SIGKILL), wait, start it on the same
    data; returns (time it went down, time it was ready again), wall clock."""
    before = kafka.bootstrap
    if how == "term":
        await kafka.astop()
    else:
        await asyncio.to_thread(kafka.kill_node, 1)
    down = time.time()
    await asyncio.sleep(DOWN_S)
    after = await kafka.astart(timeout=90)
    ready = time.time()
    assert after == before, "the broker came back on another address"
    return down, ready


async def test_executor_and_holder_ride_out_broker_restarts(tmp_path: Path) -> None:
    kafka = LocalKafka(data_dir=tmp_path / "kafka", die_with_parent=True)
    bootstrap = await kafka.astart(timeout=90)
    try:
        await _run(kafka, bootstrap, tmp_path)
    finally:
        await kafka.astop()


async def _run(kafka: LocalKafka, bootstrap: str, tmp: Path) -> None:
    store = ModelStore(tmp / "models")
    await asyncio.to_thread(store.import_package, "magika")
    model_hash = next(m.hash for m in store.list() if m.interface == "magika")
    wid = f"restart{int(time.time() * 1000) % 10**9}"
    figures: dict[str, float] = {}
    async with ExecutorHarness(bootstrap, wid, store.root, work=tmp, module=MODULE,
                               effect_kinds=(INFERENCE_KIND,), models={"filetype": model_hash},
                               executor={"node_id": "exec-restart", "preload": "all"},
                               executor_lease_ms=DEADLINE_MS, snapshot_every=5) as h:
        executor, holder = h.start_nodes("restart-holder")
        procs = {"executor": executor, "holder-restart-holder": holder}
        stop_feeding = asyncio.Event()
        await h.send_input(FILES[0], source="restart-test")
        await _wait_answers(h, procs, tmp, timeout=60)
        # inputs keep coming (and requests, responses and transactions are in flight) while
        # the broker goes down, while it is down, and after it is back
        feeder = asyncio.create_task(_feed(h, stop_feeding))
        try:
            for how in ("term", "kill"):
                await asyncio.sleep(2.0)
                down, ready = await _restart(kafka, how)
                log = await _wait_answers(h, procs, tmp, timeout=60, after_ms=ready * 1000)
                after = sorted(t for t, _ in _answers(log) if t >= ready * 1000)
                assert after, "no answer merged after the restart"
                figures[f"{how}: ready -> next merged answer (s)"] = after[0] / 1000 - ready
                figures[f"{how}: broker down (s)"] = ready - down
            await asyncio.sleep(1.0)
        finally:
            stop_feeding.set()
            fed = await feeder
        log = await _wait_answers(h, procs, tmp, timeout=30)
        assert len(log["in"]) >= fed + 1

        log = await h.read_log()
        # the very processes started above: they rode both restarts out themselves
        assert executor.poll() is None and holder.poll() is None
        holder_log = (tmp / "holder-restart-holder.log").read_text(errors="replace")
        executor_log = (tmp / "executor.log").read_text(errors="replace")
    print("\nbroker restart figures:", json.dumps({k: round(v, 2) for k, v in figures.items()}))
    print("holder reconnects:", holder_log.count("broker unavailable"),
          "executor reconnects:", executor_log.count("broker unavailable"))

    answers = [body for _, body in _answers(log)]
    requests = [r for r in (decode(x.value) for x in log["out"]) if isinstance(r, EffectRequest)]
    assert len(requests) == len(log["in"])  # one request per input...
    per_step = Counter(a["answer_for"] for a in answers)  # ...and one answer per request
    assert sorted(per_step) == sorted(r.header.input_offset for r in requests), per_step
    assert set(per_step.values()) == {1}, per_step
    assert {a["outcome"] for a in answers} == {"ok"}, answers
    assert all(a["label"] for a in answers), answers
    # no output slot written twice
    slots = Counter(decode(r.value).header.slot for r in log["out"])  # type: ignore[union-attr]
    assert set(slots.values()) == {1}, [s for s, n in slots.items() if n > 1]
    assert len(out_slots(log)) == 2 * len(log["in"])
    # nothing merged twice
    delivered = Counter(e.effect_id for e in (decode(r.value) for r in log["merge"])
                        if isinstance(e, MergeEntry) and e.effect_id is not None
                        and e.action == "deliver")
    assert set(delivered) == {r.effect_id for r in requests}
    assert set(delivered.values()) == {1}
    # no holder-written timeout/unknown: nothing ran out while the broker was down
    outcomes = Counter(r.outcome for r in (decode(x.value) for x in log["resp"])
                       if isinstance(r, ResponseRecord))
    assert set(outcomes) == {"ok"}, outcomes
    full = replay(AskEach(), log, use_snapshots=False)
    assert compare_outputs(full, log) == [] and len(full.outputs) == len(out_slots(log))
    assert compare_outputs(replay(AskEach(), log), log) == []
