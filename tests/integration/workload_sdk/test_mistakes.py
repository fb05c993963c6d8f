"""Mistakes get one clear line (issue 26, part 6), on a real broker with real processes.

* Every documented mistake (docs/operations.md, "Mistakes and what they print") is run as a user
  runs it: ``fx ...`` in a process. Each ends with a non-zero exit code and one line on stderr,
  never a traceback, and a typo in a workload id answers at once (it used to wait 40 s for a
  topic that does not exist, then print ``KafkaTimeoutError``), naming the workloads that exist.
* Model hashes are checked when a spec is written: a short hash is one line, an unknown full
  hash is refused, and ``--force`` writes it with the override on the record.
* A model imported into a running executor's store is on ``sys.facts`` within seconds (facts on
  change), so a lease holder checking placement and ``fx workload spec`` see it at once.
* Every follow-up command the tools print (``fx why``'s replay hint, ``fx shadow``'s
  ``show_again``, the console's shadow-report commands) is extracted from their output and run.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from broker_schema import INFERENCE_KIND, OutputRecord, SpecRecord, decode, topics
from console import views
from fx_kafka.workload_log import read_facts, read_topic
from fx_kafka.workloads import list_workloads
from tests.integration.conftest import MAGIKA_WHEEL_GLOB
from tests.integration.harness import FILETYPE_GATE, FILETYPE_GATE_KINDS, ExecutorHarness
from workload_sdk import MODULE_PLACEHOLDER
from workload_sdk._placement import placement_missing
from workload_sdk.examples.filetype_gate import GATE_KIND
from workload_sdk.testing import WorkloadHarness, fx_command

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
#: a model hash nobody holds (well formed)
NOBODY = "sha256:" + "ab" * 32
#: "at once": far below the 40 s a read of a missing topic used to wait
AT_ONCE_S = 10.0


def _fx(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*fx_command(), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, check=False)


def _one_clear_line(proc: subprocess.CompletedProcess[str], *must: str) -> str:
    """The one line a mistake printed on stderr (asserting: non-zero exit, no traceback, one
    line, containing each of ``must``)."""
    err = proc.stderr
    assert proc.returncode != 0, (proc.returncode, proc.stdout, err)
    assert "Traceback" not in err and "Traceback" not in proc.stdout, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for text in must:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def _mistake(argv: Sequence[str], *must: str) -> str:
    started = time.monotonic()
    proc = _fx(*argv)
    took = time.monotonic() - started
    line = _one_clear_line(proc, *must)
    assert took < AT_ONCE_S, (argv, took, line)
    return line


async def test_documented_mistakes_print_one_line(kafka_bootstrap: str, unique_workload_id: str,
                                                  tmp_path: Path) -> None:
    wid = unique_workload_id
    typo = wid + "x"
    b = ("--bootstrap", kafka_bootstrap)
    async with WorkloadHarness(kafka_bootstrap, wid, FILETYPE_GATE,
                               effect_kinds=FILETYPE_GATE_KINDS,
                               models={"filetype": NOBODY}, log_dir=tmp_path):
        assert wid in await list_workloads(kafka_bootstrap)
        known = f"no workload {typo!r} on this broker; known: "
        # a typo in the workload id, on every command that takes one: at once, with the ids
        for argv in (
            ("why", typo, "--output", "3"),
            ("replay", typo, "--to", "3", "--module", FILETYPE_GATE),
            ("audit", typo),
            ("trim", typo, "--dry-run"),
            ("shadow", typo, "--module", FILETYPE_GATE, "--model", f"filetype={NOBODY}"),
            ("shadow", "show", "e1", "--workload", typo),
            ("upgrade", typo, "--model", f"filetype={NOBODY}", "--at-step", "5"),
            ("rollback", typo, "--model", "filetype", "--at-step", "5"),
            ("workload", "input", typo, "--text", "hello"),
            ("workload", "run", FILETYPE_GATE, "--id", typo),
        ):
            line = _mistake([*argv, *b], known, wid)
            assert line.startswith(f"fx {argv[0]}"), line
        _mistake(["verify", "--workload", typo, *b], known, wid)
        _mistake(["why", wid, "--at", "yesterday", *b], "--at 'yesterday' is not a time")
        # a typo never created the workload it named
        assert typo not in await list_workloads(kafka_bootstrap)
        _mistake(["why", "bad.id", "--output", "0", *b], "invalid workload id")
        # a broker that is not there: one line, at once
        _mistake(["why", wid, "--output", "0", "--bootstrap", "127.0.0.1:9"],
                 "cannot list the workloads on 127.0.0.1:9")

        # model hashes when a spec is written
        spec = ("workload", "spec", wid, "--module", FILETYPE_GATE, "--kind", INFERENCE_KIND)
        _mistake([*spec, "--model", "filetype=sha256:6f6f", *b],
                 "--model filetype=sha256:6f6f: a short hash (4 of 64 hex digits)")
        _mistake([*spec, "--model", "filetype=6f6f6f6f", *b], "a short hash")
        _mistake([*spec, "--model", "filetype=magika", *b], "not a sha256:<64 lowercase hex>")
        _mistake([*spec, "--model", f"filetype={NOBODY}", *b],
                 f"no node on sys.facts holds filetype={NOBODY}", "--force")
        _mistake([*spec, "--local-model", "m=sha256:12", *b], "--local-model m=sha256:12")
        _mistake(["upgrade", wid, "--model", "filetype=sha256:12", "--at-step", "0", *b],
                 "--model takes NAME=sha256:HEX")
        _mistake(["upgrade", wid, "--model", f"filetype={'cd' * 32}", "--at-step", "0", *b],
                 "--model takes NAME=sha256:HEX")
        # registry names (fx models register): a name never registered, a bad spelling
        _mistake([*spec, "--model", f"filetype=no-such-model-{wid}@1.0", *b],
                 f"--model: no model named 'no-such-model-{wid}'")
        _mistake(["upgrade", wid, "--model", f"filetype=no-such-model-{wid}@prod", "--at-step",
                  "0", *b], "fx upgrade: --model", "no model named")
        other = "sha256:" + "cd" * 32
        _mistake(["models", "register", "Not-A-Name@1", other, *b],
                 "fx models register: 'Not-A-Name@1' is not a model reference")
        _mistake(["upgrade", wid, "--model", f"filetype={other}", "--at-step", "0", *b],
                 f"no node on sys.facts holds filetype={other}")
        # a module that is not there: one line (the last guard)
        _mistake(["workload", "spec", wid, "--module", "no_such_pkg.gate:Gate", *b],
                 "ModuleNotFoundError")
        _mistake(["workload", "input", wid, "--file", str(tmp_path / "absent.bin"), *b],
                 "FileNotFoundError")

        # --force writes the unknown hash, and records the override on the spec
        before = len(await read_topic(kafka_bootstrap, topics.spec(wid)))
        forced = _fx(*spec, "--model", f"filetype={NOBODY}", "--force", *b)
        assert forced.returncode == 0, forced.stderr
        up = _fx("upgrade", wid, "--model", f"filetype={other}", "--at-offset", "3", "--force",
                 *b)
        assert up.returncode == 0, up.stderr
        assert "--at-offset is deprecated" in up.stderr and "--at-step" in up.stderr
        assert "from step 3" in up.stdout, up.stdout
        view = await read_topic(kafka_bootstrap, topics.spec(wid))
        written = [decode(r.value) for r in view][before:]
        assert [type(s) for s in written] == [SpecRecord, SpecRecord]
        assert written[0].unchecked_models == (NOBODY,)  # type: ignore[union-attr]
        assert set(written[1].unchecked_models) == {NOBODY, other}  # type: ignore[union-attr]
        assert written[1].binding_switches[-1].at_input_offset == 3  # type: ignore[union-attr]
        # a spec without the override keeps its canonical bytes: the field is absent
        assert b"unchecked_models" not in view.raw(0).value


async def _wait(what: str, check: Callable[[], object], timeout: float, tail: Callable[[], str],
                ) -> object:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s\n{tail()}"
        await asyncio.sleep(0.2)


async def test_new_model_announced_and_printed_commands_run(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path,
    magika_store: tuple[Path, str], magika_pair_store: tuple[Path, str, str],
    executor_harness: Callable[..., ExecutorHarness],
) -> None:
    _, v33, v32 = magika_pair_store
    wheel = sorted((Path(sys.prefix) / "model-wheels").glob(MAGIKA_WHEEL_GLOB))[0]
    models = tmp_path / "models"
    shutil.copytree(magika_store[0], models)  # v3_3 only, for now
    wid = unique_workload_id
    b = ("--bootstrap", kafka_bootstrap)
    async with executor_harness(kafka_bootstrap, wid, models, models={"filetype": v33}) as h:
        executor = h.start_configured_executor()
        node = f"exec-{wid[:12]}"

        async def node_holds(model: str) -> bool:
            latest = {f.node_id: f for f in await read_facts(kafka_bootstrap)}
            return node in latest and model in latest[node].models_present

        await _wait("the executor's first facts", lambda: node_holds(v33), 60, h.tail)
        assert not await node_holds(v32)
        # facts on change: a model imported while the executor runs is announced at once
        # (facts_interval_s is 0 here: without facts on change it would never be)
        imported = _fx("models", "import", str(wheel), "--store", str(models), timeout=300)
        assert imported.returncode == 0, imported.stderr
        t0 = time.monotonic()
        await _wait("the imported model on sys.facts", lambda: node_holds(v32), 5.0, h.tail)
        announced_s = time.monotonic() - t0
        # ... so a spec naming it is written without --force, as a holder's placement sees it
        spec = _fx("workload", "spec", wid + "-v32", "--module", FILETYPE_GATE, "--kind",
                   INFERENCE_KIND, "--model", f"filetype={v32}", *b)
        assert spec.returncode == 0, spec.stderr
        assert announced_s < 5.0

        # ... and by the rule a lease holder places a workload with (a spec binding v3_2)
        facts = await read_facts(kafka_bootstrap)
        bound = SpecRecord(workload_id=wid, module_hash=NOBODY, effect_kinds=(INFERENCE_KIND,),
                           models={"filetype": v32})
        assert placement_missing(bound, facts, now_us=time.time_ns() // 1000,
                                 max_age_s=300) == []
        holder = h.start_holder("mistakes-holder")  # nobody serves the gate: --force
        for data in (b"%PDF-1.4\n" + b"1 0 obj << >> endobj\n" * 30,
                     b"import os\n\nprint(os.getcwd())\n" * 30):
            await h.send_input(data, source="upload")

        async def decided() -> bool:
            log = await h.read_log()
            gates = [o for o in (decode(r.value) for r in log["out"])
                     if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
                     and "gate" in o.body.data]
            return len(gates) == 2

        await _wait("two gate outcomes", decided, 120, lambda: h.tail() + h.tail(
            "holder-mistakes-holder"))
        assert executor.poll() is None and holder.poll() is None, h.tail()
        log = await h.read_log()
        gate_offset = h.requests(log, GATE_KIND)[-1][0]

        # fx why prints the replay command for the state at the time: it runs
        why = _fx("why", wid, "--output", str(gate_offset), *b)
        assert why.returncode == 0, why.stderr
        found = re.findall(r"(fx replay \S+ --to \d+ --module \S+)", why.stdout)
        assert found, why.stdout
        _run_printed(found[0], kafka_bootstrap)

        # fx shadow prints the command that shows the report again: it runs
        shadow = _fx("shadow", wid, "--module", FILETYPE_GATE, "--model", f"filetype={v32}",
                     "--timeout-s", "120", *b, timeout=240)
        assert shadow.returncode in (0, 1), shadow.stderr
        (show_again,) = re.findall(r"^show_again: (fx shadow show .+)$", shadow.stdout, re.M)
        _run_printed(show_again, kafka_bootstrap)
        (eval_id,) = re.findall(r"^eval_id: (\S+)$", shadow.stdout, re.M)
        # the console's shadow-report commands (console/views.py), as the page prints them
        row = views.shadow_report(wid, eval_id, 0, topics.shadow_stream(wid, eval_id, "eval"),
                                  None)
        summary = _run_printed(row["show"], kafka_bootstrap)
        assert "report_hash" in summary.stdout
        _run_printed(row["show_full"], kafka_bootstrap)
        h.stop(holder)
        h.stop(executor)


def _run_printed(command: str, bootstrap: str) -> subprocess.CompletedProcess[str]:
    """Run a command a tool printed (its ``MODULE:Class`` filled in with the workload's code,
    as the printed text says to) and require it to succeed."""
    assert command.startswith("fx "), command
    argv = [FILETYPE_GATE if word == MODULE_PLACEHOLDER else word for word in command.split()]
    proc = _fx(*argv[1:], "--bootstrap", bootstrap, timeout=240)
    assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    return proc
