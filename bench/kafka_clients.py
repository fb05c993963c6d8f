"""aiokafka vs confluent-kafka (librdkafka) on the executor's and the holder's Kafka paths.

    .venv/bin/python bench/kafka_clients.py [--records 5000] [--quick] [--json OUT.json]

Needs the ``bench`` extra (``pip install -e '.[bench]'``: confluent-kafka). Uses
``FX_KAFKA_BOOTSTRAP`` if set, else starts a local Apache Kafka (fx_kafka.testing). Records are
shaped like executor responses: ~1 KB (a small model's response) and ~3 KB (an LLM response
with a receipt). Measured side by side in one run, per client, per size:

- ``burst``: N records produced at once, every acknowledgement awaited together, as the
  executor does (aiokafka: ``fx_kafka.client.make_producer`` with ``max_batch_size`` 1 MiB and
  linger 0, ``send()`` futures gathered; confluent-kafka ``Producer``: acks=all, idempotence,
  batch.size 1 MiB, linger 0, ``produce`` + ``poll(0)`` then ``flush``; and its asyncio wrapper
  ``confluent_kafka.aio.AIOProducer``, ``produce`` futures gathered): records/s and process CPU
  per record (``time.process_time``: every thread of this process, librdkafka's included; the
  broker is another process);
- ``txn k``: transactions of k = 1 and 8 records (begin, k sends, commit; the holder's and the
  executor's batch): transactions/s, latency p50/p99, CPU per transaction;
- ``ctp``: consume-transform-produce: a request is written, a read_committed consumer reads it,
  the answer is produced in a transaction with the consumer's offset
  (``send_offsets_to_transaction``), committed: latency from the request's send to the commit;
- ``consume``: a read_committed consumer reads N transactionally written records from the
  start: records/s, CPU per record;
- ``fencing``: a second producer with the same transactional id fences the first; what the
  first one raises on its next commit (API parity, not a timing).

Every phase is bounded by a record count and runs once unrecorded first (a fresh broker's first
transactions are slow); the run stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:
    import confluent_kafka as ck
    from confluent_kafka.aio import AIOProducer
except ImportError:  # pragma: no cover - the message is the point
    sys.exit("bench/kafka_clients.py needs confluent-kafka: pip install -e '.[bench]' "
             "(or pip install 'confluent-kafka>=2.4')")

from aiokafka import TopicPartition  # noqa: E402
from aiokafka.errors import KafkaError  # noqa: E402

from fx_kafka.client import FRAME_CAP_BYTES, create_topics, make_consumer, make_producer  # noqa: E402
from fx_kafka.testing import broker_for_tests  # noqa: E402

#: the executor's producer batch (fx_node/producer.py PRODUCER_BATCH_BYTES)
BATCH_BYTES = 1 << 20
SIZES = {"1KB": 1000, "3KB": 3000}


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def payload(size: int, i: int) -> bytes:
    """A JSON-looking record of about ``size`` bytes (hex text, like digests and base64)."""
    head = b'{"effect_id":"sha256:%064x","body":"' % i
    body = os.urandom(max(0, size - len(head) - 2) // 2).hex().encode()
    return head + body + b'"}'


def ck_conf(bootstrap: str, **kw: Any) -> dict[str, Any]:
    """librdkafka settings comparable to ``make_producer``'s (plaintext only)."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 0,
        "batch.size": BATCH_BYTES,
        "message.max.bytes": FRAME_CAP_BYTES,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 2_097_151,
    }
    conf.update(kw)
    return conf


class Clock:
    """Wall and process-CPU time of one measured block."""

    def __enter__(self) -> Clock:
        self.w0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.w0
        self.cpu = time.process_time() - self.c0


def rate(n: int, clk: Clock, unit: str = "rec") -> dict[str, float]:
    return {"n": n, f"{unit}_per_s": round(n / clk.wall, 1),
            f"cpu_us_per_{unit}": round(clk.cpu / n * 1e6, 1), "wall_s": round(clk.wall, 3)}


