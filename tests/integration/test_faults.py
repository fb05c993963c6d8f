"""The reduced fault run (``bench/faults.py``, docs/reliability.md): real brokers, executors
(``fx executor run`` with magika) and holders (``fx workload run`` election candidates) carry a
steady stream of inputs through a few faults of each type: executor SIGKILLs, a graceful restart
of a one-node broker, holder SIGKILLs with automatic fail-over, a SIGKILL of one node of a 3-node
cluster, and a rogue writer's duplicate and late answers. Then ``fx audit`` (a process) and a
count from the log: nothing lost, nothing duplicated, every fault happened and recovered.

The first tests are the harness's pure parts (percentiles, the executor-kill classes), no
broker. The full benchmark is the same harness with larger counts (docs/reliability.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _faults() -> ModuleType:
    name = "bench_faults"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "faults.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_nearest_rank_percentiles() -> None:
    pct = _faults().percentile
    assert pct([], 50) is None
    assert pct([3.0], 99) == 3.0
    assert pct([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert pct([float(i) for i in range(1, 101)], 99) == 99.0
    assert pct([float(i) for i in range(1, 11)], 99) == 10.0  # under 100 values: the maximum


def test_executor_kill_classes_from_the_log() -> None:
    faults = _faults()
    row, classify = faults._RespRow, faults.classify_executor_kill
    nodes = {"exec-a", "exec-b"}
    rows = [row(0, 1000, "accepted", "e1", "exec-a"), row(1, 1010, "response", "e1", "exec-a"),
            row(2, 2000, "accepted", "e2", "exec-a")]
    requests = [(990, "e1"), (1990, "e2"), (2990, "e3")]
    # e2 accepted and not answered at 2500
    assert classify("exec-a", 2500, rows, requests, nodes) == "after_accept"
    # at 1500: exec-a serves, nothing in flight, nothing waiting
    assert classify("exec-a", 1500, rows, requests, nodes) == "after_response"
    # at 1995: e2 is on .out and nobody accepted it yet
    assert classify("exec-a", 1995, rows, requests, nodes) == "before_accept"
    # exec-b was not the one serving
    assert classify("exec-b", 2500, rows, requests, nodes) == "standby"
    # a response by the rogue writer (not an executor node) does not make it the owner
    rows.append(row(3, 2100, "response", "e2", "rogue-late"))
    assert classify("exec-b", 2500, rows, requests, nodes) == "standby"


@pytest.mark.integration
@pytest.mark.slow
async def test_reduced_fault_run_loses_and_duplicates_nothing(
    tmp_path: Path, magika_store: tuple[Path, str]
) -> None:
    faults = _faults()
    try:
        from fx_kafka.local import find_java

        find_java()
    except Exception as exc:  # any reason the local broker cannot run
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(f"CI=true and the local Kafka cannot run: {exc}")
        pytest.skip(f"the local Kafka cannot run here: {exc}")
    store, _ = magika_store
    cfg = faults.FaultConfig(
        executor_kills=3, broker_restarts=1, holder_failovers=2, cluster_kills=1,
        duplicates=3, late_answers=3, duration_cap_s=420, seed=11, rate_hz=2.0,
        workdir=tmp_path / "faults", model_store=store)
    report = await faults.run_faults(cfg)
    doc = report.as_dict()
    (tmp_path / "faults.json").write_text(json.dumps(doc, indent=2, default=str))
    text = faults.render_report(report)
    print("\n" + text)
    assert report.ok, text
    assert not report.capped, text
    totals = doc["totals"]
    assert totals["lost"] == 0 and totals["duplicated"] == 0, text
    assert totals["inputs"] > 0 and totals["decisions"] == totals["inputs"], text
    assert [p["name"] for p in doc["phases"]] == ["single", "cluster"]
    for phase in doc["phases"]:
        assert phase["audit_exit"] == 0 and phase["audit"]["result"] == "ok", phase["audit"]
        one = phase["audit"]["invariants"]["one_answer"]["counts"]
        assert one["pending"] == 0 and one["answered"] == one["requests"], one
    done = totals["faults_by_type"]
    for kind, n in (("executor_kill", 3), ("broker_restart", 1), ("holder_failover", 2),
                    ("cluster_kill", 1), ("rogue_duplicate", 3), ("rogue_late", 3)):
        assert done.get(kind) == n, (kind, done)
    for kind in ("executor_kill", "broker_restart", "holder_failover", "cluster_kill"):
        assert totals["recovery"][kind]["n"] == done[kind], totals["recovery"]
    single = doc["phases"][0]["counts"]
    # every duplicate the rogue wrote was passed over (as a duplicate, or after the holder's
    # timeout of that request); every late answer was either the recorded outcome (it came
    # before the holder's timeout) or passed over after it
    dup = single["rogue"]["dup"]
    assert sum(dup.values()) == 3 and set(dup) <= {"duplicate", "after_outcome"}, dup
    late = single["rogue"]["late"]
    assert sum(late.values()) == 3 and set(late) <= {"delivered", "after_outcome"}, late
