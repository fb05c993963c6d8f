"""The aiokafka shell of trimming: read what :func:`~workload_sdk._trim.plan_trim` needs, find
the horizon's offsets (ListOffsets by timestamp), and delete with DeleteRecords.

``fx trim`` and the lease holder's periodic trim (``HolderConfig.trim_every_s``) both call
:func:`trim_workload`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import TopicPartition
from aiokafka.admin import RecordsToDelete

from broker_schema import topics
from fx_kafka.client import make_admin, make_consumer
from fx_kafka.workload_log import TopicView, WorkloadLog, read_topic
from workload_sdk._trim import TRIMMED, TrimPlan, horizon_cutoff_ms, latest_spec, plan_trim

__all__ = ["delete_below", "horizon_offsets", "read_trim_log", "trim_workload"]

log = logging.getLogger(__name__)


async def read_trim_log(bootstrap: str, workload_id: str) -> WorkloadLog:
    """``.spec``, ``.merge``, ``.resp`` and ``.out`` from their log starts, and ``.in``'s start
    and end offsets only (no ``.in`` record names another, so plan_trim needs none)."""
    wl = WorkloadLog.empty(workload_id)
    full = ("spec", "merge", "resp", "out")
    views = await asyncio.gather(
        *(read_topic(bootstrap, topics.stream(workload_id, s)) for s in full))
    for stream, view in zip(full, views, strict=True):
        wl.views[stream] = view
    in_topic = topics.stream(workload_id, "in")
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(in_topic, 0)
        start = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
    finally:
        await consumer.stop()
    wl.views["in"] = TopicView(topic=in_topic, start=start, end=max(start, end))
    return wl


async def horizon_offsets(bootstrap: str, workload_id: str, cutoff_ms: int) -> dict[str, int]:
    """Per trimmable stream, the first offset whose broker append time is at or after
    ``cutoff_ms`` (the end offset when every record is older), by ListOffsets by timestamp."""
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        tps = {s: TopicPartition(topics.stream(workload_id, s), 0) for s in TRIMMED}
        found = await consumer.offsets_for_times({tp: cutoff_ms for tp in tps.values()})
        ends = await consumer.end_offsets(list(tps.values()))
    finally:
        await consumer.stop()
    out: dict[str, int] = {}
    for stream, tp in tps.items():
        hit = found.get(tp)
        out[stream] = ends[tp] if hit is None else min(int(hit.offset), ends[tp])
    return out


async def delete_below(bootstrap: str, before: dict[str, int]) -> dict[str, int]:
    """DeleteRecords: delete every record of partition 0 of each topic below its offset; return
    the log start offsets (low watermarks) the broker reports."""
    if not before:
        return {}
    admin = make_admin(bootstrap)
    try:
        await admin.start()
        result = await admin.delete_records(
            {TopicPartition(topic, 0): RecordsToDelete(offset) for topic, offset in
             before.items()})
    finally:
        await admin.close()
    return {tp.topic: int(low) for tp, low in result.items()}


async def trim_workload(bootstrap: str, workload_id: str, *, dry_run: bool = False,
                        now_ms: int | None = None) -> TrimPlan:
    """Trim a workload's ``.in``, ``.out``, ``.resp`` and ``.merge`` by its latest spec's audit
    horizon, keeping what resume and replay from the trim snapshot need (see
    :mod:`workload_sdk._trim`). ``dry_run``: decide and return the plan, delete nothing.
    ``now_ms``: the time the horizon counts back from (default: this machine's clock)."""
    wl = await read_trim_log(bootstrap, workload_id)
    if any(wl[s].mirrored for s in ("spec", "merge", "resp", "out")):
        # the copy's own offsets are not the site's: DeleteRecords at site offsets would cut
        # elsewhere (and the fleet keeps the site's history by design)
        plan = plan_trim(wl, None)
        plan.note = (f"{topics.prefix(workload_id)}* here is a copy made by fx mirror: nothing "
                     "is trimmed (trim the site; the copy's offsets are not the site's)")
        return plan
    spec = latest_spec(wl)
    if spec is None:
        plan = plan_trim(wl, None)
        plan.note = f"no spec on {wl['spec'].topic}: nothing is trimmed"
        return plan
    horizon_ms = spec[1].audit_horizon_ms
    now = int(time.time() * 1000) if now_ms is None else now_ms
    cutoff = horizon_cutoff_ms(horizon_ms, now)
    offsets = None if cutoff is None else await horizon_offsets(bootstrap, workload_id, cutoff)
    plan = plan_trim(wl, offsets, audit_horizon_ms=horizon_ms, cutoff_ms=cutoff)
    if dry_run or not plan.changes:
        return plan
    lows = await delete_below(bootstrap, {t.topic: t.new_start for t in plan.changes.values()})
    by_topic = {t.topic: s for s, t in plan.topics.items()}
    plan.low_watermarks = {by_topic[topic]: low for topic, low in lows.items()}
    plan.applied = True
    log.info("trimmed %s: %s", workload_id, ", ".join(
        f"{t.topic} {t.start} -> {plan.low_watermarks.get(s, t.new_start)}"
        for s, t in plan.changes.items()))
    return plan
