"""A test harness for the executor on a real broker: one workload's topics, a writer for spec,
claims and requests, a reader for ``.resp`` and ``sys.rejects``, and executors in-process or as
``fx executor run`` subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition

from broker_schema import decode, encode, topics
from broker_schema.records import (
    AcceptedRecord,
    EffectRequest,
    RejectedRecord,
    ResponseRecord,
)
from executor.config import ExecutorConfig, load_config
from executor.service import ExecutorService
from fx_kafka.client import make_consumer, make_producer
from fx_kafka.workload import ensure_system_topics, ensure_workload_topics
from tests.integration.harness import executor_config as process_executor_config
from tests.unit.executor.helpers import claim, spec

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Workload:
    """One workload's topics on the broker, and a producer to write to them."""

    bootstrap: str
    workload_id: str
    producer: AIOKafkaProducer
    #: offsets of requests written, by effect id
    offsets: dict[str, int] = field(default_factory=dict)

    async def write(self, topic: str, value: bytes, key: bytes | None = None) -> int:
        meta = await self.producer.send_and_wait(topic, value=value, key=key)
        return int(meta.offset)

    async def setup(self, models: dict[str, str], *, epoch: int = 1, **spec_kw: Any) -> None:
        """Write a spec binding ``models`` and a claim at ``epoch``."""
        await self.write(topics.spec(self.workload_id), encode(spec(self.workload_id, models,
                                                                     **spec_kw)))
        await self.write(topics.claims(self.workload_id), encode(claim(self.workload_id, epoch)))

    async def send(self, req: EffectRequest) -> int:
        """Write a request on ``.out``; returns its offset."""
        offset = await self.write(topics.out(self.workload_id), encode(req),
                                  key=req.effect_id.encode())
        self.offsets[req.effect_id] = offset
        return offset

    async def read(self, topic: str, *, until: Any, timeout: float = 30.0) -> list[Any]:
        """Decoded records of ``topic`` from the start until ``until(records)`` is true."""
        consumer = make_consumer(self.bootstrap, isolation_level="read_uncommitted")
        await consumer.start()
        records: list[Any] = []
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while not until(records):
                if loop.time() > deadline:
                    raise TimeoutError(f"{topic}: condition not met; have {len(records)} "
                                       f"records: {[_short(r) for r in records][-10:]}")
                batch = await consumer.getmany(tp, timeout_ms=300)
                for msg in batch.get(tp, []):
                    rec = decode(msg.value)
                    records.append(rec)
        finally:
            await consumer.stop()
        return records

    async def responses(self, effect_ids: list[str], *, timeout: float = 30.0,
                        settle: float = 0.0) -> list[ResponseRecord | AcceptedRecord]:
        """``.resp`` records until every effect id has a response (then ``settle`` s more)."""
        wanted = set(effect_ids)

        def done(recs: list[Any]) -> bool:
            got = {r.effect_id for r in recs if isinstance(r, ResponseRecord)}
            return wanted <= got

        recs = await self.read(topics.resp(self.workload_id), until=done, timeout=timeout)
        if settle:
            await asyncio.sleep(settle)
            n = len(recs)
            recs = await self.read(topics.resp(self.workload_id),
                                   until=lambda r: len(r) >= n, timeout=timeout)
        return recs


def _short(rec: Any) -> str:
    if isinstance(rec, ResponseRecord):
        return f"response {rec.effect_id} {rec.outcome} {rec.error.code if rec.error else ''}"
    return f"{rec.kind} {getattr(rec, 'effect_id', '')}"


def by_effect(recs: list[Any]) -> dict[str, list[ResponseRecord]]:
    """Responses grouped by effect id."""
    out: dict[str, list[ResponseRecord]] = {}
    for r in recs:
        if isinstance(r, ResponseRecord):
            out.setdefault(r.effect_id, []).append(r)
    return out


@contextlib.asynccontextmanager
async def workload(bootstrap: str, prefix: str) -> AsyncIterator[Workload]:
    """A fresh workload ``<prefix>-<uuid>`` with its topics created."""
    wid = f"{prefix}-{uuid.uuid4().hex[:12]}"
    await ensure_system_topics(bootstrap)
    await ensure_workload_topics(bootstrap, wid)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        yield Workload(bootstrap, wid, producer)
    finally:
        await producer.stop()


def executor_config(bootstrap: str, workload_id: str, tmp: Path, model_dir: Path,
                    **kw: Any) -> ExecutorConfig:
    """A config that reads only ``workload_id``'s ``.out`` (so tests never see each other): the
    settings of :func:`tests.integration.harness.executor_config` with a node id of its own, a
    5 s shutdown grace and the device the executor picks by default (``auto``); ``kw``
    overrides them."""
    settings = process_executor_config(bootstrap, workload_id, tmp, model_dir,
                                       node_id=f"exec-{uuid.uuid4().hex[:8]}",
                                       shutdown_grace_s=5.0, device="auto")
    settings.update(kw)
    return load_config(environ={}, **settings)


@contextlib.asynccontextmanager
async def running(config: ExecutorConfig, **kw: Any) -> AsyncIterator[ExecutorService]:
    """An executor in this process, started and (gracefully) stopped around the block."""
    service = ExecutorService(config, **kw)
    task = asyncio.create_task(service.run())
    try:
        for _ in range(600):
            if service.is_live() or task.done():
                break
            await asyncio.sleep(0.05)
        if task.done():
            task.result()
        await wait_assigned(service)
        yield service
    finally:
        service.request_stop()
        await asyncio.wait_for(task, 30)


async def wait_assigned(service: ExecutorService, timeout: float = 20.0) -> None:
    """Until every kind's consumer owns at least one partition."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not all(c.assignment() for c in service.node.consumers.values()):
        if loop.time() > deadline:
            raise TimeoutError("executor got no partition assigned")
        await asyncio.sleep(0.05)


class Subprocess:
    """``python -m fx_cli.main executor run --config FILE`` with its log captured."""

    def __init__(self, config: ExecutorConfig, tmp: Path, name: str = "exec") -> None:
        self.config_path = tmp / f"{name}.json"
        self.config_path.write_text(json.dumps(config.model_dump(mode="json")))
        self.log_path = tmp / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FX_EXECUTOR_")}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fx_cli.main", "-v", "executor", "run", "--config",
                 str(self.config_path)],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait_log(self, needle: str, timeout: float = 60.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while needle not in self.log():
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"executor exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            if loop.time() > deadline:
                raise TimeoutError(f"{needle!r} not in log:\n{self.log()[-3000:]}")
            await asyncio.sleep(0.1)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    async def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.proc.poll() is None:
            if loop.time() > deadline:
                self.proc.kill()
                raise TimeoutError("executor did not exit")
            await asyncio.sleep(0.05)
        return self.proc.returncode


async def rejects_for(bootstrap: str, topic: str, n: int, timeout: float = 20.0
                      ) -> list[RejectedRecord]:
    """The first ``n`` RejectedRecords on ``sys.rejects`` for ``topic``."""
    consumer = make_consumer(bootstrap, isolation_level="read_uncommitted")
    await consumer.start()
    found: list[RejectedRecord] = []
    try:
        tp = TopicPartition(topics.REJECTS, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(found) < n and loop.time() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=300)
            for msg in batch.get(tp, []):
                rec = decode(msg.value)
                if isinstance(rec, RejectedRecord) and rec.topic == topic:
                    found.append(rec)
    finally:
        await consumer.stop()
    return found


__all__ = ["REPO", "Subprocess", "Workload", "by_effect", "executor_config", "rejects_for",
           "running", "signal", "wait_assigned", "workload"]