# -- burst ------------------------------------------------------------------------------------
async def burst_aiokafka(bootstrap: str, topic: str, recs: list[bytes]) -> dict[str, float]:
    p = make_producer(bootstrap, max_batch_size=BATCH_BYTES)
    await p.start()
    try:
        await (await p.send(topic, recs[0], key=b"warm"))
        with Clock() as clk:
            futs = [await p.send(topic, value=r, key=b"k%d" % i) for i, r in enumerate(recs)]
            await asyncio.gather(*futs)
    finally:
        await p.stop()
    return rate(len(recs), clk)


def burst_ck(bootstrap: str, topic: str, recs: list[bytes]) -> dict[str, float]:
    p = ck.Producer(ck_conf(bootstrap))
    failed: list[Any] = []

    def dr(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    p.produce(topic, recs[0], key=b"warm", on_delivery=dr)
    p.flush(30)
    with Clock() as clk:
        for i, r in enumerate(recs):
            p.produce(topic, r, key=b"k%d" % i, on_delivery=dr)
            p.poll(0)
        left = p.flush(60)
    if failed or left:
        raise RuntimeError(f"confluent-kafka burst: {len(failed)} failed, {left} not delivered")
    return rate(len(recs), clk)


async def burst_ck_aio(bootstrap: str, topic: str, recs: list[bytes]) -> dict[str, float]:
    p = AIOProducer(ck_conf(bootstrap))
    try:
        await (await p.produce(topic, recs[0], key=b"warm"))
        with Clock() as clk:
            futs = [await p.produce(topic, r, key=b"k%d" % i) for i, r in enumerate(recs)]
            await p.flush()
            await asyncio.gather(*futs)
    finally:
        await p.close()
    return rate(len(recs), clk)


# -- transactions -----------------------------------------------------------------------------
def txn_summary(lat: list[float], clk: Clock, k: int,
                read: list[float] | None = None) -> dict[str, float]:
    out = rate(len(lat), clk, "txn")
    out |= {"records_per_txn": k, "p50_ms": round(pct(lat, 0.5), 3),
            "p99_ms": round(pct(lat, 0.99), 3)}
    if read:  # consume-transform-produce: the request's send to its read, alone
        out |= {"read_p50_ms": round(pct(read, 0.5), 3), "read_p99_ms": round(pct(read, 0.99), 3)}
    return out


async def txn_aiokafka(bootstrap: str, topic: str, recs: list[bytes], k: int,
                       n: int) -> dict[str, float]:
    p = make_producer(bootstrap, transactional_id=f"bench-aio-{uuid.uuid4().hex[:8]}")
    await p.start()
    lat: list[float] = []
    try:
        async def one(i: int) -> None:
            futs = []
            async with p.transaction():
                for j in range(k):
                    futs.append(await p.send(topic, recs[(i * k + j) % len(recs)], partition=0))
            await asyncio.gather(*futs)
        await one(0)
        with Clock() as clk:
            for i in range(n):
                t = time.perf_counter()
                await one(i)
                lat.append((time.perf_counter() - t) * 1000)
    finally:
        await p.stop()
    return txn_summary(lat, clk, k)


def txn_ck(bootstrap: str, topic: str, recs: list[bytes], k: int, n: int) -> dict[str, float]:
    p = ck.Producer(ck_conf(bootstrap, **{"transactional.id": f"bench-ck-{uuid.uuid4().hex[:8]}"}))
    p.init_transactions(30)
    lat: list[float] = []

    def one(i: int) -> None:
        p.begin_transaction()
        for j in range(k):
            p.produce(topic, recs[(i * k + j) % len(recs)], partition=0)
        p.commit_transaction(30)

    one(0)
    with Clock() as clk:
        for i in range(n):
            t = time.perf_counter()
            one(i)
            lat.append((time.perf_counter() - t) * 1000)
    return txn_summary(lat, clk, k)


# -- consume-transform-produce ----------------------------------------------------------------
async def ctp_aiokafka(bootstrap: str, req: str, ans: str, rec: bytes, n: int) -> dict[str, float]:
    group = f"bench-aio-{uuid.uuid4().hex[:8]}"
    driver = make_producer(bootstrap)
    p = make_producer(bootstrap, transactional_id=f"{group}-tx")
    c = make_consumer(bootstrap, group_id=group, fetch_max_wait_ms=500)
    tp = TopicPartition(req, 0)
    await driver.start()
    await p.start()
    await c.start()
    lat: list[float] = []
    reads: list[float] = []
    try:
        c.assign([tp])
        await c.seek_to_end(tp)
        await c.position(tp)

        async def one() -> float:
            t = time.perf_counter()
            sent = await driver.send(req, rec, partition=0)
            got: list[Any] = []
            while not got:
                got = (await c.getmany(tp, timeout_ms=1000, max_records=1)).get(tp, [])
            reads.append((time.perf_counter() - t) * 1000)
            async with p.transaction():
                fut = await p.send(ans, got[0].value, partition=0)
                await p.send_offsets_to_transaction({tp: got[0].offset + 1}, group)
            await fut
            done = time.perf_counter()
            await sent
            return (done - t) * 1000
        await one()
        reads.clear()
        with Clock() as clk:
            lat = [await one() for _ in range(n)]
    finally:
        await c.stop()
        await p.stop()
        await driver.stop()
    return txn_summary(lat, clk, 1, reads)


def ctp_ck(bootstrap: str, req: str, ans: str, rec: bytes, n: int) -> dict[str, float]:
    group = f"bench-ck-{uuid.uuid4().hex[:8]}"
    driver = ck.Producer(ck_conf(bootstrap))
    p = ck.Producer(ck_conf(bootstrap, **{"transactional.id": f"{group}-tx"}))
    p.init_transactions(30)
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                     "isolation.level": "read_committed", "enable.auto.commit": False,
                     "fetch.wait.max.ms": 500, "fetch.max.bytes": max(52_428_800, FRAME_CAP_BYTES),
                     "max.partition.fetch.bytes": FRAME_CAP_BYTES})
    _lo, hi = c.get_watermark_offsets(ck.TopicPartition(req, 0), timeout=10)
    c.assign([ck.TopicPartition(req, 0, hi)])
    reads: list[float] = []
    try:
        def one() -> float:
            t = time.perf_counter()
            driver.produce(req, rec, partition=0)
            driver.poll(0)
            m = None
            while m is None:
                m = c.poll(1.0)
                if m is not None and m.error():
                    raise RuntimeError(m.error())
            reads.append((time.perf_counter() - t) * 1000)
            p.begin_transaction()
            p.produce(ans, m.value(), partition=0)
            done = [ck.TopicPartition(req, 0, int(m.offset() or 0) + 1)]
            p.send_offsets_to_transaction(done, c.consumer_group_metadata(), 30)
            p.commit_transaction(30)
            return (time.perf_counter() - t) * 1000
        one()
        reads.clear()
        with Clock() as clk:
            lat = [one() for _ in range(n)]
        driver.flush(30)
    finally:
        c.close()
    return txn_summary(lat, clk, 1, reads)


