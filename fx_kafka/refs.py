"""Reading what references name off the broker: chunks on ``sys.chunks``, and stream records.

Chunks for the lease holder and replay (the executor has its own store, :mod:`executor.chunks`,
which writes the same files, :mod:`fx_kafka.chunk_files`); the chunk format is
:mod:`broker_schema.chunks`, so both read and write the same parts.

- :class:`ChunkTopicReader`: reads the parts of a set of wanted chunks in one pass over
  ``sys.chunks`` (read_committed), keeping an index (key -> offset) so a later call reads only
  what was appended since, and seeks back for parts it indexed before. A tombstone (a part with
  a null value) deletes that part. Chunks are sealed (:mod:`broker_schema.chunk_crypto`): the
  reader keeps each chunk's key entry (``<workload>/<hash>/key``) and redaction record, and opens
  what it assembles with the local tenant keys (:mod:`fx_kafka.tenant_keys`); a tombstoned key
  entry is a redacted chunk (``ChunkProblem`` ``redacted``).
- :func:`write_chunk`: seals a chunk and writes its key entry and parts (acks=all) with a plain
  producer.
- :func:`read_record_at`: the one reading of a stream reference (the executor's inputs, read
  uncommitted, and :class:`StreamRecordReader`, the committed record for the holder and replay).

No rule about *which* chunks or topics may be read lives here: callers ask
:mod:`broker_schema.refs` first. A topic this client's ACLs deny raises aiokafka's
``TopicAuthorizationFailedError`` at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import InvalidTopicError, KafkaError, UnknownTopicOrPartitionError, for_code
from aiokafka.protocol.metadata import MetadataRequest

from broker_schema import topics
from broker_schema.chunk_crypto import key_entry_key, parse_key_entry_key
from broker_schema.chunks import (
    ChunkProblem,
    chunk_ref_of,
    join_parts,
    parse_part_key,
    part_headers,
    part_key,
    split_parts,
)
from broker_schema.records import ChunkRef
from fx_kafka.client import check_authorized, make_consumer
from fx_kafka.retry import broker_unavailable
from fx_kafka.tenant_keys import TenantKeys, open_from_store, seal_for_store

__all__ = [
    "ChunkTopicReader", "StreamAbsent", "StreamRecordReader", "StreamUnreachable",
    "read_record_at", "topic_partitions", "write_chunk",
]

ChunkKey = tuple[str, str]


class ChunkTopicReader:
    """Chunks of any workload off ``sys.chunks``, read committed, with an index of part offsets.

    Start it with :meth:`start` (a consumer with no group, assigned the one partition), stop it
    with :meth:`stop`. One task at a time reads (a lock)."""

    def __init__(self, bootstrap: str, *, topic: str = topics.CHUNKS,
                 timeout_s: float = 60.0, keys: TenantKeys | None = None) -> None:
        self.bootstrap = bootstrap
        self.keys = keys or TenantKeys()
        #: (workload, hash) -> key entry (None: tombstoned), and redaction records' bytes
        self._keys: dict[ChunkKey, bytes | None] = {}
        self._redactions: dict[ChunkKey, bytes] = {}
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
                if key in self._redactions or (key in self._keys and self._keys[key] is None):
                    raise ChunkProblem("redacted", f"chunk {ref.hash} of workload {key[0]} is "
                                       f"redacted: its data key was destroyed {where}"
                                       + self.redaction_note(key))
                stored = join_parts(ref, key[0], got[key], total, where=where)
                out[key] = open_from_store(stored, self._keys.get(key), ref, workload=key[0],
                                           keys=self.keys)
            except ChunkProblem as exc:
                out[key] = exc
        return out

    def redaction_note(self, key: ChunkKey) -> str:
        """`` (redacted by P: reason)`` from the chunk's redaction record, when one was read."""
        raw = self._redactions.get(key)
        if raw is None:
            return ""
        try:
            from broker_schema.codec import decode

            record = decode(raw)
            return (f" (redacted by {getattr(record, 'principal', '?')}: "
                    f"{getattr(record, 'reason', '')})")
        except ValueError:
            return " (a redaction record this version cannot read)"

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
                other = parse_key_entry_key(msg.key)
                if other is not None:
                    if other[2] == "key":
                        self._keys[other[:2]] = msg.value
                    elif msg.value is not None:
                        self._redactions[other[:2]] = msg.value
                    continue
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
                      media_type: str | None = None, topic: str = topics.CHUNKS,
                      keys: TenantKeys | None = None) -> ChunkRef:
    """Write ``data`` as ``workload``'s chunk on ``sys.chunks``, sealed under the tenant's key
    (``keys``, default the local key directory): its key entry, then every part (acks as the
    producer has them: the project's are acks=all). Returns its reference (of the plaintext)."""
    ref = chunk_ref_of(data, media_type=media_type)
    sealed, entry = await asyncio.to_thread(seal_for_store, data, ref, workload=workload,
                                            keys=keys or TenantKeys())
    parts = split_parts(sealed)
    futures = [await producer.send(topic, value=entry, key=key_entry_key(workload, ref.hash))]
    for i, part in enumerate(parts):
        futures.append(await producer.send(
            topic, value=part, key=part_key(workload, ref.hash, i, len(parts)),
            headers=part_headers(workload, ref.hash, i, len(parts), len(sealed))))
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


