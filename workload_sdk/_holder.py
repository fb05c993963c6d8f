"""The lease holder: a thin aiokafka shell around :class:`~workload_sdk._core.Core`.

Start-up (each step is a fact on the log, so a successor can check it):

1. Start a transactional producer whose id is derived from the workload id. ``InitProducerId``
   bumps the producer epoch, so the broker fences any older holder of the same workload: its
   next transaction fails.
2. Read ``.claims`` and write a claim with the highest epoch seen plus one, naming the latest
   spec on ``.spec`` (its offset and hash). The running module must hash to one of the modules
   the spec runs (its ``module_hash`` or a module switch's, ``fx workload deploy``); the code
   of every other step is loaded by hash from the module store ``sys.modules``
   (:mod:`workload_sdk._code`), and a spec with new code is adopted live only once its code is
   loaded.
3. Replay ``.merge`` from the latest snapshot with the same core replay uses, reading ``.in``,
   ``.resp`` and ``.out`` only from the positions that snapshot recorded; write any output slot
   ``(input_offset, index)`` the replay computed that is not on ``.out`` (none, normally: outputs
   and merge entries commit in one transaction), and refuse to run if a slot that is on ``.out``
   differs from what replay computed.
4. Read ``.in`` and ``.resp`` from the positions the replay ended at, and loop: merge in the
   recorded order (:func:`choose_next`), run the step, write outputs, merge entries and periodic
   snapshots in one transaction, then judge deadlines against the append time of the latest
   ``.resp`` record merged, writing ``timeout``/``unknown`` records, and append a tick to
   ``.resp`` when a deadline is near and nothing else would move broker time forward.

Broker restarts and outages: the holder rides them out in the same process and loses nothing.
aiokafka itself reconnects and retries most calls (a transactional producer never expires a
batch; ``EndTxn`` and fetches are retried), so a short outage only delays the loop. When a call
does fail with :func:`~fx_kafka.retry.broker_unavailable` (a client started while the broker is
down, a send that timed out waiting for metadata, a read that could not finish), or the producer
is fenced while this holder's own claim is still the highest on ``.claims`` (the transaction
coordinator aborted a transaction left open across a long outage and bumped the producer epoch),
the holder *restarts itself from the log*: it drops every piece of in-memory state, waits with
backoff (after a fence at least ``FENCE_SETTLE_S``, so that a successor's claim is on the log),
reads ``.claims`` (a higher claim than its own: it was replaced, :class:`Fenced`), starts
a new transactional producer (``InitProducerId`` aborts whatever transaction of this id was still
open, so nothing half-written can ever commit), and runs start-up again. It keeps its epoch and
writes no new claim when its claim is still the latest and names the latest spec (a new epoch
would make executors refuse its own pending requests as ``stale_epoch``); otherwise it claims
anew. The resume then replays the committed merge log, exactly as a successor would: the aborted
transaction's decisions are made again by the deterministic fold, outputs already on ``.out`` are
checked byte for byte. Exactly-once rests on the transaction, never on the restart being clean.
Restarts are counted (``HolderStats.broker_restarts``) and logged as ``broker unavailable`` at
WARNING; three fences in a row without a committed transaction between them end the holder with
:class:`Fenced`.

References: an input whose body, or an answer whose output, is a chunk or stream reference is
resolved in the fetch loop before it is buffered (:mod:`workload_sdk._refs_io`; chunks from
``sys.chunks``, or from ``HolderConfig.chunk_dir``), so the step reads its bytes. A chunk or
record that is not there yet is waited for with backoff: an input's until the spec's
``input_policy`` deadline, then it is skipped on the record (``quarantine``: a ``quarantined``
merge entry and a ``skip_alarm`` on ``sys.alarms``, one transaction) or the holder stops
(``stop``); an answer's up to ``HolderConfig.ref_wait_s``, then the holder stops. Stopping is
:class:`~fx_kafka.workload_log.RefGap` naming it (never a guess: nothing is merged past it, and
a restart once it is there, or once an operator ordered it skipped, carries on). An input whose
step raises is skipped on the record too (``input_policy.on_step_error``), and an operator's
skip order on ``.spec`` (``fx workload skip``, :mod:`workload_sdk._holder_skips`) skips the
input it names. Snapshots over the inline limit are stored as a chunk before the transaction
that holds them commits.

Optionally (``HolderConfig.trim_every_s``) the holder also trims the workload's log by the spec's
audit horizon every so often, with the same :func:`~workload_sdk._trim_io.trim_workload` that
``fx trim`` runs.

The holder class keeps the loop (read, merge, judge and tick, write) and its state; its other
jobs are objects it makes and starts: start-up and restarts (:mod:`workload_sdk._holder_start`),
signature watching (:mod:`workload_sdk._holder_signatures`), metrics observation
(:mod:`workload_sdk._holder_observer`), trimming (:mod:`workload_sdk._holder_trim`), references
(:mod:`workload_sdk._holder_refs`), foreign ticks (:mod:`workload_sdk._holder_rejects`) and the
broker clock estimate (:mod:`workload_sdk._broker_clock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Set
from typing import TYPE_CHECKING, Any

from aiokafka import TopicPartition
from aiokafka.errors import (
    IllegalOperation,
    InvalidProducerEpoch,
    KafkaError,
    ProducerFenced,
)

from broker_schema import (
    ClaimRecord,
    EffectRequest,
    ResponseRecord,
    SkipAlarmRecord,
    SpecRecord,
    TickRecord,
    encode,
    record_hash,
    topics,
)
from broker_schema.signatures import HOLDER_SIG_HEADER, SigningKey, holder_signature
from broker_schema.streams import OutRecord
from fx_kafka.client import broker_time_us, make_consumer, make_producer
from fx_kafka.workload import (
    check_workload_topics,
    ensure_alarms_topic,
    ensure_workload_topics,
)
from workload_sdk._api import Workload
from workload_sdk._broker_clock import BrokerClock
from workload_sdk._code import Code
from workload_sdk._core import (
    Core,
    Item,
    next_due_ms,
)
from workload_sdk._holder_config import HOLDER_LOG as log
from workload_sdk._holder_config import HolderConfig, HolderStats
from workload_sdk._holder_intake import decode_item, spec_adoption
from workload_sdk._holder_observer import MetricsObserver
from workload_sdk._holder_refs import HolderRefs
from workload_sdk._holder_rejects import TickRejects
from workload_sdk._holder_signatures import SignatureWatcher
from workload_sdk._holder_start import (
    Fenced,
    NoSpec,
    Replaced,
    RequestAt,
    Restarts,
    Unplaced,
    check_restart,
    claim_engine,
    keep_epoch,
    latest_spec,
    read_claims,
    rejoin_epoch,
    resumed_state,
    transactional_id_for,
    wait_for_epoch,
    wait_for_placement,
)
from workload_sdk._holder_trim import PeriodicTrim
from workload_sdk._holder_watch import ClaimWatch, readiness
from workload_sdk._kafka_io import read_resume_log
from workload_sdk._module_store import read_modules
from workload_sdk._observe import PendingRequest
from workload_sdk._round import alarms_for, merge_batch, outcomes_due, skip_alarms, tick_due
from workload_sdk._signature_tally import ReadResponse

if TYPE_CHECKING:  # the metrics are the process's (cli), never needed to run the fold
    from workload_sdk._holder_metrics import HolderMetrics

__all__ = ["Fenced", "HolderConfig", "HolderStats", "LeaseHolder", "NoSpec", "Replaced",
           "Unplaced", "check_restart", "rejoin_epoch", "transactional_id_for"]


def _retrieve(fut: Any) -> None:
    if not fut.cancelled():
        fut.exception()


async def _start_reading(consumer: Any, workload_id: str, core: Core, spec_offset: int
                         ) -> tuple[TopicPartition, TopicPartition]:
    """Start ``consumer`` on ``.in`` and ``.resp`` from where ``core`` is, and on ``.spec``
    after ``spec_offset`` (specs written from now on); the ``.in`` and ``.resp`` partitions."""
    await consumer.start()
    tp_in = TopicPartition(topics.inputs(workload_id), 0)
    tp_resp = TopicPartition(topics.resp(workload_id), 0)
    tp_spec = TopicPartition(topics.spec(workload_id), 0)
    consumer.assign([tp_in, tp_resp, tp_spec])
    consumer.seek(tp_in, core.positions["in"])
    consumer.seek(tp_resp, core.positions["resp"])
    consumer.seek(tp_spec, spec_offset + 1)
    return tp_in, tp_resp


class LeaseHolder:
    """Holds the lease of one workload and runs its fold (see the module docstring).

    Create it, then ``await run(stop)``; it returns when ``stop`` is set, raises :class:`Fenced`
    when a newer holder took over, :class:`WorkloadError` when the step broke a rule,
    :class:`NoSpec` when there is no spec to run,
    :class:`~fx_kafka.errors.RetentionTooShortError` when a workload topic's retention is shorter
    than the spec's audit horizon, and on resume :class:`ReplayError` when the
    module does not reproduce the recorded merge decisions or outputs and :class:`LogGap` when a
    record replay needs is gone; :class:`~fx_kafka.workload_log.RefGap` (a ``LogGap``) when a
    chunk or stream record an input, an answer or the snapshot resumed from names cannot be read.
    """

    def __init__(self, workload: Workload, config: HolderConfig,
                 metrics: HolderMetrics | None = None, *,
                 watch: ClaimWatch | None = None) -> None:
        self.workload = workload
        self.config = config
        #: reads ``.claims`` for ``/readyz`` (the election's, else one run by :meth:`run`)
        self.watch = watch or ClaimWatch(config.bootstrap, config.workload_id)
        self._own_watch = watch is None
        #: when this holder's claim (or the rejoin of its epoch) was written (monotonic)
        self.claimed_at: float | None = None
        #: updated by this shell from what the pure code returns (None: no metrics)
        self.metrics = metrics
        self.epoch = 0
        self.spec: SpecRecord | None = None
        self.core: Core | None = None
        #: the code of each step (the module store as read at start, and since)
        self.code = Code(workload)
        self.stats = HolderStats()
        self.ready = asyncio.Event()
        self._requests: dict[str, RequestAt] = {}
        #: effect id -> the node of its latest ``accepted`` read (for alarms: people only)
        self._accepted_by: dict[str, str] = {}
        self._written_outcomes: set[str] = set()
        self._now_resp_ms: int | None = None
        self._clock = BrokerClock()
        self._tick_inflight_since: float | None = None
        #: inputs are buffered behind the merge (the outstanding limit or a backpressure pause)
        self._inputs_waiting = False
        #: offset on ``.spec`` of the spec in force (claimed or adopted)
        self._spec_offset = -1
        self._producer: Any = None
        self._out_end = 0  # offset after the last committed .out record this holder knows
        # offsets of records skipped (undecodable, wrong kind) behind records still buffered:
        # the read position passes them only once everything before them is merged
        self._skipped: dict[str, deque[int]] = {"in": deque(), "resp": deque()}
        self._refs: HolderRefs | None = None
        #: signature checks (an observation of the shell: kept across restarts from the log)
        self.signatures = SignatureWatcher(config, self.stats, metrics)
        #: the gauges (lease, outstanding, merge lag, unread requests): no-ops without metrics
        self.observer = MetricsObserver(config, metrics, self)
        #: why this holder cannot go on now (e.g. no epoch left to claim), for ``/readyz``
        self.problem: str | None = None
        #: the key this holder signs its records on .out with (None: ``sign_requests`` off),
        #: made for this holder and named in its claims
        self._holder_key = SigningKey.generate() if config.sign_requests else None
        self._holder_key_text = (None if self._holder_key is None
                                 else self._holder_key.public_key_b64)
        #: ticks not written by their epoch's holder, for ``sys.rejects``
        self._ticks = TickRejects(config, self.stats, metrics)

    def status(self) -> dict[str, Any]:
        """For ``/readyz``: ``ready`` while the role is ``leader`` (merging, the broker
        answering, its claim confirmed on ``.claims``: :func:`~workload_sdk._holder_watch.
        holder_role`), else ``candidate`` (claiming, resuming, restarting from the log after
        a broker outage, or waiting for its claim to be confirmed); whether the broker answers;
        the epoch and the next merge seq."""
        return readiness(self.watch, merging=self.ready.is_set(), claimed_at=self.claimed_at,
                         epoch=self.epoch, holder_id=self.config.holder_id,
                         workload_id=self.config.workload_id,
                         seq=None if self.core is None else self.core.seq, problem=self.problem)

    # -- start-up ------------------------------------------------------------------------------
    async def _claim(self, rejoin: int | None = None, forced: list[str] | None = None) -> None:
        """Claim the next epoch (or keep ``rejoin``); ``forced``: what placement found missing
        when claiming with ``force_placement`` (recorded in the claim)."""
        cfg = self.config
        spec_offset, self.spec = await latest_spec(cfg.bootstrap, cfg.workload_id)
        self._spec_offset = spec_offset
        mine = self.code.given_hash
        if cfg.check_module and mine not in self.spec.module_hashes():
            raise NoSpec(f"module hash {mine} is none of the modules the spec at offset "
                         f"{spec_offset} runs ({', '.join(self.spec.module_hashes())})")
        # the broker must not delete what the spec's audit horizon keeps
        await check_workload_topics(cfg.bootstrap, cfg.workload_id,
                                    audit_horizon_ms=self.spec.audit_horizon_ms)
        claims = await read_claims(cfg.bootstrap, cfg.workload_id)
        self.signatures.note_holders(c.holder_id for c in claims)  # whose timeouts are unsigned
        self._ticks.epoch_holders = {c.epoch: c.holder_id for c in claims if c.from_seq is None}
        if rejoin is not None:
            kept = keep_epoch(claims, epoch=rejoin, holder_id=cfg.holder_id,
                              spec_offset=spec_offset, holder_key=self._holder_key_text)
            if kept is not None:
                self.epoch = kept
                self.claimed_at = time.monotonic()
                log.info("rejoined %s at epoch %d (spec offset %d)", cfg.workload_id,
                         self.epoch, spec_offset)
                self.observer.lease(True, self.epoch)
                return
        epoch = await wait_for_epoch(cfg.bootstrap, cfg.workload_id, claims, self._say)
        self.epoch = epoch
        self._ticks.epoch_holders[epoch] = cfg.holder_id
        claim = ClaimRecord(workload_id=cfg.workload_id, epoch=self.epoch, holder_id=cfg.holder_id,
                            spec_hash=record_hash(self.spec), spec_offset=spec_offset,
                            forced=tuple(forced or ()), holder_key=self._holder_key_text,
                            local_engine=claim_engine(self.spec))
        await self._write([(topics.claims(cfg.workload_id), encode(claim))])
        self.claimed_at = time.monotonic()
        log.info("claimed %s at epoch %d (spec offset %d)", cfg.workload_id, self.epoch,
                 spec_offset)
        self.observer.lease(True, self.epoch)

    def _say(self, problem: str | None) -> None:
        self.problem = problem

    async def _resume(self) -> None:
        cfg = self.config
        assert self._refs is not None
        wl, positions = await read_resume_log(cfg.bootstrap, cfg.workload_id,
                                              resolver=self._refs.resolver)
        self.stats.resumed_from = dict(positions)
        resumed = resumed_state(self.workload, wl, code=self.code)
        result, missing = resumed.result, resumed.missing
        self.core = result.core
        assert self.spec is not None
        problem = self.code.problem(self.spec, self.core.seq)
        if problem is not None and cfg.check_module:
            raise NoSpec(f"the spec at offset {self._spec_offset} {problem}")
        self._out_end = wl["out"].end
        self._requests.update(resumed.requests)
        self._written_outcomes.update(resumed.written_outcomes)
        self._accepted_by.update(resumed.accepted_by)
        if missing:
            log.warning("%d output slots computed by replay are not on .out: writing them",
                        len(missing))
            self.stats.rewritten_outputs += len(missing)
            metas = await self._write([(topics.out(cfg.workload_id), encode(o)) for o in missing])
            self._note_outputs(missing, metas)
        for rec in wl["resp"]:
            self._clock.observe(rec.time_ms)
        self.observer.resumed(wl["merge"])
        log.info("resumed %s at seq %d (snapshot seq %s, %d entries replayed, %d pending)",
                 cfg.workload_id, self.core.seq, result.snapshot_seq, result.entries,
                 len(self.core.pending))

    # -- the transactional writer --------------------------------------------------------------
    async def _write(self, items: list[tuple[str, bytes]]) -> list[Any]:
        producer = self._producer
        futures: list[Any] = []
        out_topic = topics.out(self.config.workload_id)
        try:
            async with producer.transaction():
                for topic, value in items:
                    headers = None
                    if topic == out_topic and self._holder_key is not None:
                        headers = [(HOLDER_SIG_HEADER,
                                    holder_signature(self._holder_key, value))]
                    futures.append(await producer.send(topic, value=value, partition=0,
                                                       headers=headers))
            metas = [await f for f in futures]
        except (ProducerFenced, InvalidProducerEpoch, IllegalOperation) as exc:
            # IllegalOperation: the producer left the transaction by itself, which aiokafka does
            # when the broker fenced it (from a send of an earlier transaction) or aborted it;
            # collect the sends' own errors so none is reported as "never retrieved"
            await asyncio.gather(*futures, return_exceptions=True)
            raise Fenced(f"epoch {self.epoch} of {self.config.workload_id} was fenced by the "
                         f"broker: {exc!r}") from exc
        except (KafkaError, TimeoutError):
            # the transaction did not commit (run() restarts from the log); the sends' futures
            # may still be pending on a broker that is down: retrieve their errors when they come
            for f in futures:
                f.add_done_callback(_retrieve)
            raise
        self.stats.transactions += 1
        out_topic = topics.out(self.config.workload_id)
        for meta in metas:
            self._clock.observe(meta.timestamp)
            if meta.topic == out_topic:
                self._out_end = max(self._out_end, meta.offset + 1)
        return metas

    def _note_outputs(self, outs: list[OutRecord], metas: list[Any]) -> None:
        for out, meta in zip(outs, metas, strict=True):
            if isinstance(out, EffectRequest):
                self._requests[out.effect_id] = RequestAt(meta.offset, meta.timestamp,
                                                          out.reissue_of)

    # -- the loop ------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Claim the workload, resume it, and merge until ``stop`` is set; restart from the log
        in this process after a broker outage (see the module docstring)."""
        stop = stop or asyncio.Event()
        watching = (asyncio.create_task(self.watch.run(stop)) if self._own_watch else None)
        try:
            await self._run(stop)
        finally:
            self.observer.lease(False, self.epoch)
            if watching is not None:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)

    async def _run(self, stop: asyncio.Event) -> None:
        rejoin: int | None = None
        restarts = Restarts()
        while True:
            transactions = self.stats.transactions
            try:
                await self._run_once(stop, rejoin, fenced=restarts.fenced)
                return
            except (Fenced, KafkaError, TimeoutError) as exc:
                if not restarts.survivable(exc, committed=self.stats.transactions > transactions,
                                           ran=self.ready.is_set()):
                    raise
                reason: BaseException = exc
            rejoin = self.epoch or None
            self._forget()
            self.stats.broker_restarts += 1
            delay = restarts.delay_s()
            log.warning("broker unavailable or transaction aborted (%r): restarting the holder "
                        "of %s from the log in %.1f s (restart %d, epoch %s kept if still ours)",
                        reason, self.config.workload_id, delay, self.stats.broker_restarts,
                        rejoin)
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
                return
            except TimeoutError:
                pass

    def _forget(self) -> None:
        """Drop every piece of in-memory state (a restart rebuilds it from the log)."""
        self.ready.clear()
        self.claimed_at = None
        self.observer.lease(False, self.epoch)
        self.spec = None
        self.core = None
        self._requests = {}
        self._accepted_by = {}
        self._written_outcomes = set()
        self._now_resp_ms = None
        self._inputs_waiting = False
        self._clock = BrokerClock()
        self._tick_inflight_since = None
        self._producer = None
        self._out_end = 0
        self._skipped = {"in": deque(), "resp": deque()}

    async def _run_once(self, stop: asyncio.Event, rejoin: int | None, *, fenced: bool) -> None:
        cfg = self.config
        await ensure_workload_topics(cfg.bootstrap, cfg.workload_id)
        await ensure_alarms_topic(cfg.bootstrap)
        # placement before the transactional producer starts: its InitProducerId fences the
        # holder running now, which must not happen for a claim that will not be made. A
        # holder restarting in place after an outage is not checked again.
        forced = None if rejoin is not None else await wait_for_placement(
            cfg, (await latest_spec(cfg.bootstrap, cfg.workload_id))[1])
        if rejoin is not None:
            # before a new producer fences whoever holds the transactional id now: a holder that
            # claimed after this one is the rightful one
            claims = await read_claims(cfg.bootstrap, cfg.workload_id)
            check_restart(claims, epoch=rejoin, holder_id=cfg.holder_id, fenced=fenced)
        self._producer = make_producer(cfg.bootstrap,
                                       transactional_id=transactional_id_for(cfg.workload_id))
        await self._producer.start()
        self._refs = HolderRefs(cfg, self.stats)
        consumer = None
        jobs: list[asyncio.Task[None]] = []  # the holder's other jobs, for this run
        try:
            self.code = Code(self.workload, await read_modules(cfg.bootstrap))
            await self._claim(rejoin, forced)
            await self._resume()
            assert self.core is not None
            await self._refs.orders.read()
            self._refs.orders.forget_merged(self.core.positions["in"])
            consumer = make_consumer(cfg.bootstrap)
            tp_in, tp_resp = await _start_reading(consumer, cfg.workload_id, self.core,
                                                  self._spec_offset)
            self.ready.set()
            if cfg.trim_every_s is not None:
                jobs.append(asyncio.create_task(PeriodicTrim(
                    cfg.bootstrap, cfg.workload_id, cfg.trim_every_s, self.stats).run(stop)))
            if self.metrics is not None:
                jobs.append(asyncio.create_task(self.observer.run(consumer, tp_resp, stop)))
            if cfg.check_signatures:
                jobs.extend(self.signatures.start(stop))
            await self._loop(consumer, tp_in, tp_resp, stop)
        finally:
            for task in jobs:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            if consumer is not None:
                await consumer.stop()
            with contextlib.suppress(KafkaError, TimeoutError):
                await asyncio.wait_for(self._refs.resolver.close(), timeout=10.0)
            try:
                # bounded: stop() flushes, which waits for a broker that may be down; what it
                # leaves unsent is of an aborted transaction (the next InitProducerId fences it)
                await asyncio.wait_for(self._producer.stop(), timeout=10.0)
            except (KafkaError, TimeoutError) as exc:  # a fenced producer may not close cleanly
                log.debug("producer stop: %r", exc)

    def pending_requests(self) -> list[PendingRequest]:
        """The pending effects whose request offset on ``.out`` is known (for the metrics)."""
        assert self.core is not None
        return [PendingRequest(p.effect_kind, self._requests[eid].offset)
                for eid, p in self.core.pending.items() if eid in self._requests]

    async def _loop(self, consumer: Any, tp_in: TopicPartition, tp_resp: TopicPartition,
                    stop: asyncio.Event) -> None:
        core, spec, cfg = self.core, self.spec, self.config
        assert core is not None and spec is not None and self._refs is not None
        refs = self._refs
        bufs: dict[str, deque[Item]] = {"in": deque(), "resp": deque()}
        topic_source = {tp_in: "in", tp_resp: "resp"}
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=self._poll_timeout_ms())
            responses: list[ReadResponse] = []
            for tp, msgs in batch.items():
                if tp not in topic_source:  # .spec: a binding change to adopt, or refuse
                    for msg in msgs:
                        await self._spec_written(msg.offset, msg.value)
                    continue
                source = topic_source[tp]
                for msg in msgs:
                    item = self._decode(source, msg)
                    if item is not None and isinstance(item.record, ResponseRecord):
                        responses.append((msg.offset, item.record, broker_time_us(msg)))
                    if item is not None:
                        item = await refs.resolved(
                            item, msg.topic, core, self.spec, stop,
                            lambda: self._merge_available(bufs))
                        if item is None:  # stopped while waiting for a reference
                            log.info("holder of %s stopping at seq %d (waiting for a "
                                     "reference)", cfg.workload_id, core.seq)
                            return
                        bufs[source].append(item)
                    elif bufs[source]:
                        self._skipped[source].append(msg.offset)
                    else:
                        core.positions[source] = max(core.positions[source], msg.offset + 1)
            if responses and cfg.check_signatures:
                self.signatures.queue(responses)
            await self._ticks.flush(self._write)
            await self._merge_available(bufs)
            self._inputs_waiting = bool(bufs["in"])
            await self._judge_and_tick()
        log.info("holder of %s stopping at seq %d", cfg.workload_id, core.seq)

    async def _spec_written(self, offset: int, value: bytes) -> None:
        """A spec appended to ``.spec`` while this holder runs (``fx upgrade``/``fx rollback``):
        adopt it from the next step by writing a claim of this epoch that names it
        (``from_seq``; the rule is :mod:`broker_schema.binding`), or refuse it, logged and
        counted, when it would rebind a step already taken (:func:`switch_problem`)."""
        core, cfg = self.core, self.config
        assert core is not None and self.spec is not None and self._refs is not None
        order = self._refs.orders.note(offset, value)  # fx workload skip
        if order is not None:
            self._refs.orders.took(order, core.positions["in"])
            return
        found = await spec_adoption(offset, value, code=self.code, bootstrap=cfg.bootstrap,
                                    spec=self.spec, seq=core.seq, epoch=self.epoch,
                                    holder_id=cfg.holder_id, holder_key=self._holder_key_text,
                                    workload_id=cfg.workload_id)
        if isinstance(found, str):
            self.stats.specs_refused += 1
            log.error("spec at %s@%d not adopted: %s", topics.spec(cfg.workload_id), offset,
                      found)
        if not isinstance(found, tuple):
            return
        record, adoption = found
        await self._write([(topics.claims(cfg.workload_id), encode(adoption))])
        self.spec, self._spec_offset = record, offset
        self.stats.specs_adopted += 1
        log.info("adopted the spec at .spec@%d from step %d (models at it: %s; module %s)",
                 offset, core.seq, record.models_at(core.seq), record.module_at(core.seq)[0])

    def _decode(self, source: str, msg: Any) -> Item | None:
        return decode_item(source, msg, workload_id=self.config.workload_id,
                           metrics=self.metrics, clock=self._clock, ticks=self._ticks,
                           accepted_by=self._accepted_by)

    async def _merge_available(self, bufs: dict[str, deque[Item]]) -> None:
        """Merge what is buffered, one transaction per :func:`~workload_sdk._round.merge_batch`
        (the decisions are there; this writes them and keeps the books)."""
        core, spec, cfg = self.core, self.spec, self.config
        assert core is not None and spec is not None
        wid = cfg.workload_id
        assert self._refs is not None
        self._refs.orders.mark_buffered(bufs["in"])  # an order read after the input was
        while True:
            batch = merge_batch(core, spec, bufs, epoch=self.epoch,
                                now_resp_ms=self._now_resp_ms, max_batch=cfg.max_batch,
                                skipped=self._skipped,
                                snapshot_out_position=self._snapshot_out_position)
            self._now_resp_ms = batch.now_resp_ms
            if batch.tick_merged:
                self._tick_inflight_since = None
            round_trips: list[tuple[str, float]] = []
            now_ms = time.time() * 1000
            for answer in batch.answers:
                if answer.effect_id in self._requests:
                    ms = now_ms - self._requests[answer.effect_id].time_ms
                    self.stats.roundtrips_ms.append(ms)
                    round_trips.append((answer.effect_kind, ms / 1000))
            self.stats.steps += batch.steps
            self.stats.passed_over += batch.passed_over
            assert self._refs is not None
            await self._refs.store_chunks(batch)
            self.stats.snapshots += batch.snapshots
            self.stats.snapshots_skipped += len(batch.snapshots_skipped)
            for why in batch.snapshots_skipped:
                log.warning("%s", why)
            if batch.records:
                topic = {"merge": topics.merge(wid), "out": topics.out(wid)}
                # an input skipped on the record and its alarm: one transaction
                alarms = skip_alarms(batch.skipped, holder_id=cfg.holder_id,
                                     now_us=time.time_ns() // 1000)
                metas = await self._write([(topic[stream], encode(rec))
                                           for stream, rec in batch.records]
                                          + [(topics.ALARMS, encode(a)) for a in alarms])
                self._skips_written(alarms)
                self.stats.outputs += len(batch.output_at)
                self._note_outputs(batch.outputs, [metas[i] for i in batch.output_at])
            # after the commit: what the merge log now says
            self.observer.merged(batch, metas if batch.records else [], round_trips)
            if batch.failure is not None:
                raise batch.failure
            if not batch.records:
                return

    def _skips_written(self, alarms: list[SkipAlarmRecord]) -> None:
        self.stats.inputs_skipped += len(alarms)
        self.stats.alarms += len(alarms)
        for alarm in alarms:
            log.error("ALARM %s: input %d skipped on the record (%s%s): %s", alarm.alarm_id,
                      alarm.input_offset, alarm.skip.cause,
                      f" by {alarm.skip.principal}" if alarm.skip.principal else "",
                      alarm.skip.detail)

    async def _judge_and_tick(self) -> None:
        core, cfg = self.core, self.config
        assert core is not None
        times = {eid: r.time_ms for eid, r in self._requests.items()}
        records = outcomes_due(core, times, {eid: r.offset for eid, r in self._requests.items()},
                               already_written=self._written_outcomes,
                               now_resp_ms=self._now_resp_ms, holder_id=cfg.holder_id,
                               workload_id=cfg.workload_id)
        if records:
            assert self.spec is not None
            alarms = alarms_for(records, core, self.spec, accepted_by=self._accepted_by,
                                reissues={eid: r.reissue_of for eid, r in self._requests.items()
                                          if r.reissue_of is not None},
                                holder_id=cfg.holder_id, now_us=time.time_ns() // 1000)
            self._written_outcomes.update(r.effect_id for r in records)
            # one transaction: an at-most-once unknown and its alarm exist together or not at all
            await self._write([(topics.resp(cfg.workload_id), encode(r)) for r in records]
                              + [(topics.ALARMS, encode(a)) for a in alarms])
            self.stats.outcomes_written += len(records)
            self.stats.alarms += len(alarms)
            log.info("wrote %s", ", ".join(f"{r.outcome} for {r.effect_id}" for r in records))
            for alarm in alarms:
                log.error("ALARM %s (%s): %s", alarm.alarm_id, alarm.effect_kind, alarm.reason)
        in_flight = (self._tick_inflight_since is not None
                     and time.monotonic() - self._tick_inflight_since < cfg.tick_ms / 1000)
        if not tick_due(core, times, already_written=self._written_outcomes,
                        inputs_waiting=self._inputs_waiting, now_resp_ms=self._now_resp_ms,
                        broker_now_ms=self._clock.now_ms(), tick_in_flight=in_flight):
            return
        tick = TickRecord(workload_id=cfg.workload_id, epoch=self.epoch, holder_id=cfg.holder_id)
        await self._write([(topics.resp(cfg.workload_id), encode(tick))])
        self.stats.ticks += 1
        self._tick_inflight_since = time.monotonic()

    def _snapshot_out_position(self, issued_in_txn: Set[str]) -> int | None:
        """The lowest ``.out`` offset a resume from a snapshot taken now needs: the request of
        every pending effect, and every output from the snapshot's step on. None (read all of
        ``.out``) if a pending request's offset is not known."""
        assert self.core is not None
        lowest = self._out_end  # outputs of this transaction land at or after it
        for eid in self.core.pending:
            req = self._requests.get(eid)
            if req is not None:
                lowest = min(lowest, req.offset)
            elif eid not in issued_in_txn:
                return None
        return lowest

    def _next_due_ms(self) -> int | None:
        assert self.core is not None
        return next_due_ms(self.core.pending, {e: r.time_ms for e, r in self._requests.items()},
                           already_written=self._written_outcomes, pacing=self.core.pacing,
                           inputs_waiting=self._inputs_waiting, now_resp_ms=self._now_resp_ms)

    def _poll_timeout_ms(self) -> int:
        nxt = self._next_due_ms()
        if nxt is None:
            return self.config.poll_ms
        wait = nxt - self._clock.now_ms() + 1
        return int(max(1, min(self.config.poll_ms, wait)))
