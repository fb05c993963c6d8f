"""Reading a workload's streams from the broker into a :class:`WorkloadLog` (read_committed)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from broker_schema import (
    Body,
    ChunkRef,
    DecodeError,
    MergeEntry,
    SnapshotRecord,
    SpecRecord,
    decode,
    topics,
)
from fx_kafka import security as _security
from fx_kafka.workload_log import TopicView, WorkloadLog, read_facts, read_topic
from workload_sdk._core import referenced_body
from workload_sdk._refs_io import RefResolver


def _decoded(view: TopicView) -> Iterable[tuple[int, object]]:
    for rec in view:
        try:
            yield rec.offset, decode(rec.value)
        except DecodeError:
            continue  # replay reports it, if it needs it


async def resolve_log(log: WorkloadLog, resolver: RefResolver, *,
                      snapshots: Literal["all", "latest"] = "all") -> None:
    """Fill ``log.resolved`` (and ``log.unresolved``) with what replay needs: the referenced
    body of every record a merge entry delivers, and the chunk state of the snapshots on
    ``.merge`` (every one, or the latest only: a resume starts there). Only what one of the
    specs on ``.spec`` lets the workload read is read (:mod:`broker_schema.refs`). Reads
    nothing when nothing is referenced."""
    wants: list[tuple[tuple[str, int], Body]] = []
    snaps: list[tuple[int, SnapshotRecord]] = []
    for offset, record in _decoded(log["merge"]):
        if isinstance(record, SnapshotRecord):
            snaps.append((offset, record))
        elif isinstance(record, MergeEntry) and record.action == "deliver":
            view = log[record.source]
            raw = view.records.get(record.source_offset)
            if raw is None:
                continue
            try:
                item_record = decode(raw.value)
            except DecodeError:
                continue
            body = referenced_body(item_record)  # type: ignore[arg-type]
            if body is not None:
                wants.append(((record.source, record.source_offset), body))
    if snapshots == "latest":
        snaps = snaps[-1:]
    wants.extend((("merge", offset), snap.state) for offset, snap in snaps
                 if isinstance(snap.state, ChunkRef))
    if not wants:
        return
    specs = [r for _, r in _decoded(log["spec"]) if isinstance(r, SpecRecord)]
    res = await resolver.resolve(wants, workload=log.workload_id, specs=specs)
    log.resolved.update(res.resolved)
    log.unresolved.update({key: p.message for key, p in res.problems.items()})
    log.redacted.update(key for key, p in res.problems.items() if p.why == "redacted")


async def read_workload_log(bootstrap: str, workload_id: str, *,
                            streams: Iterable[str] = topics.STREAMS,
                            with_facts: bool = True, resolve: bool = True,
                            chunk_dir: str | Path | None = None) -> WorkloadLog:
    """The committed records of a workload's streams (and ``sys.facts``) as a WorkloadLog.

    ``resolve`` (default): also read what the referenced bodies replay needs name
    (:func:`resolve_log`), chunks from ``chunk_dir`` (a filesystem store) or else
    ``sys.chunks``."""
    log = WorkloadLog.empty(workload_id)
    wanted = list(streams)
    views = await asyncio.gather(
        *(read_topic(bootstrap, topics.stream(workload_id, s)) for s in wanted)
    )
    for stream, view in zip(wanted, views, strict=True):
        log.views[stream] = view
    if with_facts:
        log.facts = await read_facts(bootstrap)
    if resolve:
        async with RefResolver(bootstrap, chunk_dir=chunk_dir) as resolver:
            await resolve_log(log, resolver)
    return log


def resume_positions(merge: TopicView) -> dict[str, int]:
    """Where a resuming holder starts reading ``.in``, ``.resp`` and ``.out``: the positions the
    latest snapshot on ``.merge`` recorded (0 for a source it does not name, or with no snapshot).

    Sound because each source is merged in offset order, so every merge entry after the snapshot
    names an offset at or above the snapshot's position on its source; and the holder records
    ``out`` as the lowest ``.out`` offset it still needs (the requests of effects pending at the
    snapshot, and every output of the snapshot's step or later).
    """
    latest: SnapshotRecord | None = None
    for rec in merge:
        try:
            record = decode(rec.value)
        except DecodeError:
            continue  # replay reports it, if it needs it
        if isinstance(record, SnapshotRecord):
            latest = record
    positions = {"in": 0, "resp": 0, "out": 0}
    if latest is not None:
        for source in positions:
            positions[source] = latest.positions.get(source, 0)
    return positions


async def read_resume_log(bootstrap: str, workload_id: str, *,
                          resolver: RefResolver | None = None
                          ) -> tuple[WorkloadLog, dict[str, int]]:
    """The part of a workload's log a resuming holder needs: ``.spec``, ``.claims`` and
    ``.merge`` in full, ``.in``/``.resp``/``.out`` from the latest snapshot's positions (see
    :func:`resume_positions`), and (with ``resolver``) what the latest snapshot's chunk state and
    the referenced bodies delivered after it name. Returns the log and the positions used."""
    log = WorkloadLog.empty(workload_id)
    full = ("spec", "claims", "merge")
    views = await asyncio.gather(
        *(read_topic(bootstrap, topics.stream(workload_id, s)) for s in full)
    )
    for stream, view in zip(full, views, strict=True):
        log.views[stream] = view
    positions = resume_positions(log["merge"])
    tail = ("in", "resp", "out")
    views = await asyncio.gather(
        *(read_topic(bootstrap, topics.stream(workload_id, s), start=positions[s]) for s in tail)
    )
    for stream, view in zip(tail, views, strict=True):
        log.views[stream] = view
    if resolver is not None:
        await resolve_log(log, resolver, snapshots="latest")
    return log, positions


def default_unsigned_policy() -> Literal["count", "refuse"]:
    """The spec's ``unsigned`` policy when its writer does not choose: ``refuse`` when this
    process talks to a secured broker (SASL, :func:`fx_kafka.security.current`), where every
    executor signs and only a forger writes unsigned answers; ``count`` on a plain broker."""
    return "refuse" if _security.current().sasl else "count"
