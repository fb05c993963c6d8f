"""The lease holder's references: an input whose body, or an answer whose output, is a chunk or
stream reference is resolved in the fetch loop before it is buffered, so the step reads its
bytes (:mod:`workload_sdk._refs_io` reads them). What is not there yet is read again with
backoff, up to ``HolderConfig.ref_wait_s``; then the holder stops with
:class:`~fx_kafka.workload_log.RefGap` naming it (never a guess, never a skip). Snapshots over
the inline limit are stored as a chunk before the transaction that holds them commits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from aiokafka.errors import TopicAuthorizationFailedError

from broker_schema import ResponseRecord, SpecRecord
from fx_kafka.retry import backoff_s
from fx_kafka.workload_log import RefGap
from workload_sdk._core import Core, Item, describe_ref, referenced_body
from workload_sdk._holder_config import HOLDER_LOG as log
from workload_sdk._holder_config import HolderConfig, HolderStats
from workload_sdk._refs_io import RefResolver
from workload_sdk._round import MergedBatch

__all__ = ["HolderRefs"]


class HolderRefs:
    """Resolves the referenced bodies of what a holder buffers, waiting for what is late, and
    stores its snapshots' chunk states; one per run of the holder (:attr:`resolver` also reads
    what the resume needs, and is closed when the run ends)."""

    def __init__(self, config: HolderConfig, stats: HolderStats) -> None:
        self.resolver = RefResolver(config.bootstrap, chunk_dir=config.chunk_dir)
        self.config = config
        self.stats = stats

    async def store_chunks(self, batch: MergedBatch) -> None:
        """Store the chunks ``batch`` names before the transaction that names them commits (an
        aborted one leaves an unnamed chunk behind: content-addressed, harmless); a snapshot
        whose chunk cannot be stored is dropped from the batch, with why."""
        for ref, data in list(batch.chunks):
            try:
                stored = await self.resolver.write_chunk(data, workload=self.config.workload_id,
                                                         media_type=ref.media_type)
            except (TopicAuthorizationFailedError, OSError) as exc:
                batch.drop_snapshot(ref, f"snapshot with chunk state {ref.hash} "
                                    f"({ref.size} B) skipped: cannot store the chunk in "
                                    f"{self.resolver.where}: {exc!r}")
                continue
            assert stored.hash == ref.hash
            self.stats.chunk_snapshots += 1

    async def resolved(self, item: Item, topic: str, core: Core, spec: SpecRecord | None,
                       stop: asyncio.Event,
                       merge_buffered: Callable[[], Awaitable[None]]) -> Item | None:
        """``item`` with the bytes of its referenced body, if the step may read it: an input's,
        or an answer's that may still be delivered (:meth:`Core.may_deliver`), and only what
        the spec in force lets the workload read (else the core hands the step the reference
        and why). What is not there yet is read again with backoff, up to ``ref_wait_s``
        (``merge_buffered`` first: what was read before it is merged, not held up); then
        :class:`RefGap` naming it. None when ``stop`` is set while waiting."""
        cfg = self.config
        assert spec is not None  # the spec in force (an adoption changes it while running)
        ref = referenced_body(item.record)
        if ref is None or (isinstance(item.record, ResponseRecord)
                           and not core.may_deliver(item.record.effect_id)):
            return item
        key = (item.source, item.offset)
        give_up = time.monotonic() + cfg.ref_wait_s
        attempt = 0
        while True:
            res = await self.resolver.resolve([(key, ref)], workload=cfg.workload_id, specs=[spec])
            if key in res.resolved:
                self.stats.refs_resolved += 1
                return replace(item, resolved=res.resolved[key])
            problem = res.problems[key]
            if problem.why == "forbidden":
                return item
            attempt += 1
            delay = backoff_s(attempt, cap_s=2.0)
            if not problem.retry or time.monotonic() + delay > give_up:
                waited = (f" (waited {cfg.ref_wait_s:.0f} s for it)" if problem.retry else "")
                raise RefGap(topic, item.offset, ref, f"its {ref.type} reference cannot be read: "
                             f"{problem.message}{waited}; the holder stops here, nothing is "
                             "merged past it")
            if attempt == 1:
                await merge_buffered()
            log.warning("%s@%d names %s, which is not there yet (%s): reading it again in "
                        "%.1f s", topic, item.offset, describe_ref(ref, cfg.workload_id),
                        problem.message, delay)
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
                return None
            except TimeoutError:
                pass