class StreamUnreachable(Exception):
    """A stream record could not be read because the broker cannot be reached right now (or
    fetched nothing in time from an offset it holds): try again later."""


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int] | None:
    """The partitions of ``topic`` in the cluster's metadata, None when it has no such topic.

    Asked with ``allow_auto_topic_creation=false`` on ``consumer``'s connection: a broker that
    auto-creates topics does not create this one (a consumer's own metadata look-up would:
    aiokafka asks for a topic it is given with auto-creation allowed). A broker that cannot be
    reached raises :class:`StreamUnreachable`; another error on the topic is re-raised."""
    client = consumer._client  # aiokafka (pinned) has no public metadata request
    node = client.get_random_node()
    if node is None:
        raise StreamUnreachable("no broker in the cluster metadata")
    try:
        resp = await client.send(node, MetadataRequest([topic], allow_auto_topic_creation=False))
    except KafkaError as exc:
        if broker_unavailable(exc):
            raise StreamUnreachable(repr(exc)) from exc
        raise
    for entry in resp.topics:
        code, name, parts = entry[0], entry[1], entry[-1]
        if name != topic:
            continue
        if code == 0:
            return {int(p[1]) for p in parts}
        error = for_code(code)
        if error in (UnknownTopicOrPartitionError, InvalidTopicError):
            return None
        if broker_unavailable(error()):  # e.g. no leader right now
            raise StreamUnreachable(f"{topic}: {error.__name__}")
        raise error(f"cannot read {topic}")
    return None


async def read_record_at(fetch: AIOKafkaConsumer, topic: str, partition: int, offset: int, *,
                         lookup: AIOKafkaConsumer | None = None, check_acl: bool = True,
                         fetch_timeout_ms: int = 5000) -> bytes:
    """The value of the record at ``topic``/``partition``@``offset``, fetched on ``fetch``
    (reassigned to that one partition) with its isolation level: the one reading of a stream
    reference, for the executor's inputs and the holder's and replay's references.

    The topic is looked up first and never created (:func:`topic_partitions`, on ``lookup``,
    default ``fetch``, which also answers the offset range). Raises :class:`StreamAbsent`
    (``no_topic``, ``trimmed``, ``not_yet``: at or past the end ``fetch``'s isolation level
    sees, ``missing``: another record is there) or :class:`StreamUnreachable` (the broker is
    away, or nothing came within ``fetch_timeout_ms`` from an offset in range). ``check_acl``:
    say at once when this client's ACLs deny the topic
    (:class:`~aiokafka.errors.TopicAuthorizationFailedError`)."""
    where = f"{topic}/{partition}@{offset}"
    lookup = fetch if lookup is None else lookup
    parts = await topic_partitions(lookup, topic)
    if parts is None:
        raise StreamAbsent("no_topic", f"{where}: no topic {topic} in the cluster")
    if partition not in parts:
        raise StreamAbsent("no_topic", f"{where}: {topic} has no partition {partition} "
                           f"(it has {len(parts)})")
    tp = TopicPartition(topic, partition)
    fetch.assign([tp])
    if check_acl:
        await check_authorized(fetch, [topic])  # denied: said at once
    try:
        first = (await lookup.beginning_offsets([tp]))[tp]
        end = (await lookup.end_offsets([tp]))[tp]
    except KafkaError as exc:
        if broker_unavailable(exc):
            raise StreamUnreachable(repr(exc)) from exc
        raise
    if offset < first:
        raise StreamAbsent("trimmed", f"{where}: trimmed (the log starts at {first})")
    if offset >= end:
        raise StreamAbsent("not_yet", f"{where}: not written (or not committed) yet "
                           f"(the partition ends at {end})")
    fetch.seek(tp, offset)
    batch = await fetch.getmany(tp, timeout_ms=fetch_timeout_ms, max_records=1)
    msgs = batch.get(tp, [])
    if not msgs:  # the offset is in the partition's range: nothing fetched means not reachable
        raise StreamUnreachable(f"{where}: nothing fetched in {fetch_timeout_ms / 1000:g} s")
    if msgs[0].offset != offset:
        raise StreamAbsent("missing", f"{where}: no record there (the next is at "
                           f"{msgs[0].offset})")
    value: bytes = msgs[0].value or b""
    return value


class StreamRecordReader:
    """The committed record at a topic, partition and offset (one consumer, reassigned per
    read; one task at a time), by :func:`read_record_at`."""

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
        :class:`StreamAbsent` (a broker that cannot be reached, or a fetch that brings nothing,
        is ``not_yet``: it may still come)."""
        if self._consumer is None:
            raise RuntimeError("StreamRecordReader.read before start()")
        async with self._lock:
            try:
                return await read_record_at(self._consumer, topic, partition, offset)
            except StreamUnreachable as exc:
                raise StreamAbsent("not_yet", f"{topic}/{partition}@{offset}: {exc}") from None
