"""The pinned broker works with aiokafka the way the project needs: idempotent producers,
transactions with zombie fencing, offsets inside a transaction, and the frame cap."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError, ProducerFenced

from broker_schema import topics
from broker_schema.limits import MAX_RECORD_BYTES
from fx_kafka.client import FRAME_CAP_BYTES, create_topics, make_consumer, make_producer

pytestmark = pytest.mark.integration


async def _read_all(
    consumer: AIOKafkaConsumer, expected: int, timeout: float = 15.0
) -> list[bytes]:
    """Values until ``expected`` were read, or until ``timeout`` (then whatever came)."""
    values: list[bytes] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(values) < expected and loop.time() < deadline:
        batches = await consumer.getmany(timeout_ms=500)
        for records in batches.values():
            values.extend(r.value for r in records if r.value is not None)
    return values


async def _read_to_end(bootstrap: str, topic: str) -> list[bytes]:
    """Every committed value in ``topic``'s only partition, up to its last stable offset."""
    consumer = make_consumer(bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        values: list[bytes] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15.0
        while await consumer.position(tp) < end and loop.time() < deadline:
            batches = await consumer.getmany(tp, timeout_ms=500)
            values.extend(r.value for r in batches.get(tp, []) if r.value is not None)
        return values
    finally:
        await consumer.stop()


@pytest.fixture
async def topic(kafka_bootstrap: str, unique_workload_id: str) -> AsyncIterator[str]:
    name = topics.inputs(unique_workload_id)
    await create_topics(kafka_bootstrap, [name])
    yield name


async def test_create_topics_is_idempotent(kafka_bootstrap: str, topic: str) -> None:
    await create_topics(kafka_bootstrap, [topic])
    await create_topics(kafka_bootstrap, [topic, f"{topic}.compacted"], compacted=True)


async def test_idempotent_producer_round_trip_in_order(kafka_bootstrap: str, topic: str) -> None:
    producer = make_producer(kafka_bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        futures = [await producer.send(topic, f"m{i}".encode(), key=b"k") for i in range(50)]
        metas = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    assert [m.offset for m in metas] == list(range(50))

    consumer = make_consumer(kafka_bootstrap, topic, group_id=f"g-{topic}")
    await consumer.start()
    try:
        values = await _read_all(consumer, 50)
    finally:
        await consumer.stop()
    assert values == [f"m{i}".encode() for i in range(50)]


async def test_same_transactional_id_fences_the_older_producer(
    kafka_bootstrap: str, topic: str
) -> None:
    txn_id = f"txn-{topic}"
    first: AIOKafkaProducer = make_producer(kafka_bootstrap, transactional_id=txn_id)
    await first.start()
    second: AIOKafkaProducer | None = None
    try:
        async with first.transaction():
            await (await first.send(topic, b"first-committed"))

        # The first producer opens a transaction, then a second one with the same id starts:
        # InitProducerId bumps the epoch, and the coordinator aborts the first one's open
        # transaction.
        await first.begin_transaction()
        await (await first.send(topic, b"first-open-then-aborted"))
        second = make_producer(kafka_bootstrap, transactional_id=txn_id)
        await second.start()

        with pytest.raises(ProducerFenced):
            await first.commit_transaction()

        async with second.transaction():
            await (await second.send(topic, b"second-committed"))
        await second.begin_transaction()
        await (await second.send(topic, b"second-aborted"))
        await second.abort_transaction()
        async with second.transaction():
            await (await second.send(topic, b"second-committed-2"))
    finally:
        if second is not None:
            await second.stop()
        await first.stop()

    assert await _read_to_end(kafka_bootstrap, topic) == [
        b"first-committed",
        b"second-committed",
        b"second-committed-2",
    ]


async def test_fenced_producer_cannot_start_a_new_transaction(
    kafka_bootstrap: str, topic: str
) -> None:
    txn_id = f"txn-{topic}"
    first = make_producer(kafka_bootstrap, transactional_id=txn_id)
    await first.start()
    second = make_producer(kafka_bootstrap, transactional_id=txn_id)
    await second.start()
    try:
        with pytest.raises(ProducerFenced):
            async with first.transaction():
                await (await first.send(topic, b"zombie"))
        async with second.transaction():
            await (await second.send(topic, b"live"))
    finally:
        await second.stop()
        await first.stop()
    assert await _read_to_end(kafka_bootstrap, topic) == [b"live"]


async def test_send_offsets_to_transaction(kafka_bootstrap: str, topic: str) -> None:
    source, sink = topic, f"{topic}.out"
    group = f"g-{topic}"
    await create_topics(kafka_bootstrap, [sink])
    seed = make_producer(kafka_bootstrap)
    await seed.start()
    try:
        for i in range(3):
            await seed.send_and_wait(source, f"in{i}".encode())
    finally:
        await seed.stop()

    consumer = make_consumer(kafka_bootstrap, source, group_id=group)
    producer = make_producer(kafka_bootstrap, transactional_id=f"txn-{topic}")
    await consumer.start()
    await producer.start()
    try:
        tp = TopicPartition(source, 0)
        records: list[ConsumerRecord[bytes, bytes]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15.0
        while len(records) < 3 and loop.time() < deadline:
            records.extend((await consumer.getmany(timeout_ms=500)).get(tp, []))
        assert [r.value for r in records] == [b"in0", b"in1", b"in2"]
        async with producer.transaction():
            for r in records:
                await (await producer.send(sink, r.value.upper()))
            await producer.send_offsets_to_transaction({tp: records[-1].offset + 1}, group)
        # EndTxn returns once the commit is decided; the markers that make the offsets visible
        # to OffsetFetch are written right after, so poll briefly.
        committed = None
        deadline = loop.time() + 10.0
        while committed != 3 and loop.time() < deadline:
            committed = await consumer.committed(tp)
            await asyncio.sleep(0.05)
        assert committed == 3
    finally:
        await producer.stop()
        await consumer.stop()
    assert await _read_to_end(kafka_bootstrap, sink) == [b"IN0", b"IN1", b"IN2"]


async def test_record_at_max_record_bytes_fits(kafka_bootstrap: str, topic: str) -> None:
    producer = make_producer(kafka_bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(
            topic, b"x" * MAX_RECORD_BYTES, key=b"k" * 200, headers=[("h", b"v" * 200)]
        )
    finally:
        await producer.stop()
    assert meta.offset == 0
    assert [len(v) for v in await _read_to_end(kafka_bootstrap, topic)] == [MAX_RECORD_BYTES]


async def test_record_over_frame_cap_is_refused_by_producer(
    kafka_bootstrap: str, topic: str
) -> None:
    producer = make_producer(kafka_bootstrap)
    await producer.start()
    try:
        with pytest.raises(MessageSizeTooLargeError):
            await producer.send_and_wait(topic, b"x" * (FRAME_CAP_BYTES + 1))
    finally:
        await producer.stop()


async def test_record_over_frame_cap_is_refused_by_broker(kafka_bootstrap: str, topic: str) -> None:
    # A producer whose own check is looser than the broker's: the broker must refuse the record.
    producer = make_producer(kafka_bootstrap, max_request_size=4 * FRAME_CAP_BYTES)
    await producer.start()
    try:
        with pytest.raises(MessageSizeTooLargeError):
            await producer.send_and_wait(topic, b"x" * (FRAME_CAP_BYTES + 1))
    finally:
        await producer.stop()
    assert await _read_to_end(kafka_bootstrap, topic) == []
