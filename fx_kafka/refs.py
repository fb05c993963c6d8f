"""Reading what references name off the broker: chunks on ``sys.chunks``, and stream records.

For the lease holder and replay (the executor has its own store, :mod:`executor.chunks`); the
chunk format is :mod:`broker_schema.chunks`, so both read and write the same parts.

- :class:`ChunkTopicReader`: reads the parts of a set of wanted chunks in one pass over
  ``sys.chunks`` (read_committed), keeping an index (key -> offset) so a later call reads only
  what was appended since, and seeks back for parts it indexed before. A tombstone (a part with
  a null value) deletes that part.
- :func:`write_chunk`: writes a chunk's parts (acks=all) with a plain producer.
- :class:`StreamRecordReader`: the committed record at a topic, partition and offset.

No rule about *which* chunks or topics may be read lives here: callers ask
:mod:`broker_schema.refs` first. A topic this client's ACLs deny raises aiokafka's
``TopicAuthorizationFailedError`` at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from aiokafka import TopicPartition

from broker_schema import topics
from broker_schema.chunks import (
    ChunkProblem,
    assemble,
    chunk_ref_of,
    parse_part_key,
    part_headers,
    part_key,
    split_parts,
)
from broker_schema.records import ChunkRef
from fx_kafka.client import check_authorized, make_consumer

__all__ = ["ChunkTopicReader", "StreamAbsent", "StreamRecordReader", "write_chunk"]

ChunkKey = tuple[str, str]


class ChunkTopicReader:
    """Chunks of any workload off ``sys.chunks``, read committed, with an index of part offsets.

    Start it with :meth:`start` (a consumer with no group, assigned the one partition), stop it
    with :meth:`stop`. One task at a time reads (a lock)."""

    def __init__(self, bootstrap: str, *, topic: str = topics.CHUNKS,
                 timeout_s: float = 60.0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.timeout_s = timeout_s
        self._consumer: Any = None
        self._tp = TopicPartition(topic, 0)
        self._present = False
        #: (workload, chunk hash) -> {part index: offset}, and the part count.
        self._index: dict[ChunkKey, dict[int, int]] = {}
        self._parts: dict[ChunkKey, int] = {}
        self._end = 0
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Start the consumer (the topic is looked up on each read: it may appear later)."""
        self._consumer = make_consumer(self.bootstrap)
        await self._consumer.start()

    async def stop(self) -> None:
        """Stop the consumer."""
        if self._consumer is not None:
            await self._consumer.stop()
        self._consumer = None

    async def read(self, wanted: Mapping[ChunkKey, ChunkRef]
                   ) -> dict[ChunkKey, bytes | ChunkProblem]:
        """The bytes of each wanted ``(owner workload, hash)`` chunk, hash-checked, or the
        :class:`~broker_schema.chunks.ChunkProblem` that says why not (``missing``: not on the
        topic as read to its last stable offset; ``mismatch``)."""
        if not wanted:
            return {}
        if self._consumer is None:
            raise RuntimeError("ChunkTopicReader.read before start()")
        async with self._lock:
            got = await self._catch_up(set(wanted))
            for key in wanted:
                for i, offset in sorted(self._index.get(key, {}).items()):
                    if i not in got[key]:
                        value = await self._fetch_at(offset)
                        if value is not None:
                            got[key][i] = value
        where = (f"on {self.topic} (read to offset {self._end})" if self._present
                 else f"on {self.topic} (the topic does not exist)")
        out: dict[ChunkKey, bytes | ChunkProblem] = {}
        for key, ref in wanted.items():
            total = self._parts.get(key) if self._index.get(key) else None
            try:
                out[key] = assemble(ref, key[0], got[key], total, where=where)
            except ChunkProblem as exc:
                out[key] = exc
        return out

    async def _catch_up(self, wanted: set[ChunkKey]) -> dict[ChunkKey, dict[int, bytes]]:
        """Read to the last stable offset, indexing every part; the parts of ``wanted`` seen."""
        got: dict[ChunkKey, dict[int, bytes]] = {k: {} for k in wanted}
        consumer = self._consumer
        if not self._present:
            if self.topic not in await consumer.topics():
                return got
            consumer.assign([self._tp])
            await check_authorized(consumer, [self.topic])  # denied: said at once
            self._present = True
            await consumer.seek_to_beginning(self._tp)
        end = (await consumer.end_offsets([self._tp]))[self._tp]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while await consumer.position(self._tp) < end:
            if loop.time() > deadline:
                raise TimeoutError(f"reading {self.topic}: stuck at "
                                   f"{await consumer.position(self._tp)} of {end}")
            batch = await consumer.getmany(self._tp, timeout_ms=500)
            for msg in batch.get(self._tp, []):
                parsed = parse_part_key(msg.key)
                if parsed is None:
                    continue
                w, h, i, n = parsed
                key = (w, h)
                if msg.value is None:  # a tombstone: the part is deleted
                    self._index.get(key, {}).pop(i, None)
                    if key in got:
                        got[key].pop(i, None)
                    continue
                self._index.setdefault(key, {})[i] = msg.offset
                self._parts[key] = n
                if key in got:
                    got[key][i] = msg.value
        self._end = max(self._end, end)
        return got

    async def _fetch_at(self, offset: int) -> bytes | None:
        consumer = self._consumer
        resume = await consumer.position(self._tp)
        consumer.seek(self._tp, offset)
        try:
            batch = await consumer.getmany(self._tp, timeout_ms=5000, max_records=1)
        finally:
            consumer.seek(self._tp, resume)
        msgs = batch.get(self._tp, [])
        if not msgs or msgs[0].offset != offset or msgs[0].value is None:
            return None
        value: bytes = msgs[0].value
        return value