# -- consume ----------------------------------------------------------------------------------
async def fill(bootstrap: str, topic: str, recs: list[bytes], per_txn: int = 100) -> None:
    """Write ``recs`` to ``topic`` in transactions of ``per_txn`` (markers among them)."""
    p = make_producer(bootstrap, transactional_id=f"bench-fill-{uuid.uuid4().hex[:8]}",
                      max_batch_size=BATCH_BYTES)
    await p.start()
    try:
        for i in range(0, len(recs), per_txn):
            futs = []
            async with p.transaction():
                for r in recs[i:i + per_txn]:
                    futs.append(await p.send(topic, r, partition=0))
            await asyncio.gather(*futs)
    finally:
        await p.stop()


async def consume_aiokafka(bootstrap: str, topic: str, n: int) -> dict[str, float]:
    c = make_consumer(bootstrap)
    tp = TopicPartition(topic, 0)
    await c.start()
    try:
        c.assign([tp])
        c.seek(tp, 0)
        got = 0
        with Clock() as clk:
            while got < n:
                for m in (await c.getmany(tp, timeout_ms=1000)).get(tp, []):
                    got += 1 if m.value else 0
    finally:
        await c.stop()
    return rate(got, clk)


def consume_ck(bootstrap: str, topic: str, n: int) -> dict[str, float]:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                     "isolation.level": "read_committed", "enable.auto.commit": False,
                     "fetch.max.bytes": max(52_428_800, FRAME_CAP_BYTES),
                     "max.partition.fetch.bytes": FRAME_CAP_BYTES})
    got = 0
    try:
        with Clock() as clk:
            c.assign([ck.TopicPartition(topic, 0, 0)])
            while got < n:
                for m in c.consume(num_messages=min(10_000, n - got), timeout=1.0):
                    if m.error():
                        raise RuntimeError(m.error())
                    got += 1 if m.value() else 0
    finally:
        c.close()
    return rate(got, clk)


