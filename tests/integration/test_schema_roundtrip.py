"""The wire contract on a real broker: every kind round-trips byte-identical and decodes equal."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

import broker_schema as bs
from broker_schema import topics
from fx_kafka.client import make_consumer, make_producer
from fx_kafka.workload import ensure_workload_topics

pytestmark = pytest.mark.integration


async def _read(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> list[Any]:
    consumer = make_consumer(bootstrap, topic)
    await consumer.start()
    out: list[Any] = []
    try:
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=300)).values():
                out.extend(msgs)
    finally:
        await consumer.stop()
    return out


def _samples() -> list[Any]:
    """Records of every kind: the canonical examples of docs/records.md, plus variants of them
    with other bodies and values. (Deterministic on purpose: drawing with Hypothesis inside an
    async test trips CPython 3.11.7's "AST constructor recursion depth mismatch" bug; the
    generated round trips run in tests/unit/test_schema.py.)"""
    text = (Path(__file__).resolve().parents[2] / "docs" / "records.md").read_text()
    docs = [bs.decode(b.encode(), strict=True)
            for b in re.findall(r"```json\n(.*?)\n```", text, flags=re.S)]
    bodies: list[Any] = [
        bs.InlineBody.of_json({"nested": [1, 2.5, None, True, "\u00e9\u2603\U0001f600"]}),
        bs.InlineBody.of_text("line one\nline two\t\"quoted\""),
        bs.InlineBody.of_bytes(bytes(range(256))),
        bs.InlineBody.of_text("x" * (bs.INLINE_MAX_BYTES - 2)),
        bs.ChunkRef(hash="sha256:" + "c" * 64, size=10_000_000, media_type="video/mp4"),
        bs.StreamRef(topic="wl.cam-9.in", offset=2**53 - 1, hash="sha256:" + "d" * 64),
    ]
    variants = [rec.model_copy(update={"body": body}) for rec in docs if hasattr(rec, "body")
                for body in bodies]
    return [*docs, *variants]


async def test_every_kind_round_trips_byte_identical(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    samples = _samples()
    assert {r.kind for r in samples} == set(bs.RECORD_TYPES)
    await ensure_workload_topics(kafka_bootstrap, unique_workload_id)
    topic = topics.out(unique_workload_id)
    producer = make_producer(kafka_bootstrap)
    await producer.start()
    try:
        encoded = [bs.encode(r) for r in samples]
        for data in encoded:
            await producer.send(topic, data)
        await producer.flush()
    finally:
        await producer.stop()
    msgs = await _read(kafka_bootstrap, topic, len(samples))
    assert [m.value for m in msgs] == encoded
    for msg, rec, data in zip(msgs, samples, encoded, strict=True):
        back = bs.decode(msg.value, strict=True)
        assert back == rec
        assert bs.encode(back) == data
        assert bs.record_hash(back) == bs.sha256_hex(msg.value)
        # LogAppendTime: the broker's clock stamps workload topics
        assert msg.timestamp_type == 1


async def test_bad_records_on_the_wire_raise_the_typed_error(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    await ensure_workload_topics(kafka_bootstrap, unique_workload_id)
    topic = topics.out(unique_workload_id)
    good = bs.ClaimRecord(workload_id=unique_workload_id, epoch=1, holder_id="h",
                          spec_hash="sha256:" + "0" * 64, spec_offset=0)
    bad = {
        b"\x89PNG\r\n\x1a\n\x00garbage": "not_json",
        b'{"kind":"claim","v":2,"epoch":1}': "unsupported_version",
        b'{"kind":"nonsense","v":1}': "unknown_kind",
        bs.encode(good).replace(b'"epoch":1', b'"epoch":"1"'): "invalid_record",
        # over the schema's record limit but under the broker's frame cap: the broker stores it,
        # the decoder refuses it
        b" " * (bs.MAX_RECORD_BYTES + 10): "oversize",
    }
    producer = make_producer(kafka_bootstrap)
    await producer.start()
    try:
        for data in bad:
            await producer.send_and_wait(topic, data)
        await producer.send_and_wait(topic, bs.encode(good))
    finally:
        await producer.stop()
    msgs = await _read(kafka_bootstrap, topic, len(bad) + 1)
    assert len(msgs) == len(bad) + 1
    for msg, code in zip(msgs, bad.values(), strict=False):
        with pytest.raises(bs.DecodeError) as info:
            bs.decode(msg.value)
        assert info.value.code == code
    assert bs.decode(msgs[-1].value) == good  # the consumer moved on to the next record



async def test_workload_topic_with_producer_clock_is_refused(
    kafka_bootstrap: str, unique_workload_id: str
) -> None:
    from fx_kafka.client import create_topics
    from fx_kafka.errors import TopicConfigError
    from fx_kafka.workload import topic_configs

    # a topic made by someone else with producer-clock timestamps
    await create_topics(kafka_bootstrap, [topics.inputs(unique_workload_id)],
                        configs={"message.timestamp.type": "CreateTime"})
    with pytest.raises(TopicConfigError, match="LogAppendTime"):
        await ensure_workload_topics(kafka_bootstrap, unique_workload_id)
    configs = await topic_configs(kafka_bootstrap, [topics.out(unique_workload_id)])
    assert configs[topics.out(unique_workload_id)]["message.timestamp.type"] == "LogAppendTime"
