"""New workload code at a recorded step, on a real broker with holders as processes (issue 26,
part 1): ``fx workload deploy`` stores the module by hash and appends a module switch; the running
holder adopts it live (a claim of its epoch from the next step); the steps after it run the new
code; a fresh holder started with the new code resumes (replaying the old range with the old
code, loaded from the module store); ``fx replay`` (with no ``--module``), ``fx replay --diff
--from-step``, ``fx audit`` and ``fx why`` run each range with the code recorded for it; ``fx
shadow --module`` shadows a module change; and a spec naming a module that never ran a step does
not block shadowing. The procedure is the one docs/workloads.md tells ("New workload code at a
step")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker_schema import ClaimRecord, OutputRecord, SpecRecord, decode, encode, topics
from fx_kafka.workload_log import WorkloadLog
from workload_sdk import load_workload, module_hash
from workload_sdk._module_store import module_record, read_modules, store_module
from workload_sdk.testing import WorkloadHarness

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]

GATE = '''from workload_sdk import Workload, emit


class Gate(Workload):
    """Counts its inputs; version {v} of the code."""

    def initial_state(self):
        return {{"n": 0}}

    def step(self, state, event):
        n = state["n"] + 1
        return {{"n": n}}, [emit({{"version": {v}, "n": n, "text": event.text()}})]
'''


def _fx(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fx_cli.main", *args, "--bootstrap", bootstrap],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)


def _outputs(log: WorkloadLog) -> dict[int, tuple[int, dict[str, object]]]:
    """Step -> (offset on .out, body) of each output."""
    found: dict[int, tuple[int, dict[str, object]]] = {}
    for rec in log["out"]:
        out = decode(rec.value)
        if isinstance(out, OutputRecord) and isinstance(out.body.data, dict):
            found.setdefault(out.header.input_offset, (rec.offset, out.body.data))
    return found


def _claims(log: WorkloadLog) -> list[ClaimRecord]:
    return [c for c in (decode(r.value) for r in log["claims"]) if isinstance(c, ClaimRecord)]


async def test_deploy_new_code_at_a_step_live_then_resume_replay_audit_why_shadow(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    wid = unique_workload_id
    refs = {}
    for v in (1, 2, 3):
        path = tmp_path / f"gate_v{v}.py"
        path.write_text(GATE.format(v=v) + f"# {wid}\n")  # code no earlier run stored
        refs[v] = f"{path}:Gate"
    hashes = {v: module_hash(load_workload(ref)) for v, ref in refs.items()}
    assert len(set(hashes.values())) == 3

    async with WorkloadHarness(kafka_bootstrap, wid, refs[1], effect_kinds=(), snapshot_every=3,
                               log_dir=tmp_path / "logs") as h:
        # what fx workload spec does beside writing the spec: keep its code in the module store
        await store_module(kafka_bootstrap, module_record(load_workload(refs[1])))
        first = h.start_holder("dep-a")

        async def feed(texts: list[str], total: int) -> WorkloadLog:
            for text in texts:
                await h.send_input(text, source="t")
            return await h.wait_for(lambda lg: len(_outputs(lg)) >= total, timeout=90,
                                    what=f"{total} outputs")

        await feed([f"a{i}" for i in range(4)], 4)
        # new code from the workload's next step (4), adopted by the running holder
        dep = _fx(kafka_bootstrap, "workload", "deploy", wid, "--module", refs[2])
        assert dep.returncode == 0, dep.stderr
        assert "runs steps 4 and later" in dep.stdout and hashes[2] in dep.stdout, dep.stdout
        assert hashes[2] in await read_modules(kafka_bootstrap)
        # a step already passed is refused with one line
        passed = _fx(kafka_bootstrap, "workload", "deploy", wid, "--module", refs[3],
                     "--at-step", "1")
        assert passed.returncode == 2 and "already passed" in passed.stderr, passed.stderr
        assert "Traceback" not in passed.stderr
        log = await feed([f"b{i}" for i in range(3)], 7)
        outs = _outputs(log)
        assert [outs[s][1]["version"] for s in range(7)] == [1, 1, 1, 1, 2, 2, 2], outs
        assert [outs[s][1]["n"] for s in range(7)] == list(range(1, 8))  # the state carried on
        adoption = [c for c in _claims(log) if c.from_seq is not None]
        assert [(c.from_seq, c.holder_id) for c in adoption] == [(4, "dep-a")], adoption
        assert first.poll() is None, "the holder adopted the code live and kept running"

        # a fresh holder with the new code resumes: it replays steps 0..3 with the old code
        h.stop(first)
        h.module = refs[2]
        second = h.start_holder("dep-b")
        log = await feed(["c0", "c1"], 9)
        outs = _outputs(log)
        assert [outs[s][1]["version"] for s in (7, 8)] == [2, 2]
        assert outs[8][1]["n"] == 9
        assert {c.holder_id for c in _claims(log) if c.from_seq is None} >= {"dep-b"}
        assert second.poll() is None

        # a spec naming a module that never runs a step (refused by the running holder: it
        # would change the code of steps taken) does not block shadowing
        stray = h.spec.model_copy(update={"module_hash": hashes[3]})
        await h.append(topics.spec(wid), encode(stray))
        h.stop(second)

    # replay with no --module: each range with the code recorded for it, from the store
    for extra in ((), ("--from-start",), ("--module", refs[2]), ("--module", refs[1])):
        rp = _fx(kafka_bootstrap, "replay", wid, "--json", *extra)
        assert rp.returncode == 0, (extra, rp.stdout, rp.stderr)
        summary = json.loads(rp.stdout)
        assert summary["output_problems"] == [] and summary["state"] == {"n": 9}, summary
    # diff: the new code from step 4 is what ran; v3 from step 6 differs from step 6 on
    same = _fx(kafka_bootstrap, "replay", wid, "--diff", "--module", refs[2], "--from-step", "4")
    assert same.returncode == 0 and "same" in same.stdout, same.stdout + same.stderr
    other = _fx(kafka_bootstrap, "replay", wid, "--diff", "--module", refs[3], "--from-step", "6",
                "--json")
    assert other.returncode == 1, other.stderr
    report = json.loads(other.stdout)
    assert report["kind"] == "output_differs" and report["first"]["seq"] == 6, report
    # audit: replay of every range with its module, without --module too
    for extra in ((), ("--module", refs[2])):
        au = _fx(kafka_bootstrap, "audit", wid, "--json", *extra)
        assert au.returncode == 0, au.stdout + au.stderr
        audited = json.loads(au.stdout)
        assert audited["result"] == "ok" and "replay" not in audited["skipped"], audited
    # why: the module that ran the step, and the switch
    for step, version in ((2, 1), (5, 2)):
        offset = outs[step][0]
        wy = _fx(kafka_bootstrap, "why", wid, "--output", str(offset), "--json")
        assert wy.returncode == 0, wy.stderr
        spec = json.loads(wy.stdout)["step"]["spec"]
        assert spec["module_hash"] == hashes[version], spec
        assert spec.get("module_switch_at") == (4 if version == 2 else None), spec
    # shadow a module change (v3 for steps 5..8; steps before it with their recorded code)
    sh = _fx(kafka_bootstrap, "shadow", wid, "--module", refs[3], "--from", "5", "--to", "8",
             "--json")
    assert sh.returncode == 1, sh.stdout + sh.stderr  # decisions differ: that is the point
    shadowed = json.loads(sh.stdout)
    rep = shadowed["report"]
    assert rep["module"] == {"module_hash": hashes[3], "workload_class": "Gate"}, rep
    assert rep["steps"] == 4 and rep["decisions_differ"] == 4, rep
    assert rep["requests_diverged_at"] is None, rep
    again = _fx(kafka_bootstrap, "shadow", "show", shadowed["eval_id"], "--workload", wid,
                "--module", refs[3], "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["reproduced"] is True
    # the code that ran the steps shadows nothing: say so in one line
    none = _fx(kafka_bootstrap, "shadow", wid, "--module", refs[2], "--from", "5", "--to", "8")
    assert none.returncode == 2 and "--model" in none.stderr, none.stderr
    # the stray spec is on the log, unclaimed
    specs = [r for r in (decode(x.value) for x in (await _read_spec(kafka_bootstrap, wid)))
             if isinstance(r, SpecRecord)]
    assert specs[-1].module_hash == hashes[3]


async def _read_spec(bootstrap: str, wid: str) -> list:  # type: ignore[type-arg]
    from fx_kafka.workload_log import read_topic

    return list(await read_topic(bootstrap, topics.spec(wid)))


async def test_code_that_cannot_be_had_is_refused_in_one_line_and_the_holder_runs_on(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    wid = unique_workload_id
    refs = {}
    for v in (1, 3):
        path = tmp_path / f"gone_v{v}.py"
        path.write_text(GATE.format(v=v) + f"# {wid}\n")  # code no earlier run stored
        refs[v] = f"{path}:Gate"
    v3 = module_hash(load_workload(refs[3]))
    # the spec's module is not stored (a spec written before the module store existed)
    async with WorkloadHarness(kafka_bootstrap, wid, refs[1], effect_kinds=(),
                               log_dir=tmp_path / "logs") as h:
        holder = h.start_holder("gone-a")
        for text in ("x0", "x1"):
            await h.send_input(text)
        await h.wait_for(lambda lg: len(_outputs(lg)) >= 2, timeout=90, what="2 outputs")
        # a spec switching to code nobody stored: the holder refuses it and runs on
        from broker_schema import ModuleSwitch

        bad = h.spec.model_copy(update={"module_switches": (
            ModuleSwitch(at_step=2, module_hash=v3, workload_class="Gate"),)})
        await h.append(topics.spec(wid), encode(bad))
        await h.send_input("x2")
        log = await h.wait_for(lambda lg: len(_outputs(lg)) >= 3, timeout=90, what="3 outputs")
        assert _outputs(log)[2][1]["version"] == 1
        assert not [c for c in _claims(log) if c.from_seq is not None]
        # deployed properly (stored, from the next step), the same code is adopted: the
        # refused spec's switch at a passed step is not the code of the steps taken
        dep = _fx(kafka_bootstrap, "workload", "deploy", wid, "--module", refs[3])
        assert dep.returncode == 0 and "runs steps 3 and later" in dep.stdout, dep.stderr
        await h.send_input("x3")
        log = await h.wait_for(lambda lg: len(_outputs(lg)) >= 4, timeout=90, what="4 outputs")
        assert _outputs(log)[3][1]["version"] == 3
        assert [c.from_seq for c in _claims(log) if c.from_seq is not None] == [3]
        assert holder.poll() is None
        h.stop(holder)
    text = (tmp_path / "logs" / "holder-gone-a.log").read_text()
    assert "not adopted" in text and "not in the module store sys.modules" in text, text
    # replay without --module, the code not in the store: one line, exit 4
    rp = _fx(kafka_bootstrap, "replay", wid)
    assert rp.returncode == 4 and "not in the module store sys.modules" in rp.stderr, rp.stderr
    assert "Traceback" not in rp.stderr
    # with the code at hand it replays
    assert _fx(kafka_bootstrap, "replay", wid, "--module", refs[1]).returncode == 0
    # other code at hand stands in for the missing module, as before the store, and it is said
    # (here it computes other outputs than were recorded: exit 4)
    stand_in = _fx(kafka_bootstrap, "replay", wid, "--module", refs[3])
    assert stand_in.returncode == 4, stand_in.stderr
    assert f"its steps ran --module ({v3}) instead" in stand_in.stderr, stand_in.stderr
    # a deploy of a file that is not there
    gone = _fx(kafka_bootstrap, "workload", "deploy", wid, "--module",
               str(tmp_path / "nope.py") + ":Gate")
    assert gone.returncode == 2 and gone.stderr.startswith("fx workload deploy: --module"), \
        gone.stderr
    assert "Traceback" not in gone.stderr and len(gone.stderr.strip().splitlines()) == 1
    # fx workload spec keeps its module in the store too: now replay needs no --module
    spec = _fx(kafka_bootstrap, "workload", "spec", wid, "--module", refs[1])
    assert spec.returncode == 0, spec.stderr
    rp = _fx(kafka_bootstrap, "replay", wid, "--json")
    assert rp.returncode == 0, rp.stderr
    assert json.loads(rp.stdout)["state"] == {"n": 4}
    # the path: a spec naming another module, then a fresh holder with that code. It
    # claims with that spec from its epoch's first step; the steps before keep their code
    # (replayed from the store), so it resumes instead of disagreeing with the log
    again = _fx(kafka_bootstrap, "workload", "spec", wid, "--module", refs[3])
    assert again.returncode == 0, again.stderr
    async with WorkloadHarness(kafka_bootstrap, wid, refs[3], effect_kinds=(),
                               log_dir=tmp_path / "logs2") as h2:  # (its spec: that code)
        fresh = h2.start_holder("gone-b")
        await h2.send_input("x4")
        log = await h2.wait_for(lambda lg: len(_outputs(lg)) >= 5, timeout=90, what="5 outputs")
        assert _outputs(log)[4][1] == {"version": 3, "n": 5, "text": "x4"}
        assert fresh.poll() is None
        h2.stop(fresh)
    rp = _fx(kafka_bootstrap, "replay", wid, "--from-start", "--json")
    assert rp.returncode == 0 and json.loads(rp.stdout)["state"] == {"n": 5}, rp.stderr
