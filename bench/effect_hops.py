"""One effect's round trip hop by hop, with the real executor, beside a bare aiokafka ping-pong.

    .venv/bin/python bench/effect_hops.py [--bootstrap HOST:PORT] [--n 100] [--json OUT.json]

Uses ``--bootstrap`` or ``FX_KAFKA_BOOTSTRAP``, else starts a local Apache Kafka. A lease holder
(in this process) runs a workload that asks one inference per input of a trivial ONNX model
(``y = x + 1``, float32 [1, 16]); an in-process :class:`executor.service.ExecutorService`
answers. Inputs go one at a time (one effect in flight). Per effect, from broker append times
(LogAppendTime: one clock) and the holder's own measure:

- ``request_to_commit``: the request's append to the holder's transaction commit returning
  (EndTxn answered; wall clock, as are the next two: :class:`TimingPoints`);
- ``request_to_executor_read``: the request's append to the executor's handler receiving it
  (its ``read_committed`` consumer sees it once the transaction's marker is written);
- ``executor_catch_up``: the executor's ``.claims``/``.spec`` catch-up before deciding;
- ``request_to_accepted``: the request's append on ``.out`` to its ``accepted`` on ``.resp``:
  the holder's transaction commit (the request is read ``read_committed``), the executor's
  fetch, decision and write;
- ``accepted_to_response``: ``accepted`` to the response (0 when both go in one produce
  request);
- ``response_to_holder_read``: the response's append to the holder's consumer handing it over
  (wall clock);
- ``response_to_step``: the response's append to the holder's step seeing it (the holder's
  read, its merge transaction not included);
- ``roundtrip``: the request's append to the step seeing its answer (the holder's figure).

The bare ping-pong is :func:`bench.effect_roundtrip.ping_pong` (a 100-byte request and its echo,
acks=all, no transactions). Bounded: ``--n`` effects, a timeout each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
from aiokafka import TopicPartition  # noqa: E402
from effect_roundtrip import Ping, ping_pong, summary  # noqa: E402
from executor_setup import executor_settings  # noqa: E402
from executor_throughput import trivial_model  # noqa: E402

from broker_schema import (  # noqa: E402
    INFERENCE_KIND,
    AcceptedRecord,
    EffectRequest,
    InlineBody,
    InputRecord,
    ResponseRecord,
    SpecRecord,
    decode,
    encode,
    topics,
)
from executor.config import load_config  # noqa: E402
from executor.models import ModelStore  # noqa: E402
from executor.service import ExecutorService  # noqa: E402
from fx_kafka.client import make_consumer, make_producer  # noqa: E402
from fx_kafka.testing import broker_for_tests  # noqa: E402
from fx_kafka.workload import ensure_system_topics, ensure_workload_topics  # noqa: E402
from fx_node.shell import NodeShell  # noqa: E402
from workload_sdk import (  # noqa: E402
    HolderConfig,
    LeaseHolder,
    module_hash,
)

TIMEOUT_S = 20.0


class TimingPoints:
    """Wall-clock timing points inside the holder and the executor of this process (the broker's
    append times are wall clock on this machine too): when the holder's transaction holding a
    request returned from its commit, when the executor's consumer handed the request over, and
    how long its ``.claims``/``.spec`` catch-up took. Installed by wrapping three methods for
    the run (``install``), removed after (``remove``); nothing else changes."""

    def __init__(self) -> None:
        self.committed: dict[int, float] = {}  # request append ms -> commit returned, ms
        self.read: dict[int, float] = {}  # request append ms -> executor handler, ms
        self.catch_up_ms: list[float] = []
        #: a response's append to the holder's consumer handing it over (ms)
        self.holder_read_ms: list[float] = []
        self._saved: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        points = self
        write, handle = LeaseHolder._write, NodeShell.handle
        sync = NodeShell.sync_workload

        async def timed_write(holder: Any, items: Any) -> Any:
            metas = await write(holder, items)
            done = time.time() * 1000
            for meta in metas:
                if meta.topic.endswith(".out"):
                    points.committed.setdefault(meta.timestamp, done)
            return metas

        async def timed_handle(service: Any, kind: Any, tracker: Any, tp: Any, msg: Any,
                               synced: Any) -> Any:
            points.read.setdefault(msg.timestamp, time.time() * 1000)
            return await handle(service, kind, tracker, tp, msg, synced)

        async def timed_sync(service: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await sync(service, *args, **kwargs)
            finally:
                points.catch_up_ms.append((time.perf_counter() - t0) * 1000)

        decode_item = LeaseHolder._decode

        def timed_decode(holder: Any, source: str, msg: Any) -> Any:
            item = decode_item(holder, source, msg)
            if item is not None and isinstance(item.record, ResponseRecord):
                points.holder_read_ms.append(time.time() * 1000 - msg.timestamp)
            return item

        for cls, name, fn in ((LeaseHolder, "_decode", timed_decode),
                              (LeaseHolder, "_write", timed_write),
                              (NodeShell, "handle", timed_handle),
                              (NodeShell, "sync_workload", timed_sync)):
            self._saved.append((cls, name, getattr(cls, name)))
            setattr(cls, name, fn)

    def remove(self) -> None:
        for cls, name, fn in self._saved:
            setattr(cls, name, fn)
        self._saved.clear()


async def _log(bootstrap: str, topic: str, until: int) -> list[Any]:
    """Every record of ``topic`` (partition 0) with its append time, up to ``until`` records."""
    consumer = make_consumer(bootstrap, isolation_level="read_uncommitted")
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        out: list[Any] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(out) < until and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=200)
            out.extend(batch.get(tp, []))
        return out
    finally:
        await consumer.stop()


async def effect_hops(bootstrap: str, n: int, tmp: Path, *, speculative_reads: bool = False,
                      model_name: str = "trivial") -> dict[str, Any]:
    """``n`` effects (after one unrecorded) with ``model_name`` (``trivial``: ``y = x + 1``;
    ``magika``: magika on 4 KB of Python source as JSON text)."""
    store = ModelStore(tmp / "models")
    if model_name == "magika":
        model = store.import_package("magika").hash
    else:
        trivial_model(tmp / "add1.onnx")
        model = store.import_path(tmp / "add1.onnx", name="add1").hash
    wid = f"hops-{uuid.uuid4().hex[:10]}"
    await ensure_workload_topics(bootstrap, wid)
    producer = make_producer(bootstrap)
    await producer.start()
    spec = SpecRecord(workload_id=wid, module_hash=module_hash(Ping), effect_kinds=(
        INFERENCE_KIND,), models={"m": model}, snapshot_every=10_000)
    await producer.send_and_wait(topics.spec(wid), encode(spec), partition=0)
    cfg = load_config(environ={}, **executor_settings(
        bootstrap, wid, tmp, store.root, node_id=f"hops-{wid}", group_prefix=f"hops-{wid}",
        workers=1, max_batch=1, kinds={INFERENCE_KIND: 1000}, preload=[model],
        speculative_reads=speculative_reads))
    points = TimingPoints()
    points.install()
    service = ExecutorService(cfg)
    exec_task = asyncio.create_task(service.run())
    holder = LeaseHolder(Ping(), HolderConfig(bootstrap=bootstrap, workload_id=wid,
                                              holder_id="hops", poll_ms=50,
                                              force_placement=True))
    stop = asyncio.Event()
    holder_task = asyncio.create_task(holder.run(stop))
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    tensor: Any = {"inputs": {"x": {"dtype": "float32", "shape": [1, 16],
                                    "data": x.ravel().tolist()}}}
    if model_name == "magika":
        tensor = {"text": (ROOT / "fx_node" / "admission.py").read_text()[:4096]}
    try:
        await asyncio.wait_for(holder.ready.wait(), 60)
        while not all(c.assignment() for c in service.node.consumers.values()):
            await asyncio.sleep(0.05)
        for i in range(n + 1):  # the first one warms up (model cost unknown: a worker runs it)
            before = len(holder.stats.roundtrips_ms)
            rec = InputRecord(workload_id=wid, body=InlineBody.of_json(tensor))
            await producer.send_and_wait(topics.inputs(wid), encode(rec), partition=0)
            t_end = time.monotonic() + TIMEOUT_S
            while len(holder.stats.roundtrips_ms) == before:
                if holder_task.done():
                    holder_task.result()
                if exec_task.done():
                    exec_task.result()
                if time.monotonic() > t_end:
                    raise TimeoutError(f"round trip {i} did not complete")
                await asyncio.sleep(0.0005)
    finally:
        stop.set()
        await asyncio.wait_for(holder_task, 30)
        service.request_stop()
        await asyncio.wait_for(exec_task, 60)
        await producer.stop()
        points.remove()
    roundtrips = list(holder.stats.roundtrips_ms)[1:]
    requests: dict[str, int] = {}
    for msg in await _log(bootstrap, topics.out(wid), n + 1):
        rec = decode(msg.value)
        if isinstance(rec, EffectRequest):
            requests[rec.effect_id] = msg.timestamp
    accepted: dict[str, int] = {}
    answered: dict[str, int] = {}
    for msg in await _log(bootstrap, topics.resp(wid), 2 * (n + 1)):
        rec = decode(msg.value)
        if isinstance(rec, AcceptedRecord):
            accepted.setdefault(rec.effect_id, msg.timestamp)
        elif isinstance(rec, ResponseRecord):
            answered.setdefault(rec.effect_id, msg.timestamp)
    order = sorted(requests, key=requests.__getitem__)[1:]
    req_acc = [float(accepted[e] - requests[e]) for e in order]
    acc_resp = [float(answered[e] - accepted[e]) for e in order]
    resp_step = [rt - (answered[e] - requests[e]) for e, rt in zip(order, roundtrips, strict=False)]
    commit = [points.committed[requests[e]] - requests[e] for e in order
              if requests[e] in points.committed]
    read = [points.read[requests[e]] - requests[e] for e in order if requests[e] in points.read]
    spec = {r: service.metrics.speculative.labels(r)._value.get()
            for r in ("prepared", "ran", "hit", "miss", "expired")} if speculative_reads else {}
    return {"speculative_reads": spec, "request_to_commit": summary(commit),
            "request_to_executor_read": summary(read),
            "executor_catch_up": summary(points.catch_up_ms[1:]) if points.catch_up_ms[1:]
            else {"n": 0},
            "request_to_accepted": summary(req_acc), "accepted_to_response": summary(acc_resp),
            "response_to_holder_read": summary(points.holder_read_ms[1:]),
            "response_to_step": summary(resp_step), "roundtrip": summary(roundtrips)}


async def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("FX_KAFKA_BOOTSTRAP"))
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--speculative-reads", action="store_true",
                        help="the executor with speculative_reads on")
    parser.add_argument("--model", choices=("trivial", "magika"), default="trivial")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fx-hops-") as d:
        if args.bootstrap:
            return await _run(args, args.bootstrap, Path(d))
        async with broker_for_tests() as bootstrap:
            return await _run(args, bootstrap, Path(d))


async def _run(args: argparse.Namespace, bootstrap: str, tmp: Path) -> dict[str, Any]:
    await ensure_system_topics(bootstrap)
    pp = summary(await ping_pong(bootstrap, args.n, warmup=20))
    hops = await effect_hops(bootstrap, args.n, tmp, speculative_reads=args.speculative_reads,
                             model_name=args.model)
    report = {"n": args.n, "load": os.getloadavg()[0], "ping_pong": pp, **hops,
              "ratio_p50": round(hops["roundtrip"]["p50_ms"] / pp["p50_ms"], 2),
              "ratio_p99": round(hops["roundtrip"]["p99_ms"] / pp["p99_ms"], 2)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return report


if __name__ == "__main__":
    asyncio.run(main())
