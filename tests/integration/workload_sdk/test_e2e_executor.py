"""End to end with the project's REAL executor (``fx executor run``, a process) and magika.

Files go in on ``wl.<id>.in``; the holder (a process) asks ``filetype``; the executor runs magika
and writes a signed response; the step decides and asks the gate (which nobody serves: the holder
writes its ``timeout``). Replay reproduces every output, and ``fx why`` walks from the gate request
back to the file's bytes, checking the executor's signature against its key on ``sys.facts``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_schema import OutputRecord, decode, sha256_hex
from tests.integration.harness import ExecutorHarness
from workload_sdk import WorkloadLog, replay
from workload_sdk._replay import compare_outputs, out_slots
from workload_sdk.examples.filetype_gate import GATE_KIND, FiletypeGate

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]

FILES = {
    "pdf": b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" * 20,
    "python": b"import os\n\ndef main() -> None:\n    print(os.getcwd())\n\n" * 20,
}


def _decisions(log: WorkloadLog) -> list[dict[str, object]]:
    return [o.body.data for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
            and "decision" in o.body.data]


async def test_real_executor_magika_end_to_end(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path,
    magika_store: tuple[Path, str], executor_harness: Callable[..., ExecutorHarness],
) -> None:
    store, model_hash = magika_store
    wid = unique_workload_id
    async with executor_harness(kafka_bootstrap, wid, store, models={"filetype": model_hash}) as h:
        executor, holder = h.start_nodes("e2e-holder")
        for data in FILES.values():
            await h.send_input(data, source="upload")
        deadline = time.monotonic() + 90
        while True:
            log = await h.read_log()
            gate_outcomes = [o for o in (decode(r.value) for r in log["out"])
                             if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
                             and "gate" in o.body.data]
            if len(_decisions(log)) == len(FILES) and len(gate_outcomes) == len(FILES):
                break
            assert executor.poll() is None, h.tail()
            assert time.monotonic() < deadline, h.tail()
            await asyncio.sleep(0.3)
        assert h.stop(holder) == 0
        h.stop(executor)
        log = await h.read_log()

    decisions = {d["file_offset"]: d for d in _decisions(log)}
    labels = {decisions[o]["label"] for o in decisions}
    assert "pdf" in labels and "python" in labels, decisions
    assert all(d["model"] == model_hash for d in decisions.values())
    full = replay(FiletypeGate(), log, use_snapshots=False)
    assert compare_outputs(full, log) == [] and len(full.outputs) == len(out_slots(log))

    gate_offset, _ = h.requests(log, GATE_KIND)[0]
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "workload_sdk", "why", wid, "--output",
                         str(gate_offset), "--json", "--bootstrap", kafka_bootstrap],
        capture_output=True, cwd=ROOT, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    tree = json.loads(proc.stdout)
    resp = tree["step"]["response"]
    assert resp["model_hash"] == model_hash and resp["executor"]["engine"]
    assert resp["signature"]["signed"] is True and resp["signature"]["valid"] is True, resp
    sent = list(FILES.values())[tree["step"]["response"]["request"]["step"]["input"]["offset"]]
    asked = resp["request"]["step"]["input"]
    assert asked["body"]["bytes_sha256"] == sha256_hex(sent)
