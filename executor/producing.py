"""The executor's producer side: sends that ride out a broker restart, records put on the
producer and settled in bulk, the producer replaced after a lost batch (see
:mod:`executor.service` for the semantics)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from executor.chunks import KafkaChunkStore
from executor.scheduler import Job
from fx_kafka.client import make_producer
from fx_kafka.retry import backoff_s, batch_lost, broker_unavailable

if TYPE_CHECKING:
    from executor.service import ExecutorService

log = logging.getLogger("executor.service")


#: The executor's producer batches: a burst's accepted and response records share produce
#: requests (aiokafka's 16 KiB default makes thousands of sends wait on a full batch).
PRODUCER_BATCH_BYTES = 1 << 20



class ProducerMixin:
    """The producer methods of :class:`executor.service.ExecutorService`."""

    async def _broker_wait(
        self: ExecutorService, op: str, what: str, exc: BaseException, attempt: int,
    ) -> None:
        """Count, log and sleep before retry ``attempt`` of ``op`` while the broker is away."""
        self.metrics.broker_retries.labels(op).inc()
        delay = backoff_s(attempt)
        log.warning("broker unavailable (%s %s, retry %d): %r; retrying in %.1f s",
                    op, what, attempt, exc, delay)
        await asyncio.sleep(delay)

    async def _produce(self: ExecutorService, op: str, topic: str, value: bytes, key: bytes) -> Any:
        """``send_and_wait`` that rides out a broker restart: a send that fails because the broker
        is down is sent again with backoff until it is acknowledged (while stopping, for
        ``shutdown_grace_s`` at most, then the error goes up). Sending again may write a record
        twice; a second ``response``, ``accepted``, facts or reject record is harmless (the
        holder merges the first answer). Fencing and other errors go up at once."""
        loop = asyncio.get_running_loop()
        attempt = 0
        give_up: float | None = None
        while True:
            producer, gen = self._producer, self._producer_gen
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
            if self._stopping:
                give_up = give_up or loop.time() + self.config.shutdown_grace_s
                if loop.time() >= give_up:
                    raise error
            if lost:
                await self._renew_producer(gen, error)
            attempt += 1
            await self._broker_wait(op, topic, error, attempt)

    async def _enqueue(
        self: ExecutorService, topic: str, value: bytes, key: bytes,
    ) -> asyncio.Future[Any] | None:
        """Put a record on the producer without waiting for its acknowledgement (records put
        back to back share a produce request); None when the broker is away (then
        :meth:`_settle` sends it through :meth:`_produce`)."""
        assert self._producer is not None
        try:
            fut: asyncio.Future[Any] = await self._producer.send(topic, value=value, key=key)
        except KafkaError as exc:
            if not broker_unavailable(exc):
                raise
            return None
        return fut

    async def _settle(self: ExecutorService, op: str, topic: str, value: bytes, key: bytes,
                      fut: asyncio.Future[Any] | None, gen: int) -> Any:
        """Wait for a record put by :meth:`_enqueue` (with producer generation ``gen``) to be
        acknowledged; one not put, or lost with its batch, is sent again by :meth:`_produce`."""
        if fut is not None:
            try:
                return await fut
            except KafkaError as exc:
                if not batch_lost(exc):
                    raise
                await self._renew_producer(gen, exc)
        return await self._produce(op, topic, value, key)

    async def _renew_producer(self: ExecutorService, gen: int, exc: BaseException) -> None:
        """Replace the producer of generation ``gen`` after one of its batches was lost (see
        :func:`fx_kafka.retry.batch_lost`): an idempotent producer whose batch failed cannot
        send to that partition again. The new one has a new producer id; the old one is closed
        in the background (what it still delivers is fine, what it fails is sent again by its
        own caller). Only the first caller of a generation renews it."""
        async with self._renew_lock:
            if gen != self._producer_gen:
                return
            attempt = 0
            while True:
                new = make_producer(self.config.bootstrap, max_batch_size=PRODUCER_BATCH_BYTES)
                try:
                    await new.start()
                    break
                except KafkaError as start_exc:
                    with contextlib.suppress(KafkaError):
                        await new.stop()
                    if not broker_unavailable(start_exc):
                        raise
                    attempt += 1
                    await self._broker_wait("producer", "start", start_exc, attempt)
            old, self._producer = self._producer, new
            self._producer_gen += 1
            if isinstance(self.chunks, KafkaChunkStore):
                self.chunks.producer = new
            self.metrics.broker_retries.labels("producer").inc()
            log.warning("broker unavailable: replaced the producer after a lost batch (%r); "
                        "generation %d", exc, self._producer_gen)
            if old is not None:
                task = asyncio.ensure_future(_close_quietly(old, 60.0))
                self._retired.add(task)
                task.add_done_callback(self._retired.discard)

    async def _send_accepted(
        self: ExecutorService, topic: str, value: bytes, key: bytes,
    ) -> asyncio.Future[Any]:
        """Enqueue ``accepted`` (the ack is awaited by the worker before the model runs)."""
        assert self._producer is not None
        attempt = 0
        while True:
            try:
                fut: asyncio.Future[Any] = await self._producer.send(topic, value=value, key=key)
                return fut
            except KafkaError as exc:
                if not broker_unavailable(exc) or self._stopping:
                    raise
                attempt += 1
                await self._broker_wait("accepted", topic, exc, attempt)

    async def _accepted_written(self: ExecutorService, j: Job) -> None:
        """Wait for ``j``'s ``accepted`` to be acknowledged; write it again if the broker lost
        it (only a broker outage: any other failure goes up)."""
        try:
            await j.accepted_ack
        except KafkaError as exc:
            if not batch_lost(exc):
                raise
            await self._renew_producer(j.accepted_gen, exc)
            await self._produce("accepted", *j.accepted)


async def _close_quietly(producer: AIOKafkaProducer, timeout: float) -> None:
    """Stop ``producer``, waiting at most ``timeout`` s for it to flush (the broker may be down)."""
    try:
        await asyncio.wait_for(producer.stop(), timeout)
    except (KafkaError, TimeoutError) as exc:
        log.warning("producer did not close cleanly: %r", exc)
