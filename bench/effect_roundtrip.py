"""Effect round trip vs a bare aiokafka request/reply ping-pong, on the same broker, in one run;
and replay speed.

    .venv/bin/python bench/effect_roundtrip.py --bootstrap HOST:PORT [--n 200] [--json]

1. ping-pong: a producer sends a 100-byte request (acks=all), a responder consumes it and sends a
   reply, the requester consumes the reply. Time: send start to reply received.
2. effect: a lease holder (in this process) runs a workload that asks one inference per input; a
   responder plays the executor (``accepted`` then ``response``, no model). Time: the request's
   broker append time to the step seeing its answer (the holder's own measure). Inputs go one at a
   time, so there is one effect in flight.

   The two alternate, one ping-pong then one effect, after ``--warmup`` unrecorded ones of each,
   so both see the same moments of a shared machine (before this, all ping-pongs ran first, on a
   young broker, and their p50 moved 2-5x between runs).
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
    read_workload_log,
    replay,
)

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


class PingPong:
    """A bare aiokafka request/reply: a producer sends a 100-byte request (acks=all), a responder
    consumes it and sends a reply, the requester consumes the reply."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        run = uuid.uuid4().hex[:8]
        self.req_t, self.rep_t = f"bench.ping.{run}", f"bench.pong.{run}"
        self.producer = make_producer(bootstrap)
        self.responder_out = make_producer(bootstrap)
        self.req_c = make_consumer(bootstrap, auto_offset_reset="latest")
        self.rep_c = make_consumer(bootstrap, auto_offset_reset="latest")
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await create_topics(self.bootstrap, [self.req_t, self.rep_t])
        for client in (self.producer, self.responder_out, self.req_c, self.rep_c):
            await client.start()
        self.req_c.assign([TopicPartition(self.req_t, 0)])
        self.rep_c.assign([TopicPartition(self.rep_t, 0)])
        await self.req_c.seek_to_end()
        await self.rep_c.seek_to_end()
        self._task = asyncio.create_task(self._respond())

    async def _respond(self) -> None:
        while True:
            batch = await self.req_c.getmany(timeout_ms=100)
            for msgs in batch.values():
                for msg in msgs:
                    await self.responder_out.send_and_wait(self.rep_t, value=msg.value,
                                                           partition=0)

    async def one(self) -> float:
        """One request and its reply: ms from the send's start to the reply received."""
        t0 = time.perf_counter()
        await self.producer.send_and_wait(self.req_t, value=b"x" * 100, partition=0)
        got = False
        while not got:
            batch = await asyncio.wait_for(self.rep_c.getmany(timeout_ms=100), TIMEOUT_S)
            got = any(batch.values())
        return (time.perf_counter() - t0) * 1000

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for client in (self.producer, self.responder_out, self.req_c, self.rep_c):
            await client.stop()


async def ping_pong(bootstrap: str, n: int, warmup: int = 0) -> list[float]:
    """``n`` ping-pongs in a row (after ``warmup`` unrecorded ones): ms each."""
    pp = PingPong(bootstrap)
    await pp.start()
    try:
        for _ in range(warmup):
            await pp.one()
        return [await pp.one() for _ in range(n)]
    finally:
        await pp.stop()


class EffectLoop:
    """A lease holder (in this process) running :class:`Ping`, and a responder that plays the
    executor (``accepted`` then ``response``, no model). One effect in flight at a time."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.wid = f"bench-{uuid.uuid4().hex[:10]}"
        self.producer = make_producer(bootstrap)
        self.out_c = make_consumer(bootstrap)
        self.holder = LeaseHolder(Ping(), HolderConfig(bootstrap=bootstrap, workload_id=self.wid,
                                                       holder_id="bench", poll_ms=50,
                                                       force_placement=True))
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._i = 0

    async def start(self) -> None:
        wid = self.wid
        await ensure_workload_topics(self.bootstrap, wid)
        await self.producer.start()
        spec = SpecRecord(workload_id=wid, module_hash=module_hash(Ping), effect_kinds=(
            INFERENCE_KIND,), models={"m": MODEL}, snapshot_every=10_000)
        await self.producer.send_and_wait(topics.spec(wid), encode(spec), partition=0)
        self._tasks.append(asyncio.create_task(self.holder.run(self._stop)))
        await self.out_c.start()
        self.out_c.assign([TopicPartition(topics.out(wid), 0)])
        self._tasks.append(asyncio.create_task(self._execute()))
        await asyncio.wait_for(self.holder.ready.wait(), 60)

    async def _execute(self) -> None:
        wid = self.wid
        while True:
            batch = await self.out_c.getmany(timeout_ms=100)
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
                    await self.producer.send(topics.resp(wid), encode(acc), partition=0)
                    await self.producer.send_and_wait(topics.resp(wid), encode(resp),
                                                      partition=0)

    async def one(self) -> float:
        """One input, its request and answer: the holder's own round trip figure (ms from the
        request's broker append time to the step seeing its answer)."""
        holder = self.holder
        before, outputs = len(holder.stats.roundtrips_ms), holder.stats.outputs
        rec = InputRecord(workload_id=self.wid, body=InlineBody.of_json(self._i))
        self._i += 1
        await self.producer.send_and_wait(topics.inputs(self.wid), encode(rec), partition=0)
        t_end = time.monotonic() + TIMEOUT_S
        # the round trip, then the holder's transaction that writes the step's output (so the
        # next ping-pong does not share the broker and the loop with it)
        while len(holder.stats.roundtrips_ms) == before or holder.stats.outputs < outputs + 2:
            if self._tasks[0].done():
                self._tasks[0].result()
            if time.monotonic() > t_end:
                raise TimeoutError(f"round trip {self._i - 1} did not complete")
            await asyncio.sleep(0.0005)
        return float(holder.stats.roundtrips_ms[before])

    async def stop(self) -> None:
        self._tasks[1].cancel()
        self._stop.set()
        await asyncio.wait_for(self._tasks[0], 30)
        await self.out_c.stop()
        await self.producer.stop()


async def side_by_side(bootstrap: str, n: int, warmup: int) -> tuple[list[float], list[float],
                                                                      str]:
    """``n`` ping-pongs and ``n`` effect round trips, alternating one of each, after ``warmup``
    unrecorded ones of each (a young broker's first requests are slow): both figures see the
    same moments of a noisy machine."""
    pp, eff = PingPong(bootstrap), EffectLoop(bootstrap)
    await pp.start()
    await eff.start()
    try:
        for _ in range(warmup):
            await pp.one()
            await eff.one()
        pings: list[float] = []
        effects: list[float] = []
        for _ in range(n):
            pings.append(await pp.one())
            effects.append(await eff.one())
        return pings, effects, eff.wid
    finally:
        await eff.stop()
        await pp.stop()


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
    parser.add_argument("--warmup", type=int, default=20,
                        help="unrecorded round trips of each kind first")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not args.bootstrap:
        parser.error("--bootstrap or FX_KAFKA_BOOTSTRAP is required")
    pp, eff, wid = await side_by_side(args.bootstrap, args.n, args.warmup)
    rs = await replay_speed(args.bootstrap, wid)
    report = {"n": args.n, "warmup": args.warmup, "ping_pong": summary(pp),
              "effect_roundtrip": summary(eff), "replay": rs}
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
