"""Consumer side: aiokafka vs confluent-kafka (librdkafka), fetch and decode of the records the
executor and the lease holder read.

    .venv/bin/python bench/kafka_consume.py [--records 2000] [--rounds 3] [--quick] [--json OUT]

Needs the ``bench`` extra (``pip install -e '.[bench]'``: confluent-kafka). Uses
``FX_KAFKA_BOOTSTRAP`` if set, else starts a local Apache Kafka (fx_kafka.testing).

Topics are filled once with N records built by the project's own constructors and encoders
(``broker_schema``), as the executor and the lease holder write them:

- ``trivial req``: an ``EffectRequest`` for the trivial model (``y = x + 1``, a float32 [1, 16]
  tensor as the executor bench sends it, base64 inline), with the holder's ``fx-holder-sig``
  header; ~0.6 KB;
- ``magika req``: the same for magika, ``--magika-bytes`` of a Python source file inline (base64);
  ~18 KB with the default 13,500;
- ``trivial resp`` / ``magika resp``: the executor's signed ``ResponseRecord`` for each (the
  engine's output shape, model hash, executor info, timing, receipt base, request hash, an
  Ed25519 signature by :func:`broker_schema.encode_signed`); ~1.3 KB.

Requests are written twice: one record per transaction (``… txn``: the holder writes each
request in its own transaction, so a commit marker follows every record) and without
transactions (``… plain``); responses without transactions (the executor's producer). Every
consumer reads ``read_committed`` (the executor's and the holder's setting) from offset 0 until
it has N records. Measured per topic, one after another and in a rotated order each round:

- ``aiokafka``: ``fx_kafka.client.make_consumer`` (the executor's consumer settings),
  ``getmany(max_records=500)`` (the executor's), each record's value, headers, topic and offset
  read (what ``fx_node.shell`` reads); ``+ strict``: and ``broker_schema.decode(value,
  topic=topic)`` (the executor's decode: validated, canonical form checked); ``+ trusted``: and
  ``broker_schema.decode_trusted`` instead;
- ``ck``: ``confluent_kafka.Consumer`` with the same fetch sizes, ``consume(num_messages=k,
  timeout=1.0)`` with k = min(500, records still to read) (librdkafka's ``consume`` returns when
  it has k messages or at the timeout, unlike ``getmany``, which returns what is there), each
  message's ``error()``, ``value()``, ``headers()``, ``topic()``, ``offset()`` read; the same
  ``+ strict`` / ``+ trusted``;
- ``aiokafka no CRC``: fetch only, with ``check_crcs=False`` (librdkafka's default,
  ``check.crcs=false``; aiokafka's is to check every batch's CRC-32C);
- ``ck.aio``: ``confluent_kafka.aio.AIOConsumer`` (its thread pool), ``await consume(500)``, and
  ``+ strict``.

Each figure is process CPU time (``time.process_time``: every thread of this process, aiokafka's
loop and librdkafka's threads alike; the broker is another process) and wall time, per record,
from ``assign`` to the N-th record; the consumer is created and connected to the partition's
leader (a ``ListOffsets``) before the clock starts. The run stops by itself and deletes the
topics it made.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:
    import confluent_kafka as ck
except ImportError:  # pragma: no cover - the message is the point
    sys.exit("bench/kafka_consume.py needs confluent-kafka: pip install -e '.[bench]' "
             "(or pip install 'confluent-kafka>=2.4')")
try:
    from confluent_kafka.aio import AIOConsumer

    HAVE_AIO = True
except ImportError:  # pragma: no cover - older confluent-kafka: the ck.aio rows are left out
    HAVE_AIO = False

import numpy as np  # noqa: E402
from aiokafka import TopicPartition  # noqa: E402

from broker_schema import decode, decode_trusted, encode, encode_signed, request_hash  # noqa: E402
from broker_schema import topics as wire_topics  # noqa: E402
from broker_schema.records import (  # noqa: E402
    INFERENCE_KIND,
    EffectHeader,
    EffectRequest,
    ExecutorInfo,
    InlineBody,
    ResponseRecord,
    Signature,
    Timing,
)
from broker_schema.signatures import HOLDER_SIG_HEADER, SigningKey, holder_signature  # noqa: E402
from fx_kafka.client import FRAME_CAP_BYTES, create_topics, make_admin, make_consumer  # noqa: E402
from fx_kafka.testing import broker_for_tests  # noqa: E402

#: the executor's ``getmany(max_records=...)`` (executor/service.py)
MAX_RECORDS = 500
#: a manifest hash for the receipt (its value is not read)
FAKE_HASH = "sha256:" + "ab" * 32
#: an encoded record and its Kafka headers
Rec = tuple[bytes, list[tuple[str, str | bytes | None]]]


# -- the records ------------------------------------------------------------------------------
def trivial_input() -> bytes:
    """The trivial model's input as ``bench/executor_throughput.py`` sends it."""
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    return json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [1, 16],
                                        "data": x.ravel().tolist()}}}).encode()


