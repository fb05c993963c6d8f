"""A node's producer side: sends that ride out a broker restart, records put on the producer and
settled in bulk, the producer replaced after a lost batch (see :mod:`fx_node.shell` for the
semantics).

:class:`BrokerWait` counts, logs and sleeps before a retry of anything the broker refused while
it was away (a send, a poll, a stream read); :class:`ResilientProducer` is the node's one
producer, which its shell starts and closes and its runner writes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from fx_kafka.client import make_producer
from fx_kafka.retry import batch_lost, broker_unavailable, jittered_backoff_s

__all__ = ["PRODUCER_BATCH_BYTES", "BrokerWait", "ResilientProducer", "close_quietly"]

#: The executor's producer batches (the gateway keeps aiokafka's default): a burst's accepted and
#: response records share produce requests (aiokafka's 16 KiB default makes thousands of sends
#: wait on a full batch).
PRODUCER_BATCH_BYTES = 1 << 20


class BrokerWait:
    """Count (``retries``, a counter labelled by operation), log and sleep before retry
    ``attempt`` of an operation while the broker is away."""

    def __init__(self, retries: Any, log: logging.Logger) -> None:
        self.retries = retries
        self.log = log

    async def __call__(self, op: str, what: str, exc: BaseException, attempt: int) -> None:
        self.retries.labels(op).inc()
        delay = jittered_backoff_s(attempt)
        self.log.warning("broker unavailable (%s %s, retry %d): %r; retrying in %.1f s",
                         op, what, attempt, exc, delay)
        await asyncio.sleep(delay)


class ResilientProducer:
    """The node's producer (acks=all, idempotent), replaced when one of its batches is lost.

    ``current`` is the producer of generation ``gen`` (None before :meth:`start`); a record put
    with :meth:`enqueue` is settled with :meth:`settle` under the generation it was put with.
    ``stopping`` (set by the shell) bounds the retries of :meth:`produce` to ``grace_s``.
    ``max_batch_size``: the producer's batch (None: aiokafka's default)."""

    def __init__(self, bootstrap: str, *, wait: BrokerWait, grace_s: float,
                 max_batch_size: int | None = None) -> None:
        self.bootstrap = bootstrap
        self.wait = wait
        self.log = wait.log
        self.grace_s = grace_s
        self.max_batch_size = max_batch_size
        self.current: AIOKafkaProducer | None = None
        self.gen = 0
        self.stopping = False
        self._renew_lock = asyncio.Lock()
        self._retired: set[asyncio.Task[Any]] = set()
        self._on_renew: list[Callable[[AIOKafkaProducer], None]] = []

    def _make(self) -> AIOKafkaProducer:
        if self.max_batch_size is None:
            return make_producer(self.bootstrap)
        return make_producer(self.bootstrap, max_batch_size=self.max_batch_size)

    async def start(self) -> None:
        """Make and start the first producer."""
        self.current = self._make()
        await self.current.start()

    def on_renew(self, callback: Callable[[AIOKafkaProducer], None]) -> None:
        """Call ``callback(new)`` whenever the producer is replaced (a chunk store that writes
        through it)."""
        self._on_renew.append(callback)

    async def produce(self, op: str, topic: str, value: bytes, key: bytes) -> Any:
        """``send_and_wait`` that rides out a broker restart: a send that fails because the broker
        is down is sent again with backoff until it is acknowledged (while stopping, for
        ``grace_s`` at most, then the error goes up). Sending again may write a record
        twice; a second ``response``, ``accepted``, facts or reject record is harmless (the
        holder merges the first answer). Fencing and other errors go up at once."""
        loop = asyncio.get_running_loop()
        attempt = 0
        give_up: float | None = None
        while True:
            producer, gen = self.current, self.gen
            assert producer is not None
            error: KafkaError
            try:
                fut = await producer.send(topic, value=value, key=key)
            except KafkaError as exc:  # not enqueued
                if not broker_unavailable(exc):
                    raise
                error, lost = exc, False
            else:
                try:
                    return await fut
                except KafkaError as exc:
                    if not batch_lost(exc):
                        raise
                    error, lost = exc, True
            if self.stopping:
                give_up = give_up or loop.time() + self.grace_s
                if loop.time() >= give_up:
                    raise error
            if lost:
                await self.renew(gen, error)
            attempt += 1
            await self.wait(op, topic, error, attempt)

    async def enqueue(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[Any] | None:
        """Put a record on the producer without waiting for its acknowledgement (records put
        back to back share a produce request); None when the broker is away (then
        :meth:`settle` sends it through :meth:`produce`)."""
        assert self.current is not None
        try:
            fut: asyncio.Future[Any] = await self.current.send(topic, value=value, key=key)
        except KafkaError as exc:
            if not broker_unavailable(exc):
                raise
            return None
        return fut

    async def settle(self, op: str, topic: str, value: bytes, key: bytes,
                     fut: asyncio.Future[Any] | None, gen: int) -> Any:
        """Wait for a record put by :meth:`enqueue` (with producer generation ``gen``) to be
        acknowledged; one not put, or lost with its batch, is sent again by :meth:`produce`."""
        if fut is not None:
            try:
                return await fut
            except KafkaError as exc:
                if not batch_lost(exc):
                    raise
                await self.renew(gen, exc)
        return await self.produce(op, topic, value, key)

    async def renew(self, gen: int, exc: BaseException) -> None:
        """Replace the producer of generation ``gen`` after one of its batches was lost (see
        :func:`fx_kafka.retry.batch_lost`): an idempotent producer whose batch failed cannot
        send to that partition again. The new one has a new producer id; the old one is closed
        in the background (what it still delivers is fine, what it fails is sent again by its
        own caller). Only the first caller of a generation renews it."""
        async with self._renew_lock:
            if gen != self.gen:
                return
            attempt = 0
            while True:
                new = self._make()
                try:
                    await new.start()
                    break
                except KafkaError as start_exc:
                    with contextlib.suppress(KafkaError):
                        await new.stop()
                    if not broker_unavailable(start_exc):
                        raise
                    attempt += 1
                    await self.wait("producer", "start", start_exc, attempt)
            old, self.current = self.current, new
            self.gen += 1
            for callback in self._on_renew:
                callback(new)
            self.wait.retries.labels("producer").inc()
            self.log.warning("broker unavailable: replaced the producer after a lost batch (%r); "
                             "generation %d", exc, self.gen)
            if old is not None:
                task = asyncio.ensure_future(close_quietly(old, 60.0, self.log))
                self._retired.add(task)
                task.add_done_callback(self._retired.discard)

    async def send_accepted(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[Any]:
        """Enqueue ``accepted`` (its ack is awaited before the effect runs: see
        :meth:`written`)."""
        assert self.current is not None
        attempt = 0
        while True:
            try:
                fut: asyncio.Future[Any] = await self.current.send(topic, value=value, key=key)
                return fut
            except KafkaError as exc:
                if not broker_unavailable(exc) or self.stopping:
                    raise
                attempt += 1
                await self.wait("accepted", topic, exc, attempt)

    async def written(self, ack: asyncio.Future[Any], gen: int,
                      record: tuple[str, bytes, bytes], op: str = "accepted") -> None:
        """Wait for ``ack`` of ``record`` (topic, value, key), put with generation ``gen``, to
        be acknowledged; write it again if the broker lost it (only a broker outage: any other
        failure goes up)."""
        try:
            await ack
        except KafkaError as exc:
            if not batch_lost(exc):
                raise
            await self.renew(gen, exc)
            await self.produce(op, *record)

    async def broker_answers(self) -> bool:
        """Whether the broker answers a metadata request within 3 s (readiness)."""
        if self.current is None:
            return False
        try:
            await asyncio.wait_for(self.current.client.fetch_all_metadata(), 3.0)
        except (KafkaError, OSError, TimeoutError):
            return False
        return True

    async def close(self, timeout: float) -> None:
        """Close the producers replaced meanwhile, then the current one (``timeout`` s)."""
        if self._retired:
            await asyncio.gather(*self._retired, return_exceptions=True)
        if self.current is not None:
            await close_quietly(self.current, timeout, self.log)


async def close_quietly(producer: AIOKafkaProducer, timeout: float,
                        log: logging.Logger) -> None:
    """Stop ``producer``, waiting at most ``timeout`` s for it to flush (the broker may be down)."""
    try:
        await asyncio.wait_for(producer.stop(), timeout)
    except (KafkaError, TimeoutError) as exc:
        log.warning("producer did not close cleanly: %r", exc)
