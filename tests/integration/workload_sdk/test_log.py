"""``fx log`` on a real run (issue 26, part 4): the file-type gate with the REAL executor
(``fx executor run``, magika) and a lease holder, both processes, on a real broker; the gate
requests nobody serves time out.

``fx log ID`` lists every record as a row (a table, or JSON lines), the filters keep what they
say (stream, kind, outcome, model as asked and as answered, effect id, ``--where``, offsets,
``--decisions``), every row's ``why`` offset given to ``fx why`` (the ``why_command`` the row
prints, run as printed) succeeds, the command the console shows for its timeline filter lists the
same rows, an unknown workload is answered at once, and ``--follow`` prints a record appended
after it started, then stops cleanly on Ctrl-C (SIGINT) and on SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker_schema import INFERENCE_KIND, OutputRecord, decode
from console import views
from tests.integration.harness import ExecutorHarness
from workload_sdk import WorkloadLog
from workload_sdk.examples.filetype_gate import GATE_KIND
from workload_sdk.testing import _env, fx_command

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
FILES = (b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" * 20,
         b"import os\n\ndef main() -> None:\n    print(os.getcwd())\n\n" * 20)
LATE = b"#!/bin/sh\necho hello\nexit 0\n" * 20


def _fx(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*fx_command(), *argv], env=_env(), cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout, check=False)


def _rows(wid: str, bootstrap: str, *filters: str) -> list[dict[str, Any]]:
    proc = _fx("log", wid, "--json", "--bootstrap", bootstrap, *filters)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _keys(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(r["stream"], r["offset"]) for r in rows]


def _done(log: WorkloadLog, inputs: int) -> bool:
    outs = [o for o in (decode(r.value) for r in log["out"]) if isinstance(o, OutputRecord)
            and isinstance(o.body.data, dict)]
    return (sum("decision" in o.body.data for o in outs) == inputs  # type: ignore[operator]
            and sum("gate" in o.body.data for o in outs) == inputs)  # type: ignore[operator]


class _Follower:
    """``fx log ID --follow`` as a process, its stdout read line by line in a thread."""

    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen([*fx_command(), "log", *argv, "--follow"], env=_env(),
                                     cwd=str(ROOT), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []

    async def wait_for(self, predicate: Callable[[str], bool], timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines:
                if predicate(line):
                    return line
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            assert time.monotonic() < deadline, self.lines[-5:]
            assert self.proc.stdout is not None
            line = await asyncio.to_thread(self.proc.stdout.readline)
            if line:
                self.lines.append(line.rstrip("\n"))

    def stop(self, sig: int) -> tuple[int, str]:
        self.proc.send_signal(sig)
        _, err = self.proc.communicate(timeout=15)
        return self.proc.returncode, err


async def test_fx_log_lists_filters_explains_and_follows_a_real_run(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path,
    magika_store: tuple[Path, str], executor_harness: Callable[..., ExecutorHarness],
) -> None:
    store, model_hash = magika_store
    wid = unique_workload_id
    b = ("--bootstrap", kafka_bootstrap)
    async with executor_harness(kafka_bootstrap, wid, store, models={"filetype": model_hash},
                                deadline_default_ms=1_500) as h:
        executor, _holder = h.start_nodes("log-holder")
        for data in FILES:
            await h.send_input(data, source="upload")
        await h.wait_for(lambda log: _done(log, len(FILES)), timeout=120,
                         what="both files decided and gated")
        log = await h.read_log()
        assert executor.poll() is None, h.tail()

        # every record, one row each, in timeline order
        rows = await asyncio.to_thread(_rows, wid, kafka_bootstrap)
        total = sum(len(log[s]) for s in views.STREAM_ORDER)
        assert len(rows) >= total
        assert {(s, r.offset) for s in views.STREAM_ORDER for r in log[s]} <= set(_keys(rows))
        assert [r["time_ms"] for r in rows] == sorted(r["time_ms"] for r in rows)
        table = await asyncio.to_thread(_fx, "log", wid, *b)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].startswith("time") and " why " in lines[0]
        assert len(lines) - 1 >= total and any(".out@0" in ln for ln in lines)

        # each row's offset given to fx why (the printed why_command, run as printed)
        commands = sorted({r["why_command"] for r in rows if r["why_command"]})
        assert any(r["kind"] == "input" and r["why"] is not None for r in rows)
        assert any(r["kind"] == "response" and r["why"] is not None for r in rows)
        for command in commands:
            argv = shlex.split(command)
            assert argv[:2] == ["fx", "why"]
            proc = await asyncio.to_thread(_fx, *argv[1:], *b)
            assert proc.returncode == 0, (command, proc.stderr)
            assert "Traceback" not in proc.stderr and "output wl." in proc.stdout

        # filters
        timeouts = await asyncio.to_thread(_rows, wid, kafka_bootstrap, "--outcome", "timeout")
        assert len(timeouts) == len(FILES)
        assert {(r["kind"], r["effect_kind"]) for r in timeouts} == {("response", GATE_KIND)}
        asked = await asyncio.to_thread(_rows, wid, kafka_bootstrap, "--kind", "request",
                                        "--model", "filetype")
        assert len(asked) == len(FILES)
        assert all(r["effect_kind"] == INFERENCE_KIND and r["model_hash"] == model_hash
                   for r in asked)
        by_hash = await asyncio.to_thread(_rows, wid, kafka_bootstrap, "--model", model_hash,
                                          "--stream", "resp", "--kind", "response")
        assert len(by_hash) == len(FILES) and {r["outcome"] for r in by_hash} == {"ok"}
        effect = asked[0]["effect_id"]
        one = await asyncio.to_thread(_rows, wid, kafka_bootstrap, "--effect", effect)
        assert {r["effect_id"] for r in one} == {effect}
        assert {"request", "accepted", "response", "merge"} <= {r["kind"] for r in one}
        uploads = await asyncio.to_thread(_rows, wid, kafka_bootstrap, "--stream", "in",
                                          "--where", "source=upload")
        assert _keys(uploads) == [("in", 0), ("in", 1)]
        ranged = await asyncio.to_thread(_rows, wid, kafka_bootstrap, "--stream", "out",
                                         "--from", "1", "--to", "2")
        assert {o for _, o in _keys(ranged)} <= {1, 2} and ranged
        decided = await asyncio.to_thread(_rows, wid, kafka_bootstrap, "--decisions",
                                          "--where", "kind=output")
        assert decided and all(r["stream"] == "out" for r in decided)
        # the console's timeline filter, as the command it shows: the same rows
        flt = views.parse_filter([], ["timeout"], None, None, None)
        shown = shlex.split(views.log_query(wid, flt))
        same = await asyncio.to_thread(_fx, *shown[1:], "--json", *b)
        assert same.returncode == 0, same.stderr
        assert [json.loads(x) for x in same.stdout.splitlines()] == timeouts

        # mistakes: one line, at once
        started = time.monotonic()
        typo = await asyncio.to_thread(_fx, "log", wid + "x", *b)
        assert typo.returncode == 4 and time.monotonic() - started < 10
        assert typo.stderr.strip().startswith(f"fx log: no workload '{wid}x' on this broker; "
                                              "known: ")
        unbound = await asyncio.to_thread(_fx, "log", wid, "--model", "magika", *b)
        assert unbound.returncode == 2 and unbound.stderr.strip() == (
            "fx log: --model 'magika': no spec of the workload binds a model of that name "
            "(bound: filetype); or give a sha256: hash"), unbound.stderr
        for argv, says in ((("--outcome", "late"), "unknown outcome 'late' (one of ok,"),
                           (("--stream", "log"), "unknown stream 'log' (one of in, spec,"),
                           (("--where", "kind"), "a field test is FIELD=VALUE")):
            bad = await asyncio.to_thread(_fx, "log", wid, *argv, *b)
            assert bad.returncode == 2 and "Traceback" not in bad.stderr
            assert bad.stderr.strip().startswith(f"fx log: {says}"), bad.stderr
            assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr

        # --follow: a record appended after it started is printed; Ctrl-C and SIGTERM end it
        as_json = _Follower(wid, "--json", "--stream", "in", *b)
        table_f = _Follower(wid, "--kind", "input", *b)
        await as_json.wait_for(lambda ln: json.loads(ln)["offset"] == len(FILES) - 1)
        await table_f.wait_for(lambda ln: f".in@{len(FILES) - 1} " in ln)
        late = await h.send_input(LATE, source="late")
        row = json.loads(await as_json.wait_for(lambda ln: json.loads(ln)["offset"] == late))
        assert (row["stream"], row["kind"], row["who"]) == ("in", "input", "late")
        await table_f.wait_for(lambda ln: f".in@{late} " in ln)
        for follower, sig in ((as_json, signal.SIGINT), (table_f, signal.SIGTERM)):
            code, err = follower.stop(sig)
            assert code == 0 and "Traceback" not in err, (sig, code, err)
        assert sum(f".in@{late} " in ln for ln in table_f.lines) == 1
