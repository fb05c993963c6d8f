"""References resolved before the step, on a real broker.

An input whose body is a chunk reference (the chunk put with the executor's ``fx chunk put
--workload ID``, Kafka backend, run as a process) or a stream reference: the holder reads what it
names before the step, so the step reads its bytes; replay reads it too and gives the same
outputs; once the chunk is deleted (tombstones on ``sys.chunks``) ``fx replay`` stops with exit 3
naming it. A chunk that was never written stops the live holder (after a bounded wait, under
``input_policy.then = "stop"``) naming it, with nothing merged past it, and a holder started
once the chunk is there carries on. A state
past the 64 KiB inline limit is snapshotted by chunk reference, and a restarted holder resumes
from that snapshot.

The executor's part is PLAYED BY THE TEST: it writes real ``accepted``/``response`` records
(one with a chunk reference as its output) on the real broker, but no model runs.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker_schema import (
    INFERENCE_KIND,
    ChunkRef,
    InputPolicy,
    MergeEntry,
    OutputRecord,
    SnapshotRecord,
    StreamRef,
    decode,
    sha256_hex,
    topics,
)
from broker_schema.chunks import part_key
from fx_kafka.client import make_producer
from fx_kafka.refs import ChunkTopicReader
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
    infer,
    replay,
)
from workload_sdk._kafka_io import read_workload_log
from workload_sdk._replay import compare_outputs
from workload_sdk.cli import EXIT_GAP
from workload_sdk.testing import WorkloadHarness, _env, fx_command

pytestmark = pytest.mark.integration

MODULE = "tests.integration.workload_sdk.test_refs:RefReader"
MODEL = "sha256:" + "8c" * 32
ROOT = Path(__file__).resolve().parents[3]


class RefReader(Workload):
    """Emits what it read of each input: the sha256 and size of a referenced body's bytes, or
    the JSON of an inline one. ``{"ask": n}`` asks the model with the previous referenced input
    passed on as the request's input; ``{"grow": n}`` pads the state with ``n`` bytes. An
    answer's output is read and emitted."""

    def initial_state(self) -> State:
        return {"n": 0, "pad": "", "last_ref": None}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        new = dict(state, n=state["n"] + 1)
        if isinstance(event, EffectResult):
            return new, [emit({"answer": event.json(), "outcome": event.outcome})]
        if not isinstance(event.body, ChunkRef | StreamRef):
            value = event.json()
            outs: list[Output] = [emit({"saw": value})]
            if "grow" in value:
                new["pad"] = "x" * int(value["grow"])
            if "ask" in value and state["last_ref"] is not None:
                outs.append(infer(model="m", input=ChunkRef(**state["last_ref"]),
                                  deadline_ms=600_000))
            return new, outs
        data = event.bytes()
        if isinstance(event.body, ChunkRef):
            new["last_ref"] = event.body.model_dump(mode="json", exclude_none=True)
        return new, [emit({"read": sha256_hex(data), "size": len(data),
                           "type": event.body.type})]


def _outputs(log: WorkloadLog) -> list[dict[str, object]]:
    return [o.body.data for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)]


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=_env(), cwd=str(ROOT), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _chunk_put(path: Path, wid: str, bootstrap: str, cache: Path) -> ChunkRef:
    """``fx chunk put FILE --workload ID`` (the executor's CLI, Kafka backend) as a process."""
    proc = _run(*fx_command(), "chunk", "put", str(path), "--workload", wid, "--backend",
                "kafka", "--bootstrap", bootstrap, "--dir", str(cache))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return ChunkRef.model_validate(json.loads(proc.stdout))