async def write_chunk(producer: Any, data: bytes, *, workload: str,
                      media_type: str | None = None, topic: str = topics.CHUNKS) -> ChunkRef:
    """Write ``data`` as ``workload``'s chunk on ``sys.chunks`` (every part, acks as the
    producer has them: the project's are acks=all) and return its reference."""
    ref = chunk_ref_of(data, media_type=media_type)
    parts = split_parts(data)
    futures = []
    for i, part in enumerate(parts):
        futures.append(await producer.send(
            topic, value=part, key=part_key(workload, ref.hash, i, len(parts)),
            headers=part_headers(workload, ref.hash, i, len(parts), len(data))))
    for fut in futures:
        await fut
    return ref


@dataclass
class StreamAbsent(Exception):
    """No committed record at the offset: ``no_topic`` (no such topic or partition),
    ``trimmed`` (below the log start), ``not_yet`` (at or past the last stable offset: it may
    still come) or ``missing`` (in range, but not fetched: a transaction marker, an aborted
    record)."""

    why: Literal["no_topic", "trimmed", "not_yet", "missing"]
    message: str

    def __str__(self) -> str:
        return self.message


class StreamRecordReader:
    """The committed record at a topic, partition and offset (one consumer, reassigned per
    read; one task at a time)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._consumer: Any = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Start the consumer."""
        self._consumer = make_consumer(self.bootstrap)
        await self._consumer.start()

    async def stop(self) -> None:
        """Stop the consumer."""
        if self._consumer is not None:
            await self._consumer.stop()
        self._consumer = None

    async def read(self, topic: str, partition: int, offset: int) -> bytes:
        """The value of the record at ``topic``/``partition``@``offset``, or
        :class:`StreamAbsent`. The topic is looked up first (never created)."""
        if self._consumer is None:
            raise RuntimeError("StreamRecordReader.read before start()")
        where = f"{topic}/{partition}@{offset}"
        async with self._lock:
            consumer = self._consumer
            # the cluster's metadata as fetched (never creating the topic); aiokafka has no
            # public view of another topic's partitions before it is assigned
            cluster = await consumer._client.fetch_all_metadata()
            if topic not in cluster.topics():
                raise StreamAbsent("no_topic", f"{where}: no topic {topic} in the cluster")
            parts = cluster.partitions_for_topic(topic) or set()
            if partition not in parts:
                raise StreamAbsent("no_topic", f"{where}: {topic} has no partition {partition}")
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            await check_authorized(consumer, [topic])  # denied: said at once
            first = (await consumer.beginning_offsets([tp]))[tp]
            end = (await consumer.end_offsets([tp]))[tp]
            if offset < first:
                raise StreamAbsent("trimmed", f"{where}: trimmed (the log starts at {first})")
            if offset >= end:
                raise StreamAbsent("not_yet", f"{where}: not written (or not committed) yet "
                                   f"(the partition ends at {end})")
            consumer.seek(tp, offset)
            batch = await consumer.getmany(tp, timeout_ms=5000, max_records=1)
            msgs = batch.get(tp, [])
            if not msgs:
                raise StreamAbsent("not_yet", f"{where}: nothing fetched in 5 s")
            if msgs[0].offset != offset:
                raise StreamAbsent("missing", f"{where}: no record there (the next is at "
                                   f"{msgs[0].offset})")
            value: bytes = msgs[0].value or b""
            return value
