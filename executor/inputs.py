"""Reading a request's input: inline bodies, chunks and stream references (each read in a
fetch task of its own, see :mod:`executor.runner`), and storing a response body
(:class:`InputReader`).

A stream reference is read by :func:`fx_kafka.refs.read_record_at` (the one reader, shared with
the holder and replay): the cluster metadata is checked first, so a missing topic is a prompt
``input_missing`` and is never created. A stream input that cannot be read while the broker is
down is waited for, in its own fetch task, and answered ``input_missing`` only once the request's
executor lease has lapsed (the holder has written ``unknown`` by then)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from broker_schema import DecodeError, topics
from broker_schema.canonical import canonical_json, sha256_hex
from broker_schema.codec import decode
from broker_schema.records import (
    Body,
    ChunkRef,
    InlineBody,
    InputRecord,
    StreamRef,
)
from executor.chunks import ChunkStore, FsChunkStore, KafkaChunkStore
from executor.config import ExecutorConfig
from executor.engines import EngineResult
from fx_kafka.client import make_consumer
from fx_kafka.refs import StreamAbsent, StreamUnreachable, read_record_at
from fx_kafka.retry import backoff_s, broker_unavailable
from fx_node.admission import ExecutorState, chunk_owner, chunk_problem
from fx_node.errors import EngineError, OutcomeError
from fx_node.producer import BrokerWait, ResilientProducer

__all__ = ["InputReader"]

log = logging.getLogger("executor.service")


class InputReader:
    """Reads the inputs of the requests of ``state``'s workloads, and stores response bodies
    (``chunks``). Referenced inputs are read apart from the workers, at most ``input_fetchers``
    at once (``slots``; one idle stream consumer each, made on first use). ``stopping``: whether
    the node is shutting down (a read waiting for the broker then gives up)."""

    def __init__(self, config: ExecutorConfig, state: ExecutorState, *, wait: BrokerWait,
                 stopping: Callable[[], bool]) -> None:
        self.config = config
        self.state = state
        self._wait = wait
        self._stopping = stopping
        self.chunks: ChunkStore = FsChunkStore(config.chunk_dir)
        self.slots = asyncio.Semaphore(config.input_fetchers)
        #: the node's consumer that fetches nothing (offset and metadata look-ups)
        self.probe: AIOKafkaConsumer | None = None
        self._streams: list[AIOKafkaConsumer] = []
        self._all_streams: set[AIOKafkaConsumer] = set()
        self._retired: set[asyncio.Task[Any]] = set()

    async def start(self, probe: AIOKafkaConsumer, producer: ResilientProducer) -> None:
        """Use ``probe`` for look-ups; with ``chunk_backend = "kafka"``, start the chunk store
        on ``sys.chunks`` (writing through ``producer``, and its successors)."""
        self.probe = probe
        if self.config.chunk_backend == "kafka":
            assert producer.current is not None
            kstore = KafkaChunkStore(self.config.bootstrap, producer.current,
                                     FsChunkStore(self.config.chunk_dir))
            await kstore.start()
            self.chunks = kstore

            def renewed(new: Any) -> None:
                kstore.producer = new

            producer.on_renew(renewed)

    async def close(self) -> None:
        """Stop the stream consumers and the chunk store."""
        for c in self._all_streams:
            with contextlib.suppress(KafkaError):
                await c.stop()
        if isinstance(self.chunks, KafkaChunkStore):
            await self.chunks.stop()
        if self._retired:
            await asyncio.gather(*self._retired, return_exceptions=True)

    async def resolve(self, body: Body | None, *, reader: str,
                       give_up_at: float | None = None) -> bytes:
        """The input's bytes for a request of workload ``reader``; a reference that cannot be
        read is ``input_missing`` (an I/O or broker error here is that request's outcome, never
        the worker's, and the service's, end)."""
        try:
            return await self._resolve_body(body, reader=reader, context=reader, depth=0,
                                            give_up_at=give_up_at)
        except (OSError, KafkaError) as exc:
            raise OutcomeError(
                "input_missing", f"cannot read the input: {type(exc).__name__}: {exc}"
            ) from exc

    async def _resolve_body(self, body: Body | None, *, reader: str,
                            context: str, depth: int,
                            give_up_at: float | None = None) -> bytes:
        """``context``: the workload ``body`` was found in (``reader``, or the workload of the
        topic of the stream record that holds it), which a chunk reference is relative to."""
        if body is None:
            return b""
        if isinstance(body, InlineBody):
            return body.raw()
        if isinstance(body, ChunkRef):
            # the request's own chunk reference was allowed by decide(); one inside a stream
            # record is asked here, by the same rule, before the store is
            problem = chunk_problem(body, reader=reader, context=context,
                                    spec=self.state.workload(reader).spec)
            if problem is not None:
                raise OutcomeError("input_forbidden", problem)
            return await self.chunks.get(body, workload=chunk_owner(body, context))
        if isinstance(body, StreamRef):
            if depth > 0:
                raise OutcomeError("input_invalid", "a stream reference may not name another")
            value = await self._read_stream(body, give_up_at=give_up_at)
            if body.hash is not None and sha256_hex(value) != body.hash:
                raise OutcomeError(
                    "input_hash_mismatch",
                    f"{body.topic}/{body.partition}@{body.offset} does not hash to {body.hash}",
                )
            try:
                record = decode(value)
            except DecodeError:
                return value
            if isinstance(record, InputRecord):
                return await self._resolve_body(record.body, reader=reader,
                                                context=topics.parse(body.topic)[0],
                                                depth=depth + 1)
            return value
        raise OutcomeError("input_invalid", f"unknown body type {type(body).__name__}")

    async def _read_stream(self, ref: StreamRef, *,
                           give_up_at: float | None = None) -> bytes:
        """The record ``ref`` names (a topic :func:`fx_node.admission.input_problem` allowed).

        A topic that does not exist, or a partition or offset it does not hold, is a prompt
        ``input_missing``: the metadata check comes first and never creates a topic. While the
        broker is down (or an attempt runs over ``input_attempt_s``) the read is retried with
        backoff, until the service stops or ``give_up_at`` (monotonic) passes: an input that
        exists but cannot be reached right now is not ``input_missing`` within the lease."""
        attempt = 0
        while True:
            try:
                return await self._read_stream_once(ref)
            except StreamUnreachable as exc:
                if self._stopping():
                    raise EngineError("shutdown", "the executor stopped while the broker was "
                                      f"unavailable: {exc}") from None
                attempt += 1
                if give_up_at is not None and \
                        time.monotonic() + backoff_s(attempt) >= give_up_at:
                    raise OutcomeError(
                        "input_missing", f"{ref.topic}/{ref.partition}@{ref.offset} could not be "
                        f"read within the executor lease ({attempt} attempts): {exc}") from None
                await self._wait("stream", ref.topic, exc, attempt)

    async def _read_stream_once(self, ref: StreamRef) -> bytes:
        """One bounded attempt (``input_attempt_s``) at reading ``ref``, on an idle stream
        consumer of this task's own (a consumer whose attempt ran over is closed, not reused)."""
        stream = self._streams.pop() if self._streams else None
        if stream is None:
            stream = make_consumer(self.config.bootstrap, isolation_level="read_uncommitted")
            try:
                await stream.start()
            except KafkaError as exc:
                with contextlib.suppress(KafkaError):
                    await stream.stop()
                if broker_unavailable(exc):
                    raise StreamUnreachable(repr(exc)) from exc
                raise
            self._all_streams.add(stream)
        try:
            value = await asyncio.wait_for(self._read_on(stream, ref),
                                           self.config.input_attempt_s)
        except TimeoutError:
            self._retire_stream(stream)
            raise StreamUnreachable(f"reading {ref.topic}/{ref.partition}@{ref.offset} took over "
                               f"{self.config.input_attempt_s} s") from None
        except (OutcomeError, StreamUnreachable):
            self._streams.append(stream)
            raise
        except BaseException:  # cancelled mid-read, or a bug: its state is unknown
            self._retire_stream(stream)
            raise
        self._streams.append(stream)
        return value

    def _retire_stream(self, stream: AIOKafkaConsumer) -> None:
        self._all_streams.discard(stream)

        async def close() -> None:
            with contextlib.suppress(KafkaError):
                await stream.stop()

        task = asyncio.ensure_future(close())
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    async def _read_on(self, stream: AIOKafkaConsumer, ref: StreamRef) -> bytes:
        """``ref`` read uncommitted on ``stream`` (offsets and metadata asked on the probe):
        a record that is not there is ``input_missing``."""
        assert self.probe is not None
        try:
            return await read_record_at(stream, ref.topic, ref.partition, ref.offset,
                                        lookup=self.probe, check_acl=False)
        except StreamAbsent as exc:
            raise OutcomeError("input_missing", str(exc)) from None
        except KafkaError as exc:  # not an outage (that is StreamUnreachable): e.g. denied
            raise OutcomeError("input_missing", f"cannot read {ref.topic}: {exc!r}") from None

    async def output_body(self, result: EngineResult, workload: str) -> Body:
        """The response body: inline, else a chunk stored for ``workload`` (the request's)."""
        try:
            if isinstance(result.output, bytes):
                return InlineBody.of_bytes(result.output, media_type=result.media_type)
            return InlineBody.of_json(result.output, media_type=result.media_type)
        except ValidationError:
            pass
        data = result.output if isinstance(result.output, bytes) else canonical_json(result.output)
        return await self.chunks.put(data, workload=workload,
                                     media_type=result.media_type or "application/json")
