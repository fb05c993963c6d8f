"""``fx audit`` on a real broker, over a workload run end to end with the REAL executor.

The file-type gate runs under a lease holder (a process) with ``fx executor run`` and magika (a
process): two files, two signed ``ok`` answers, two gate requests nobody serves (the holder's
``timeout``). ``fx audit`` (a process) then exits 0 with every invariant holding; after a plain
producer writes an existing ``.out`` slot a second time and a copy of a signed response with a
changed output onto ``.resp`` (what anyone with write access could do, no holder or executor
involved), it exits 1 naming exactly those two invariants.
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

from broker_schema import (
    InlineBody,
    OutputRecord,
    ResponseRecord,
    decode,
    encode,
    topics,
)
from tests.integration.harness import ExecutorHarness
from workload_sdk import WorkloadLog
from workload_sdk._api import body_of

pytestmark = pytest.mark.integration

MODULE = "workload_sdk.examples.filetype_gate:FiletypeGate"
ROOT = Path(__file__).resolve().parents[3]
FILES = (b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" * 20,
         b"import os\n\ndef main() -> None:\n    print(os.getcwd())\n\n" * 20)


def _gate_outcomes(log: WorkloadLog) -> int:
    """How many gate requests have had their answer (the step emits ``{"gate": ...}``)."""
    found = 0
    for rec in log["out"]:
        out = decode(rec.value)
        if (isinstance(out, OutputRecord) and isinstance(out.body, InlineBody)
                and isinstance(out.body.data, dict) and "gate" in out.body.data):
            found += 1
    return found


async def _fx_audit(wid: str, bootstrap: str, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "fx_cli.main", "audit", wid, "--module", MODULE,
                         "--bootstrap", bootstrap, *extra],
        capture_output=True, cwd=ROOT, timeout=120, check=False)


async def test_fx_audit_passes_a_real_run_and_fails_forged_records(
    kafka_bootstrap: str, unique_workload_id: str, magika_store: tuple[Path, str],
    executor_harness: Callable[..., ExecutorHarness],
) -> None:
    store, model_hash = magika_store
    wid = unique_workload_id
    async with executor_harness(kafka_bootstrap, wid, store, models={"filetype": model_hash},
                                snapshot_every=2) as h:
        executor, holder = h.start_nodes("audit-holder")
        for data in FILES:
            await h.send_input(data, source="upload")
        deadline = time.monotonic() + 90
        while _gate_outcomes(log := await h.read_log()) < len(FILES):
            assert executor.poll() is None, h.tail()
            assert time.monotonic() < deadline, h.tail("holder-audit-holder")
            await asyncio.sleep(0.3)
        assert h.stop(holder) == 0
        h.stop(executor)

        clean = await _fx_audit(wid, kafka_bootstrap)
        assert clean.returncode == 0, clean.stdout.decode() + clean.stderr.decode()[-2000:]
        table = clean.stdout.decode()
        assert table.splitlines()[0] == f"fx audit {wid}: every invariant holds"
        for name in ("one_answer", "out_once", "epochs", "signatures", "merge_order", "replay"):
            assert any(line.split()[:2] == [name, "ok"] for line in table.splitlines()), table
        doc = json.loads((await _fx_audit(wid, kafka_bootstrap, "--json")).stdout)
        counts = {i["name"]: i["counts"] for i in doc["invariants"]}
        assert doc["result"] == "ok" and counts["one_answer"]["answered"] == 4
        assert counts["signatures"]["valid"] == 2 and counts["signatures"]["unsigned_holder"] == 2
        assert counts["replay"]["snapshots"] >= 1

        # forgeries by a plain producer: a second write of an existing .out slot, and a copy of
        # the executor's signed response with another output
        (out_offset, out_raw), *_ = [(r.offset, r.value) for r in log["out"]
                                     if isinstance(decode(r.value), OutputRecord)]
        forged_out = await h.append(topics.out(wid), out_raw)
        signed = next(r for r in (decode(x.value) for x in log["resp"])
                      if isinstance(r, ResponseRecord) and r.signature is not None)
        forged_resp = await h.append(topics.resp(wid), encode(signed.model_copy(
            update={"output": body_of({"label": "pdf", "forged": True})})))

    proc = await _fx_audit(wid, kafka_bootstrap, "--json")
    assert proc.returncode == 1, proc.stdout.decode() + proc.stderr.decode()[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["violated"] == ["out_once", "signatures"], doc
    by_name = {i["name"]: i for i in doc["invariants"]}
    (dup,) = by_name["out_once"]["violations"]
    assert dup["offset"] == forged_out and f"first at {topics.out(wid)}@{out_offset}" in dup[
        "message"]
    (bad,) = by_name["signatures"]["violations"]
    assert bad["offset"] == forged_resp and "INVALID" in bad["message"]
    text = (await _fx_audit(wid, kafka_bootstrap)).stdout.decode()
    assert "2 invariant(s) violated: out_once, signatures" in text
