"""The chunk store: bodies over the 64 KiB inline limit, named by the sha256 of their bytes.

Chunks are stored **per workload**: every read and write names the workload the chunk belongs
to, and a chunk stored for one workload is not there for another, even with the same bytes.
Which workload a request may read chunks of is decided, purely, by
:func:`fx_node.admission.chunk_problem`; the store only keeps the namespaces apart.

Two backends with one interface (:class:`ChunkStore`):

- :class:`FsChunkStore` (default): ``<dir>/wl/<workload>/sha256/<hex>``, written atomically.
  One machine, or a shared filesystem.
- :class:`KafkaChunkStore`: the compacted topic ``sys.chunks`` (one partition), with a
  :class:`FsChunkStore` as local cache. Chosen over an S3-compatible store because a Kafka broker
  is always there (no new service, credentials or client library), it replicates the chunks exactly
  as it replicates the records that name them, and compaction by key never drops a chunk while it
  is the latest value of its key (content-addressed values never change, so every chunk stays).
  A chunk larger than the frame cap is split into parts of :data:`PART_BYTES`, keyed
  ``<workload>/<hash>/<i>/<n>``; each part's headers repeat the workload, chunk hash, part
  number and total size (the format's one home is :mod:`broker_schema.chunks`, which the lease
  holder's reader, :mod:`fx_kafka.refs`, uses too).
  The cost: Kafka has no lookup by key, so a reader keeps an index (key -> offset) by reading the
  topic from the start, and catches up to the end offset on a miss. Fine for request/response
  bodies (kilobytes to megabytes); model files (gigabytes) stay in the model store.

Chunks are stored sealed (AES-GCM under a data key per chunk, wrapped by the workload's tenant
key: :mod:`broker_schema.chunk_crypto`, :mod:`fx_kafka.tenant_keys`). Every read is opened and
hash-checked: a missing chunk raises ``input_missing``, a redacted one (its key entry destroyed
by ``fx redact``, or its tenant key gone) ``input_missing`` saying so, one whose bytes do not
open or hash to the reference (or have the wrong size) ``input_hash_mismatch``. The Kafka
store asks the topic for the chunk's key entry on every read, so a redaction there reaches
every executor's cache.

Chunks written before the store was per workload (``<dir>/sha256/<hex>``, keys
``<hash>/<i>/<n>``) belong to no workload and are never read; store them again with
``fx chunk put --workload ID`` (docs/executor.md, "The chunk store").
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Protocol

from broker_schema import topics
from broker_schema.canonical import is_hash
from broker_schema.chunk_crypto import key_entry_key, parse_key_entry_key
from broker_schema.chunks import (
    PART_BYTES,
    ChunkProblem,
    fs_relpath,
    parse_part_key,
    part_headers,
    part_key,
    split_parts,
)
from broker_schema.chunks import check_chunk as _check_chunk
from broker_schema.codec import decode
from broker_schema.records import ChunkRef
from broker_schema.topics import check_workload_id
from fx_kafka.chunk_files import read_chunk_file, store_files, stored_files, write_chunk_file
from fx_kafka.tenant_keys import TenantKeys, open_from_store
from fx_node.errors import OutcomeError

__all__ = ["PART_BYTES", "ChunkStore", "FsChunkStore", "KafkaChunkStore", "check_chunk"]

log = logging.getLogger(__name__)


def check_chunk(ref: ChunkRef, data: bytes) -> bytes:
    """``data`` if it matches ``ref`` (hash and size), else ``input_hash_mismatch``."""
    try:
        return _check_chunk(ref, data)
    except ChunkProblem as exc:
        raise OutcomeError("input_hash_mismatch", exc.message) from None


def _outcome(exc: ChunkProblem) -> OutcomeError:
    return OutcomeError("input_hash_mismatch" if exc.why == "mismatch" else "input_missing",
                        exc.message)


def _workload(workload: str) -> str:
    try:
        return check_workload_id(workload)
    except ValueError as exc:
        raise OutcomeError("input_missing", str(exc)) from None


def _reason(value: bytes) -> str:
    """What a redaction record on ``sys.chunks`` says (its reason and who), for messages."""
    try:
        record = decode(value)
        return f"redacted by {getattr(record, 'principal', '?')}: {getattr(record, 'reason', '')}"
    except Exception:  # a record this version cannot read still means redacted
        return "redacted"


class ChunkStore(Protocol):
    """Where bodies over the inline limit live, one namespace per workload."""

    async def get(self, ref: ChunkRef, *, workload: str) -> bytes:
        """The bytes of ``workload``'s chunk ``ref.hash``, hash-checked (``input_missing`` /
        ``input_hash_mismatch``). ``ref.workload`` is not looked at: the caller decides whose
        chunk to read (:func:`fx_node.admission.chunk_owner`)."""
        ...

    async def put(self, data: bytes, *, workload: str,
                  media_type: str | None = None) -> ChunkRef:
        """Store ``data`` for ``workload`` (idempotent) and return its reference."""
        ...


class FsChunkStore:
    """Chunks as files under ``root/wl/<workload>/sha256/``."""

    def __init__(self, root: str | Path, keys: TenantKeys | None = None) -> None:
        self.root = Path(root)
        self.keys = keys or TenantKeys()

    def path(self, chunk_hash: str, workload: str) -> Path:
        """The file of ``workload``'s chunk ``chunk_hash``."""
        if not is_hash(chunk_hash):
            raise OutcomeError("input_missing", f"not a chunk hash: {chunk_hash!r}")
        return self.root / fs_relpath(_workload(workload), chunk_hash)

    def get_sync(self, ref: ChunkRef, *, workload: str) -> bytes:
        """Blocking :meth:`get`."""
        self.path(ref.hash, workload)  # a bad hash or workload id: input_missing
        try:
            return read_chunk_file(self.root, ref, workload=workload, keys=self.keys)
        except ChunkProblem as exc:
            if exc.why == "missing":  # said without this machine's paths
                raise OutcomeError("input_missing", f"no chunk {ref.hash} of workload "
                                   f"{workload} in this executor's chunk store") from None
            raise _outcome(exc) from None

    def put_sync(self, data: bytes, *, workload: str,
                 media_type: str | None = None) -> ChunkRef:
        """Blocking :meth:`put` (:func:`fx_kafka.chunk_files.write_chunk_file`)."""
        return write_chunk_file(self.root, data, workload=_workload(workload),
                                media_type=media_type, keys=self.keys)

    def has(self, chunk_hash: str, workload: str) -> bool:
        """Whether a file for ``workload``'s ``chunk_hash`` is there (not checked)."""
        return self.path(chunk_hash, workload).exists()

    async def get(self, ref: ChunkRef, *, workload: str) -> bytes:
        """The chunk's bytes, hash-checked."""
        return await asyncio.to_thread(self.get_sync, ref, workload=workload)

    async def put(self, data: bytes, *, workload: str,
                  media_type: str | None = None) -> ChunkRef:
        """Store ``data`` for ``workload`` and return its reference."""
        return await asyncio.to_thread(self.put_sync, data, workload=workload,
                                       media_type=media_type)


