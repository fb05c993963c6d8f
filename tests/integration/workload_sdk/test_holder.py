"""The lease holder on a real broker, with holders as real processes.

The executor's part is PLAYED BY THE TEST here: it writes real ``accepted`` and ``response``
records to ``wl.<id>.resp`` on the real broker, but no model runs. The end-to-end test with the
project's executor and magika is ``test_e2e_executor.py``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from broker_schema import (
    INFERENCE_KIND,
    EffectRequest,
    MergeEntry,
    OutputRecord,
    decode,
    sha256_hex,
)
from workload_sdk import WorkloadLog, replay
from workload_sdk._replay import compare_outputs, out_slots
from workload_sdk.examples.filetype_gate import GATE_KIND, FiletypeGate
from workload_sdk.testing import WorkloadHarness

pytestmark = pytest.mark.integration

MODULE = "workload_sdk.examples.filetype_gate:FiletypeGate"
MODEL = "sha256:" + "5e" * 32
ROOT = Path(__file__).resolve().parents[3]


def _decisions(log: WorkloadLog) -> list[dict[str, object]]:
    found = []
    for rec in log["out"]:
        out = decode(rec.value)
        if isinstance(out, OutputRecord) and isinstance(out.body.data, dict) and (
                "decision" in out.body.data):
            found.append(out.body.data)
    return found


async def _answer_new(h: WorkloadHarness, done: set[str], label: str = "pdf") -> int:
    log = await h.read_log()
    n = 0
    for offset, req in h.requests(log, INFERENCE_KIND):
        if req.effect_id not in done:
            done.add(req.effect_id)
            await h.answer(offset, req, output={"label": label, "score": 0.97})
            n += 1
    return n


async def test_failover_fences_the_old_holder_and_writes_every_output_once(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    """Executor played by the test. Holder A runs; A is paused (SIGSTOP) and B claims; A resumes
    and the broker refuses its transaction; B is SIGKILLed mid-stream and C takes over. Holders
    started outside the election (``--no-elect``): each claims at once, as a supervisor restarting
    one would (the election is ``test_election.py``)."""
    wid = unique_workload_id
    async with WorkloadHarness(
        kafka_bootstrap, wid, MODULE, effect_kinds=(INFERENCE_KIND, GATE_KIND),
        models={"filetype": MODEL}, snapshot_every=3, log_dir=tmp_path,
    ) as h:
        files = [f"file number {i}\n".encode() * (i + 1) for i in range(8)]
        done: set[str] = set()
        a = h.start_holder("holder-a", elect=False)
        await h.wait_for(lambda log: h.epochs(log) == [1], what="claim 1")
        for data in files[:3]:
            await h.send_input(data, source="sensor-1")
        await h.wait_for(lambda log: len(h.requests(log, INFERENCE_KIND)) == 3, what="3 asks")
        assert await _answer_new(h, done) == 3
        await h.wait_for(lambda log: len(_decisions(log)) == 3, what="3 decisions")

        # A pauses; B claims epoch 2 and fences A's producer
        a.send_signal(signal.SIGSTOP)
        b = h.start_holder("holder-b", elect=False)
        await h.wait_for(lambda log: h.epochs(log) == [1, 2], what="claim 2")
        for data in files[3:5]:
            await h.send_input(data, source="sensor-1")
        await h.wait_for(lambda log: len(h.requests(log, INFERENCE_KIND)) == 5, what="5 asks")
        a.send_signal(signal.SIGCONT)
        # A reads the new inputs (or its due gate timeouts) and tries to write: fenced
        rc_a = await asyncio.to_thread(a.wait, 60)
        assert rc_a == 3, (tmp_path / "holder-holder-a.log").read_text()[-3000:]
        assert "fenced" in (tmp_path / "holder-holder-a.log").read_text()

        # B dies mid-stream (answers and inputs in flight); C takes over at epoch 3
        await _answer_new(h, done)
        for data in files[5:]:
            await h.send_input(data, source="sensor-1")
        b.send_signal(signal.SIGKILL)
        await asyncio.to_thread(b.wait, 30)
        c = h.start_holder("holder-c", elect=False)
        await h.wait_for(lambda log: h.epochs(log) == [1, 2, 3], what="claim 3")
        deadline = time.monotonic() + 60
        while True:
            await _answer_new(h, done)
            log = await h.read_log()
            gates = [r for _, r in h.requests(log, GATE_KIND)]
            gate_answers = [o for o in _outputs(log) if "gate" in o and "outcome" in o]
            if len(_decisions(log)) == len(files) and len(gate_answers) == len(gates) == len(
                    files):
                break
            assert time.monotonic() < deadline, f"{len(_decisions(log))} decisions"
            await asyncio.sleep(0.3)
        assert h.stop(c) == 0

    # every input decided once, no output slot twice, each effect answered once
    slots = Counter(decode(r.value).header.slot for r in log["out"])  # type: ignore[union-attr]
    assert max(slots.values()) == 1
    decisions = _decisions(log)
    assert sorted(d["file_offset"] for d in decisions) == sorted(  # type: ignore[type-var]
        r.offset for r in log["in"])
    entries = [e for e in (decode(r.value) for r in log["merge"]) if isinstance(e, MergeEntry)]
    delivered = Counter(e.effect_id for e in entries if e.action == "deliver" and e.effect_id)
    assert all(n == 1 for n in delivered.values())
    assert {e.epoch for e in entries} <= {1, 2, 3} and 3 in {e.epoch for e in entries}
    # the gate actuator never answered: each gate request got the holder's timeout record
    assert all(o["outcome"] == "timeout" for o in _outputs(log) if "gate" in o)

    # replay reproduces every output byte for byte, from the start and from snapshots
    full = replay(FiletypeGate(), log, use_snapshots=False)
    assert compare_outputs(full, log) == [] and len(full.outputs) == len(out_slots(log))
    snap = replay(FiletypeGate(), log)
    assert snap.snapshot_seq is not None and snap.core.state_hash == full.core.state_hash
    # trust_log over a fresh read of the same log (nothing decoded strictly yet): the same
    # fold, outputs and entries without validating the records again
    trusted = replay(FiletypeGate(), await h.read_log(), use_snapshots=False, trust_log=True)
    assert (trusted.core.state_hash, trusted.outputs, trusted.entries) == (
        full.core.state_hash, full.outputs, full.entries)

    # fx why walks from a gate actuation back to the file's bytes
    gate_offset, gate_req = h.requests(log, GATE_KIND)[-1]
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "workload_sdk", "why", wid, "--output",
                         str(gate_offset), "--json", "--bootstrap", kafka_bootstrap],
        capture_output=True, cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    tree = json.loads(proc.stdout)
    assert tree["output"]["effect_id"] == gate_req.effect_id
    resp = tree["step"]["response"]
    assert resp["outcome"] == "ok" and resp["model_hash"] == MODEL
    assert resp["signature"]["signed"] is False  # the played executor does not sign
    asked = resp["request"]["step"]
    in_offset = asked["input"]["offset"]
    sent = files[in_offset]  # inputs came from one plain producer: offsets 0..7 in order
    assert asked["input"]["body"]["bytes_sha256"] == sha256_hex(sent)
    assert asked["input"]["source"] == "sensor-1"

    # fx replay --to prints the state at a step, from the nearest snapshot
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "workload_sdk", "replay", wid, "--module", MODULE,
                         "--to", "4", "--json", "--bootstrap", kafka_bootstrap],
        capture_output=True, cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    printed = json.loads(proc.stdout)
    assert printed["seq"] == 5 and printed["snapshot"]["seq"] == 3
    assert printed["state_hash"] == replay(FiletypeGate(), log, to_seq=4,
                                           use_snapshots=False).core.state_hash
    # ... and with --trust-log, from the start: the whole log's state, every output checked
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "workload_sdk", "replay", wid, "--module", MODULE,
                         "--from-start", "--trust-log", "--json", "--bootstrap",
                         kafka_bootstrap],
        capture_output=True, cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    printed = json.loads(proc.stdout)
    assert printed["trust_log"] is True and printed["output_problems"] == []
    assert printed["state_hash"] == full.core.state_hash
    assert printed["outputs_checked"] == len(full.outputs)


def _outputs(log: WorkloadLog) -> list[dict[str, object]]:
    return [o.body.data for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)]


async def test_fenced_holder_transaction_fails_in_process(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    """The broker itself refuses a stale holder: a second producer with the holder's
    transactional id bumps the epoch, and the first one's next transaction raises."""
    from aiokafka.errors import InvalidProducerEpoch, ProducerFenced

    from broker_schema import topics
    from fx_kafka.client import make_producer
    from fx_kafka.workload import ensure_workload_topics
    from workload_sdk import transactional_id_for

    await ensure_workload_topics(kafka_bootstrap, unique_workload_id)
    tid = transactional_id_for(unique_workload_id)
    old = make_producer(kafka_bootstrap, transactional_id=tid)
    await old.start()
    new = make_producer(kafka_bootstrap, transactional_id=tid)
    try:
        async with old.transaction():
            await old.send(topics.merge(unique_workload_id), value=b"{}", partition=0)
        await new.start()
        with pytest.raises((ProducerFenced, InvalidProducerEpoch)):
            async with old.transaction():
                await old.send(topics.merge(unique_workload_id), value=b"{}", partition=0)
    finally:
        for p in (old, new):
            try:
                await p.stop()
            except Exception as exc:  # a fenced producer may not close cleanly
                print(f"stop: {exc!r}")


