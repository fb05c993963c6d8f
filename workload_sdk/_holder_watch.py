"""What a lease holder process says about itself from outside (``/readyz``): whether the broker
answers, and whether this process is the one leader (docs/operations.md, "Health").

A :class:`ClaimWatch` reads ``wl.<id>.claims`` every :data:`PROBE_S` (one consumer, no group):
each read that succeeds proves the broker answers and shows the highest claim. Reads that fail
are tried again after a backoff with jitter (:func:`fx_kafka.retry.jittered_backoff_s`), so a
holder whose broker is away does bounded work.

:func:`holder_role` (pure) decides the role. A holder is ``leader`` only while

- it merges (claimed, resumed, reading);
- a read of ``.claims`` that *started* less than :data:`CONFIRM_TTL_S` ago showed its own claim
  as the highest (so a broker that stopped answering ends it within that time);
- its claim was written at least :data:`CONFIRM_TTL_S` ago.

The last rule makes "one leader at a time" hold as seen from outside: a predecessor's
confirmation read started before the new claim was written (a later read would have shown the
new claim), so it expires before the new holder's claim is :data:`CONFIRM_TTL_S` old. Until then
the new holder says ``candidate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from broker_schema import DecodeError, decode, topics
from broker_schema.records import ClaimRecord
from fx_kafka.client import make_consumer, read_partition
from fx_kafka.retry import jittered_backoff_s

__all__ = [
    "CONFIRM_TTL_S",
    "PROBE_S",
    "ClaimView",
    "ClaimWatch",
    "broker_answers",
    "holder_role",
    "readiness",
]

log = logging.getLogger(__name__)

#: how often ``.claims`` is read while the broker answers
PROBE_S = 1.0
#: how long one confirmation counts, and how long a new claim waits before it says leader
CONFIRM_TTL_S = 3.0
#: one read of ``.claims`` (start, offsets, records) must finish within this
READ_TIMEOUT_S = 3.0
#: the cap of the backoff between reads while the broker does not answer
BACKOFF_CAP_S = 10.0


@dataclass(frozen=True)
class ClaimView:
    """The latest successful read of ``.claims``: when it started (monotonic seconds) and the
    highest claim then (epoch, holder id), None when there was none."""

    confirmed_at: float | None = None
    top: tuple[int, str] | None = None


def broker_answers(view: ClaimView, now: float, *, ttl_s: float = CONFIRM_TTL_S) -> bool:
    """Whether the broker answered a read that started less than ``ttl_s`` before ``now``."""
    return view.confirmed_at is not None and now - view.confirmed_at < ttl_s


def holder_role(*, merging: bool, claimed_at: float | None, epoch: int, holder_id: str,
                view: ClaimView, now: float, ttl_s: float = CONFIRM_TTL_S) -> str:
    """``leader`` or ``candidate`` (see the module docstring). ``claimed_at``: when this
    holder's claim (or rejoin of its epoch) was written, monotonic; None before. Pure."""
    if (merging and claimed_at is not None and now - claimed_at >= ttl_s
            and broker_answers(view, now, ttl_s=ttl_s) and view.top == (epoch, holder_id)):
        return "leader"
    return "candidate"


def _highest(values: list[bytes], topic: str) -> tuple[int, str] | None:
    top: ClaimRecord | None = None
    for value in values:
        try:
            record = decode(value, topic=topic)
        except DecodeError:
            continue
        if isinstance(record, ClaimRecord) and (top is None or record.epoch >= top.epoch):
            top = record
    return None if top is None else (top.epoch, top.holder_id)


class ClaimWatch:
    """Reads ``.claims`` of ``workload_id`` (see the module docstring); :attr:`view` is the
    latest successful read. ``await run(stop)`` until ``stop`` is set."""

    def __init__(self, bootstrap: str, workload_id: str, *, probe_s: float = PROBE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.bootstrap = bootstrap
        self.topic = topics.claims(workload_id)
        self.probe_s = probe_s
        self.clock = clock
        self.view = ClaimView()
        #: consecutive failed reads, and the last error (for ``/readyz``)
        self.failures = 0
        self.error: str | None = None

    def broker_ok(self) -> bool:
        """The broker answered a read within :data:`CONFIRM_TTL_S`."""
        return broker_answers(self.view, self.clock())

    async def _read(self, consumer: AIOKafkaConsumer) -> tuple[int, str] | None:
        read = await read_partition(consumer, self.topic, timeout=READ_TIMEOUT_S)
        return _highest([value for _, _, value in read.records], self.topic)

    async def run(self, stop: asyncio.Event) -> None:
        """Read every :data:`PROBE_S`; after a failure, back off with jitter."""
        consumer: AIOKafkaConsumer | None = None
        try:
            while not stop.is_set():
                started = self.clock()
                try:
                    if consumer is None:
                        consumer = make_consumer(self.bootstrap)
                        await asyncio.wait_for(consumer.start(), READ_TIMEOUT_S)
                    top = await asyncio.wait_for(self._read(consumer), READ_TIMEOUT_S)
                except (KafkaError, OSError, TimeoutError) as exc:
                    self.failures += 1
                    self.error = repr(exc)
                    if consumer is not None:
                        with contextlib.suppress(KafkaError, OSError, TimeoutError):
                            await asyncio.wait_for(consumer.stop(), READ_TIMEOUT_S)
                        consumer = None
                    delay = jittered_backoff_s(self.failures, base_s=0.5, cap_s=BACKOFF_CAP_S)
                    if self.failures == 1 or self.failures % 20 == 0:
                        log.warning("cannot read %s (try %d): %s; trying again in %.1f s",
                                    self.topic, self.failures, self.error, delay)
                else:
                    self.view = ClaimView(confirmed_at=started, top=top)
                    self.failures, self.error = 0, None
                    delay = self.probe_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
        finally:
            if consumer is not None:
                with contextlib.suppress(KafkaError, OSError, TimeoutError):
                    await asyncio.wait_for(consumer.stop(), READ_TIMEOUT_S)


def readiness(watch: ClaimWatch, *, merging: bool, claimed_at: float | None, epoch: int,
              holder_id: str, workload_id: str, seq: int | None,
              problem: str | None) -> dict[str, Any]:
    """The holder's ``/readyz`` body: ``ready`` while its role (:func:`holder_role`) is
    ``leader``, the role, whether the broker answers (and why not), the epoch, the next merge
    seq and a problem it stopped on."""
    role = holder_role(merging=merging, claimed_at=claimed_at, epoch=epoch, holder_id=holder_id,
                       view=watch.view, now=watch.clock())
    body: dict[str, Any] = {"ready": role == "leader", "role": role,
                            "broker": watch.broker_ok(), "workload": workload_id,
                            "holder_id": holder_id, "epoch": epoch, "seq": seq}
    if watch.error is not None:
        body["broker_error"] = watch.error
    if problem is not None:
        body["problem"] = problem
    return body