class KafkaChunkStore:
    """Chunks on the compacted topic ``sys.chunks``, cached in a local :class:`FsChunkStore`.

    ``producer`` is the service's (started) producer; the store starts its own consumer (no
    group, manual assignment) in :meth:`start`. One task at a time uses the consumer (a lock).
    """

    def __init__(
        self, bootstrap: str, producer: Any, cache: FsChunkStore, *, topic: str = topics.CHUNKS
    ) -> None:
        self.bootstrap = bootstrap
        self.producer = producer
        self.cache = cache
        self.topic = topic
        self._consumer: Any = None
        # end offsets come from a consumer with no assignment: see ExecutorService._probe
        self._probe: Any = None
        self._tp: Any = None
        #: (workload, chunk hash) -> {part index: offset}, and the part count.
        self._index: dict[tuple[str, str], dict[int, int]] = {}
        self._parts: dict[tuple[str, str], int] = {}
        #: (workload, chunk hash) -> its key entry on the topic (None: tombstoned, redacted),
        #: and the reason of its redaction record
        self._keys: dict[tuple[str, str], bytes | None] = {}
        self._redactions: dict[tuple[str, str], str] = {}
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Start the index consumer at the beginning of the topic."""
        from aiokafka import TopicPartition

        from fx_kafka.client import make_consumer

        self._tp = TopicPartition(self.topic, 0)
        self._consumer = make_consumer(self.bootstrap, isolation_level="read_uncommitted")
        await self._consumer.start()
        self._probe = make_consumer(self.bootstrap, isolation_level="read_uncommitted")
        await self._probe.start()
        self._consumer.assign([self._tp])
        await self._consumer.seek_to_beginning(self._tp)

    async def stop(self) -> None:
        """Stop the index consumer."""
        for c in (self._consumer, self._probe):
            if c is not None:
                await c.stop()
        self._consumer = self._probe = None

    async def put(self, data: bytes, *, workload: str,
                  media_type: str | None = None) -> ChunkRef:
        """Write every part (acks=all) unless the index already has ``workload``'s chunk; cache
        locally."""
        ref = await self.cache.put(data, workload=workload, media_type=media_type)
        if (workload, ref.hash) in self._parts and self._keys.get((workload, ref.hash)):
            return ref
        # the cache's sealed bytes and key entry go to the topic as they are
        stored, entry = await asyncio.to_thread(stored_files, self.cache.root, workload,
                                                ref.hash)
        parts = split_parts(stored)
        total = len(parts)
        futures = []
        if entry is not None:
            futures.append(await self.producer.send(
                self.topic, value=entry, key=key_entry_key(workload, ref.hash)))
        for i, part in enumerate(parts):
            headers = part_headers(workload, ref.hash, i, total, len(stored))
            futures.append(
                await self.producer.send(
                    self.topic, value=part, key=part_key(workload, ref.hash, i, total),
                    headers=headers,
                )
            )
        for fut in futures:
            await fut
        return ref

    async def get(self, ref: ChunkRef, *, workload: str) -> bytes:
        """From the cache, else from ``sys.chunks`` (catching the index up first, always: a
        chunk whose key entry the topic no longer holds is redacted, cached or not)."""
        if self._consumer is None:
            raise OutcomeError("input_missing", "the Kafka chunk store is not started")
        key = (workload, ref.hash)
        async with self._lock:
            await self._catch_up(key)
            self._check_redacted(key, ref)
        if self.cache.has(ref.hash, workload):
            try:
                return await self.cache.get(ref, workload=workload)
            except OutcomeError:
                log.warning("cached chunk %s of %s does not open or fails its hash; reading "
                            "it from %s", ref.hash, workload, self.topic)
        async with self._lock:
            stored = await self._read(key)
            self._check_redacted(key, ref)
        if stored is None:
            raise OutcomeError("input_missing",
                               f"no chunk {ref.hash} of workload {workload} on {self.topic}")
        entry = self._keys.get(key)
        try:
            data = open_from_store(stored, entry, ref, workload=workload, keys=self.cache.keys,
                                   redaction=self._redactions.get(key))
        except ChunkProblem as exc:
            raise _outcome(exc) from None
        await asyncio.to_thread(store_files, self.cache.root, workload, ref.hash, stored, entry)
        return data

    def _check_redacted(self, key: tuple[str, str], ref: ChunkRef) -> None:
        if (key in self._keys and self._keys[key] is None) or key in self._redactions:
            why = self._redactions.get(key)
            raise OutcomeError("input_missing", f"chunk {ref.hash} of workload {key[0]} is "
                               "redacted: its data key was destroyed"
                               + (f" ({why})" if why else ""))

    async def _catch_up(self, wanted: tuple[str, str]) -> dict[int, bytes]:
        """Read to the end offset, indexing every part; return the parts of ``wanted`` seen."""
        got: dict[int, bytes] = {}
        end = (await self._probe.end_offsets([self._tp]))[self._tp]
        while await self._consumer.position(self._tp) < end:
            batch = await self._consumer.getmany(self._tp, timeout_ms=1000)
            for msg in batch.get(self._tp, []):
                other = parse_key_entry_key(msg.key)
                if other is not None:
                    w, h, what = other
                    if what == "key":
                        self._keys[(w, h)] = msg.value
                    elif msg.value is not None:
                        self._redactions[(w, h)] = _reason(msg.value)
                    continue
                parsed = parse_part_key(msg.key)
                if parsed is None:
                    continue
                w, h, i, n = parsed
                self._index.setdefault((w, h), {})[i] = msg.offset
                self._parts[(w, h)] = n
                if (w, h) == wanted:
                    got[i] = msg.value
        return got

    async def _read(self, key: tuple[str, str]) -> bytes | None:
        parts = await self._catch_up(key)
        total = self._parts.get(key)
        if total is None:
            return None
        missing = [i for i in range(total) if i not in parts]
        if missing:
            resume = await self._consumer.position(self._tp)
            for i in missing:
                offset = self._index.get(key, {}).get(i)
                if offset is None:
                    return None
                self._consumer.seek(self._tp, offset)
                batch = await self._consumer.getmany(self._tp, timeout_ms=5000, max_records=1)
                msgs = batch.get(self._tp, [])
                if not msgs or msgs[0].offset != offset:
                    return None
                parts[i] = msgs[0].value
            self._consumer.seek(self._tp, resume)
        return b"".join(parts[i] for i in range(total))