def trivial_output() -> dict[str, Any]:
    """What the ONNX engine answers for it (``executor/engines/onnx.py``: ``{"outputs": ...}``)."""
    y = np.arange(16, dtype=np.float32).reshape(1, 16) + 1
    return {"outputs": {"y": {"dtype": "float32", "shape": [1, 16], "data": y.ravel().tolist()}}}


def magika_output() -> dict[str, Any]:
    """The shape of the magika engine's answer (label, scores, top 3: the manifest default)."""
    return {"label": "python", "dl_label": "python", "score": 0.9971,
            "top": [{"label": "python", "score": 0.9971}, {"label": "txt", "score": 0.0012},
                    {"label": "shell", "score": 0.0004}],
            "overwrite_reason": "none"}


def requests(wid: str, model: str, data: bytes, n: int,
             holder: SigningKey) -> list[Rec]:
    """``n`` encoded requests of ``wid`` with their holder-signature header."""
    body = InlineBody.of_bytes(data)
    out: list[Rec] = []
    for i in range(n):
        value = encode(EffectRequest(
            header=EffectHeader(workload_id=wid, input_offset=i, index=0, epoch=1),
            effect_kind=INFERENCE_KIND, model=model, input=body, deadline_ms=600_000))
        out.append((value, [(HOLDER_SIG_HEADER, holder_signature(holder, value))]))
    return out


def responses(reqs: list[Rec], output: dict[str, Any],
              node: SigningKey) -> list[Rec]:
    """The executor's signed ``ok`` response to each of ``reqs`` (no headers)."""
    info = ExecutorInfo(node_id="bench-exec", engine="onnxruntime", engine_version="1.22.0",
                        device_class="cpu", provider="CPUExecutionProvider")

    def sign(message: bytes) -> Signature:
        return Signature(alg="ed25519", key_id=node.key_id,
                         value=base64.b64encode(node.sign(message)).decode("ascii"))

    out: list[Rec] = []
    now = time.time_ns() // 1000
    for offset, (value, _h) in enumerate(reqs):
        req = decode(value)
        assert isinstance(req, EffectRequest)
        resp = ResponseRecord(
            effect_id=req.effect_id, header=req.header, request_offset=offset, outcome="ok",
            output=InlineBody.of_json(output), model_hash=req.model, executor=info,
            timing=Timing(received_us=now, started_us=now + 40, finished_us=now + 95),
            written_by="bench-exec", request_hash=request_hash(value),
            receipt={"batch_size": 1, "manifest_hash": FAKE_HASH, "preprocessing_version": 1})
        out.append((encode_signed(resp, sign)[1], []))
    return out


# -- filling ----------------------------------------------------------------------------------
def ck_producer_conf(bootstrap: str, **kw: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "acks": "all",
                            "enable.idempotence": True, "linger.ms": 5,
                            "message.max.bytes": FRAME_CAP_BYTES}
    conf.update(kw)
    return conf


def fill(bootstrap: str, topic: str, recs: list[Rec],
         per_txn: int) -> None:
    """Write ``recs`` to partition 0 of ``topic``: in transactions of ``per_txn`` records, or
    without transactions when ``per_txn`` is 0. (librdkafka: quicker to fill with; what is
    measured is the reading.)"""
    if per_txn:
        p = ck.Producer(ck_producer_conf(
            bootstrap, **{"transactional.id": f"bench-consume-{uuid.uuid4().hex[:8]}"}))
        p.init_transactions(30)
        for i in range(0, len(recs), per_txn):
            p.begin_transaction()
            for value, headers in recs[i:i + per_txn]:
                p.produce(topic, value, partition=0, headers=headers or None)
            p.commit_transaction(30)
    else:
        p = ck.Producer(ck_producer_conf(bootstrap))
        for value, headers in recs:
            p.produce(topic, value, partition=0, headers=headers or None)
            p.poll(0)
        if p.flush(60):
            raise RuntimeError(f"fill of {topic}: records not delivered")


# -- measuring --------------------------------------------------------------------------------
class Clock:
    """Wall and process-CPU time of one measured block."""

    def __enter__(self) -> Clock:
        self.w0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.w0
        self.cpu = time.process_time() - self.c0


Decoder = Callable[..., Any] | None


