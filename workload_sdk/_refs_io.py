"""Resolving references for the lease holder and replay: the bytes a chunk or stream reference
names, read and hash-checked before the step sees them.

The pure core never reads anything: the I/O shell (the holder's fetch loop, the log readers of
:mod:`workload_sdk._kafka_io`) hands each :class:`~workload_sdk._core.Item` the bytes of its one
referenced body (``Item.resolved``). What a reference resolves to is what the executor would give
a model for the same reference as a request input:

- a chunk reference: the chunk's bytes, from the store (``sys.chunks`` by default, or a
  filesystem store shared with the executors: ``--chunk-dir``), of the owner
  :func:`broker_schema.refs.chunk_owner` names, checked against its hash and size;
- a stream reference: the committed record at its topic, partition and offset, checked against
  its ``hash`` when it has one; when that record is an input record, that record's body (inline,
  or a chunk of the topic's workload; a stream reference there is not followed).

Only what :mod:`broker_schema.refs` lets the workload read is asked of the broker or the store (a
forbidden reference is left unresolved: the core hands the step the reference and says why).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from aiokafka.errors import TopicAuthorizationFailedError

from broker_schema import (
    Body,
    ChunkRef,
    DecodeError,
    InlineBody,
    InputRecord,
    SpecRecord,
    StreamRef,
    decode,
    sha256_hex,
    topics,
)
from broker_schema.chunks import ChunkProblem, fs_relpath
from broker_schema.refs import chunk_owner, chunk_problem, stream_problem
from fx_kafka.chunk_files import read_chunk_file, write_chunk_file

__all__ = ["ChunkStore", "FsChunks", "KafkaChunks", "RefProblem", "RefResolver", "Resolution",
           "chunk_store", "store_where"]

#: Where a resolved body sits: ``(stream, offset)`` of the record that holds the reference
#: (``in``, ``resp``, or ``merge`` for a snapshot's state).
Key = tuple[str, int]
ChunkKey = tuple[str, str]


@dataclass(frozen=True)
class RefProblem:
    """Why a reference resolved to nothing: ``missing`` (not there: it may still come, so the
    holder waits a while), ``mismatch`` (bytes that are not the reference's), ``redacted`` (its
    data key was destroyed: ``fx redact``), ``forbidden`` (the workload may not read it: nothing
    was asked) or ``invalid``."""

    why: Literal["missing", "mismatch", "redacted", "forbidden", "invalid"]
    message: str

    @property
    def retry(self) -> bool:
        """Whether trying again later may find it."""
        return self.why == "missing"


@dataclass
class Resolution:
    """What :meth:`RefResolver.resolve` found: bytes by key, and why for the others."""

    resolved: dict[Key, bytes] = field(default_factory=dict)
    problems: dict[Key, RefProblem] = field(default_factory=dict)


def _allowed(check: Callable[[SpecRecord | None], str | None],
             specs: Sequence[SpecRecord]) -> str | None:
    """None when any of ``specs`` (or, with none, the workload's own rule) allows it; else the
    last refusal."""
    if not specs:
        return check(None)
    problem: str | None = None
    for spec in specs:
        problem = check(spec)
        if problem is None:
            return None
    return problem


def _stream_problem(ref: StreamRef, reader: str, spec: SpecRecord | None) -> str | None:
    return stream_problem(ref, reader=reader, spec=spec)


class FsChunks:
    """Chunks as files under ``root`` (:func:`broker_schema.chunks.fs_relpath`): the layout of
    the executor's filesystem store, so the two can share a directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _read_one(self, key: ChunkKey, ref: ChunkRef) -> bytes | ChunkProblem:
        try:
            return read_chunk_file(self.root, ref, workload=key[0])
        except ChunkProblem as exc:
            if exc.why == "mismatch":
                return ChunkProblem("mismatch", f"{exc.message} (file "
                                    f"{self.root / fs_relpath(key[0], ref.hash)})")
            return exc

    async def read(self, wanted: Mapping[ChunkKey, ChunkRef]
                   ) -> dict[ChunkKey, bytes | ChunkProblem]:
        """Each wanted ``(owner, hash)`` chunk's bytes, hash-checked, or why not."""
        return await asyncio.to_thread(
            lambda: {key: self._read_one(key, ref) for key, ref in wanted.items()})

    async def write(self, data: bytes, *, workload: str,
                    media_type: str | None = None) -> ChunkRef:
        """Store ``data`` as ``workload``'s chunk (atomically, idempotent)."""
        return await asyncio.to_thread(partial(write_chunk_file, self.root, data, workload=workload,
                                              media_type=media_type))

    async def close(self) -> None:
        """Nothing to close."""


class KafkaChunks:
    """Chunks on ``sys.chunks`` (:class:`fx_kafka.refs.ChunkTopicReader`), started on first use.
    Writes go through a plain producer of its own (acks=all), after creating the compacted topic
    if it is not there."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._reader: Any = None
        self._producer: Any = None

    async def read(self, wanted: Mapping[ChunkKey, ChunkRef]
                   ) -> dict[ChunkKey, bytes | ChunkProblem]:
        """Each wanted ``(owner, hash)`` chunk's bytes, hash-checked, or why not."""
        if not wanted:
            return {}
        if self._reader is None:
            from fx_kafka.refs import ChunkTopicReader

            reader = ChunkTopicReader(self.bootstrap)
            await reader.start()
            self._reader = reader
        result: dict[ChunkKey, bytes | ChunkProblem] = await self._reader.read(wanted)
        return result

    async def write(self, data: bytes, *, workload: str,
                    media_type: str | None = None) -> ChunkRef:
        """Write ``data`` as ``workload``'s chunk on ``sys.chunks``."""
        from fx_kafka.refs import write_chunk

        if self._producer is None:
            from aiokafka.errors import (
                ClusterAuthorizationFailedError,
                TopicAuthorizationFailedError,
            )

            from fx_kafka.client import create_topics, make_producer

            # as the executor does at start; a writer that may not create topics finds it there
            with contextlib.suppress(ClusterAuthorizationFailedError,
                                     TopicAuthorizationFailedError):
                await create_topics(self.bootstrap, [topics.CHUNKS], compacted=True)
            producer = make_producer(self.bootstrap)
            await producer.start()
            self._producer = producer
        ref: ChunkRef = await write_chunk(self._producer, data, workload=workload,
                                          media_type=media_type)
        return ref

    async def close(self) -> None:
        """Stop the reader and the producer."""
        reader, producer = self._reader, self._producer
        self._reader = self._producer = None
        if reader is not None:
            await reader.stop()
        if producer is not None:
            await producer.stop()


ChunkStore = FsChunks | KafkaChunks


def chunk_store(bootstrap: str, chunk_dir: str | Path | None = None) -> ChunkStore:
    """The chunk store a workload's tools read and write: the filesystem store ``chunk_dir``
    when given (shared with the executors), else the default, ``sys.chunks`` on ``bootstrap``.
    The one place the default is decided: the holder, replay, audit and
    :class:`~workload_sdk.InputWriter` all take their store from here."""
    return FsChunks(chunk_dir) if chunk_dir is not None else KafkaChunks(bootstrap)


def store_where(store: ChunkStore) -> str:
    """Where ``store`` keeps chunks, for messages."""
    if isinstance(store, FsChunks):
        return f"the chunk directory {store.root}"
    return topics.CHUNKS


class RefResolver:
    """Reads what references name: chunks from one store (``chunk_dir``: a filesystem store;
    default ``sys.chunks`` on ``bootstrap``), stream records from ``bootstrap``. Clients start
    on first use; :meth:`close` stops them."""

    def __init__(self, bootstrap: str, *, chunk_dir: str | Path | None = None) -> None:
        self.bootstrap = bootstrap
        self.chunks: ChunkStore = chunk_store(bootstrap, chunk_dir)
        self._streams: Any = None

    @property
    def where(self) -> str:
        """Where chunks are looked for, for messages."""
        return store_where(self.chunks)

    async def close(self) -> None:
        """Stop every client started."""
        await self.chunks.close()
        if self._streams is not None:
            await self._streams.stop()
            self._streams = None

    async def __aenter__(self) -> RefResolver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def write_chunk(self, data: bytes, *, workload: str,
                          media_type: str | None = None) -> ChunkRef:
        """Store ``data`` as ``workload``'s chunk (the holder's snapshots over the inline
        limit)."""
        return await self.chunks.write(data, workload=workload, media_type=media_type)

    async def _stream_value(self, ref: StreamRef) -> bytes | RefProblem:
        from fx_kafka.refs import StreamAbsent, StreamRecordReader

        if self._streams is None:
            reader = StreamRecordReader(self.bootstrap)
            await reader.start()
            self._streams = reader
        try:
            value: bytes = await self._streams.read(ref.topic, ref.partition, ref.offset)
        except StreamAbsent as exc:
            return RefProblem("missing" if exc.why == "not_yet" else "invalid",
                              f"stream record {exc.message}")
        except TopicAuthorizationFailedError as exc:
            return RefProblem("invalid", f"stream record {ref.topic}/{ref.partition}@"
                              f"{ref.offset}: this client may not read {ref.topic} ({exc}); "
                              "grant its principal READ on it")
        if ref.hash is not None and sha256_hex(value) != ref.hash:
            return RefProblem("mismatch", f"stream record {ref.topic}/{ref.partition}@"
                              f"{ref.offset} does not hash to {ref.hash}")
        return value

    async def resolve(self, wants: Iterable[tuple[Key, Body]], *, workload: str,
                      specs: Sequence[SpecRecord] = ()) -> Resolution:
        """The bytes of each ``(key, body)`` found in ``workload``'s own records, reading only
        what ``specs`` (any of them; none: the workload's own streams and chunks) let it read.
        Inline bodies resolve to their bytes. Chunks are read in one pass over the store."""
        res = Resolution()
        chunk_wants: dict[ChunkKey, tuple[ChunkRef, list[Key]]] = {}

        def want_chunk(key: Key, ref: ChunkRef, context: str) -> None:
            problem = _allowed(lambda s: chunk_problem(ref, reader=workload, spec=s,
                                                       context=context), specs)
            if problem is not None:
                res.problems[key] = RefProblem("forbidden", problem)
                return
            ck = (chunk_owner(ref, context), ref.hash)
            chunk_wants.setdefault(ck, (ref, []))[1].append(key)

        for key, body in wants:
            if isinstance(body, InlineBody):
                res.resolved[key] = body.raw()
            elif isinstance(body, ChunkRef):
                want_chunk(key, body, workload)
            elif isinstance(body, StreamRef):
                problem = _allowed(partial(_stream_problem, body, workload), specs)
                if problem is not None:
                    res.problems[key] = RefProblem("forbidden", problem)
                    continue
                value = await self._stream_value(body)
                if isinstance(value, RefProblem):
                    res.problems[key] = value
                    continue
                try:
                    record = decode(value)
                except DecodeError:
                    res.resolved[key] = value
                    continue
                if not isinstance(record, InputRecord):
                    res.resolved[key] = value
                elif isinstance(record.body, InlineBody):
                    res.resolved[key] = record.body.raw()
                elif isinstance(record.body, ChunkRef):
                    want_chunk(key, record.body, topics.parse(body.topic)[0])
                else:
                    res.problems[key] = RefProblem(
                        "invalid", f"stream record {body.topic}/{body.partition}@{body.offset} "
                        "is an input whose body is a stream reference (not followed)")
        if chunk_wants:
            try:
                got = await self.chunks.read({ck: ref for ck, (ref, _keys) in
                                              chunk_wants.items()})
            except TopicAuthorizationFailedError as exc:
                denied = RefProblem("invalid", f"this client may not read {topics.CHUNKS} "
                                    f"({exc}): grant its principal READ on it, or use a "
                                    "filesystem chunk store (--chunk-dir; docs/operations.md, "
                                    "\"The holder's chunk store\")")
                for _ref, keys in chunk_wants.values():
                    res.problems.update(dict.fromkeys(keys, denied))
                return res
            for ck, (_ref, keys) in chunk_wants.items():
                value_or_problem = got[ck]
                for key in keys:
                    if isinstance(value_or_problem, ChunkProblem):
                        res.problems[key] = RefProblem(value_or_problem.why,
                                                       value_or_problem.message)
                    else:
                        res.resolved[key] = value_or_problem
        return res

