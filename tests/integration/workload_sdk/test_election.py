"""Automatic holder fail-over: several ``fx workload run ID`` processes elect one lease holder
through the consumer group ``fx-holder-elect.<id>`` on a real broker; the others stand by; a
SIGKILLed holder is replaced within the session timeout plus a resume, a SIGTERMed one at once;
a candidate that joins later does not take the lease from the one holding it. The executor is
played by the test (as in ``test_holder.py``). Every output is written once and replay
reproduces them all."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from broker_schema import INFERENCE_KIND, ClaimRecord, MergeEntry, decode
from tests.integration.workload_sdk.test_holder import MODEL, MODULE, _answer_new, _decisions
from workload_sdk import WorkloadLog, replay
from workload_sdk._election import choose_leader
from workload_sdk._replay import compare_outputs
from workload_sdk.examples.filetype_gate import GATE_KIND, FiletypeGate
from workload_sdk.testing import WorkloadHarness

pytestmark = pytest.mark.integration

SESSION_MS = 6000


def _claims(log: WorkloadLog) -> list[ClaimRecord]:
    return [c for c in (decode(r.value) for r in log["claims"]) if isinstance(c, ClaimRecord)]


def test_the_choice_is_sticky_and_the_highest_epoch_wins() -> None:
    assert choose_leader({}) is None
    assert choose_leader({"b": None, "a": None}) == "a"
    assert choose_leader({"a": None, "b": 3}) == "b"  # a newcomer does not take the lease
    assert choose_leader({"a": 1, "b": 2}) == "b"  # a paused old holder does not win it back
    assert choose_leader({"a": 0, "b": None}) == "a"  # still claiming counts as holding


async def test_one_of_three_holds_and_a_standby_takes_over(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    wid = unique_workload_id
    async with WorkloadHarness(
        kafka_bootstrap, wid, MODULE, effect_kinds=(INFERENCE_KIND, GATE_KIND),
        models={"filetype": MODEL}, snapshot_every=3, log_dir=tmp_path,
    ) as h:
        procs = {name: h.start_holder(name, "--session-timeout-ms", str(SESSION_MS))
                 for name in ("cand-a", "cand-b", "cand-c")}
        log = await h.wait_for(lambda lg: len(_claims(lg)) >= 1, timeout=60, what="a claim")
        await asyncio.sleep(3)  # the others are in the group by now: still one claim
        log = await h.read_log()
        assert len(_claims(log)) == 1, [(c.epoch, c.holder_id) for c in _claims(log)]
        first = _claims(log)[0].holder_id
        assert all(p.poll() is None for p in procs.values())

        files = [f"file number {i}\n".encode() * (i + 1) for i in range(9)]
        done: set[str] = set()

        async def feed(chunk: list[bytes], decided: int) -> None:
            for data in chunk:
                await h.send_input(data, source="sensor-1")
            deadline = time.monotonic() + 60
            while len(_decisions(await h.read_log())) < decided:
                await _answer_new(h, done)
                assert time.monotonic() < deadline, f"{decided} decisions"
                await asyncio.sleep(0.2)

        await feed(files[:3], 3)

        # the holder dies: a standby is elected after the session timeout and claims epoch 2
        procs[first].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        log = await h.wait_for(lambda lg: len(_claims(lg)) >= 2, timeout=SESSION_MS / 1000 + 30,
                               what="the stand-by's claim")
        kill_takeover_s = time.monotonic() - killed_at
        second = _claims(log)[1].holder_id
        assert second != first and _claims(log)[1].epoch == 2
        await feed(files[3:6], 6)

        # a latecomer joins: it stands by, the lease stays where it is
        procs["cand-d"] = h.start_holder("cand-d", "--session-timeout-ms", str(SESSION_MS))
        await asyncio.sleep(5)
        assert len(_claims(await h.read_log())) == 2

        # the holder is stopped gracefully: it leaves the group and a stand-by takes over at once
        stopped_at = time.monotonic()
        assert h.stop(procs[second]) == 0
        log = await h.wait_for(lambda lg: len(_claims(lg)) >= 3, timeout=30,
                               what="the claim after a graceful stop")
        stop_takeover_s = time.monotonic() - stopped_at
        third = _claims(log)[2].holder_id
        assert third not in (first, second)
        await feed(files[6:], 9)
        log = await h.read_log()
        print(f"\ntake-over after SIGKILL: {kill_takeover_s:.1f} s (session {SESSION_MS} ms); "
              f"after SIGTERM: {stop_takeover_s:.1f} s")
        assert kill_takeover_s < SESSION_MS / 1000 + 15
        assert stop_takeover_s < 10

    slots = Counter(decode(r.value).header.slot for r in log["out"])  # type: ignore[union-attr]
    assert max(slots.values()) == 1
    assert sorted(d["file_offset"] for d in _decisions(log)) == sorted(  # type: ignore[type-var]
        r.offset for r in log["in"])
    entries = [e for e in (decode(r.value) for r in log["merge"]) if isinstance(e, MergeEntry)]
    delivered = Counter(e.effect_id for e in entries if e.action == "deliver" and e.effect_id)
    assert all(n == 1 for n in delivered.values())
    assert [c.epoch for c in _claims(log)] == [1, 2, 3]
    full = replay(FiletypeGate(), log, use_snapshots=False)
    assert compare_outputs(full, log) == []


async def test_a_candidate_started_while_the_broker_is_away_waits_for_it(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    """A candidate whose broker is not there yet (a restart under way) waits, with backoff,
    instead of exiting (the reduced fault run once saw a restarted candidate exit 1 when its
    start fell inside a broker restart); it stops cleanly on SIGTERM while it waits."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # nothing listens here once the socket is closed
    root = Path(__file__).resolve().parents[3]
    log_path = tmp_path / "away.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workload_sdk", "workload", "run", MODULE, "--id",
             unique_workload_id, "--holder-id", "away", "--bootstrap",
             f"127.0.0.1:{dead_port}", "--force"],
            cwd=root, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while b"broker unavailable for the election" not in log_path.read_bytes():
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                await asyncio.sleep(0.5)
            await asyncio.sleep(2)
            assert proc.poll() is None, log_path.read_text()[-3000:]  # still waiting
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM), log_path.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