def per_record(n: int, clk: Clock) -> dict[str, float]:
    return {"n": n, "cpu_us": clk.cpu / n * 1e6, "wall_us": clk.wall / n * 1e6}


async def read_aiokafka(bootstrap: str, topic: str, n: int, dec: Decoder,
                        check_crcs: bool = True) -> dict[str, float]:
    # read_committed, no group: the executor's fetch settings
    c = make_consumer(bootstrap, check_crcs=check_crcs)
    tp = TopicPartition(topic, 0)
    await c.start()
    try:
        await c.end_offsets([tp])  # the leader's connection, made before the clock
        got = 0
        with Clock() as clk:
            c.assign([tp])
            c.seek(tp, 0)
            while got < n:
                batch = await c.getmany(tp, timeout_ms=1000, max_records=MAX_RECORDS)
                for m in batch.get(tp, ()):
                    value, _headers, _offset, t = m.value, m.headers, m.offset, m.topic
                    if dec is not None:
                        dec(value, topic=t)
                    got += 1
    finally:
        await c.stop()
    return per_record(got, clk)


def ck_consumer_conf(bootstrap: str) -> dict[str, Any]:
    """librdkafka settings matching ``make_consumer``'s (read_committed, fetch sizes)."""
    return {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed", "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.max.bytes": max(52_428_800, FRAME_CAP_BYTES),
            "max.partition.fetch.bytes": FRAME_CAP_BYTES}


def read_ck(bootstrap: str, topic: str, n: int, dec: Decoder) -> dict[str, float]:
    c = ck.Consumer(ck_consumer_conf(bootstrap))
    try:
        c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=10)
        got = 0
        with Clock() as clk:
            c.assign([ck.TopicPartition(topic, 0, 0)])
            while got < n:
                for m in c.consume(num_messages=min(MAX_RECORDS, n - got), timeout=1.0):
                    if m.error():
                        raise RuntimeError(m.error())
                    value, _headers, _offset, t = m.value(), m.headers(), m.offset(), m.topic()
                    if dec is not None:
                        dec(value, topic=t)
                    got += 1
    finally:
        c.close()
    return per_record(got, clk)


async def read_ck_aio(bootstrap: str, topic: str, n: int, dec: Decoder) -> dict[str, float]:
    c = AIOConsumer(ck_consumer_conf(bootstrap))
    try:
        await c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=10)
        got = 0
        with Clock() as clk:
            await c.assign([ck.TopicPartition(topic, 0, 0)])
            while got < n:
                for m in await c.consume(num_messages=min(MAX_RECORDS, n - got), timeout=1.0):
                    if m.error():
                        raise RuntimeError(m.error())
                    value, _headers, _offset, t = m.value(), m.headers(), m.offset(), m.topic()
                    if dec is not None:
                        dec(value, topic=t)
                    got += 1
    finally:
        await c.close()
    return per_record(got, clk)


def variants(bootstrap: str) -> dict[str, Callable[[str, int], Any]]:
    """The measured readers by name; each ``(topic, n)`` -> awaitable of per-record figures."""
    async def ck_sync(topic: str, n: int, dec: Decoder) -> dict[str, float]:
        # blocking, but nothing else runs on the loop meanwhile (no aiokafka client is open)
        return read_ck(bootstrap, topic, n, dec)

    out: dict[str, Callable[[str, int], Any]] = {}
    for suffix, dec in (("", None), (" + strict", decode), (" + trusted", decode_trusted)):
        out["aiokafka" + suffix] = (lambda d: lambda t, n: read_aiokafka(bootstrap, t, n, d))(dec)
        out["ck" + suffix] = (lambda d: lambda t, n: ck_sync(t, n, d))(dec)
    # librdkafka does not check CRCs by default (check.crcs=false); aiokafka does
    out["aiokafka no CRC"] = lambda t, n: read_aiokafka(bootstrap, t, n, None, check_crcs=False)
    if HAVE_AIO:
        for suffix, dec in (("", None), (" + strict", decode)):
            out["ck.aio" + suffix] = (
                lambda d: lambda t, n: read_ck_aio(bootstrap, t, n, d))(dec)
    return out


def ck_version() -> str:
    v = ck.version()
    return str(v[0] if isinstance(v, tuple) else v)


