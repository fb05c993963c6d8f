"""Replay vs re-running the model on the same inputs: magika, and the integer LLM (SmolLM2-135M).

    .venv/bin/python bench/replay_speed.py [--quick] [--files 300] [--prompts 3] [--tokens 8]
                                           [--no-llm] [--json]

For each model a workload's log is built without a broker: the simulated lease holder of the
unit tests (tests/unit/workload_sdk/sim.py: the live holder's pure functions over an in-memory
log, Kafka-style offsets and transaction gaps) merges real inputs, and each request is answered
with the model's real output, computed here (magika through onnxruntime, 1 thread, as the executor
runs it; the integer oracle through ``fx_integer``'s engine, greedy, its receipt in the response),
signed with Ed25519 as an executor signs. Then, in the same process:

- **replay**: ``workload_sdk.replay`` of the whole log from seq 0, no snapshots (best of 3),
  strict (the default: every record validated again) and with ``trust_log=True`` (records the
  holder validated when it merged them are not validated again), alternating;
- **re-inference**: the model re-run on the same inputs, one request per call (magika: features +
  ``InferenceSession.run`` + labelling; LLM: the same generation through the oracle).

magika runs twice: with each file inline in its input record (base64), and with each file in the
chunk store and its input record holding a ``ChunkRef`` (the bytes resolved beside the log, as
the log readers do; the step passes the reference on as the request's input).

The figure is re-inference time ÷ replay time. Bounded: a fixed number of inputs, no waiting.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from broker_schema import (  # noqa: E402
    INFERENCE_KIND,
    ChunkRef,
    EffectRequest,
    InlineBody,
    ResponseRecord,
    SpecRecord,
    decode,
)
from tests.unit.workload_sdk.sim import WID, Sim, sign  # noqa: E402
from workload_sdk import (  # noqa: E402
    EffectResult,
    InputEvent,
    Output,
    State,
    Workload,
    emit,
    infer,
    module_hash,
    replay,
)


class AskOnce(Workload):
    """Asks the model once per input (the input's bytes as the request's input); emits the
    answer's label (or text) and counts answers by label."""

    def initial_state(self) -> State:
        return {"asked": 0, "labels": {}}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        if isinstance(event, InputEvent):
            return (dict(state, asked=state["asked"] + 1),
                    [infer(model="m", input=event.body, deadline_ms=600_000)])
        answer = event.json() if event.ok else {}
        label = str(answer.get("label", answer.get("text", event.outcome)))[:40]
        labels = dict(state["labels"])
        labels[label] = labels.get(label, 0) + 1
        return dict(state, labels=labels), [emit({"effect": event.effect_id, "label": label})]


def build_log(inputs: list[bytes], answer: Callable[[bytes], dict[str, Any]],
              receipt: Callable[[bytes], dict[str, Any] | None] | None = None, *,
              chunks: bool = False) -> Sim:
    """The workload's log: every input merged, asked, answered with the model's output."""
    spec = SpecRecord(workload_id=WID, module_hash=module_hash(AskOnce),
                      effect_kinds=(INFERENCE_KIND,), models={"m": "sha256:" + "ab" * 32},
                      outstanding_limit=10_000, deadline_default_ms=600_000,
                      executor_lease_ms=600_000, snapshot_every=1_000_000)
    key = Ed25519PrivateKey.generate()
    sim = Sim(spec=spec, workload=AskOnce(), key=key)
    sim.start()
    holder = sim.holder
    assert holder is not None
    seen_out = 0
    for data in inputs:
        sim.input_body(sim.put_chunk(data) if chunks else InlineBody.of_bytes(data))
        holder.pump()
        out = sim.log["out"]
        new = [(o, out.records[o]) for o in range(seen_out, out.end) if o in out.records]
        seen_out = out.end
        for offset, rec in new:
            req = decode(rec.value)
            if not isinstance(req, EffectRequest):
                continue
            raw = (req.input.raw() if isinstance(req.input, InlineBody)
                   else sim.chunks[req.input.hash] if isinstance(req.input, ChunkRef) else b"")
            resp = ResponseRecord(
                effect_id=req.effect_id, header=req.header, request_offset=offset,
                outcome="ok", output=InlineBody.of_json(answer(raw)), model_hash=req.model,
                written_by="exec-1", receipt=receipt(raw) if receipt else None)
            sim.append("resp", sign(resp, key))
        holder.pump()
        sim.now += 5
    holder.drain()
    return sim


def time_replay(sim: Sim, rounds: int = 3) -> dict[str, Any]:
    """Best of ``rounds`` replays of each kind, strict (the default) and ``trust_log=True``,
    alternating, each of a fresh copy of the log (nothing decoded yet); both must reach the same
    state hash and outputs."""
    pristine = copy.deepcopy(sim.log)
    best = {False: float("inf"), True: float("inf")}
    results: dict[bool, Any] = {}
    for _ in range(rounds):
        for trusted in (False, True):
            log = copy.deepcopy(pristine)
            t0 = time.perf_counter()
            results[trusted] = replay(sim.workload, log, use_snapshots=False, trust_log=trusted)
            best[trusted] = min(best[trusted], time.perf_counter() - t0)
    strict, trusted_result = results[False], results[True]
    assert strict.core.state_hash == trusted_result.core.state_hash
    assert strict.outputs == trusted_result.outputs
    return {"steps": strict.steps, "merge_entries": strict.entries,
            "replay_s": round(best[False], 4), "steps_per_s": round(strict.steps / best[False]),
            "trusted_replay_s": round(best[True], 4),
            "trusted_steps_per_s": round(strict.steps / best[True])}


