"""Effect round trip vs a bare aiokafka request/reply ping-pong, on the same broker, in one run;
and replay speed.

    .venv/bin/python bench/effect_roundtrip.py --bootstrap HOST:PORT [--n 200] [--json]

1. ping-pong: a producer sends a 100-byte request (acks=all), a responder consumes it and sends a
   reply, the requester consumes the reply. Time: send start to reply received.
2. effect: a lease holder (in this process) runs a workload that asks one inference per input; a
   responder plays the executor (``accepted`` then ``response``, no model). Time: the request's
   broker append time to the step seeing its answer (the holder's own measure). Inputs go one at a
   time, so there is one effect in flight.
3. replay: the effect run's log, replayed from seq 0 (no snapshots) several times; merge entries/s.

Bounded: ``--n`` round trips each, a timeout per round trip, then it stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiokafka import TopicPartition

from broker_schema import (
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
from fx_kafka.client import create_topics, make_consumer, make_producer
from fx_kafka.workload import ensure_workload_topics
from workload_sdk import (
    EffectResult,
    HolderConfig,
    InputEvent,
    LeaseHolder,
    Output,
    State,
    Workload,
    emit,
    infer,
    module_hash,
    replay,
)
from workload_sdk._kafka_io import read_workload_log

MODEL = "sha256:" + "be" * 32
TIMEOUT_S = 10.0


class Ping(Workload):
    """One inference per input; emits the answer."""

    def initial_state(self) -> State:
        return {"n": 0}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        if isinstance(event, InputEvent):
            return {"n": state["n"] + 1}, [infer(model="m", input=event.json(),
                                                 deadline_ms=30_000)]
        return state, [emit({"answer": event.outcome})]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_ms": round(pct(values, 50), 3),
            "p99_ms": round(pct(values, 99), 3), "mean_ms": round(statistics.fmean(values), 3)}


async def ping_pong(bootstrap: str, n: int) -> list[float]:
    run = uuid.uuid4().hex[:8]
    req_t, rep_t = f"bench.ping.{run}", f"bench.pong.{run}"
    await create_topics(bootstrap, [req_t, rep_t])
    producer = make_producer(bootstrap)
    responder_out = make_producer(bootstrap)
    req_c = make_consumer(bootstrap, auto_offset_reset="latest")
    rep_c = make_consumer(bootstrap, auto_offset_reset="latest")
    for client in (producer, responder_out, req_c, rep_c):
        await client.start()
    req_c.assign([TopicPartition(req_t, 0)])
    rep_c.assign([TopicPartition(rep_t, 0)])
    await req_c.seek_to_end()
    await rep_c.seek_to_end()

    async def responder() -> None:
        while True:
            batch = await req_c.getmany(timeout_ms=100)
            for msgs in batch.values():
                for msg in msgs:
                    await responder_out.send_and_wait(rep_t, value=msg.value, partition=0)

    task = asyncio.create_task(responder())
    samples = []
    try:
        payload = b"x" * 100
        for _ in range(n):
            t0 = time.perf_counter()
            await producer.send_and_wait(req_t, value=payload, partition=0)
            got = False
            while not got:
                batch = await asyncio.wait_for(rep_c.getmany(timeout_ms=100), TIMEOUT_S)
                got = any(batch.values())
            samples.append((time.perf_counter() - t0) * 1000)
    finally:
        task.cancel()
        for client in (producer, responder_out, req_c, rep_c):
            await client.stop()
    return samples


async def effect_roundtrip(bootstrap: str, n: int) -> tuple[list[float], str]:
    wid = f"bench-{uuid.uuid4().hex[:10]}"
    await ensure_workload_topics(bootstrap, wid)
    producer = make_producer(bootstrap)
    await producer.start()
    spec = SpecRecord(workload_id=wid, module_hash=module_hash(Ping), effect_kinds=(
        INFERENCE_KIND,), models={"m": MODEL}, snapshot_every=10_000)
    await producer.send_and_wait(topics.spec(wid), encode(spec), partition=0)
    holder = LeaseHolder(Ping(), HolderConfig(bootstrap=bootstrap, workload_id=wid,
                                              holder_id="bench", poll_ms=50,
                                              force_placement=True))
    stop = asyncio.Event()
    holder_task = asyncio.create_task(holder.run(stop))
    out_c = make_consumer(bootstrap)
    await out_c.start()
    out_c.assign([TopicPartition(topics.out(wid), 0)])

    async def executor() -> None:
        while True:
            batch = await out_c.getmany(timeout_ms=100)
            for msgs in batch.values():
                for msg in msgs:
                    req = decode(msg.value)
                    if not isinstance(req, EffectRequest):
                        continue
                    acc = AcceptedRecord(effect_id=req.effect_id, header=req.header,
                                         request_offset=msg.offset, node_id="bench-exec",
                                         lease_ms=30_000, accepted_us=int(time.time() * 1e6))
                    resp = ResponseRecord(effect_id=req.effect_id, header=req.header,
                                          request_offset=msg.offset, outcome="ok",
                                          output=InlineBody.of_json({"label": "txt"}),
                                          model_hash=req.model, written_by="bench-exec")
                    await producer.send(topics.resp(wid), encode(acc), partition=0)
                    await producer.send_and_wait(topics.resp(wid), encode(resp), partition=0)

    exec_task = asyncio.create_task(executor())
    try:
        await asyncio.wait_for(holder.ready.wait(), 60)
        for i in range(n):
            before = len(holder.stats.roundtrips_ms)
            rec = InputRecord(workload_id=wid, body=InlineBody.of_json(i))
            await producer.send_and_wait(topics.inputs(wid), encode(rec), partition=0)
            t_end = time.monotonic() + TIMEOUT_S
            while len(holder.stats.roundtrips_ms) == before:
                if holder_task.done():
                    holder_task.result()
                if time.monotonic() > t_end:
                    raise TimeoutError(f"round trip {i} did not complete")
                await asyncio.sleep(0.0005)
    finally:
        exec_task.cancel()
        stop.set()
        await asyncio.wait_for(holder_task, 30)
        await out_c.stop()
        await producer.stop()
    return list(holder.stats.roundtrips_ms), wid


async def replay_speed(bootstrap: str, wid: str, rounds: int = 5) -> dict[str, Any]:
    log = await read_workload_log(bootstrap, wid, with_facts=False)
    entries = len(log["merge"])
    best = float("inf")
    for _ in range(rounds):
        fresh = copy.deepcopy(log)  # nothing decoded yet: a log record keeps its parse
        t0 = time.perf_counter()
        result = replay(Ping(), fresh, use_snapshots=False)
        best = min(best, time.perf_counter() - t0)
    return {"merge_records": entries, "steps": result.steps, "best_s": round(best, 4),
            "records_per_s": round(entries / best), "steps_per_s": round(result.steps / best)}


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("FX_KAFKA_BOOTSTRAP"))
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not args.bootstrap:
        parser.error("--bootstrap or FX_KAFKA_BOOTSTRAP is required")
    pp = await ping_pong(args.bootstrap, args.n)
    eff, wid = await effect_roundtrip(args.bootstrap, args.n)
    rs = await replay_speed(args.bootstrap, wid)
    report = {"n": args.n, "ping_pong": summary(pp), "effect_roundtrip": summary(eff),
              "replay": rs}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"bare aiokafka ping-pong : p50 {report['ping_pong']['p50_ms']} ms, "
              f"p99 {report['ping_pong']['p99_ms']} ms (n={len(pp)})")
        print(f"effect round trip       : p50 {report['effect_roundtrip']['p50_ms']} ms, "
              f"p99 {report['effect_roundtrip']['p99_ms']} ms (n={len(eff)})")
        print(f"replay                  : {rs['records_per_s']} merge records/s "
              f"({rs['steps_per_s']} steps/s, {rs['merge_records']} records in {rs['best_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