def _pass_over_reasons(log: WorkloadLog) -> list[str | None]:
    return [e.reason for e in (decode(r.value) for r in log["merge"])
            if isinstance(e, MergeEntry) and e.action == "pass_over"]


async def test_a_second_answer_is_passed_over_and_diff_of_the_same_code_is_clean(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    """Executor played by the test: it answers one request twice; the step sees the first
    answer, the second is passed over as a duplicate; ``replay --diff`` with the same module over
    the broker's log finds no difference."""
    async with WorkloadHarness(
        kafka_bootstrap, unique_workload_id, MODULE, effect_kinds=(INFERENCE_KIND, GATE_KIND),
        models={"filetype": MODEL}, log_dir=tmp_path,
    ) as h:
        holder = h.start_holder("solo")
        await h.send_input(b"%PDF-1.4 hello", source="s")
        log = await h.wait_for(lambda log: len(h.requests(log, INFERENCE_KIND)) == 1,
                               what="a request")
        (offset, req), = h.requests(log, INFERENCE_KIND)
        assert isinstance(req, EffectRequest) and req.model == MODEL
        await h.answer(offset, req, output={"label": "pdf"})
        await h.answer(offset, req, output={"label": "exe"})  # a second answer: passed over
        # the decision can land before the second answer is merged: wait for both, or the
        # holder may be stopped with the duplicate still unread
        await h.wait_for(lambda log: len(_decisions(log)) == 1
                         and _pass_over_reasons(log).count("duplicate") == 1,
                         what="a decision and the duplicate passed over")
        assert h.stop(holder) == 0
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "workload_sdk", "replay", unique_workload_id,
                         "--diff", "--module", MODULE, "--json", "--bootstrap", kafka_bootstrap],
        capture_output=True, cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()[-2000:]
    assert json.loads(proc.stdout)["kind"] == "same"
    log = await h.read_log()
    assert _decisions(log)[0]["label"] == "pdf"
    reasons = _pass_over_reasons(log)
    assert reasons.count("duplicate") == 1 and reasons.count("not_an_answer") == 2