# -- driver -----------------------------------------------------------------------------------
async def main(args: argparse.Namespace) -> dict[str, Any]:
    n, rounds = (300, 1) if args.quick else (args.records, args.rounds)
    run = uuid.uuid4().hex[:8]
    holder, node = SigningKey.generate(), SigningKey.generate()
    magika_src = (ROOT / "fx_node" / "admission.py").read_bytes()[:args.magika_bytes]
    cases: dict[str, tuple[str, list[Rec], int]] = {}
    for model, data, output in (("trivial", trivial_input(), trivial_output()),
                                ("magika", magika_src, magika_output())):
        wids = {w: f"bench-consume-{run}-{model}-{w}" for w in ("txn", "plain", "resp")}
        model_hash = "sha256:" + os.urandom(32).hex()
        txn_reqs = requests(wids["txn"], model_hash, data, n, holder)
        cases[f"{model} req txn"] = (wire_topics.out(wids["txn"]), txn_reqs, 1)
        cases[f"{model} req plain"] = (wire_topics.out(wids["plain"]),
                                       requests(wids["plain"], model_hash, data, n, holder), 0)
        resp_reqs = requests(wids["resp"], model_hash, data, n, holder)
        cases[f"{model} resp"] = (wire_topics.resp(wids["resp"]),
                                  responses(resp_reqs, output, node), 0)
    res: dict[str, Any] = {
        "records": n, "rounds": rounds, "max_records": MAX_RECORDS,
        "confluent_kafka": ck_version(), "librdkafka": ck.libversion()[0],
        "python": platform.python_version(), "load_before": os.getloadavg(),
        "record_bytes": {k: len(v[1][0][0]) for k, v in cases.items()},
        "cases": {k: {} for k in cases},
    }
    async with broker_for_tests() as bootstrap:
        names = [t for t, _r, _k in cases.values()]
        await create_topics(bootstrap, names)
        try:
            await measure(bootstrap, cases, n, rounds, res)
        finally:  # a shared broker keeps no bench topics
            admin = make_admin(bootstrap)
            await admin.start()
            try:
                await admin.delete_topics(names)
            finally:
                await admin.close()
    res["load_after"] = os.getloadavg()
    return res


async def measure(bootstrap: str, cases: dict[str, tuple[str, list[Rec], int]], n: int,
                  rounds: int, res: dict[str, Any]) -> None:
    """Fill every topic of ``cases``, then read each with every reader, ``rounds`` times."""
    for name, (topic, recs, per_txn) in cases.items():
        fill(bootstrap, topic, recs, per_txn)
        print(f"filled {name}: {len(recs)} x {len(recs[0][0])} B", file=sys.stderr,
              flush=True)
    readers = variants(bootstrap)
    names = list(readers)
    # one unrecorded pass: a fresh process's first reads pay imports, JIT of the broker...
    for topic, _recs, _k in cases.values():
        for reader in readers.values():
            await reader(topic, min(n, 200))
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for case, (topic, _recs, _k) in cases.items():
            for name in order:
                fig = await readers[name](topic, n)
                res["cases"][case].setdefault(name, []).append(fig)
                print(f"  round {r + 1} {case} {name}: {fig['cpu_us']:.1f} µs CPU, "
                      f"{fig['wall_us']:.1f} µs wall per record", file=sys.stderr,
                      flush=True)


def table(res: dict[str, Any]) -> str:
    """Median (min–max) of the rounds, CPU and wall µs per record, one row per topic."""
    cases: dict[str, dict[str, list[dict[str, float]]]] = res["cases"]
    names = list(next(iter(cases.values())))
    rows = ["| records (size) | " + " | ".join(names) + " |",
            "| --- |" + " ---: |" * len(names)]
    for case, figs in cases.items():
        cells = []
        for name in names:
            cpu = [f["cpu_us"] for f in figs[name]]
            wall = [f["wall_us"] for f in figs[name]]
            cells.append(f"{statistics.median(cpu):.1f} ({min(cpu):.1f}–{max(cpu):.1f}) / "
                         f"{statistics.median(wall):.1f}")
        rows.append(f"| {case} ({res['record_bytes'][case]:,} B) | " + " | ".join(cells) + " |")
    rows.append(f"\nCPU µs per record, median (min–max) of {res['rounds']} rounds / wall µs "
                f"median; N = {res['records']}, confluent-kafka {res['confluent_kafka']} "
                f"(librdkafka {res['librdkafka']}), load {res['load_before'][0]:.2f} -> "
                f"{res['load_after'][0]:.2f}")
    return "\n".join(rows)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--records", type=int, default=2000, help="N records per topic")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    ap.add_argument("--magika-bytes", type=int, default=13_500,
                    help="bytes of a source file in a magika request (13,500: ~18 KB record)")
    ap.add_argument("--quick", action="store_true", help="300 records, one round (seconds)")
    ap.add_argument("--json", type=Path, help="write the figures as JSON here")
    a = ap.parse_args()
    out = asyncio.run(main(a))
    print(table(out))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
