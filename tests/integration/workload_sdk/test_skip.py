"""Bad inputs skipped on the record, on a real broker (issue 26, part 2).

Before: an input whose chunk the holder could not find was waited for 30 s, then the holder
stopped for good, with no way to skip it; a step that raised ended the holder too. Now the
spec's ``input_policy`` decides: the input is skipped on the record (a ``quarantined`` merge
entry saying why, and a ``skip_alarm`` on ``sys.alarms``, in one transaction), later inputs are
merged as ever, and replay (the function and ``fx replay``) reproduces the skip. An operator
skips an input by hand with ``fx workload skip`` (recorded with their name); the command the
holder prints when it stops (``then = "stop"``) is run as printed. One chunk store: a holder
whose store, or a live executor's, differs from the spec's ``chunk_store`` refuses to start with
one line.

No executor runs: the workload binds no model (inputs only), or a kind of its own that the
facts written by the test claim to serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from aiokafka.errors import KafkaError

from actuator.alarms import read_alarms
from broker_schema import (
    ChunkRef,
    FactsRecord,
    InputPolicy,
    KindServed,
    MergeEntry,
    OutputRecord,
    SkipAlarmRecord,
    decode,
    encode,
    sha256_hex,
    skip_alarm_id,
    topics,
)
from fx_kafka.client import create_topics, make_producer
from fx_kafka.workload_log import RefGap
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
    replay,
)
from workload_sdk._holder_start import ChunkStoreMismatch
from workload_sdk._kafka_io import read_workload_log
from workload_sdk._replay import compare_outputs
from workload_sdk.cli import EXIT_MISMATCH
from workload_sdk.testing import WorkloadHarness, _env, fx_command

pytestmark = pytest.mark.integration

MODULE = "tests.integration.workload_sdk.test_skip:Picky"
ROOT = Path(__file__).resolve().parents[3]


class Picky(Workload):
    """Counts and sums its inputs: a chunk adds its size, a number itself; it raises on 13
    (a bug that has been seen in the field), after changing its state in place."""

    def initial_state(self) -> State:
        return {"n": 0, "sum": 0}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        assert isinstance(event, InputEvent)
        value = len(event.bytes()) if isinstance(event.body, ChunkRef) else int(event.json())
        if value == 13:
            state["sum"] = -13
            raise ArithmeticError("13 is not a valid reading")
        new = {"n": state["n"] + 1, "sum": state["sum"] + value}
        return new, [emit({"offset": event.offset, **new})]


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=_env(), cwd=str(ROOT), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _fx(*argv: str) -> subprocess.CompletedProcess[str]:
    return _run(*fx_command(), *argv)


def _entries(log: WorkloadLog) -> list[MergeEntry]:
    return [e for e in (decode(r.value) for r in log["merge"]) if isinstance(e, MergeEntry)]


def _outputs(log: WorkloadLog) -> list[dict[str, object]]:
    return [o.body.data for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)]


def _skipped(log: WorkloadLog) -> dict[int, MergeEntry]:
    return {e.source_offset: e for e in _entries(log) if e.reason == "quarantined"}


async def _start(h: WorkloadHarness, holder_id: str, **config: object
                 ) -> tuple[LeaseHolder, asyncio.Event, asyncio.Task[None]]:
    holder = LeaseHolder(Picky(), HolderConfig(bootstrap=h.bootstrap, workload_id=h.workload_id,
                                               holder_id=holder_id, force_placement=True,
                                               **config))  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(holder.run(stop))
    ready = asyncio.create_task(holder.ready.wait())
    done, _ = await asyncio.wait({task, ready}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # raises what the holder raised
    assert ready in done, "holder not ready after 60 s"
    return holder, stop, task


async def _stop(stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    await asyncio.wait_for(task, 30)


async def _alarm(bootstrap: str, wid: str, offset: int) -> SkipAlarmRecord:
    states = {s.alarm.alarm_id: s for s in await read_alarms(bootstrap)}
    alarm = states[skip_alarm_id(wid, offset)].alarm
    assert isinstance(alarm, SkipAlarmRecord)
    return alarm


async def test_a_missing_chunk_is_waited_for_then_skipped_on_the_record_and_replayed(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    wid = unique_workload_id
    data = b"never stored\n" * 7000
    missing = ChunkRef(hash=sha256_hex(data), size=len(data))
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE, effect_kinds=(),
                               input_policy=InputPolicy(wait_ms=3000)) as h:
        await h.send_input(1)
        at = await h.send_input(missing)
        await h.send_input(2)
        holder, stop, task = await _start(h, "skip-a")
        try:
            log = await h.wait_for(lambda log: {"offset": 2, "n": 2, "sum": 3} in _outputs(log),
                                   what="the input after the missing chunk merged")
            await h.send_input(4)  # and later ones, as ever
            log = await h.wait_for(lambda log: len(_outputs(log)) == 3, what="input 3 merged")
        finally:
            await _stop(stop, task)
        state = holder.core.state if holder.core else None
        assert holder.stats.inputs_skipped == 1 and holder.stats.alarms == 1
    # waited (the policy's 3 s from the input's append time, broker time), then skipped
    skip_at = next(r.time_ms for r in log["merge"]
                   if getattr(decode(r.value), "reason", None) == "quarantined")
    assert skip_at - log["in"].raw(at).time_ms >= 3000
    skip = _skipped(log)[at].skip
    assert skip is not None and skip.cause == "unresolvable"
    assert missing.hash in skip.detail and topics.CHUNKS in skip.detail
    assert "waited 3 s from the input's append time" in skip.detail
    assert [(e.source_offset, e.action) for e in _entries(log)] == [
        (0, "deliver"), (at, "pass_over"), (2, "deliver"), (3, "deliver")]
    alarm = await _alarm(kafka_bootstrap, wid, at)
    assert alarm.skip == skip and alarm.input_offset == at and alarm.raised_by == "skip-a"
    assert state == {"n": 3, "sum": 7}

    # replay reproduces it (the chunk is never read: the recorded skip is followed)
    full = await read_workload_log(kafka_bootstrap, wid)
    result = replay(Picky(), full, use_snapshots=False)
    assert result.core.state == state and compare_outputs(result, full) == []
    proc = await asyncio.to_thread(_fx, "replay", wid, "--module", MODULE, "--from-start",
                                   "--bootstrap", kafka_bootstrap)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # fx alarms lists it, saying what was skipped and why
    listed = await asyncio.to_thread(_fx, "alarms", "--bootstrap", kafka_bootstrap)
    line = f"{skip_alarm_id(wid, at)}  input skipped (unresolvable)  OPEN"
    assert line in listed.stdout, listed.stdout[-3000:]


async def test_a_step_that_raises_is_skipped_the_state_unchanged_and_the_workload_goes_on(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    wid = unique_workload_id
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE, effect_kinds=(),
                               snapshot_every=2) as h:
        holder_proc = h.start_holder("skip-b", elect=False)
        for value in (5, 13, 6, 7):
            await h.send_input(value)
        log = await h.wait_for(lambda log: len(_outputs(log)) == 3, what="three steps")
        assert h.stop(holder_proc) == 0
    skip = _skipped(log)[1].skip
    assert skip is not None and skip.cause == "step_raised"
    assert skip.detail == "ArithmeticError: 13 is not a valid reading"
    # the in-place change is undone: the next step starts from the state before it
    assert _outputs(log) == [{"offset": 0, "n": 1, "sum": 5}, {"offset": 2, "n": 2, "sum": 11},
                             {"offset": 3, "n": 3, "sum": 18}]
    assert (await _alarm(kafka_bootstrap, wid, 1)).skip == skip
    full = await read_workload_log(kafka_bootstrap, wid)
    for use_snapshots in (False, True):
        result = replay(Picky(), full, use_snapshots=use_snapshots)
        assert result.core.state == {"n": 3, "sum": 18}
        assert compare_outputs(result, full) == []


async def test_an_operator_skips_an_input_by_hand_recorded_with_their_name(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    """While the holder waits for a chunk (a long policy), and for an input the holder stopped
    at (``then = "stop"``): the command it prints is run as printed, then a new holder skips."""
    wid = unique_workload_id
    data = b"lost in transit\n" * 5000
    missing = ChunkRef(hash=sha256_hex(data), size=len(data))
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE, effect_kinds=(),
                               input_policy=InputPolicy(wait_ms=600_000)) as h:
        await h.send_input(1)
        at = await h.send_input(missing)
        await h.send_input(2)
        _holder, stop, task = await _start(h, "skip-c")
        try:
            await h.wait_for(lambda log: len(_outputs(log)) == 1, what="the first input")
            ordered = await asyncio.to_thread(
                _fx, "workload", "skip", wid, "--input", str(at), "--reason",
                "upload truncated at the camera", "--by", "alice", "--bootstrap",
                kafka_bootstrap)
            assert ordered.returncode == 0, ordered.stderr
            assert f"skip order written to {topics.spec(wid)}@" in ordered.stdout
            log = await h.wait_for(lambda log: len(_outputs(log)) == 2,
                                   what="the skip and the input after it", timeout=60)
        finally:
            await _stop(stop, task)
        skip = _skipped(log)[at].skip
        assert skip is not None and skip.cause == "operator" and skip.principal == "alice"
        assert skip.detail == "upload truncated at the camera" and skip.order_offset is not None
        assert (await _alarm(kafka_bootstrap, wid, at)).skip == skip

        # an input merged already, one not written, a workload that is not there: one line
        again = await asyncio.to_thread(_fx, "workload", "skip", wid, "--input", "0",
                                        "--reason", "late", "--bootstrap", kafka_bootstrap)
        assert again.returncode == EXIT_MISMATCH and "was merged already" in again.stderr
        ahead = await asyncio.to_thread(_fx, "workload", "skip", wid, "--input", "99",
                                        "--reason", "x", "--bootstrap", kafka_bootstrap)
        assert ahead.returncode == EXIT_MISMATCH and "no input 99" in ahead.stderr
        nowhere = await asyncio.to_thread(_fx, "workload", "skip", wid + "-typo", "--input",
                                          "0", "--reason", "x", "--bootstrap", kafka_bootstrap)
        assert nowhere.returncode == EXIT_MISMATCH and "no workload" in nowhere.stderr
        for proc in (again, ahead, nowhere):
            assert "Traceback" not in proc.stderr

        # then = "stop": the holder stops naming the input and the command to skip it
        stop_policy = h.spec.model_copy(update={"input_policy": InputPolicy(wait_ms=1000,
                                                                            then="stop")})
        await h.append(topics.spec(wid), encode(stop_policy))
        second = await h.send_input(missing)
        await h.send_input(3)
        stopping = LeaseHolder(Picky(), HolderConfig(
            bootstrap=kafka_bootstrap, workload_id=wid, holder_id="skip-d", force_placement=True))
        with pytest.raises(RefGap) as caught:
            await asyncio.wait_for(stopping.run(asyncio.Event()), 60)
        text = str(caught.value)
        printed = f"fx workload skip {wid} --input {second} --reason 'REASON'"
        assert printed in text and "the holder stops here" in text
        argv = [*printed.split()[1:-1], "operator: the camera lost it"]
        ran = await asyncio.to_thread(_fx, *argv, "--bootstrap", kafka_bootstrap)
        assert ran.returncode == 0, ran.stderr
        _c, stop_c, task_c = await _start(h, "skip-e")
        try:
            log = await h.wait_for(lambda log: {"offset": second + 1, "n": 3, "sum": 6}
                                   in _outputs(log), what="the input after the second skip")
        finally:
            await _stop(stop_c, task_c)
        late = _skipped(log)[second].skip
        assert late is not None and late.cause == "operator"
        assert late.detail == "operator: the camera lost it" and late.principal
    full = await read_workload_log(kafka_bootstrap, wid)
    result = replay(Picky(), full, use_snapshots=False)
    assert result.core.state == {"n": 3, "sum": 6} and compare_outputs(result, full) == []


async def test_a_chunk_store_other_than_the_specs_is_refused_at_start(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    wid = unique_workload_id
    kind = f"fx-test:store-{uuid.uuid4().hex[:8]}/run@1.0.0"  # this test's nodes only
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE, effect_kinds=(kind,)) as h:
        # the holder's own store: a directory, where the spec says sys.chunks
        with pytest.raises(ChunkStoreMismatch) as caught:
            await _start(h, "store-a", chunk_dir=str(tmp_path))
        assert f"the directory {tmp_path} (fs)" in str(caught.value)
        assert "chunk_store = kafka" in str(caught.value)
        proc = await asyncio.to_thread(
            _run, sys.executable, "-m", "workload_sdk", "workload", "run", MODULE, "--id", wid,
            "--no-elect", "--chunk-dir", str(tmp_path), "--bootstrap", kafka_bootstrap)
        assert proc.returncode == EXIT_MISMATCH
        lines = proc.stderr.strip().splitlines()
        assert lines[-1].startswith("cannot run: not claiming ") and "Traceback" not in proc.stderr
        assert "docs/operations.md" in lines[-1]

        # a live executor serving the workload's kind keeps chunks on disk (its facts say so)
        node = f"exec-fs-{uuid.uuid4().hex[:6]}"
        facts = FactsRecord(node_id=node, kinds=(KindServed(kind=kind, queue_limit=4),),
                            public_key="MCowBQYDK2VwAyEA", key_id="sha256:" + "1" * 64,
                            updated_us=time.time_ns() // 1000, chunk_store="fs")
        with contextlib.suppress(KafkaError):  # there already, normally
            await create_topics(kafka_bootstrap, [topics.FACTS], compacted=True)
        producer = make_producer(kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topics.FACTS, value=encode(facts), key=node.encode())
        finally:
            await producer.stop()
        with pytest.raises(ChunkStoreMismatch) as caught:
            await _start(h, "store-b")
        assert f"{node} (fs)" in str(caught.value)
        # the same store everywhere: a spec that says fs, and a holder on the directory
        fs_spec = h.spec.model_copy(update={"chunk_store": "fs"})
        await h.append(topics.spec(wid), encode(fs_spec))
        holder, stop, task = await _start(h, "store-c", chunk_dir=str(tmp_path))
        await _stop(stop, task)
        assert holder.epoch >= 1
