"""A 3-node cluster: topics replicated three times with min ISR 2, and a workload that keeps every
record when the leader of its streams is killed (SIGKILL) mid-run and restarted later."""

from __future__ import annotations

import asyncio
import collections
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker_schema import MergeEntry, OutputRecord, decode, topics
from fx_kafka.client import make_admin
from fx_kafka.local import LocalKafka
from fx_kafka.workload import ensure_system_topics, ensure_workload_topics, topic_configs
from tests.integration.harness import ExecutorHarness
from workload_sdk import WorkloadLog, compare_outputs, out_slots, replay
from workload_sdk.examples.filetype_gate import FiletypeGate

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


async def _leaders(bootstrap: str, names: list[str]) -> dict[str, tuple[int, list[int], list[int]]]:
    """``{topic: (leader, replicas, isr)}`` of partition 0 of each topic."""
    admin = make_admin(bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(names)
    finally:
        await admin.close()
    out = {}
    for topic in described:
        parts = [p for p in topic["partitions"] if p["partition"] == 0]
        if not parts:  # a topic just created may not be in every broker's metadata yet
            out[topic["topic"]] = (-1, [], [])
            continue
        part = parts[0]
        out[topic["topic"]] = (part["leader"], list(part["replicas"]), list(part["isr"]))
    return out


async def test_topics_are_replicated_three_times(cluster: LocalKafka,
                                                 unique_workload_id: str) -> None:
    bootstrap = cluster.bootstrap
    names = await ensure_workload_topics(bootstrap, unique_workload_id)
    await ensure_system_topics(bootstrap)
    system = [topics.FACTS, topics.CHUNKS, topics.REJECTS]
    # on a loaded machine a follower may join a new partition's ISR a moment after creation
    deadline = time.monotonic() + 60
    while True:
        leaders = await _leaders(bootstrap, [*names, *system])
        if all(sorted(isr) == [1, 2, 3] for _, _, isr in leaders.values()):
            break
        assert time.monotonic() < deadline, leaders
        await asyncio.sleep(0.5)
    configs = await topic_configs(bootstrap, [*names, *system])
    for name in [*names, *system]:
        _leader, replicas, isr = leaders[name]
        assert sorted(replicas) == [1, 2, 3], (name, replicas)
        assert sorted(isr) == [1, 2, 3], (name, isr)
        assert configs[name]["min.insync.replicas"] == "2", name
        assert configs[name]["unclean.leader.election.enable"] == "false", name
    for name in names:
        assert configs[name]["retention.ms"] == "-1", name


def _file(i: int) -> bytes:
    kinds = [b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n",
             b"import os\n\ndef main() -> None:\n    print(os.getcwd())\n\n",
             b'{"a": [1, 2, 3], "b": {"c": "d"}, "n": %d}\n' % i]
    return kinds[i % len(kinds)] * 20 + b"# %d\n" % i


def _decisions(log: WorkloadLog) -> list[dict[str, Any]]:
    return [o.body.data for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
            and "decision" in o.body.data]


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


async def test_leader_killed_mid_run_loses_nothing(
    cluster: LocalKafka, unique_workload_id: str, tmp_path: Path,
    magika_store: tuple[Path, str], executor_harness: Callable[..., ExecutorHarness],
) -> None:
    store, model_hash = magika_store
    wid = unique_workload_id
    bootstrap = cluster.bootstrap
    per_phase = 6
    async with executor_harness(bootstrap, wid, store, models={"filetype": model_hash},
                                executor={"topic_pattern": rf"^wl\.{re.escape(wid)}\.out$"}
                                ) as h:
        executor, holder = h.start_nodes("cluster-holder")
        logs = (tmp_path / "executor.log", tmp_path / "holder-cluster-holder.log")

        async def settle(n: int, timeout: float) -> WorkloadLog:
            deadline = time.monotonic() + timeout
            while True:
                log = await h.read_log()
                if len(_decisions(log)) >= n:
                    return log
                for proc in (executor, holder):
                    assert proc.poll() is None, "\n".join(_tail(p) for p in logs)
                assert time.monotonic() < deadline, (
                    f"{len(_decisions(log))} of {n} decisions\n"
                    + "\n".join(_tail(p) for p in logs))
                await asyncio.sleep(0.5)

        sent = 0
        for _ in range(per_phase):
            await h.send_input(_file(sent), source="upload")
            sent += 1
        await settle(sent, 120)

        leaders = await _leaders(bootstrap, topics.all_topics(wid))
        victim = collections.Counter(lead for lead, _, _ in leaders.values()).most_common(1)[0][0]
        t_kill = time.monotonic()
        cluster.kill_node(victim)
        # inputs keep coming while the leader is gone: written through the two survivors
        for _ in range(per_phase):
            await h.send_input(_file(sent), source="upload")
            sent += 1
        await settle(sent, 120)
        during = time.monotonic() - t_kill
        moved = await _leaders(bootstrap, topics.all_topics(wid))
        assert all(lead != victim for lead, _, _ in moved.values()), moved

        cluster.start_node(victim)
        for _ in range(per_phase):
            await h.send_input(_file(sent), source="upload")
            sent += 1
        log = await settle(sent, 120)
        # the restarted node catches up and is back in every ISR
        deadline = time.monotonic() + 60
        while True:
            back = await _leaders(bootstrap, topics.all_topics(wid))
            if all(sorted(isr) == [1, 2, 3] for _, _, isr in back.values()):
                break
            assert time.monotonic() < deadline, back
            await asyncio.sleep(0.5)
        assert executor.poll() is None and holder.poll() is None, "rode out the failover"
        assert h.stop(holder) == 0, _tail(logs[1])
        h.stop(executor)
        log = await h.read_log()
    print(f"node {victim} killed; {per_phase} inputs answered {during:.1f} s after the kill")

    decisions = _decisions(log)
    assert sorted(d["file_offset"] for d in decisions) == list(range(sent)), decisions
    # nothing merged twice: every source record at most once, every effect delivered once
    entries = [decode(r.value) for r in log["merge"]]
    merged = [(e.source, e.source_offset) for e in entries if isinstance(e, MergeEntry)]
    assert len(merged) == len(set(merged))
    delivered = [e.effect_id for e in entries
                 if isinstance(e, MergeEntry) and e.action == "deliver" and e.effect_id]
    assert len(delivered) == len(set(delivered))
    slots = [decode(r.value).header.slot for r in log["out"]]  # type: ignore[union-attr]
    assert len(slots) == len(set(slots)), "an output slot written twice"
    full = replay(FiletypeGate(), log, use_snapshots=False)
    assert compare_outputs(full, log) == [] and len(full.outputs) == len(out_slots(log))
