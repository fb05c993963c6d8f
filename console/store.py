"""The console's only reader of the broker (read-only, ``read_committed``).

Each workload a page asks about is read once into a :class:`workload_sdk.WorkloadLog` (what the
``why`` walk needs) with its timeline rows (:func:`console.views.row_of`); later requests read
only what was appended since, from where each stream was read up to (a seek), at most once per
``refresh_s``. A page never reads a whole log per request.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from broker_schema import ChunkRef, DecodeError, FactsRecord, decode, topics
from broker_schema.chunks import ChunkProblem
from broker_schema.refs import chunk_owner
from console.views import Row, row_of
from fx_kafka.client import make_consumer
from fx_kafka.refs import ChunkTopicReader
from fx_kafka.workload_log import LogRecord, TopicView, WorkloadLog, read_topic
from workload_sdk.log_rows import named


@dataclass
class CachedWorkload:
    """One workload's log as read so far, and its timeline rows in timeline order."""

    log: WorkloadLog
    rows: list[Row] = field(default_factory=list)
    read_at: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: model hash -> the registry name the specs read so far recorded (``model_names``)
    model_names: dict[str, str] = field(default_factory=dict)


@dataclass
class CachedTopic:
    """A system topic's records as read so far (offset, decoded record or None)."""

    view: TopicView
    records: list[tuple[int, Any]] = field(default_factory=list)
    read_at: float = 0.0


class Cluster:
    """What the console reads from one cluster (``bootstrap``)."""

    def __init__(self, bootstrap: str, *, refresh_s: float = 1.0) -> None:
        self.bootstrap = bootstrap
        self.refresh_s = refresh_s
        self._workloads: dict[str, CachedWorkload] = {}
        self._system: dict[str, CachedTopic] = {}
        self._topics: tuple[float, set[str]] = (0.0, set())
        self._lock = asyncio.Lock()
        #: the sys.chunks reader of the why pages (started on first use; its index is kept, so
        #: a later page reads only what was appended since)
        self._chunks: ChunkTopicReader | None = None

    async def chunk_redacted(self, workload: str, ref: ChunkRef) -> str | None:
        """Why ``workload``'s chunk ``ref`` is redacted (``fx redact``, or its tenant key
        gone), or None when it is not (readable, or unreadable for another reason)."""
        if self._chunks is None:
            reader = ChunkTopicReader(self.bootstrap)
            await reader.start()
            self._chunks = reader
        key = (chunk_owner(ref, workload), ref.hash)
        got = (await self._chunks.read({key: ref}))[key]
        return got.message if isinstance(got, ChunkProblem) and got.why == "redacted" else None

    async def topic_names(self) -> set[str]:
        """The cluster's topic names (cached for ``refresh_s``)."""
        if time.monotonic() - self._topics[0] < self.refresh_s:
            return self._topics[1]
        consumer = make_consumer(self.bootstrap)
        await consumer.start()
        try:
            names = set(await consumer.topics())
        finally:
            await consumer.stop()
        self._topics = (time.monotonic(), names)
        return names

    async def workload_ids(self) -> list[str]:
        """Every workload with a topic on the cluster (``wl.<id>.<stream>``), sorted."""
        ids = set()
        for name in await self.topic_names():
            try:
                ids.add(topics.parse(name)[0])
            except ValueError:
                continue
        return sorted(ids)

    async def shadow_topics(self) -> list[tuple[str, str, str]]:
        """``(workload id, eval id, topic)`` of every shadow evaluation's ``.eval``."""
        out = []
        for name in sorted(await self.topic_names()):
            try:
                wid, eval_id, stream = topics.parse_shadow(name)
            except ValueError:
                continue
            if stream == "eval":
                out.append((wid, eval_id, name))
        return out

    async def exists(self, workload_id: str) -> bool:
        """Does the cluster hold any topic of ``workload_id``?"""
        names = await self.topic_names()
        return any(t in names for t in topics.all_topics(workload_id))

    async def workload(self, workload_id: str) -> CachedWorkload:
        """The workload's log, extended with what was appended since it was last read (once per
        ``refresh_s``)."""
        async with self._lock:
            cached = self._workloads.get(workload_id)
            if cached is None:
                cached = CachedWorkload(WorkloadLog.empty(workload_id))
                self._workloads[workload_id] = cached
        async with cached.lock:
            if time.monotonic() - cached.read_at >= self.refresh_s:
                await self._extend(cached)
                cached.log.facts = [r for _, r in (await self.system(topics.FACTS)).records
                                    if isinstance(r, FactsRecord)]
                cached.read_at = time.monotonic()
        return cached

    async def _extend(self, cached: CachedWorkload) -> None:
        log = cached.log
        names = await self.topic_names()
        wanted = [s for s in topics.STREAMS if topics.stream(log.workload_id, s) in names]
        views = await asyncio.gather(*(read_topic(self.bootstrap, log[s].topic,
                                                  start=log[s].end) for s in wanted))
        new: list[Row] = []
        for stream, view in zip(wanted, views, strict=True):
            have = log[stream]
            have.start = view.start
            have.mirrored = view.mirrored
            for rec in view:
                if rec.offset not in have.records:
                    have.add(rec)
                    new.append(row_of(stream, rec.offset, rec.time_ms, rec.value))
            have.end = max(have.end, view.end)
        if new:
            learned = {h: n for r in new for h, n in r.names}
            if learned:  # a spec naming models: every row may show them now
                cached.model_names.update(learned)
                cached.rows = [named(r, cached.model_names) for r in cached.rows]
            new = [named(r, cached.model_names) for r in new]
            last = cached.rows[-1].order if cached.rows else None
            new.sort(key=lambda r: r.order)
            cached.rows.extend(new)
            if last is not None and new[0].order < last:
                cached.rows.sort(key=lambda r: r.order)  # appended out of time order

    async def system(self, topic: str) -> CachedTopic:
        """A system topic (``sys.facts``, ``sys.alarms``, a shadow ``.eval``...) as read so far,
        extended once per ``refresh_s``; empty when the topic does not exist."""
        cached = self._system.get(topic)
        if cached is None:
            cached = self._system[topic] = CachedTopic(TopicView(topic))
        if time.monotonic() - cached.read_at < self.refresh_s:
            return cached
        if topic in await self.topic_names():
            view = await read_topic(self.bootstrap, topic, start=cached.view.end)
            for rec in view:
                if rec.offset in cached.view.records:
                    continue
                cached.view.add(LogRecord(rec.offset, rec.time_ms, rec.value))
                try:
                    record: Any = decode(rec.value)
                except DecodeError:
                    record = None
                cached.records.append((rec.offset, record))
            cached.view.end = max(cached.view.end, view.end)
        cached.read_at = time.monotonic()
        return cached

    async def ledger(self, node_id: str) -> list[tuple[int, bytes]] | None:
        """The records of ``sys.ledger.<node_id>`` (None when the node has no ledger topic)."""
        try:
            name = topics.ledger(node_id)
        except ValueError:
            return None
        if name not in await self.topic_names():
            return None
        view = await read_topic(self.bootstrap, name)
        return [(r.offset, r.value) for r in view]