def magika_case(n_files: int, chunks: bool = False) -> dict[str, Any]:
    from executor.engines.onnx import _magika_label, magika_features
    from executor.models import ModelStore

    with tempfile.TemporaryDirectory(prefix="fx-replay-bench-") as d:
        store = ModelStore(Path(d) / "models")
        manifest = store.import_package("magika")
        cfg = manifest.config
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(store.path(manifest.hash)), sess_options=opts,
                                    providers=["CPUExecutionProvider"])
        files = sorted(p for p in ROOT.rglob("*") if p.is_file() and p.suffix in {
            ".py", ".md", ".json", ".toml", ".sh", ".yml", ".yaml", ".txt", ".cu", ".html"}
            and ".venv" not in p.parts and ".git" not in p.parts)
        inputs = [p.read_bytes()[:12_000] for p in files[:n_files]]
        inputs = [b for b in inputs if len(b) >= 16]
        input_name = sess.get_inputs()[0].name

        def run(data: bytes) -> dict[str, Any]:
            feats = magika_features(data, cfg)
            assert feats is not None
            scores = sess.run(None, {input_name: np.asarray([feats], dtype=np.int32)})[0][0]
            return dict(_magika_label(scores, "high-confidence", 3, cfg))

        sim = build_log(inputs, run, chunks=chunks)
        t0 = time.perf_counter()
        for data in inputs:
            run(data)
        rerun_s = time.perf_counter() - t0
    rep = time_replay(sim)
    return {"inputs": len(inputs), "bodies": "chunk" if chunks else "inline",
            "reinference_s": round(rerun_s, 4), **rep,
            "ratio": round(rerun_s / rep["replay_s"], 1),
            "trusted_ratio": round(rerun_s / rep["trusted_replay_s"], 1)}


PROMPTS = ["What is the capital of France?", "Name a colour of the sky.",
           "Is water wet? Answer yes or no.", "Count from one to three.",
           "What do bees make?", "Say hello."]


def llm_case(n_prompts: int, max_tokens: int) -> dict[str, Any]:
    import fx_integer
    from fx_integer import model_paths

    art = fx_integer.load_artifact(model_paths.ensure_artifact())
    engine = fx_integer.engine_for(art, backend="oracle")
    prompts = [p.encode() for p in (PROMPTS * 4)[:n_prompts]]
    runs: dict[bytes, dict[str, Any]] = {}

    def run(prompt: bytes) -> dict[str, Any]:
        return dict(engine.run({"prompt": prompt.decode(), "chat": True,
                                "max_tokens": max_tokens, "temperature": 0}))

    def answer(prompt: bytes) -> dict[str, Any]:
        out = runs.setdefault(prompt, run(prompt))
        return {k: out[k] for k in ("text", "output_tokens", "finish_reason")}

    def receipt(prompt: bytes) -> dict[str, Any]:
        return dict(runs[prompt]["receipt"])

    t0 = time.perf_counter()
    for prompt in prompts:
        runs[prompt] = run(prompt)
    rerun_s = time.perf_counter() - t0
    sim = build_log(prompts, answer, receipt)
    rep = time_replay(sim)
    return {"inputs": len(prompts), "max_tokens": max_tokens, "reinference_s": round(rerun_s, 3),
            **rep, "ratio": round(rerun_s / rep["replay_s"], 1),
            "trusted_ratio": round(rerun_s / rep["trusted_replay_s"], 1)}


def measure(*, files: int, prompts: int, tokens: int, llm: bool,
            chunks: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"magika": magika_case(files)}
    if chunks:
        out["magika_chunks"] = magika_case(files, chunks=True)
    if llm:
        out["integer_llm"] = llm_case(prompts, tokens)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="150 files, 2 prompts of 6 tokens")
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--no-llm", action="store_true")
    ap.add_argument("--no-chunks", action="store_true",
                    help="skip the magika case whose inputs are chunk references")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.quick:
        a.files, a.prompts, a.tokens = min(a.files, 150), min(a.prompts, 2), min(a.tokens, 6)
    report = measure(files=a.files, prompts=a.prompts, tokens=a.tokens, llm=not a.no_llm,
                     chunks=not a.no_chunks)
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        for name, r in report.items():
            print(f"{name:12} {r['inputs']} inputs: re-inference {r['reinference_s']} s, "
                  f"replay {r['replay_s']} s ({r['steps_per_s']} steps/s): {r['ratio']}×; "
                  f"trust_log {r['trusted_replay_s']} s ({r['trusted_steps_per_s']} steps/s): "
                  f"{r['trusted_ratio']}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