# -- fencing ----------------------------------------------------------------------------------
async def fencing_aiokafka(bootstrap: str, topic: str) -> str:
    tid = f"bench-fence-aio-{uuid.uuid4().hex[:8]}"
    a, b = make_producer(bootstrap, transactional_id=tid), make_producer(
        bootstrap, transactional_id=tid)
    await a.start()
    try:
        await a.begin_transaction()
        await (await a.send(topic, b"x", partition=0))
        await b.start()
        try:
            await a.commit_transaction()
            return "no error"
        except KafkaError as exc:
            return f"{type(exc).__name__}"
    finally:
        await b.stop()
        await a.stop()


def fencing_ck(bootstrap: str, topic: str) -> str:
    tid = f"bench-fence-ck-{uuid.uuid4().hex[:8]}"
    a = ck.Producer(ck_conf(bootstrap, **{"transactional.id": tid}))
    a.init_transactions(30)
    a.begin_transaction()
    a.produce(topic, b"x", partition=0)
    a.flush(30)
    b = ck.Producer(ck_conf(bootstrap, **{"transactional.id": tid}))
    b.init_transactions(30)
    try:
        a.commit_transaction(30)
        return "no error"
    except ck.KafkaException as exc:
        err = exc.args[0]
        return (f"KafkaException({err.name()}, fatal={err.fatal()}, "
                f"abortable={err.txn_requires_abort()})")


def ck_version() -> str:
    v = ck.version()
    return str(v[0] if isinstance(v, tuple) else v)


# -- driver -----------------------------------------------------------------------------------
async def run_in_thread(fn: Callable[..., Any], *a: Any) -> Any:
    """A blocking (librdkafka) phase, off the loop so no aiokafka client of ours starves."""
    return await asyncio.to_thread(fn, *a)


def phases_for(bootstrap: str, names: dict[str, str], recs: list[bytes], n_txn: int,
               n_ctp: int) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
    """The timed phases of one record size, in the order they run."""
    burst, txn, req, ans = names["burst"], names["txn"], names["req"], names["ans"]
    phases: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("burst aiokafka", lambda: burst_aiokafka(bootstrap, burst, recs)),
        ("burst ck", lambda: run_in_thread(burst_ck, bootstrap, burst, recs)),
        ("burst ck.aio", lambda: burst_ck_aio(bootstrap, burst, recs)),
    ]

    def txns(k: int) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
        return [(f"txn{k} aiokafka", lambda: txn_aiokafka(bootstrap, txn, recs, k, n_txn)),
                (f"txn{k} ck", lambda: run_in_thread(txn_ck, bootstrap, txn, recs, k, n_txn))]

    phases += txns(1) + txns(8)
    phases += [
        ("ctp aiokafka", lambda: ctp_aiokafka(bootstrap, req, ans, recs[0], n_ctp)),
        ("ctp ck", lambda: run_in_thread(ctp_ck, bootstrap, req, ans, recs[0], n_ctp)),
    ]
    return phases


