"""The executor's admission queue: admitted jobs on their way to a worker, per model, FIFO."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fx_node.admission import InFlight, OffsetTracker

__all__ = ["HANDLER_KEY", "Job", "Scheduler"]

#: Scheduler key prefix of the jobs of a kind served without a model (never a ``sha256:`` hash).
HANDLER_KEY = "kind:"



@dataclass
class Job:
    """An admitted request on its way through the scheduler (event-loop thread only)."""

    job: InFlight
    kind: str
    model_hash: str
    accepted_ack: asyncio.Future[Any]
    read_mono: float
    tp: tuple[str, int]
    tracker: OffsetTracker
    #: the ``accepted`` record as sent (topic, value, key): written again if its ack fails
    accepted: tuple[str, bytes, bytes]
    #: the producer generation it was sent with
    #: (see :meth:`fx_node.producer.ResilientProducer.renew`)
    accepted_gen: int = 0
    #: the input's bytes, once read (the job reaches the scheduler only then)
    data: bytes = b""


@dataclass
class Scheduler:
    """Per-model FIFO queues; a worker takes the oldest job and up to ``max_batch - 1`` more
    waiting for the same model (batching only what is already queued: it never waits to fill)."""

    queues: dict[str, deque[tuple[int, Job]]] = field(default_factory=dict)
    seq: int = 0
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def put(self, job: Job) -> None:
        async with self.cond:
            self.seq += 1
            self.queues.setdefault(job.model_hash, deque()).append((self.seq, job))
            self.cond.notify()

    async def take(self, max_batch: Any) -> tuple[str, list[Job]]:
        async with self.cond:
            while not any(self.queues.values()):
                await self.cond.wait()
            model = min((q[0][0], h) for h, q in self.queues.items() if q)[1]
            queue = self.queues[model]
            limit = int(max_batch(model))
            jobs = [queue.popleft()[1] for _ in range(min(limit, len(queue)))]
            return model, jobs

    def drain(self) -> list[Job]:
        jobs = [j for q in self.queues.values() for _, j in q]
        self.queues.clear()
        return jobs