def _replay_cli(wid: str, bootstrap: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return _run(sys.executable, "-m", "workload_sdk", "replay", wid, "--module", MODULE,
                "--json", "--bootstrap", bootstrap, *extra)


async def _start(h: WorkloadHarness, holder_id: str, **config: object
                 ) -> tuple[LeaseHolder, asyncio.Event, asyncio.Task[None]]:
    holder = LeaseHolder(RefReader(), HolderConfig(bootstrap=h.bootstrap,
                                                   workload_id=h.workload_id,
                                                   holder_id=holder_id,
                                                   force_placement=True,  # no executor here
                                                   **config))  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(holder.run(stop))
    ready = asyncio.create_task(holder.ready.wait())
    done, _ = await asyncio.wait({task, ready}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # raises what the holder raised
    assert ready in done, "holder not ready after 60 s"
    return holder, stop, task


async def test_a_chunk_input_is_read_before_the_step_and_replay_reads_it_until_deleted(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    wid = unique_workload_id
    body = bytes(range(256)) * 400  # 100 KiB: over the inline limit, so only by reference
    (tmp_path / "in.bin").write_bytes(body)
    answer = json.dumps({"label": "wav", "score": 0.5}).encode()
    (tmp_path / "answer.json").write_bytes(answer)
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE, effect_kinds=(INFERENCE_KIND,),
                               models={"m": MODEL}, snapshot_every=2, log_dir=tmp_path) as h:
        ref = await asyncio.to_thread(_chunk_put, tmp_path / "in.bin", wid, kafka_bootstrap,
                                      tmp_path / "cache")
        assert ref.hash == sha256_hex(body) and ref.size == len(body)
        out_ref = await asyncio.to_thread(_chunk_put, tmp_path / "answer.json", wid,
                                          kafka_bootstrap, tmp_path / "cache")
        holder = h.start_holder("refs-a", elect=False)
        await h.send_input({"note": 0})
        chunk_in = await h.send_input(ref)
        await h.send_input(StreamRef(topic=topics.inputs(wid), offset=0))
        await h.send_input({"ask": 1})
        log = await h.wait_for(lambda log: len(h.requests(log, INFERENCE_KIND)) == 1,
                               what="the request")
        ((req_offset, req),) = h.requests(log, INFERENCE_KIND)
        assert req.input == ref  # the step passed the reference on, as it is
        await h.answer(req_offset, req, output=out_ref)  # the executor's chunk output
        log = await h.wait_for(lambda log: any("answer" in o for o in _outputs(log)),
                               what="the answer merged")
        assert h.stop(holder) == 0
    outputs = _outputs(log)
    assert {"read": sha256_hex(body), "size": len(body), "type": "chunk"} in outputs
    # the stream reference names .in@0: its input record's body, as the executor reads it
    assert {"read": sha256_hex(b'{"note":0}'), "size": 10, "type": "stream"} in outputs
    assert {"answer": json.loads(answer), "outcome": "ok"} in outputs

    log = await read_workload_log(kafka_bootstrap, wid)
    assert log.resolved[("in", chunk_in)] == body
    full = replay(RefReader(), log, use_snapshots=False)
    assert compare_outputs(full, log) == [] and full.steps == 5
    ok = await asyncio.to_thread(_replay_cli, wid, kafka_bootstrap, "--from-start")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["output_problems"] == []

    # the input's chunk deleted (a tombstone for its one part): replay stops naming it
    producer = make_producer(kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topics.CHUNKS, value=None,
                                     key=part_key(wid, ref.hash, 0, 1))
    finally:
        await producer.stop()
    gone = await asyncio.to_thread(_replay_cli, wid, kafka_bootstrap, "--from-start")
    assert gone.returncode == EXIT_GAP, gone.stdout[-2000:] + gone.stderr[-2000:]
    assert f"{topics.inputs(wid)} offset {chunk_in} is unresolved" in gone.stderr
    assert ref.hash in gone.stderr and f"of workload {wid} on {topics.CHUNKS}" in gone.stderr
    assert "Traceback" not in gone.stderr


async def test_a_chunk_never_written_stops_the_holder_naming_it_and_nothing_is_lost(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    """With a filesystem chunk store shared with executors (``HolderConfig.chunk_dir``,
    ``--chunk-dir``; the spec's ``chunk_store = "fs"``), under ``input_policy.then = "stop"``
    (the default, ``quarantine``, skips it on the record: tests/integration/workload_sdk/
    test_skip.py)."""
    from executor.chunks import FsChunkStore

    wid = unique_workload_id
    data = b"written later\n" * 6000
    missing = ChunkRef(hash=sha256_hex(data), size=len(data))
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE, effect_kinds=(INFERENCE_KIND,),
                               models={"m": MODEL}, chunk_store="fs",
                               input_policy=InputPolicy(wait_ms=2000, then="stop")) as h:
        await h.send_input({"note": 0})
        at = await h.send_input(missing)
        await h.send_input({"note": 2})
        # no executor here: other tests' nodes on sys.facts (kafka stores) are not this
        # workload's, so no facts count as live for its chunk-store check
        holder, stop, task = await _start(h, "refs-b", chunk_dir=str(tmp_path),
                                          facts_max_age_s=0.0)
        try:
            with pytest.raises(RefGap) as caught:
                await asyncio.wait_for(task, 60)
        finally:
            stop.set()
        text = str(caught.value)
        assert f"{topics.inputs(wid)} offset {at} is unresolved" in text
        assert missing.hash in text and str(tmp_path) in text and "waited 2 s" in text
        log = await h.read_log()
        merged = [e.source_offset for e in (decode(r.value) for r in log["merge"])
                  if isinstance(e, MergeEntry) and e.source == "in"]
        assert merged == [0]  # nothing merged past it
        assert holder.stats.steps == 1

        FsChunkStore(tmp_path).put_sync(data, workload=wid)  # as fx chunk put --backend fs
        b, stop_b, task_b = await _start(h, "refs-c", chunk_dir=str(tmp_path),
                                         facts_max_age_s=0.0)
        try:
            await h.wait_for(lambda log: {"saw": {"note": 2}} in _outputs(log),
                             what="the inputs after the chunk merged")
        finally:
            stop_b.set()
            await asyncio.wait_for(task_b, 30)
        assert b.stats.refs_resolved == 1
    log = await read_workload_log(kafka_bootstrap, wid, chunk_dir=tmp_path)
    assert {"read": sha256_hex(data), "size": len(data), "type": "chunk"} in _outputs(log)
    assert compare_outputs(replay(RefReader(), log, use_snapshots=False), log) == []


async def test_a_state_past_the_inline_limit_is_snapshotted_by_chunk_and_resumed_from(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    wid = unique_workload_id
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE, effect_kinds=(INFERENCE_KIND,),
                               models={"m": MODEL}, snapshot_every=1) as h:
        a, stop_a, task_a = await _start(h, "grow-a")
        try:
            await h.send_input({"note": 0})
            await h.send_input({"grow": 70_000})
            await h.send_input({"note": 2})
            await h.wait_for(lambda log: {"saw": {"note": 2}} in _outputs(log), what="note 2")
        finally:
            stop_a.set()
            await asyncio.wait_for(task_a, 30)
        assert a.stats.snapshots == 3 and a.stats.chunk_snapshots == 2
        assert a.stats.snapshots_skipped == 0
        log = await h.read_log()
        snaps = [(r.offset, s) for r in log["merge"]
                 if isinstance(s := decode(r.value), SnapshotRecord)]
        assert [type(s.state).__name__ for _, s in snaps] == ["InlineBody", "ChunkRef",
                                                              "ChunkRef"]
        last_offset, last = snaps[-1]
        assert isinstance(last.state, ChunkRef) and last.state.size > 70_000
        # the chunk is on sys.chunks, as the workload's own
        reader = ChunkTopicReader(kafka_bootstrap)
        await reader.start()
        try:
            got = await reader.read({(wid, last.state.hash): last.state})
        finally:
            await reader.stop()
        assert isinstance(got[(wid, last.state.hash)], bytes)

        b, stop_b, task_b = await _start(h, "grow-b")
        try:
            assert b.core is not None and b.core.seq == last.seq == 3
            assert b.stats.resumed_from == last.positions
            assert len(b.core.state["pad"]) == 70_000
            await h.send_input({"note": 3})
            await h.wait_for(lambda log: {"saw": {"note": 3}} in _outputs(log), what="note 3")
        finally:
            stop_b.set()
            await asyncio.wait_for(task_b, 30)
    log = await h.read_log()
    assert ("merge", last_offset) in log.resolved
    full = replay(RefReader(), log, use_snapshots=False)
    result = replay(RefReader(), log)
    assert result.snapshot_seq == 4 and result.core.state_hash == full.core.state_hash
    assert compare_outputs(result, log) == [] and compare_outputs(full, log) == []