async def main(args: argparse.Namespace) -> dict[str, Any]:
    n, n_txn, n_ctp = ((1000, 30, 30) if args.quick else (args.records, 300, 200))
    res: dict[str, Any] = {"records": n, "txns": n_txn, "ctp_rounds": n_ctp,
                           "confluent_kafka": ck_version(), "librdkafka": ck.libversion()[0],
                           "python": platform.python_version(), "load_before": os.getloadavg()}
    async with broker_for_tests() as bootstrap:
        run = uuid.uuid4().hex[:8]
        names = {x: f"bench.clients.{run}.{x}" for x in ("burst", "txn", "req", "ans", "read")}
        await create_topics(bootstrap, names.values())
        # a warm-up pass, not recorded: a fresh broker's first transactions are several times
        # slower (JIT, coordinator loading), which would penalise whichever phase runs first
        warm = [payload(1000, i) for i in range(min(n, 500))]
        for _name, phase in phases_for(bootstrap, names, warm, 20, 20):
            await phase()
        for label, size in SIZES.items():
            recs = [payload(size, i) for i in range(n)]
            r: dict[str, Any] = {"record_bytes": len(recs[0])}
            phases = phases_for(bootstrap, names, recs, n_txn, n_ctp)
            for name, phase in phases:
                r[name] = await phase()
                print(f"  {label} {name}: {r[name]}", file=sys.stderr, flush=True)
            topic = f"{names['read']}.{label}"
            await create_topics(bootstrap, [topic])
            await fill(bootstrap, topic, recs)
            r["consume aiokafka"] = await consume_aiokafka(bootstrap, topic, n)
            r["consume ck"] = await run_in_thread(consume_ck, bootstrap, topic, n)
            res[label] = r
        res["fencing"] = {"aiokafka": await fencing_aiokafka(bootstrap, names["txn"]),
                          "ck": await run_in_thread(fencing_ck, bootstrap, names["txn"])}
    res["load_after"] = os.getloadavg()
    return res


def table(res: dict[str, Any]) -> str:
    rows = ["| path | size | aiokafka | confluent-kafka | ck ÷ aiokafka CPU |",
            "| --- | --- | --- | --- | --- |"]
    for label in SIZES:
        r = res[label]

        def cell(x: dict[str, Any]) -> str:
            if "txn_per_s" in x:
                return (f"{x['txn_per_s']:.0f} txn/s, p50 {x['p50_ms']:.2f} / p99 "
                        f"{x['p99_ms']:.2f} ms, {x['cpu_us_per_txn']:.0f} µs CPU/txn"
                        + (f" (read p50 {x['read_p50_ms']:.2f} ms)" if "read_p50_ms" in x else ""))
            return f"{x['rec_per_s']:.0f} rec/s, {x['cpu_us_per_rec']:.1f} µs CPU/rec"

        def cpu(x: dict[str, Any]) -> float:
            return float(x.get("cpu_us_per_rec", x.get("cpu_us_per_txn", 0.0)))

        pairs = [("burst", "burst aiokafka", "burst ck"),
                 ("burst (ck.aio AIOProducer)", "burst aiokafka", "burst ck.aio"),
                 ("txn of 1", "txn1 aiokafka", "txn1 ck"), ("txn of 8", "txn8 aiokafka", "txn8 ck"),
                 ("consume→txn produce→commit", "ctp aiokafka", "ctp ck"),
                 ("read_committed consume", "consume aiokafka", "consume ck")]
        for what, a, b in pairs:
            rows.append(f"| {what} | {label} | {cell(r[a])} | {cell(r[b])} | "
                        f"{cpu(r[b]) / cpu(r[a]):.2f} |")
    rows.append(f"\nfencing: aiokafka raises {res['fencing']['aiokafka']}; "
                f"confluent-kafka raises {res['fencing']['ck']}")
    rows.append(f"confluent-kafka {res['confluent_kafka']} (librdkafka {res['librdkafka']}), "
                f"N={res['records']}, load {res['load_before'][0]:.2f} -> "
                f"{res['load_after'][0]:.2f}")
    return "\n".join(rows)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=5000, help="N for burst and consume")
    ap.add_argument("--quick", action="store_true", help="small counts (seconds)")
    ap.add_argument("--json", type=Path, help="write the figures as JSON here")
    a = ap.parse_args()
    out = asyncio.run(main(a))
    print(table(out))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
