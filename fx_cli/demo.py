"""``make demo``: the main job end to end on a real broker.

Uses ``FX_KAFKA_BOOTSTRAP`` if set, else fetches and starts a local Apache Kafka for the run and
stops it afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid

import broker_schema as bs
from broker_schema import topics
from fx_kafka.client import make_consumer, make_producer
from fx_kafka.testing import kafka_for_tests
from fx_kafka.workload import ensure_workload_topics

log = logging.getLogger("fx.demo")


def _say(text: str) -> None:
    print(text, flush=True)


async def wire_roundtrip(bootstrap: str) -> int:
    """Produce one record of every kind, read them back, and show garbage being refused."""
    wl = f"demo-{uuid.uuid4().hex[:8]}"
    await ensure_workload_topics(bootstrap, wl)
    m = bs.sha256_hex(b"demo model")
    hd = bs.EffectHeader(workload_id=wl, input_offset=0, index=0, epoch=1)
    samples: list[bs.Record] = [
        bs.InputRecord(workload_id=wl, body=bs.InlineBody.of_text("hello"), source="demo"),
        bs.SpecRecord(workload_id=wl, module_hash=m, effect_kinds=(bs.INFERENCE_KIND,),
                      models={"clf": m}),
        bs.ClaimRecord(workload_id=wl, epoch=1, holder_id="demo", spec_hash=m, spec_offset=0),
        bs.EffectRequest(header=hd, effect_kind=bs.INFERENCE_KIND, model=m, params={},
                         input=bs.StreamRef(topic=topics.inputs(wl), offset=0), deadline_ms=500),
        bs.AcceptedRecord(effect_id=hd.effect_id, header=hd, request_offset=0, node_id="n1",
                          lease_ms=1000, accepted_us=0),
        bs.ResponseRecord(effect_id=hd.effect_id, header=hd, request_offset=0, outcome="ok",
                          output=bs.InlineBody.of_json({"label": "txt"}), model_hash=m,
                          written_by="n1"),
        bs.MergeEntry(workload_id=wl, seq=0, epoch=1, source="in", source_offset=0,
                      action="deliver"),
    ]
    topic = topics.resp(wl)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        sent = []
        for rec in samples:
            data = bs.encode(rec)
            md = await producer.send_and_wait(topic, data)
            sent.append((md.offset, data))
        await producer.send_and_wait(topic, b"\x00\xffgarbage")
        await producer.send_and_wait(topic, b'{"kind":"claim","v":9}')
    finally:
        await producer.stop()
    consumer = make_consumer(bootstrap, topic)
    await consumer.start()
    ok = True
    try:
        got = 0
        deadline = time.monotonic() + 20
        while got < len(samples) + 2 and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for msgs in batch.values():
                for msg in msgs:
                    got += 1
                    try:
                        rec = bs.decode(msg.value, strict=True)
                    except bs.DecodeError as exc:
                        _say(f"  offset {msg.offset}: refused, code={exc.code}")
                        continue
                    same = msg.value == sent[msg.offset][1]
                    ok &= same and rec == samples[msg.offset]
                    _say(f"  offset {msg.offset}: {rec.kind:<9} byte-identical={same} "
                         f"hash={bs.sha256_hex(msg.value)[:19]}...")
        ok &= got == len(samples) + 2
    finally:
        await consumer.stop()
    return 0 if ok else 1


def main() -> int:
    """Run the demo; exit code 0 when every step checked out."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    t0 = time.monotonic()
    with kafka_for_tests() as bootstrap:
        _say(f"broker: {bootstrap} (ready after {time.monotonic() - t0:.1f} s)")
        _say("1. the wire contract on a real broker: every record kind round-trips")
        code = asyncio.run(wire_roundtrip(bootstrap))
    _say("demo: OK" if code == 0 else "demo: FAILED")
    return code


if __name__ == "__main__":
    sys.exit(main())
