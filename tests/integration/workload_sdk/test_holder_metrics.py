"""The lease holder's ``/metrics``, ``/healthz`` and ``/readyz`` on a real broker, with the
project's real executor (``fx executor run``, magika) as a process.

Files go in while no executor runs: the holder's requests pile up on ``.out`` unread by the
executor group (``fx_workload_unread_requests`` > 0, outstanding > 0); then an executor of that
group starts, answers them, and the unread count falls to 0 while outcomes and round trips show
the answers merged.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker_schema import INFERENCE_KIND
from tests.integration.harness import ExecutorHarness
from workload_sdk.examples.filetype_gate import GATE_KIND

pytestmark = pytest.mark.integration

FILES = [b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" * 20,
         b"import os\n\ndef main() -> None:\n    print(os.getcwd())\n\n" * 20]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _parse(text: bytes) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def _port_from(log: Path, deadline: float) -> int:
    while time.monotonic() < deadline:
        found = re.search(rb"serving /metrics, /healthz, /readyz on http://[^:]+:(\d+)",
                          log.read_bytes() if log.exists() else b"")
        if found:
            return int(found.group(1))
        time.sleep(0.1)
    raise AssertionError(log.read_text()[-3000:] if log.exists() else "no holder log")


async def _until(base: str, ok: Callable[[Samples], bool], what: str, logs: list[Path],
                 timeout: float = 90.0) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        status, body = await asyncio.to_thread(_get, f"{base}/metrics")
        assert status == 200
        samples = _parse(body)
        if ok(samples):
            return samples
        if time.monotonic() > deadline:
            tails = "\n".join(p.read_text()[-2000:] for p in logs if p.exists())
            raise AssertionError(f"no {what} after {timeout} s:\n{body.decode()}\n{tails}")
        await asyncio.sleep(0.5)


async def test_holder_metrics_show_unread_requests_falling_when_an_executor_starts(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path,
    magika_store: tuple[Path, str], executor_harness: Callable[..., ExecutorHarness],
) -> None:
    store, model_hash = magika_store
    wid = unique_workload_id
    prefix = f"fx-test-{wid}"
    group = f"{prefix}.{INFERENCE_KIND}"
    holder_log = tmp_path / "holder-metrics-holder.log"
    logs = [holder_log, tmp_path / "executor.log"]
    async with executor_harness(kafka_bootstrap, wid, store, models={"filetype": model_hash},
                                executor={"group_prefix": prefix}, snapshot_every=2) as h:
        holder = h.start_holder("metrics-holder", "--http-port", "0",
                                "--executor-group-prefix", prefix)
        port = await asyncio.to_thread(_port_from, holder_log, time.monotonic() + 60)
        base = f"http://127.0.0.1:{port}"

        status, body = await asyncio.to_thread(_get, f"{base}/healthz")
        assert (status, json.loads(body)) == (200, {"live": True})
        deadline = time.monotonic() + 60
        while True:  # ready once elected, claimed and resumed
            status, body = await asyncio.to_thread(_get, f"{base}/readyz")
            ready = json.loads(body)
            if status == 200 and ready["role"] == "leader":
                break
            # until then: a stand-by in the election (ready), or claiming and resuming (not)
            assert (status, ready["ready"]) in {(200, True), (503, False)}, ready
            assert ready["role"] in ("standby", "starting", "candidate"), ready
            assert time.monotonic() < deadline, ready
            await asyncio.sleep(0.2)
        assert ready["workload"] == wid and ready["epoch"] >= 1 and ready["elected"] is True

        # no executor yet: the requests wait on .out, unread by the group that will serve them
        for data in FILES:
            await h.send_input(data, source="upload")
        before = await _until(
            base, lambda s: (_value(s, "fx_workload_unread_requests", workload=wid,
                                    group=group) or 0) >= len(FILES),
            "unread requests", logs)
        assert _value(before, "fx_holder_leader", workload=wid) == 1
        assert _value(before, "fx_holder_epoch", workload=wid) == ready["epoch"]
        assert _value(before, "fx_holder_outstanding_requests", workload=wid,
                      kind=INFERENCE_KIND) == len(FILES)
        assert _value(before, "fx_holder_outstanding_requests", workload=wid,
                      kind=GATE_KIND) == 0
        assert _value(before, "fx_holder_merge_lag_records", workload=wid) is not None
        # nothing answered yet (a 10 s deadline may have passed on a loaded machine: timeouts)
        assert not _value(before, "fx_holder_outcomes_total", workload=wid,
                          kind=INFERENCE_KIND, outcome="ok")

        executor = h.start_configured_executor()
        after = await _until(
            base, lambda s: (_value(s, "fx_holder_outcomes_total", workload=wid,
                                    kind=INFERENCE_KIND, outcome="ok") or 0) >= len(FILES)
            and _value(s, "fx_workload_unread_requests", workload=wid, group=group) == 0
            and _value(s, "fx_holder_outstanding_requests", workload=wid,
                       kind=INFERENCE_KIND) == 0,
            "answers merged and unread back to 0", logs, timeout=180)
        assert executor.poll() is None, h.tail()
        trips = _value(after, "fx_holder_round_trip_seconds_count", workload=wid,
                       kind=INFERENCE_KIND)
        answered = sum(v for (name, labels), v in after.items()
                       if name == "fx_holder_outcomes_total"
                       and ("kind", INFERENCE_KIND) in labels)
        assert trips == answered >= len(FILES)
        assert (_value(after, "fx_holder_round_trip_seconds_sum", workload=wid,
                       kind=INFERENCE_KIND) or 0) > 0
        # the gate kind nobody serves: its requests time out (1 s) and are counted as such
        await _until(base, lambda s: (_value(s, "fx_holder_outcomes_total", workload=wid,
                                             kind=GATE_KIND, outcome="timeout") or 0)
                     >= len(FILES), "gate timeouts", logs)
        # a snapshot every second step: its age is there, and young (holder clock vs broker's)
        age = _value(after, "fx_holder_snapshot_age_seconds", workload=wid)
        assert age is not None and -5 < age < 120, age
        # every .resp record read: the lag settles at 0
        await _until(base, lambda s: _value(s, "fx_holder_merge_lag_records",
                                            workload=wid) == 0, "merge lag 0", logs)
        # the accepted records of the executor are bookkeeping, never counted as rejected
        assert not [k for k in after if k[0] == "fx_holder_rejected_responses_total"
                    and ("reason", "not_an_answer") in k[1]]

        assert h.stop(holder) == 0
        h.stop(executor)
