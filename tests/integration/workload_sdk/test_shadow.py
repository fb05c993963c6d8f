"""Shadow evaluation on a real broker with the project's real executor and two real models:
the file-type gate runs on magika ``standard_v3_2`` (magika 0.6.1), and ``fx shadow`` asks what
it would have decided on ``standard_v3_3`` (magika 1.0.3), over a recorded range and over live
traffic. The report names real differing decisions; nothing is written to the live streams;
``fx shadow show`` recomputes the same report from the records."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker_schema import (
    EffectRequest,
    MergeEntry,
    ModelName,
    OutputRecord,
    ShadowEvalRecord,
    decode,
    topics,
)
from executor.engines.onnx import OnnxEngine
from executor.models import ModelStore
from fx_kafka.workload_log import read_topic
from tests.integration.harness import ExecutorHarness
from workload_sdk import WorkloadLog
from workload_sdk.examples.filetype_corpus import corpus
from workload_sdk.examples.filetype_gate import ALLOWED

pytestmark = pytest.mark.integration

MODULE = "workload_sdk.examples.filetype_gate:FiletypeGate"
ROOT = Path(__file__).resolve().parents[3]
FILES = corpus(40, seed=1)


def _fx(bootstrap: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fx_cli.main", *args, "--bootstrap", bootstrap],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False)


def _decisions(log: WorkloadLog) -> list[dict[str, Any]]:
    return [o.body.data for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
            and "decision" in o.body.data]


def _gate_outcomes(log: WorkloadLog) -> int:
    return sum(1 for o in (decode(r.value) for r in log["out"])
               if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
               and "gate" in o.body.data)


def _labels(store: Path, model_hash: str, files: list[bytes]) -> list[str]:
    """What the model says of each file, run here directly (not through the executor)."""
    ms = ModelStore(store)
    engine = OnnxEngine()
    engine.load(ms.manifest(model_hash), ms.read_verified(model_hash))
    results = engine.run_batch(model_hash, [({}, f) for f in files])
    return [r.output["label"] for r in results]  # type: ignore[union-attr, index, call-overload]


def _ends(log: WorkloadLog) -> dict[str, int]:
    return {s: log[s].end for s in ("in", "spec", "claims", "out", "resp", "merge")}


async def _wait_decided(h: ExecutorHarness, n: int, executor: subprocess.Popen[bytes],
                        timeout: float = 180) -> WorkloadLog:
    deadline = time.monotonic() + timeout
    while True:
        log = await h.read_log()
        if len(_decisions(log)) >= n and _gate_outcomes(log) >= n:
            return log
        assert executor.poll() is None, h.tail()
        assert time.monotonic() < deadline, f"{len(_decisions(log))} of {n} decided"
        await asyncio.sleep(0.5)


async def test_shadow_over_history_and_live_with_two_real_magika_models(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path,
    magika_pair_store: tuple[Path, str, str], executor_harness: Callable[..., ExecutorHarness],
) -> None:
    store, v33, v32 = magika_pair_store
    wid = unique_workload_id
    # evaluation ids unique per run: `fx shadow show ID` finds the workload by its id, and a
    # broker kept across runs holds the evaluations of earlier runs
    run = wid[-8:]
    hist, modrebind, live_id = f"hist-{run}", f"modrebind-{run}", f"live-{run}"
    history, live_files = FILES[:30], FILES[30:]
    async with executor_harness(kafka_bootstrap, wid, store, models={"filetype": v32},
                                snapshot_every=10) as h:
        executor, holder = h.start_nodes("shadow-holder")
        for data in history:
            await h.send_input(data, source="upload")
        await _wait_decided(h, len(history), executor)
        assert h.stop(holder) == 0  # the live streams hold still from here
        before = await h.read_log()
        last_step = max(e.seq for e in (decode(r.value) for r in before["merge"])
                        if isinstance(e, MergeEntry))

        # --- shadow over history ------------------------------------------------------------
        # the candidate by its registry name (issue 28): resolved when the evaluation is
        # written, the name kept beside the hash on its shadow_eval record
        name = f"magika-{run}"
        reg = await asyncio.to_thread(_fx, kafka_bootstrap, "models", "register",
                                      f"{name}@3.3", v33, "--alias", "canary")
        assert reg.returncode == 0, reg.stderr
        html_path = tmp_path / "report.html"
        proc = await asyncio.to_thread(
            _fx, kafka_bootstrap, "shadow", wid, "--module", MODULE, "--model",
            f"filetype={name}@canary", "--eval-id", hist, "--json", "--html", str(html_path))
        assert proc.returncode in (0, 1), proc.stderr[-3000:]
        out = json.loads(proc.stdout)
        report = out["report"]
        assert "answered" in proc.stderr  # progress while it runs
        after = await h.read_log()
        assert _ends(after) == _ends(before), "the evaluation wrote to the live streams"
        for stream in ("out", "resp", "merge"):
            assert not any(b"shadow:" in r.value for r in after[stream]), stream

        # what the two models say, run here directly, is what the report says
        old_labels = _labels(store, v32, history)
        new_labels = _labels(store, v33, history)
        changed = {i for i, (a, b) in enumerate(zip(old_labels, new_labels, strict=True))
                   if a != b}
        assert changed, "the corpus must hold files the two models label differently"
        rows = report["per_request"]
        assert report["requests"] == len(history) == report["answered"] == len(rows)
        assert report["from_seq"] == 0 and report["to_seq"] == last_step
        # the step that took file X (its .in offset) asked about it
        step_of_file = {e.source_offset: e.seq for e in (decode(r.value) for r in before["merge"])
                        if isinstance(e, MergeEntry) and e.source == "in"
                        and e.action == "deliver"}
        file_of_step = {v: k for k, v in step_of_file.items()}
        by_file = {}
        for row in rows:
            by_file[file_of_step[row["seq"]]] = row
            assert row["outcome"] == ["ok", "ok"] and row["models"] == [v32, v33]
        assert sorted(by_file) == list(range(len(history)))
        for i in range(len(history)):
            assert by_file[i]["label"] == [old_labels[i], new_labels[i]], i
        assert report["label_changes"] == len(changed)
        # the gate decisions that change are the files whose label changed (and only those)
        differing = [d for d in report["differing"] if d["what"] == "output"]
        assert {d["recorded"]["file_offset"] for d in differing
                if "file_offset" in d["recorded"]} == changed
        assert report["decisions_differ"] >= len(changed) > 0
        assert report["first_differing"] is not None
        assert report["requests_diverged_at"] is None, report["divergence"]
        assert report["decisions_renamed_only"] == len(history) - len(changed)
        flips = [i for i in changed if (old_labels[i] in ALLOWED) != (new_labels[i] in ALLOWED)]
        commands = [d for d in report["differing"] if d["what"] == "request"]
        assert len(commands) == len(flips)  # each flip commands the gate the other way
        assert proc.returncode == 1
        # the report's own records, and the page with its plot
        ev_view = await read_topic(kafka_bootstrap, topics.shadow_stream(wid, hist, "eval"))
        kinds = [decode(r.value).kind for r in ev_view]
        assert kinds == ["shadow_eval", "shadow_report"]
        definition = decode(next(iter(ev_view)).value)
        assert isinstance(definition, ShadowEvalRecord)
        assert definition.models == {"filetype": v33}
        assert definition.model_names == {v33: ModelName(name=name, version="3.3",
                                                          alias="canary")}
        shadow_out = await read_topic(kafka_bootstrap, topics.shadow_stream(wid, hist, "out"))
        assert len(shadow_out) == len(history)
        assert all(isinstance(r, EffectRequest) and r.header.shadow == hist
                   and r.model == v33 for r in (decode(x.value) for x in shadow_out))
        page = html_path.read_text()
        png = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
        assert png and base64.b64decode(png[1]).startswith(b"\x89PNG\r\n\x1a\n")

        # --- replayable: fx shadow show recomputes the same report from the records ---------
        shown = await asyncio.to_thread(_fx, kafka_bootstrap, "shadow", "show", hist,
                                        "--workload", wid, "--module", MODULE, "--json")
        assert shown.returncode == 0, shown.stderr[-3000:]
        again = json.loads(shown.stdout)
        assert again["reproduced"] is True
        assert again["report"]["report_hash"] == report["report_hash"]

        # --- a module change beside the rebinding (issue 26): other code, the same decisions -
        # (a copy of the gate with one comment more: another module hash, the same behaviour)
        changed_code = tmp_path / "gate_changed.py"
        source = (ROOT / "workload_sdk" / "examples" / "filetype_gate.py").read_text()
        changed_code.write_text(source + "# the same gate, deployed again\n")
        mod = await asyncio.to_thread(
            _fx, kafka_bootstrap, "shadow", wid, "--module", f"{changed_code}:FiletypeGate",
            "--model", f"filetype={v33}", "--eval-id", modrebind, "--json")
        assert mod.returncode == 1, mod.stderr[-3000:]
        mrep = json.loads(mod.stdout)["report"]
        assert mrep["module"]["workload_class"] == "FiletypeGate", mrep.get("module")
        assert mrep["requests"] == mrep["answered"] == len(history)
        assert mrep["requests_diverged_at"] is None, mrep["divergence"]
        assert (mrep["label_changes"], mrep["decisions_differ"]) == (
            report["label_changes"], report["decisions_differ"])
        shown = await asyncio.to_thread(_fx, kafka_bootstrap, "shadow", "show", modrebind,
                                        "--workload", wid, "--module",
                                        f"{changed_code}:FiletypeGate", "--json")
        assert shown.returncode == 0 and json.loads(shown.stdout)["reproduced"] is True, \
            shown.stderr[-3000:]

        # --- bad input: clear refusals, nothing written --------------------------------------
        bad = await asyncio.to_thread(_fx, kafka_bootstrap, "shadow", wid, "--module", MODULE,
                                      "--model", f"filetype={v33}", "--to", "100000")
        assert bad.returncode == 2 and "the log has steps" in bad.stderr, bad.stderr
        same_id = await asyncio.to_thread(_fx, kafka_bootstrap, "shadow", wid, "--module",
                                          MODULE, "--model", f"filetype={v33}", "--eval-id",
                                          hist, "--from", "1")
        assert same_id.returncode == 2 and "another definition" in same_id.stderr
        nobody = "sha256:" + "0" * 64
        absent = await asyncio.to_thread(_fx, kafka_bootstrap, "shadow", wid, "--module",
                                         MODULE, "--model", f"filetype={nobody}")
        assert absent.returncode == 2 and "holds" in absent.stderr, absent.stderr

        # --- shadow over live traffic --------------------------------------------------------
        holder = h.start_holder("shadow-holder-2")
        live = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fx_cli.main", "shadow", wid, "--module", MODULE, "--model",
            f"filetype={v33}", "--live", "--window", "25s", "--eval-id", live_id, "--json",
            "--bootstrap", kafka_bootstrap, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        await asyncio.sleep(6)  # it reads where the workload is, then tails .out
        for data in live_files:
            await h.send_input(data, source="upload")
        stdout, stderr = await asyncio.wait_for(live.communicate(), 240)
        assert live.returncode in (0, 1), stderr.decode()[-3000:]
        lrep = json.loads(stdout)["report"]
        assert lrep["mode"] == "live" and lrep["from_seq"] == last_step + 1
        assert lrep["requests"] == len(live_files) == lrep["answered"]
        lold = _labels(store, v32, live_files)
        lnew = _labels(store, v33, live_files)
        assert lrep["label_changes"] == sum(a != b for a, b in zip(lold, lnew, strict=True))
        await _wait_decided(h, len(FILES), executor)
        final = await h.read_log()
        for stream in ("out", "resp", "merge"):
            assert not any(b"shadow:" in r.value for r in final[stream]), stream
        # the live workload kept deciding on its own model, untouched by the evaluation
        assert all(d["model"] == v32 for d in _decisions(final))
        assert h.stop(holder) == 0
        shown = await asyncio.to_thread(_fx, kafka_bootstrap, "shadow", "show", live_id,
                                        "--workload", wid, "--module", MODULE, "--json")
        assert shown.returncode == 0, shown.stderr[-3000:]
        assert json.loads(shown.stdout)["reproduced"] is True
        h.stop(executor)

