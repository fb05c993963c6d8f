"""The wire contract on a real broker: every kind round-trips byte-identical and decodes equal."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import broker_schema as bs
from broker_schema import topics
from fx_kafka.client import make_consumer, make_producer
from fx_kafka.workload import ensure_workload_topics
from tests.unit.schema_strategies import records

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
    """A fixed, seeded draw of records covering every kind (drawn once, outside the test)."""
    found: dict[str, list[Any]] = {}

    @given(st.lists(records, min_size=40, max_size=40))
    @settings(max_examples=8, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), deadline=None)
    def draw(batch: list[Any]) -> None:
        for rec in batch:
            found.setdefault(rec.kind, []).append(rec)

    draw()
    return [rec for kind in sorted(found) for rec in found[kind][:12]]


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
