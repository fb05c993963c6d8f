"""The lease holder's references: an input whose body, or an answer whose output, is a chunk or
stream reference is resolved in the fetch loop before it is buffered, so the step reads its
bytes (:mod:`workload_sdk._refs_io` reads them). What is not there yet is read again with
backoff. An input's reference is waited for until the spec's ``input_policy.wait_ms`` after the
input's append time; then the input is skipped on the record (``then = "quarantine"``: the item
is marked, cause ``unresolvable``, and the fold records it) or the holder stops
(``then = "stop"``). An answer's is waited for up to ``HolderConfig.ref_wait_s``, then the
holder stops. Stopping is :class:`~fx_kafka.workload_log.RefGap` naming the reference (never a
guess). Operators' skip orders (:mod:`workload_sdk._holder_skips`) end a wait. Snapshots over
the inline limit are stored as a chunk before the transaction that holds them commits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from aiokafka.errors import TopicAuthorizationFailedError

from broker_schema import ChunkRef, InputPolicy, ResponseRecord, SkipNote, SpecRecord, StreamRef
from fx_kafka.retry import backoff_s
from fx_kafka.workload_log import Redacted, RefGap
from workload_sdk._commands import skip_command
from workload_sdk._core import Core, Item, describe_ref, referenced_body
from workload_sdk._holder_config import HOLDER_LOG as log
from workload_sdk._holder_config import HolderConfig, HolderStats
from workload_sdk._holder_skips import SkipOrders
from workload_sdk._refs_io import RefProblem, RefResolver
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
        #: operators' skip orders (read on resume, then as ``.spec`` is read)
        self.orders = SkipOrders(config.bootstrap, config.workload_id)

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
        and why); an input an operator ordered skipped, marked so. What is not there yet is
        read again with backoff (``merge_buffered`` first: what was read before it is merged,
        not held up) until the deadline (see the module docstring); then an input is marked
        skipped (``unresolvable``) under ``then = "quarantine"``, else :class:`RefGap` names
        it. None when ``stop`` is set while waiting."""
        cfg = self.config
        assert spec is not None  # the spec in force (an adoption changes it while running)
        item = self.orders.marked(item)
        ref = referenced_body(item.record)
        if item.skip is not None or ref is None or (
                isinstance(item.record, ResponseRecord)
                and not core.may_deliver(item.record.effect_id)):
            return item
        key = (item.source, item.offset)
        policy = spec.input_policy if item.source == "in" else None
        if policy is not None:  # until wait_ms after the input was appended (broker time)
            left_s = (item.time_ms + policy.wait_ms) / 1000 - time.time()
            give_up = time.monotonic() + max(0.0, left_s)
        else:
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
            left = give_up - time.monotonic()
            delay = min(backoff_s(attempt, cap_s=2.0), max(left, 0.0) + 0.05)
            if not problem.retry or left <= 0:
                if policy is None:
                    waited = f" (waited {cfg.ref_wait_s:.0f} s for it)" if problem.retry else ""
                    gap = Redacted if problem.why == "redacted" else RefGap
                    raise gap(topic, item.offset, ref, f"its {ref.type} reference cannot be "
                                 f"read: {problem.message}{waited}; the holder stops here, "
                                 "nothing is merged past it")
                return self._past_deadline(item, topic, ref, problem, policy)
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
            if policy is not None:  # an operator's order ends the wait
                for order in await self.orders.read():
                    self.orders.took(order, core.positions["in"])
                marked = self.orders.marked(item)
                if marked.skip is not None:
                    return marked

    def _past_deadline(self, item: Item, topic: str, ref: ChunkRef | StreamRef,
                       problem: RefProblem, policy: InputPolicy) -> Item:
        """An input whose reference cannot be read by the policy's deadline (or never can:
        other bytes than the reference's): marked skipped (``unresolvable``) when the policy
        says ``quarantine`` and the problem is the input's; :class:`RefGap` otherwise (a
        reference this client may not read is a grant to fix, not an input to skip)."""
        wid = self.config.workload_id
        waited = (f" (waited {policy.wait_ms / 1000:g} s from the input's append time)"
                  if problem.retry else "")
        what = f"its {describe_ref(ref, wid)} cannot be read: {problem.message}{waited}"
        if policy.then != "quarantine" or problem.why not in ("missing", "mismatch", "redacted"):
            gap = Redacted if problem.why == "redacted" else RefGap
            raise gap(topic, item.offset, ref, f"{what}; the holder stops here, nothing is "
                      "merged past it (to skip it on the record: "
                      f"{skip_command(wid, item.offset)})")
        log.error("%s@%d skipped on the record (input_policy: quarantine): %s", topic,
                  item.offset, what)
        return replace(item, skip=SkipNote(cause="unresolvable", detail=what[:4096]))
