"""Trimming by audit horizon on the real broker, with a horizon of seconds: ``trim_workload``
(``fx trim``) moves each topic's log start exactly where the rules say (DeleteRecords), resume and
replay from the retained snapshot are unchanged, replay and why of a trimmed decision stop with
exit 3 naming the offset, the holder trims by itself when asked, and a topic whose retention is
shorter than the horizon is refused. Holders run in-process; the executor's part is PLAYED BY THE
TEST (real ``accepted``/``response`` records on the real broker, no model runs)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker_schema import (
    INFERENCE_KIND,
    OutputRecord,
    SnapshotRecord,
    StreamRef,
    decode,
    topics,
)
from fx_kafka.client import create_topics
from fx_kafka.errors import RetentionTooShortError
from fx_kafka.workload import HORIZON_UNKNOWN, WORKLOAD_TOPIC_CONFIGS, ensure_workload_topics
from workload_sdk import (
    MODULE_PLACEHOLDER,
    EffectResult,
    HolderConfig,
    InputEvent,
    LeaseHolder,
    LogGap,
    Output,
    State,
    Workload,
    WorkloadLog,
    emit,
    infer,
    replay,
    trim_workload,
)
from workload_sdk._replay import compare_outputs
from workload_sdk._trim_io import read_trim_log
from workload_sdk.cli import EXIT_GAP, EXIT_MISMATCH
from workload_sdk.testing import WorkloadHarness, _env

pytestmark = pytest.mark.integration

MODULE = "tests.integration.workload_sdk.test_trim:RefAsker"
MODEL = "sha256:" + "7b" * 32
ROOT = Path(__file__).resolve().parents[3]
HORIZON_MS = 2_000


class RefAsker(Workload):
    """``{"ask": n}`` asks the model; an input whose body is a stream reference asks the model
    with that reference as the request's input; every step emits what it saw. Deadlines are long:
    a request stays pending until the test answers it."""

    def initial_state(self) -> State:
        return {"n": 0}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        new = dict(state, n=state["n"] + 1)
        if isinstance(event, EffectResult):
            return new, [emit({"answered": event.effect_id, "outcome": event.outcome})]
        if isinstance(event.body, StreamRef):
            return new, [emit({"saw": "ref", "offset": event.body.offset}),
                         infer(model="m", input=event.body, deadline_ms=600_000)]
        value = event.json()
        outs: list[Output] = [emit({"saw": value})]
        if "ask" in value:
            outs.append(infer(model="m", params={"n": value["ask"]}, input=value["ask"],
                              deadline_ms=600_000))
        return new, outs


def _outputs(log: WorkloadLog) -> list[object]:
    return [o.body.data for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord)]


def _snapshots(log: WorkloadLog) -> list[tuple[int, int, SnapshotRecord]]:
    """``(merge offset, append time, snapshot)`` of every snapshot on ``.merge``."""
    found = []
    for rec in log["merge"]:
        record = decode(rec.value)
        if isinstance(record, SnapshotRecord):
            found.append((rec.offset, rec.time_ms, record))
    return found


async def _start(h: WorkloadHarness, holder_id: str, **config: object
                 ) -> tuple[LeaseHolder, asyncio.Event, asyncio.Task[None]]:
    holder = LeaseHolder(RefAsker(), HolderConfig(bootstrap=h.bootstrap,
                                                  workload_id=h.workload_id,
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


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workload_sdk", *args], env=_env(),
                          cwd=str(ROOT), capture_output=True, text=True, timeout=120,
                          check=False)


async def test_trim_moves_each_start_where_the_rules_say_and_resume_and_replay_still_work(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    wid = unique_workload_id
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE, effect_kinds=(INFERENCE_KIND,),
                               models={"m": MODEL}, snapshot_every=1,
                               audit_horizon_ms=HORIZON_MS) as h:
        _a, stop_a, task_a = await _start(h, "trim-a")
        try:
            # old: two inputs, one answered request, and a request left pending whose input is
            # a stream reference to .in@2
            await h.send_input({"note": 0})
            await h.send_input({"ask": 1})
            log = await h.wait_for(lambda log: len(h.requests(log)) == 1, what="request 1")
            ((r1_offset, r1),) = h.requests(log)
            await h.answer(r1_offset, r1, output={"label": "one"})
            await h.wait_for(lambda log: {"answered": r1.effect_id, "outcome": "ok"}
                             in _outputs(log), what="answer 1 merged")
            await h.send_input({"note": 2})
            await h.send_input(StreamRef(topic=topics.inputs(wid), offset=2))
            old = await h.wait_for(lambda log: any(s.seq == 5 for _, _, s in _snapshots(log)),
                                   what="the snapshot after step 4")
            old_end_ms = max(r.time_ms for view in old.views.values() for r in view)
            await asyncio.sleep(HORIZON_MS / 1000 + 0.5)
            # young: one more input, after the horizon gap
            young_in = await h.send_input({"note": 5})
            before = await h.wait_for(lambda log: any(s.seq == 6 for _, _, s in _snapshots(log)),
                                      what="the snapshot after step 5")
        finally:
            stop_a.set()
            await asyncio.wait_for(task_a, 30)

        pending = [(o, r) for o, r in h.requests(before) if r.effect_id != r1.effect_id]
        ((r2_offset, r2),) = pending
        assert isinstance(r2.input, StreamRef) and r2.input.offset == 2
        young_ms = before["in"].records[young_in].time_ms
        assert young_ms - old_end_ms > HORIZON_MS
        cutoff = (old_end_ms + young_ms) // 2
        # the rules: .merge at the latest snapshot older than the horizon (seq 5); .resp and
        # .out at the positions it records; .in at the input the pending request names
        ((trim_offset, _t, trim_snap),) = [(o, t, s) for o, t, s in _snapshots(before)
                                           if s.seq == 5]
        assert trim_snap.positions["in"] == 4 and trim_snap.positions["resp"] == 2
        assert 0 < trim_snap.positions["out"] <= r2_offset
        expected = {"merge": trim_offset, "in": 2, "resp": 2,
                    "out": trim_snap.positions["out"]}

        # the dry run deletes nothing and says what it would do
        dry = _cli("trim", wid, "--dry-run", "--bootstrap", kafka_bootstrap)
        assert dry.returncode == 0, dry.stderr
        assert f"{topics.merge(wid)}: start 0 -> " in dry.stdout
        assert "never trimmed" in dry.stdout and "dry run: nothing was deleted" in dry.stdout
        assert all(v.start == 0 for v in (await read_trim_log(kafka_bootstrap, wid)).views.values())

        plan = await trim_workload(kafka_bootstrap, wid, now_ms=cutoff + HORIZON_MS)
        assert plan.applied and plan.snapshot == (trim_offset, 5)
        assert {s: t.new_start for s, t in plan.topics.items()} == expected
        assert plan.low_watermarks == expected
        after = await h.read_log()
        assert {s: after[s].start for s in expected} == expected
        assert after["spec"].start == 0 and after["claims"].start == 0

        # replay from the retained snapshot: the same state, every output byte for byte
        full = replay(RefAsker(), before, use_snapshots=False)
        result = replay(RefAsker(), after)
        assert result.snapshot_seq == 6
        assert result.core.state_hash == full.core.state_hash
        assert compare_outputs(result, after) == []

        # replay and why of what was trimmed: exit 3 naming the first missing offset
        ok = _cli("replay", wid, "--module", MODULE, "--bootstrap", kafka_bootstrap)
        assert ok.returncode == 0, ok.stderr
        gone = _cli("replay", wid, "--module", MODULE, "--from-start",
                    "--bootstrap", kafka_bootstrap)
        assert gone.returncode == EXIT_GAP
        assert f"{topics.merge(wid)} offset 0 is trimmed" in gone.stderr
        assert "Traceback" not in gone.stderr
        # the replay the gap names (the workload's code filled in, as it says) runs
        (hint,) = re.findall(r"\((fx replay \S+ --to \d+ --module \S+),", gone.stderr)
        named = _cli(*[MODULE if w == MODULE_PLACEHOLDER else w for w in hint.split()[1:]],
                     "--bootstrap", kafka_bootstrap)
        assert named.returncode == 0, (hint, named.stderr)
        old_out = _cli("why", wid, "--output", "0", "--bootstrap", kafka_bootstrap)
        assert old_out.returncode == EXIT_GAP
        assert f"{topics.out(wid)} offset 0 is trimmed" in old_out.stderr
        assert "Traceback" not in old_out.stderr
        # the pending request is still on .out, but the step that asked was trimmed from .merge
        asked = _cli("why", wid, "--output", str(r2_offset), "--bootstrap", kafka_bootstrap)
        assert asked.returncode == EXIT_GAP
        assert "no merge entry delivers seq 4" in asked.stderr and "trimmed" in asked.stderr

        # a new holder resumes from the latest snapshot and answers the pending request
        b, stop_b, task_b = await _start(h, "trim-b")
        try:
            assert b.stats.resumed_from == {"in": 5, "resp": 2,
                                            "out": _snapshots(after)[-1][2].positions["out"]}
            assert b.core is not None and list(b.core.pending) == [r2.effect_id]
            await h.answer(r2_offset, r2, output={"label": "two"})
            await h.wait_for(lambda log: {"answered": r2.effect_id, "outcome": "ok"}
                             in _outputs(log), what="answer 2 merged by the new holder")
        finally:
            stop_b.set()
            await asyncio.wait_for(task_b, 30)
        assert b.stats.rewritten_outputs == 0
        final = await h.read_log()
        result = replay(RefAsker(), final)
        assert result.core.state == {"n": 7} and not result.core.pending
        assert compare_outputs(result, final) == []


async def test_the_holder_trims_by_itself_when_asked(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    async with WorkloadHarness(kafka_bootstrap, unique_workload_id, MODULE,
                               effect_kinds=(INFERENCE_KIND,), models={"m": MODEL},
                               snapshot_every=1, audit_horizon_ms=1_000) as h:
        holder, stop, task = await _start(h, "trim-self", trim_every_s=0.3)
        try:
            for i in range(3):
                await h.send_input({"note": i})
            await h.wait_for(lambda log: len(_outputs(log)) == 3, what="3 outputs")
            await asyncio.sleep(1.5)
            await h.send_input({"note": 3})
            def trimmed_and_merged(log: WorkloadLog) -> bool:
                # the trim may land before the 4th input is merged: wait for both
                if not (log["merge"].start > 0 and log["in"].start > 0):
                    return False
                try:
                    return bool(replay(RefAsker(), log).core.state == {"n": 4})
                except LogGap:  # read between two topics' DeleteRecords: read again
                    return False

            log = await h.wait_for(trimmed_and_merged, timeout=30,
                                   what="a trim by the holder and the 4th input merged")
            assert holder.stats.trims >= 1 and holder.stats.trims_failed == 0
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
        snaps = _snapshots(log)
        assert snaps and log["merge"].start == snaps[0][0]  # trimmed at a snapshot
        assert replay(RefAsker(), log).core.state == {"n": 4}


async def test_a_topic_with_retention_shorter_than_the_horizon_is_refused(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    wid = unique_workload_id
    # someone made .resp with a one-minute time retention before the workload existed
    await create_topics(kafka_bootstrap, [topics.resp(wid)],
                        configs=WORKLOAD_TOPIC_CONFIGS | {"retention.ms": "60000"})
    await ensure_workload_topics(kafka_bootstrap, wid)  # no horizon known: .spec/.claims only
    with pytest.raises(RetentionTooShortError) as err:
        await ensure_workload_topics(kafka_bootstrap, wid, audit_horizon_ms=None)
    assert err.value.problems == [(topics.resp(wid), "retention.ms", 60000)]
    assert err.value.audit_horizon_ms is None
    with pytest.raises(RetentionTooShortError, match=f"{topics.resp(wid)}: retention.ms=60000"):
        await ensure_workload_topics(kafka_bootstrap, wid, audit_horizon_ms=120_000)
    await ensure_workload_topics(kafka_bootstrap, wid, audit_horizon_ms=60_000)
    await ensure_workload_topics(kafka_bootstrap, wid, audit_horizon_ms=HORIZON_UNKNOWN)

    # fx workload spec with the default horizon (forever) is refused, and writes nothing
    spec = _cli("workload", "spec", wid, "--module", MODULE, "--kind", INFERENCE_KIND,
                "--model", f"m={MODEL}", "--force", "--bootstrap", kafka_bootstrap)
    assert spec.returncode == EXIT_MISMATCH
    assert f"{topics.resp(wid)}: retention.ms=60000" in spec.stderr
    assert "retention.ms=-1" in spec.stderr and "Traceback" not in spec.stderr
    # with a horizon the retention covers, it is written
    spec = _cli("workload", "spec", wid, "--module", MODULE, "--kind", INFERENCE_KIND,
                "--model", f"m={MODEL}", "--force", "--audit-horizon-ms", "30000",
                "--bootstrap", kafka_bootstrap)
    assert spec.returncode == 0, spec.stderr
    log = await read_trim_log(kafka_bootstrap, wid)
    assert len(log["spec"]) == 1

    # a holder claiming a spec whose horizon is forever refuses to run and claims nothing
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE, effect_kinds=(INFERENCE_KIND,),
                               models={"m": MODEL}) as h:
        holder = LeaseHolder(RefAsker(), HolderConfig(bootstrap=kafka_bootstrap,
                                                      workload_id=wid, holder_id="refused",
                                                      force_placement=True))
        with pytest.raises(RetentionTooShortError, match="forever"):
            await asyncio.wait_for(holder.run(asyncio.Event()), 60)
        assert h.epochs(await h.read_log()) == []
