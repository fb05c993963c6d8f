"""Executor throughput and latency, side by side with direct ONNX Runtime calls in the same run.

    .venv/bin/python bench/executor_throughput.py [--requests 300] [--json OUT.json]

Uses ``FX_KAFKA_BOOTSTRAP`` if set, else starts a local Apache Kafka (fx_kafka.testing). For each
model (a trivial ONNX graph ``y = x + 1`` over float32 [1, 16] built with the ``onnx`` helper API
when ``onnx`` is installed, else the silero-vad opset-15 file on 0.1 s of silence; and magika on a
Python source file):

- ``direct``: ``InferenceSession.run`` in a loop, one request per call (and for magika also in
  batches of 8; its features built from the file's bytes on every call, as the executor does):
  requests/s and per-call latency;
- ``executor burst``: N requests written to ``wl.<id>.out`` at once, an in-process executor
  (1 worker thread, ``max_batch`` 1 and 8) answers them: requests/s from the first request's append
  to the last response's append, and latency per request from its append to its response's append
  (both broker LogAppendTime, so one clock);
- ``executor sequential``: one request at a time (write, wait for the response): the latency floor.

``--processes N`` (``auto``: one per core) measures instead the trivial model's burst through
``fx executor run --processes N`` (a real subprocess: N child nodes in the same consumer groups)
over N workloads (one ``.out`` partition each, so round robin gives each child one): the
requests per second of the machine (all requests, first append to last response append) and of
each process (its node's responses over its own span), for ``max_batch`` 1 and 8:

    .venv/bin/python bench/executor_throughput.py --processes auto --requests 2000

``--engine-cpu C`` puts the model on CPU ``C`` alone: the in-process executor with
``engine_cpus = [C]`` and ``loop_cpus`` = ``--rest-cpus`` (default: every other CPU this process
may use), so its event loop, the bench's client and every other thread of the process run
elsewhere; the direct loop runs on ``C`` too; a broker the bench starts itself (no
``FX_KAFKA_BOOTSTRAP``) is pinned to the rest CPUs (every thread of its processes). A shared
broker (``FX_KAFKA_BOOTSTRAP``) is not the bench's to pin: the results say so. ``--only magika``
(or ``trivial``) measures one model's direct loop and bursts (no sequential run), with a direct
loop right before each burst so that each ratio compares figures taken moments apart:

    .venv/bin/python bench/executor_throughput.py --only magika --engine-cpu 1 --requests 150

Every mode is bounded by a request count and a timeout; the run stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from aiokafka import TopicPartition

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from executor_setup import executor_settings  # noqa: E402

from broker_schema import decode, encode, topics  # noqa: E402
from broker_schema.records import (  # noqa: E402
    INFERENCE_KIND,
    ClaimRecord,
    EffectHeader,
    EffectRequest,
    InlineBody,
    ResponseRecord,
    SpecRecord,
)
from executor import affinity  # noqa: E402
from executor.config import load_config  # noqa: E402
from executor.engines.onnx import magika_features  # noqa: E402
from executor.models import ModelStore, locate_package_model  # noqa: E402
from executor.service import ExecutorService  # noqa: E402
from fx_kafka.client import make_consumer, make_producer  # noqa: E402
from fx_kafka.testing import broker_for_tests  # noqa: E402
from fx_kafka.workload import ensure_system_topics, ensure_workload_topics  # noqa: E402


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def summary(latencies_ms: list[float], seconds: float, n: int) -> dict[str, float]:
    return {
        "requests": n,
        "rps": round(n / seconds, 1) if seconds > 0 else 0.0,
        "p50_ms": round(pct(latencies_ms, 0.50), 3),
        "p99_ms": round(pct(latencies_ms, 0.99), 3),
        "mean_ms": round(statistics.fmean(latencies_ms), 3),
    }


def trivial_model(path: Path) -> bool:
    """Write ``y = x + 1`` (float32 [N, 16]) to ``path``; False when ``onnx`` is missing."""
    try:
        import onnx
        from onnx import TensorProto, helper
    except ImportError:
        return False
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "add1", [x], [y],
                              initializer=[one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return True


def direct(session: ort.InferenceSession, feeds: dict[str, Any] | Callable[[], dict[str, Any]],
           n: int) -> dict[str, float]:
    """``n`` calls of ``session.run``; ``feeds`` a callable: built for every call, inside the
    timing (magika's features from the file's bytes, as the executor does per request)."""
    make = feeds if callable(feeds) else (lambda: feeds)
    lat: list[float] = []
    session.run(None, make())  # warm
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        session.run(None, make())
        lat.append((time.perf_counter() - s) * 1000)
    return summary(lat, time.perf_counter() - t0, n)


def direct_on(cpu: int | None, session: ort.InferenceSession,
              feeds: dict[str, Any] | Callable[[], dict[str, Any]], n: int) -> dict[str, float]:
    """:func:`direct` with this (the calling) thread on ``cpu`` alone (None: as it is), its
    mask restored after."""
    if cpu is None:
        return direct(session, feeds, n)
    before = os.sched_getaffinity(0)
    affinity.pin_thread([cpu])
    try:
        return direct(session, feeds, n)
    finally:
        os.sched_setaffinity(0, before)


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, their children ...), from ``/proc``."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            parents[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out.extend(kids)
        todo.extend(kids)
    return out


def pin_broker(rest: list[int]) -> str:
    """Pin a broker this bench started (its processes are ours) to ``rest``; what was done."""
    if os.environ.get("FX_KAFKA_BOOTSTRAP"):
        return ("not pinned: the shared broker (FX_KAFKA_BOOTSTRAP) is not the bench's; it "
                "runs on any CPU, the engine's included")
    pids = descendants(os.getpid())
    threads = 0
    for p in pids:
        try:
            threads += affinity.pin_process(rest, pid=p)
        except OSError:
            continue
    return f"pinned to CPUs {affinity.format_cpus(rest)} ({len(pids)} processes, {threads} threads)"


def session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def task_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system) of every thread of this process, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for name in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def run_delay_s(tid: int) -> float:
    """Seconds thread ``tid`` of this process spent runnable but waiting for a CPU
    (``/proc/self/task/<tid>/schedstat``, its second field); 0 where the kernel does not say."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Bench:
    def __init__(self, bootstrap: str, store: ModelStore, tmp: Path,
                 pinning: dict[str, Any] | None = None) -> None:
        self.bootstrap, self.store, self.tmp = bootstrap, store, tmp
        #: ``engine_cpus`` / ``loop_cpus`` for the executor (empty: not pinned)
        self.pinning = pinning or {}

    async def executor_run(self, model_hash: str, data: bytes, n: int, *, max_batch: int,
                           sequential: bool, timeout: float = 120.0) -> dict[str, float]:
        wid = f"bench-{uuid.uuid4().hex[:10]}"
        await ensure_workload_topics(self.bootstrap, wid)
        producer = make_producer(self.bootstrap)
        await producer.start()
        cfg = load_config(environ={}, **executor_settings(
            self.bootstrap, wid, self.tmp, self.store.root, node_id=f"bench-{wid}",
            group_prefix=f"bench-{wid}", workers=1, max_batch=max_batch,
            kinds={INFERENCE_KIND: 10_000}, preload=[model_hash], **self.pinning))
        service = ExecutorService(cfg)
        task = asyncio.create_task(service.run())
        resp_consumer = make_consumer(self.bootstrap, isolation_level="read_uncommitted")
        await resp_consumer.start()
        try:
            await producer.send_and_wait(topics.spec(wid), encode(SpecRecord(
                workload_id=wid, module_hash="sha256:" + "1" * 64,
                effect_kinds=(INFERENCE_KIND,), models={"m": model_hash})))
            await producer.send_and_wait(topics.claims(wid), encode(ClaimRecord(
                workload_id=wid, epoch=1, holder_id="bench", spec_hash="sha256:" + "0" * 64,
                spec_offset=0)))
            while not all(c.assignment() for c in service.node.consumers.values()):
                await asyncio.sleep(0.05)
            tp = TopicPartition(topics.resp(wid), 0)
            resp_consumer.assign([tp])
            await resp_consumer.seek_to_beginning(tp)
            body = InlineBody.of_bytes(data)

            def req(i: int) -> bytes:
                return encode(EffectRequest(
                    header=EffectHeader(workload_id=wid, input_offset=i, index=0, epoch=1),
                    effect_kind=INFERENCE_KIND, model=model_hash, input=body,
                    deadline_ms=600_000))

            # where the CPU goes: the engine's worker thread (workers = 1), the event loop
            # (this, the main thread: the executor and the bench's client), the rest
            engine_tid = await asyncio.get_running_loop().run_in_executor(
                service.runner.answerer.threads, threading.get_native_id)
            cpu_before = task_cpu_s()
            main_tid = threading.get_native_id()
            waits_before = run_delay_s(engine_tid), run_delay_s(main_tid)
            sent: dict[int, int] = {}  # request offset -> append ms
            answered: dict[int, int] = {}  # request offset -> response append ms
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout

            async def drain(until: int) -> None:
                while len(answered) < until:
                    if loop.time() > deadline:
                        raise TimeoutError(f"{len(answered)}/{until} answered")
                    batch = await resp_consumer.getmany(tp, timeout_ms=200)
                    for msg in batch.get(tp, []):
                        rec = decode(msg.value)
                        if isinstance(rec, ResponseRecord):
                            assert rec.outcome == "ok", rec.error
                            answered[rec.request_offset] = msg.timestamp

            if sequential:
                for i in range(n):
                    meta = await producer.send_and_wait(topics.out(wid), req(i))
                    sent[meta.offset] = meta.timestamp
                    await drain(i + 1)
            else:
                futs = [await producer.send(topics.out(wid), req(i)) for i in range(n)]
                for f in futs:
                    meta = await f
                    sent[meta.offset] = meta.timestamp
                await drain(n)
            lat = [float(answered[o] - sent[o]) for o in sent]
            span = (max(answered.values()) - min(sent.values())) / 1000
            out = summary(lat, span, n)
            batches = service.metrics.registry.get_sample_value(
                "fx_executor_batch_size_sum", {"model": model_hash})
            calls = service.metrics.registry.get_sample_value(
                "fx_executor_batch_size_count", {"model": model_hash})
            out["mean_batch"] = round((batches or 0) / (calls or 1), 2)
            cpu = {t: c - cpu_before.get(t, 0.0) for t, c in task_cpu_s().items()}
            compute = service.metrics.registry.get_sample_value(
                "fx_executor_compute_duration_seconds_sum", {"model": model_hash})
            out["where"] = {
                "span_s": round(span, 3),
                "engine_wall_s": round(compute or 0.0, 3),  # inside the engine's calls
                "engine_thread_cpu_s": round(cpu.get(engine_tid, 0.0), 3),
                # runnable, waiting for a CPU (schedstat): not the GIL, not idle
                "engine_thread_cpu_wait_s": round(run_delay_s(engine_tid) - waits_before[0], 3),
                "loop_thread_cpu_s": round(cpu.get(main_tid, 0.0), 3),
                "loop_thread_cpu_wait_s": round(run_delay_s(main_tid) - waits_before[1], 3),
                "other_threads_cpu_s": round(sum(c for t, c in cpu.items()
                                                 if t not in (engine_tid, main_tid)), 3),
                "engine_thread_cpus": affinity.format_cpus(affinity.thread_cpus(engine_tid)),
                "loop_thread_cpus": affinity.format_cpus(affinity.thread_cpus(main_tid)),
            }
            return out
        finally:
            await resp_consumer.stop()
            service.request_stop()
            await asyncio.wait_for(task, 60)
            await producer.stop()


