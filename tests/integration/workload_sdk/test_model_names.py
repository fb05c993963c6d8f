"""Model names on a real broker (issue 28, part 1): ``fx models register`` / ``alias`` / ``list
--registry`` on ``sys.models``; ``fx workload spec``, ``fx upgrade`` and ``fx rollback`` take
``NAME@VERSION`` and ``NAME@ALIAS``, resolve them when they write, and the spec keeps the name
beside the hash; moving an alias later rebinds nothing already written (replay never resolves);
``fx why``, ``fx audit`` and ``fx log`` show the names; a naming mistake is one line, exit 2. The
executor is played by the test, as in ``test_holder.py``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from broker_schema import INFERENCE_KIND, ModelName, SpecRecord, decode
from tests.integration.workload_sdk.test_holder import MODULE, _answer_new, _decisions
from workload_sdk import replay
from workload_sdk._replay import compare_outputs
from workload_sdk.examples.filetype_gate import GATE_KIND, FiletypeGate
from workload_sdk.testing import WorkloadHarness

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
OLD = "sha256:" + "7a" * 32
NEW = "sha256:" + "8b" * 32


def _fx(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fx_cli.main", *args, "--bootstrap", bootstrap],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)


def _one_line_refusal(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


async def _specs(h: WorkloadHarness) -> list[SpecRecord]:
    log = await h.read_log()
    return [r for r in (decode(rec.value) for rec in log["spec"]) if isinstance(r, SpecRecord)]


async def test_names_resolve_at_write_time_and_show_beside_hashes(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    wid = unique_workload_id
    model = f"gate-{uuid.uuid4().hex[:8]}"  # the registry is shared by every test run
    licence = tmp_path / "LICENSE"
    licence.write_text("Apache License 2.0\nsee the model card\n")

    # the registry: two versions, prod and canary
    reg = _fx(kafka_bootstrap, "models", "register", f"{model}@1.0", OLD, "--alias", "prod",
              "--licence-file", str(licence))
    assert reg.returncode == 0, reg.stderr
    assert _fx(kafka_bootstrap, "models", "register", f"{model}@2.0", NEW).returncode == 0
    moved = _fx(kafka_bootstrap, "models", "alias", model, "canary", "2.0")
    assert moved.returncode == 0 and NEW in moved.stdout, moved.stderr
    _one_line_refusal(_fx(kafka_bootstrap, "models", "register", f"{model}@1.0", NEW),
                      "already registered")
    _one_line_refusal(_fx(kafka_bootstrap, "models", "alias", model, "prod", "9.9"), "9.9")
    listed = json.loads(_fx(kafka_bootstrap, "models", "list", "--registry", "--json").stdout)
    mine = {r["version"]: r for r in listed if r["name"] == model}
    assert mine["1.0"]["hash"] == OLD and mine["1.0"]["aliases"] == ["prod"]
    assert mine["1.0"]["licence"].startswith("Apache License 2.0")
    assert mine["2.0"]["aliases"] == ["canary"] and mine["2.0"]["registered_by"]

    async with WorkloadHarness(
        kafka_bootstrap, wid, MODULE, effect_kinds=(INFERENCE_KIND, GATE_KIND),
        models={"filetype": OLD}, log_dir=tmp_path,
    ) as h:
        kinds = ("--kind", INFERENCE_KIND, "--kind", GATE_KIND)
        # naming mistakes: one line each, nothing written
        for ref, word in ((f"{model}@staging", "staging"), ("nosuch-model@1.0", "nosuch-model"),
                          ("Bad@1", "not a model reference")):
            bad = _fx(kafka_bootstrap, "workload", "spec", wid, "--module", MODULE, *kinds,
                      "--model", f"filetype={ref}", "--force")
            assert bad.returncode != 0 and word in bad.stderr, bad.stderr
            assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
        assert len(await _specs(h)) == 1
        # the spec by alias: the hash bound, the name beside it
        spec = _fx(kafka_bootstrap, "workload", "spec", wid, "--module", MODULE, *kinds,
                   "--model", f"filetype={model}@prod", "--force")
        assert spec.returncode == 0, spec.stderr
        assert f"{model}@prod=1.0" in spec.stdout
        written = (await _specs(h))[-1]
        assert written.models == {"filetype": OLD}
        assert written.model_names == {OLD: ModelName(name=model, version="1.0", alias="prod")}

        holder = h.start_holder("names-a", elect=False)
        done: set[str] = set()
        for i in range(2):
            await h.send_input(f"named {i}\n".encode() * (i + 1), source="s")
        for _ in range(300):
            await _answer_new(h, done)
            if len(_decisions(await h.read_log())) >= 2:
                break
            await asyncio.sleep(0.2)
        assert len(_decisions(await h.read_log())) >= 2

        # fx upgrade by the canary alias, from the next step on
        log = await h.read_log()
        next_seq = 1 + max(decode(r.value).seq for r in log["merge"]  # type: ignore[union-attr]
                           if decode(r.value).kind == "merge")
        at = next_seq + 50
        _one_line_refusal(_fx(kafka_bootstrap, "upgrade", wid, "--model",
                              f"filetype={model}@nope", "--at-step", str(at), "--force"),
                          "nope")
        up = _fx(kafka_bootstrap, "upgrade", wid, "--model", f"filetype={model}@canary",
                 "--at-step", str(at), "--force")
        assert up.returncode == 0, up.stderr
        assert f"{model}@prod=1.0 ({OLD}) -> {model}@canary=2.0 ({NEW})" in up.stdout
        # moving prod later changes nothing written: the records keep what was resolved
        assert _fx(kafka_bootstrap, "models", "alias", model, "prod", "2.0").returncode == 0
        rb = _fx(kafka_bootstrap, "rollback", wid, "--model", "filetype", "--at-step",
                 str(at + 1), "--to", f"{model}@1.0", "--force")
        assert rb.returncode == 0, rb.stderr
        specs = await _specs(h)
        last = specs[-1]
        assert [s.models for s in last.binding_switches][-2:] == [{"filetype": NEW},
                                                                 {"filetype": OLD}]
        assert last.model_names[NEW] == ModelName(name=model, version="2.0", alias="canary")
        assert last.model_names[OLD] == ModelName(name=model, version="1.0")
        assert specs[-3].model_names[OLD].alias == "prod"  # as resolved when it was written
        h.stop(holder)

    log = await h.read_log()
    assert compare_outputs(replay(FiletypeGate(), log, use_snapshots=False), log) == []
    request = next(off for off, _ in WorkloadHarness.requests(log, INFERENCE_KIND))
    why = _fx(kafka_bootstrap, "why", wid, "--output", str(request), "--json")
    assert why.returncode == 0, why.stderr
    tree = json.loads(why.stdout)
    # the name the spec in force recorded (by the prod alias, then naming 1.0)
    assert tree["step"]["spec"]["model_names"] == {OLD: f"{model}@prod=1.0"}
    text = _fx(kafka_bootstrap, "why", wid, "--output", str(request))
    assert f"{model}@prod=1.0 ({OLD})" in text.stdout, text.stdout
    audited = _fx(kafka_bootstrap, "audit", wid, "--module", MODULE, "--json")
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert json.loads(audited.stdout)["model_names"][NEW] == f"{model}@canary=2.0"
    shown = _fx(kafka_bootstrap, "log", wid)
    assert shown.returncode == 0, shown.stderr
    assert f"{model}@1.0" in shown.stdout, shown.stdout


def test_signed_registrations_and_a_resolver_that_counts_only_them(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    model = f"signed-{uuid.uuid4().hex[:8]}"
    key = tmp_path / "fleet.pem"
    made = subprocess.run([sys.executable, "-m", "fx_cli.main", "keys", "fleet-init", "--out",
                           str(key)], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          check=False)
    assert made.returncode == 0, made.stderr
    public = json.loads(made.stdout[:made.stdout.index("}") + 1])["fleet_public_key"]
    signed = _fx(kafka_bootstrap, "models", "register", f"{model}@1.0", OLD, "--alias", "prod",
                 "--fleet-key", str(key))
    assert signed.returncode == 0 and "signed by sha256:" in signed.stdout, signed.stderr
    # an unsigned alias move (anyone who could write the topic, without the fleet key)
    assert _fx(kafka_bootstrap, "models", "register", f"{model}@2.0", NEW).returncode == 0
    assert _fx(kafka_bootstrap, "models", "alias", model, "prod", "2.0").returncode == 0
    listed = _fx(kafka_bootstrap, "models", "list", "--registry", "--json", "--fleet-key",
                 public)
    mine = [r for r in json.loads(listed.stdout) if r["name"] == model]
    assert [(r["version"], r["aliases"]) for r in mine] == [("1.0", ["prod"])]
    assert mine[0]["signed_by"].startswith("sha256:")
    assert f"not counted: {model}@2.0: unsigned" in listed.stderr
    # a spec written with the fleet key trusted resolves prod through signed records only
    wid = unique_workload_id
    env = dict(__import__("os").environ, FX_FLEET_PUBLIC_KEY=public)
    spec = subprocess.run([sys.executable, "-m", "fx_cli.main", "workload", "spec", wid,
                           "--module", MODULE, "--kind", INFERENCE_KIND, "--model",
                           f"filetype={model}@prod", "--force", "--bootstrap", kafka_bootstrap],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, env=env,
                          check=False)
    assert spec.returncode == 0, spec.stderr
    assert f"{model}@prod=1.0 = {OLD}" in spec.stdout
    unsigned_only = subprocess.run(
        [sys.executable, "-m", "fx_cli.main", "workload", "spec", wid, "--module", MODULE,
         "--kind", INFERENCE_KIND, "--model", f"filetype={model}@2.0", "--force",
         "--bootstrap", kafka_bootstrap], capture_output=True, text=True, cwd=ROOT,
        timeout=120, env=env, check=False)
    assert unsigned_only.returncode != 0 and "2.0" in unsigned_only.stderr
    assert "Traceback" not in unsigned_only.stderr
