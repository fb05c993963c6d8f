"""Writing a workload's inputs of any size: :class:`InputWriter` (Python) and ``fx workload
input`` (the command uses it: one code path).

A value whose inline body would be over the inline limit
(:data:`broker_schema.limits.INLINE_MAX_BYTES`, 64 KiB of canonical JSON) is stored as a chunk of
the workload, in the workload's chunk store (:func:`workload_sdk._refs_io.chunk_store`: the
filesystem store ``chunk_dir`` when given, else ``sys.chunks``), and the input record carries its
reference (:class:`~broker_schema.ChunkRef`). The step reads the same bytes either way
(``event.bytes()``, ``event.text()``, ``event.json()``): a chunk holds exactly what the inline
body's ``raw()`` would have been (the bytes, the UTF-8 text, or the canonical JSON).

What goes inline and what becomes a chunk is decided by :func:`plan_input` (pure); the writer
only stores and appends.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_schema import Body, ChunkRef, InlineBody, InputRecord, StreamRef, encode, topics
from broker_schema.canonical import canonical_json
from broker_schema.limits import INLINE_MAX_BYTES
from broker_schema.records import inline_size
from fx_kafka.client import make_producer
from fx_kafka.workloads import require_workload
from workload_sdk._refs_io import chunk_store, store_where

__all__ = ["ChunkPlan", "InputTooLarge", "InputWriter", "WrittenInput", "plan_input",
           "write_input"]

#: The remedy :class:`InputTooLarge` names when the Python client refused to store a chunk.
PYTHON_REMEDY = "let InputWriter store it as a chunk and write its reference (chunk=True)"


class InputTooLarge(ValueError):
    """An input over the inline limit, and chunks were not allowed: the message names the size,
    the limit and the remedy."""

    def __init__(self, size: int, remedy: str = PYTHON_REMEDY) -> None:
        self.size = size
        self.limit = INLINE_MAX_BYTES
        super().__init__(f"the input is {size} bytes inline, over the inline limit of "
                         f"{INLINE_MAX_BYTES} bytes (64 KiB of canonical JSON); {remedy}")


#: The media type a redactable inline body's chunk records when the body names none.
_MEDIA = {"json": "application/json", "utf8": "text/plain; charset=utf-8",
          "base64": "application/octet-stream"}


@dataclass(frozen=True)
class ChunkPlan:
    """An input to store as a chunk: its bytes (what the step reads), the media type its
    reference records, and the size it would have had inline."""

    data: bytes
    media_type: str | None
    inline_size: int


def plan_input(value: Body | bytes | str | Any, *, media_type: str | None = None,
               redactable: bool = False) -> Body | ChunkPlan:
    """What to write for ``value`` (see :func:`workload_sdk.body_of` for how values become
    bodies): the body itself when it fits inline (or is already a body or a reference), else a
    :class:`ChunkPlan` with the bytes to store. ``redactable`` (the spec's
    ``redactable_inputs``): every value that is not a reference becomes a chunk. Pure."""
    if isinstance(value, ChunkRef | StreamRef):
        return value
    if isinstance(value, InlineBody):
        if not redactable:
            return value
        return ChunkPlan(value.raw(), value.media_type or _MEDIA[value.encoding],
                         inline_size(value.encoding, value.data))
    if redactable:
        planned = plan_input(value, media_type=media_type)
        if isinstance(planned, InlineBody):
            return plan_input(planned, redactable=True)
        return planned
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        size = 4 * math.ceil(len(raw) / 3) + 2  # the base64 text in quotes
        if size <= INLINE_MAX_BYTES:
            return InlineBody.of_bytes(raw, media_type=media_type)
        return ChunkPlan(raw, media_type, size)
    if isinstance(value, str):
        size = inline_size("utf8", value)
        if size <= INLINE_MAX_BYTES:
            return InlineBody.of_text(value, media_type=media_type)
        return ChunkPlan(value.encode("utf-8"), media_type or "text/plain; charset=utf-8", size)
    size = inline_size("json", value)
    if size <= INLINE_MAX_BYTES:
        return InlineBody.of_json(value, media_type=media_type)
    return ChunkPlan(canonical_json(value), media_type or "application/json", size)


@dataclass(frozen=True)
class WrittenInput:
    """An input appended: where (``topic``, ``offset``) and the body it carries (a
    :class:`~broker_schema.ChunkRef` when it was stored as a chunk: ``chunked``)."""

    topic: str
    offset: int
    body: Body
    chunked: bool
    #: where the chunk was stored (``sys.chunks`` or a directory), when ``chunked``
    chunk_store: str | None = None


class InputWriter:
    """Appends inputs to ``wl.<workload_id>.in``, storing any over the inline limit as a chunk of
    the workload and writing its reference.

    ``chunk_dir``: the filesystem chunk store the workload's holder and executors share (its
    ``--chunk-dir``); default: the default store, ``sys.chunks``. ``chunk=False``: refuse an input
    over the inline limit (:class:`InputTooLarge`) instead of storing a chunk.

    Use it as an async context manager (clients start on first use, stop on exit)::

        async with InputWriter(bootstrap, "qgate-1") as writer:
            written = await writer.write(Path("scan.bin").read_bytes(), source="scanner-3")

    or, outside an event loop, :func:`write_input`. The workload must exist (its spec was
    written: ``fx workload spec``): otherwise the first write raises
    :class:`fx_kafka.workloads.UnknownWorkload` (a ``LookupError``) naming the workloads that do.
    """

    def __init__(self, bootstrap: str, workload_id: str, *, chunk_dir: str | Path | None = None,
                 chunk: bool = True, remedy: str = PYTHON_REMEDY) -> None:
        self.bootstrap = bootstrap
        self.workload_id = topics.check_workload_id(workload_id)
        self.chunk = chunk
        self.remedy = remedy
        self.store = chunk_store(bootstrap, chunk_dir)
        self._producer: Any = None
        self._checked = False
        #: the latest spec's ``redactable_inputs`` (read on the first write)
        self.redactable = False

    @property
    def where(self) -> str:
        """Where this writer stores chunks, for messages."""
        return store_where(self.store)

    async def __aenter__(self) -> InputWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the producer and the chunk store's clients."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()
        await self.store.close()

    async def write(self, value: Body | bytes | str | Any, *, media_type: str | None = None,
                    source: str | None = None) -> WrittenInput:
        """Append one input carrying ``value`` (``bytes``, ``str``, a JSON value, or a body or
        reference as is); over the inline limit it is first stored as a chunk (or refused with
        :class:`InputTooLarge` when the writer may not store chunks). Returns where it went.
        ``OSError`` or a Kafka authorization error when the chunk store refuses the chunk."""
        if not self._checked:
            # a workload that is not there is said at once (UnknownWorkload, a LookupError),
            # before a chunk is stored for it or a topic is waited for
            await require_workload(self.bootstrap, self.workload_id, streams=("in",))
            self.redactable = await _redactable(self.bootstrap, self.workload_id)
            self._checked = True
        planned = plan_input(value, media_type=media_type, redactable=self.redactable)
        chunked = isinstance(planned, ChunkPlan)
        if isinstance(planned, ChunkPlan):
            if not self.chunk:
                raise InputTooLarge(planned.inline_size, self.remedy)
            body: Body = await self.store.write(planned.data, workload=self.workload_id,
                                                media_type=planned.media_type)
        else:
            body = planned
        record = InputRecord(workload_id=self.workload_id, body=body, source=source)
        topic = topics.inputs(self.workload_id)
        if self._producer is None:
            producer = make_producer(self.bootstrap)
            await producer.start()
            self._producer = producer
        meta = await self._producer.send_and_wait(topic, value=encode(record), partition=0)
        return WrittenInput(topic, int(meta.offset), body, chunked,
                            self.where if chunked else None)


async def _redactable(bootstrap: str, workload_id: str) -> bool:
    """Whether the workload's latest spec asks every input to be redactable."""
    from workload_sdk._holder_start import NoSpec, latest_spec

    try:
        return (await latest_spec(bootstrap, workload_id))[1].redactable_inputs
    except NoSpec:
        return False


def write_input(bootstrap: str, workload_id: str, value: Body | bytes | str | Any, *,
                media_type: str | None = None, source: str | None = None,
                chunk_dir: str | Path | None = None, chunk: bool = True) -> WrittenInput:
    """Append one input with an :class:`InputWriter`, outside an event loop."""

    async def main() -> WrittenInput:
        async with InputWriter(bootstrap, workload_id, chunk_dir=chunk_dir,
                               chunk=chunk) as writer:
            return await writer.write(value, media_type=media_type, source=source)

    return asyncio.run(main())