def trivial_case(store: ModelStore, tmp: Path) -> tuple[Any, dict[str, Any], bytes, str]:
    """The trivial model (imported into ``store``): its manifest, direct feeds, the request
    input and a description."""
    trivial_path = tmp / "add1.onnx"
    if trivial_model(trivial_path):
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        return (store.import_path(trivial_path, name="add1"), {"x": x},
                json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [1, 16],
                                             "data": x.ravel().tolist()}}}).encode(),
                "onnx helper: y = x + 1, float32 [1, 16]")
    src = locate_package_model("silero_vad", "data/silero_vad_16k_op15.onnx")
    feeds = {"input": np.zeros((1, 576), np.float32), "state": np.zeros((2, 1, 128), np.float32),
             "sr": np.array(16000, np.int64)}
    data = json.dumps({"inputs": {
        "input": {"dtype": "float32", "shape": [1, 576], "data": [0.0] * 576},
        "state": {"dtype": "float32", "shape": [2, 1, 128], "data": [0.0] * 256},
        "sr": {"dtype": "int64", "shape": [], "data": 16000}}}).encode()
    return (store.import_path(src, name="silero-op15"), feeds, data,
            "silero-vad op15, one 512-sample chunk (onnx missing)")


async def processes_burst(bootstrap: str, store: ModelStore, tmp: Path, model_hash: str,
                          data: bytes, *, processes: int, per_process: int, max_batch: int,
                          timeout: float = 300.0) -> dict[str, Any]:
    """``per_process`` requests for each of ``processes`` workloads written at once, answered by
    ``fx executor run --processes N``: requests/s of the machine and of each process."""
    run = uuid.uuid4().hex[:8]
    wids = [f"benchp{run}-{i}" for i in range(processes)]
    for wid in wids:
        await ensure_workload_topics(bootstrap, wid)
    work = tmp / f"procs-{run}"
    work.mkdir()
    config = work / "executor.json"
    config.write_text(json.dumps(executor_settings(
        bootstrap, wids[0], work, store.root, node_id=f"bench-{run}",
        group_prefix=f"bench-{run}", topic_pattern=rf"^wl\.benchp{run}-[0-9]+\.out$",
        workers=1, max_batch=max_batch, kinds={INFERENCE_KIND: 10_000},
        preload=[model_hash], device="cpu", session_timeout_ms=6000,
        heartbeat_interval_ms=500)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FX_EXECUTOR_")}
    log = (work / "executor.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "fx_cli.main", "executor", "run", "--config",
                             str(config), "--processes", str(processes)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    producer = make_producer(bootstrap)
    await producer.start()
    consumer = make_consumer(bootstrap, isolation_level="read_uncommitted")
    await consumer.start()
    body = InlineBody.of_bytes(data)
    offsets = dict.fromkeys(wids, 0)
    tps = [TopicPartition(topics.resp(w), 0) for w in wids]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    #: (workload, request offset) -> (response append ms, node)
    answered: dict[tuple[str, int], tuple[int, str]] = {}
    try:
        for wid in wids:
            await producer.send_and_wait(topics.spec(wid), encode(SpecRecord(
                workload_id=wid, module_hash="sha256:" + "1" * 64,
                effect_kinds=(INFERENCE_KIND,), models={"m": model_hash})))
            await producer.send_and_wait(topics.claims(wid), encode(ClaimRecord(
                workload_id=wid, epoch=1, holder_id="bench", spec_hash="sha256:" + "0" * 64,
                spec_offset=0)))
        consumer.assign(tps)
        for tp in tps:
            await consumer.seek_to_beginning(tp)

        async def send(wid: str) -> Any:
            i = offsets[wid]
            offsets[wid] += 1
            return await producer.send(topics.out(wid), encode(EffectRequest(
                header=EffectHeader(workload_id=wid, input_offset=i, index=0, epoch=1),
                effect_kind=INFERENCE_KIND, model=model_hash, input=body,
                deadline_ms=600_000)))

        async def drain(until: int) -> None:
            while len(answered) < until:
                if loop.time() > deadline or proc.poll() is not None:
                    raise TimeoutError(f"{len(answered)}/{until} answered (executor "
                                       f"{proc.poll()}; log {work / 'executor.log'})")
                batch = await consumer.getmany(*tps, timeout_ms=200)
                for tp, msgs in batch.items():
                    for msg in msgs:
                        rec = decode(msg.value)
                        if isinstance(rec, ResponseRecord):
                            assert rec.outcome == "ok", rec.error
                            answered[(tp.topic, rec.request_offset)] = (msg.timestamp,
                                                                        rec.written_by)

        # warm up until each workload is answered by a node of its own (the group settled)
        while True:
            for wid in wids:
                await (await send(wid))
            await drain(len(answered) + len(wids))
            last = {t: max((k[1], v[1]) for k, v in answered.items() if k[0] == t)[1]
                    for t in (topics.resp(w) for w in wids)}
            if len(set(last.values())) == processes:
                break
            await asyncio.sleep(0.5)
        warm = len(answered)
        sent: dict[tuple[str, int], int] = {}
        futs = [(w, await send(w)) for _ in range(per_process) for w in wids]
        for wid, fut in futs:
            meta = await fut
            sent[(topics.resp(wid), meta.offset)] = meta.timestamp
        await drain(warm + len(sent))
        burst = {k: answered[k] for k in sent}
        span = (max(t for t, _ in burst.values()) - min(sent.values())) / 1000
        nodes: dict[str, list[tuple[str, int]]] = {}
        for k, (_, node) in burst.items():
            nodes.setdefault(node, []).append(k)
        per_node = {}
        for node, keys in sorted(nodes.items()):
            s_ = (max(burst[k][0] for k in keys) - min(sent[k] for k in keys)) / 1000
            per_node[node] = {"requests": len(keys),
                              "rps": round(len(keys) / s_, 1) if s_ > 0 else 0.0}
        machine = round(len(sent) / span, 1) if span > 0 else 0.0
        return {"processes": processes, "max_batch": max_batch, "requests": len(sent),
                "machine_rps": machine, "per_process_rps_mean": round(machine / processes, 1),
                "per_process": per_node}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        await consumer.stop()
        await producer.stop()


async def main_processes(args: argparse.Namespace) -> dict[str, Any]:
    """``--processes N``: the trivial model's burst per process and per machine."""
    from executor.processes import cores, resolve_processes

    n = resolve_processes(args.processes, cores())
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cores": cores(), "python": platform.python_version(), "load": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory(prefix="fx-bench-") as d:
        tmp = Path(d)
        store = ModelStore(tmp / "models")
        trivial, _, data, what = trivial_case(store, tmp)
        results["trivial_model"] = what
        async with broker_for_tests() as bootstrap:
            await ensure_system_topics(bootstrap)
            results["bursts"] = [
                await processes_burst(bootstrap, store, tmp, trivial.hash, data, processes=n,
                                      per_process=args.requests, max_batch=mb)
                for mb in (1, 8)]
    results["load_after"] = os.getloadavg()
    return results


def pinning_of(args: argparse.Namespace) -> tuple[int | None, dict[str, Any]]:
    """``--engine-cpu`` / ``--rest-cpus``: the engine's CPU and the executor's settings."""
    if args.engine_cpu is None:
        return None, {}
    allowed = sorted(os.sched_getaffinity(0))
    try:
        cpu = allowed[-1] if args.engine_cpu == "auto" else int(args.engine_cpu)
    except ValueError:
        raise SystemExit(f"executor_throughput: --engine-cpu takes a CPU id or 'auto', not "
                         f"{args.engine_cpu!r}") from None
    rest = (affinity.parse_cpus(args.rest_cpus) if args.rest_cpus
            else [c for c in allowed if c != cpu] or allowed)
    problem = affinity.cpus_problem([cpu], rest, allowed)
    if problem:
        raise SystemExit(f"executor_throughput: {problem}")
    return cpu, {"engine_cpus": [cpu], "loop_cpus": rest}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    n = args.requests
    cpu, pinning = pinning_of(args)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(), "onnxruntime": ort.__version__,
        "requests": n, "load": os.getloadavg(),
        "pinning": ({"engine_cpu": cpu, "rest_cpus": pinning["loop_cpus"]} if pinning
                    else "none"),
    }
    if args.only:
        return await main_one(args, results, cpu, pinning)
    with tempfile.TemporaryDirectory(prefix="fx-bench-") as d:
        tmp = Path(d)
        store = ModelStore(tmp / "models")
        magika = store.import_package("magika")
        trivial, trivial_feeds, trivial_input, results["trivial_model"] = trivial_case(store,
                                                                                      tmp)
        py = (ROOT / "fx_node" / "admission.py").read_bytes()
        cfg = magika.config

        def magika_feeds(k: int) -> Callable[[], dict[str, Any]]:
            # the executor's work per request: features from the bytes, an int32 [k, 2048]
            return lambda: {"bytes": np.asarray(
                [magika_features(py, cfg) for _ in range(k)], dtype=np.int32)}

        msess = session(store.path(magika.hash))
        results["direct"] = {
            "trivial": direct_on(cpu, session(store.path(trivial.hash)), trivial_feeds, n),
            "magika": direct_on(cpu, msess, magika_feeds(1), n),
        }
        b8 = direct_on(cpu, msess, magika_feeds(8), max(1, n // 8))
        b8["rps"] = round(b8["rps"] * 8, 1)  # requests, not calls
        results["direct"]["magika_batch8"] = b8

        async with broker_for_tests() as bootstrap:
            if pinning:
                results["broker"] = pin_broker(pinning["loop_cpus"])
            await ensure_system_topics(bootstrap)
            bench = Bench(bootstrap, store, tmp, pinning)
            ex: dict[str, Any] = {}
            for name, mh, data in (("trivial", trivial.hash, trivial_input),
                                   ("magika", magika.hash, py)):
                ex[f"{name}_sequential"] = await bench.executor_run(
                    mh, data, min(n, 100), max_batch=1, sequential=True)
                ex[f"{name}_burst_batch1"] = await bench.executor_run(
                    mh, data, n, max_batch=1, sequential=False)
                ex[f"{name}_burst_batch8"] = await bench.executor_run(
                    mh, data, n, max_batch=8, sequential=False)
            results["executor"] = ex
    d_ = results["direct"]
    results["ratios"] = {
        f"{k}: executor rps / direct rps": round(v["rps"] / d_[k.split("_")[0]]["rps"], 4)
        for k, v in results["executor"].items()
    }
    return results


async def main_one(args: argparse.Namespace, results: dict[str, Any], cpu: int | None,
                   pinning: dict[str, Any]) -> dict[str, Any]:
    """``--only MODEL``: that model's bursts (max_batch 1 and 8), each right after a direct
    loop of the same model (batch 1, on the engine's CPU when pinned): ratios of figures taken
    moments apart, on a machine whose load moves."""
    n = args.requests
    with tempfile.TemporaryDirectory(prefix="fx-bench-") as d:
        tmp = Path(d)
        store = ModelStore(tmp / "models")
        if args.only == "magika":
            manifest = store.import_package("magika")
            data = (ROOT / "fx_node" / "admission.py").read_bytes()
            cfg = manifest.config

            def feeds() -> dict[str, Any]:
                return {"bytes": np.asarray([magika_features(data, cfg)], dtype=np.int32)}

            results["model"] = "magika standard_v3_3 on fx_node/admission.py"
            make: dict[str, Any] | Callable[[], dict[str, Any]] = feeds
        else:
            manifest, make, data, results["model"] = trivial_case(store, tmp)
        sess = session(store.path(manifest.hash))
        async with broker_for_tests() as bootstrap:
            if pinning:
                results["broker"] = pin_broker(pinning["loop_cpus"])
            await ensure_system_topics(bootstrap)
            bench = Bench(bootstrap, store, tmp, pinning)
            runs: dict[str, Any] = {}
            for mb in (1, 8):
                runs[f"direct_before_batch{mb}"] = direct_on(cpu, sess, make, n)
                runs[f"burst_batch{mb}"] = await bench.executor_run(
                    manifest.hash, data, n, max_batch=mb, sequential=False)
            results["runs"] = runs
    results["ratios"] = {
        f"burst_batch{mb}: executor rps / direct rps just before": round(
            runs[f"burst_batch{mb}"]["rps"] / runs[f"direct_before_batch{mb}"]["rps"], 4)
        for mb in (1, 8)}
    results["load_after"] = os.getloadavg()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--processes", metavar="N|auto",
                        help="measure the trivial model's burst through fx executor run "
                        "--processes N instead (--requests per process)")
    parser.add_argument("--only", choices=("magika", "trivial"),
                        help="one model: direct loops and bursts only, each burst right after "
                        "a direct loop")
    parser.add_argument("--engine-cpu", metavar="C|auto",
                        help="the executor's engine thread and the direct loop on CPU C alone "
                        "(engine_cpus; auto: the last CPU this process may use), the rest of "
                        "the process on --rest-cpus")
    parser.add_argument("--rest-cpus", metavar="LIST",
                        help="with --engine-cpu: CPUs for the rest of the process and a broker "
                        "the bench starts (taskset -c form; default: every other CPU)")
    a = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    res = asyncio.run(main_processes(a) if a.processes else main(a))
    text = json.dumps(res, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
