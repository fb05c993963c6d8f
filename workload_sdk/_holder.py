"""The lease holder: a thin aiokafka shell around :class:`~workload_sdk._core.Core`.

Start-up (each step is a fact on the log, so a successor can check it):

1. Start a transactional producer whose id is derived from the workload id. ``InitProducerId``
   bumps the producer epoch, so the broker fences any older holder of the same workload: its
   next transaction fails.
2. Read ``.claims`` and write a claim with the highest epoch seen plus one, naming the latest
   spec on ``.spec`` (its offset and hash). The running module must hash to the spec's
   ``module_hash``.
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
record that is not there yet is waited for with backoff, up to ``HolderConfig.ref_wait_s``; then
the holder stops with :class:`~fx_kafka.workload_log.RefGap` naming it (never a guess, never a
skip: nothing is merged past it, and a restart once it is there carries on). Snapshots over the
inline limit are stored as a chunk before the transaction that holds them commits.

Optionally (``HolderConfig.trim_every_s``) the holder also trims the workload's log by the spec's
audit horizon every so often, with the same :func:`~workload_sdk._trim_io.trim_workload` that
``fx trim`` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Set
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from aiokafka import TopicPartition
from aiokafka.errors import (
    IllegalOperation,
    InvalidProducerEpoch,
    KafkaError,
    ProducerFenced,
    TopicAuthorizationFailedError,
)

from broker_schema import (
    AcceptedRecord,
    ClaimRecord,
    DecodeError,
    EffectRequest,
    FactsRecord,
    InputRecord,
    RejectedRecord,
    ResponseRecord,
    SnapshotRecord,
    SpecRecord,
    TickRecord,
    decode,
    encode,
    record_hash,
    sha256_hex,
    topics,
)
from broker_schema.binding import MAX_EPOCH, claim_problem, next_epoch, switch_problem
from broker_schema.signatures import HOLDER_SIG_HEADER, SigningKey, holder_signature
from broker_schema.streams import OutRecord
from fx_kafka.client import make_admin, make_consumer, make_producer
from fx_kafka.retry import backoff_s, broker_unavailable
from fx_kafka.workload import (
    check_workload_topics,
    ensure_alarms_topic,
    ensure_rejects_topic,
    ensure_workload_topics,
)
from fx_kafka.workload_log import RefGap, read_facts, read_facts_since, read_topic
from workload_sdk._api import Workload, module_hash
from workload_sdk._core import (
    Core,
    Item,
    describe_ref,
    next_due_ms,
    referenced_body,
    tick_problem,
)
from workload_sdk._kafka_io import read_resume_log
from workload_sdk._observe import (
    DEFAULT_GROUP_PREFIXES,
    PendingRequest,
    SignatureFailure,
    SignatureTally,
    check_signatures,
    executor_groups,
    latest_keys,
    merge_lag,
    outstanding_by_kind,
    unread_requests,
)
from workload_sdk._placement import placement_missing
from workload_sdk._refs_io import RefResolver
from workload_sdk._replay import out_slots, replay, resume_outputs
from workload_sdk._round import alarms_for, merge_batch, outcomes_due, tick_due
from workload_sdk._trim_io import trim_workload

if TYPE_CHECKING:  # the metrics are the process's (cli), never needed to run the fold
    from broker_schema.key_history import KeyHistory
    from workload_sdk._holder_metrics import HolderMetrics

log = logging.getLogger(__name__)

__all__ = ["Fenced", "HolderConfig", "LeaseHolder", "NoSpec", "Replaced", "Unplaced",
           "check_restart", "rejoin_epoch", "transactional_id_for"]


class Fenced(Exception):
    """The broker refused this holder's transaction: a newer holder claimed the workload."""


class Replaced(Fenced):
    """A restarting holder found a higher claim than its own on ``.claims``: it stays down."""


class NoSpec(Exception):
    """``wl.<id>.spec`` holds no spec, or the module does not match it."""


class Unplaced(NoSpec):
    """No live node on ``sys.facts`` serves everything the spec binds (and ``--force`` was not
    given): :attr:`missing` says what (:func:`workload_sdk._placement.placement_missing`)."""

    def __init__(self, message: str, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing


def transactional_id_for(workload_id: str) -> str:
    """The transactional id of the lease holder of ``workload_id`` (one per workload)."""
    return f"fx-holder.{topics.check_workload_id(workload_id)}"


@dataclass(frozen=True)
class HolderConfig:
    """How to run a lease holder.

    ``check_module``: refuse a module whose hash differs from the spec's ``module_hash``.
    ``max_batch``: most records per transaction. ``poll_ms``: longest wait for new records.
    ``tick_ms``: shortest gap between two ticks. ``trim_every_s``: trim the log by the spec's
    audit horizon this often (``fx trim``; None, the default: never). ``chunk_dir``: the chunk
    store is this directory (a filesystem store shared with the executors, the layout of
    :mod:`broker_schema.chunks`) instead of ``sys.chunks``. ``ref_wait_s``: how long a chunk or
    stream record an input or answer names is waited for before the holder stops.


    Placement (docs/actuation.md): before claiming a new epoch the holder checks that live nodes
    on ``sys.facts`` (facts at most ``facts_max_age_s`` old) serve every kind and model the spec
    binds; it waits up to ``placement_wait_s`` (None: for ever) for them, then raises
    :class:`Unplaced`. ``force_placement`` claims anyway and records what was missing in the
    claim (``ClaimRecord.forced``).

    Metrics (when the holder is given a :class:`~workload_sdk._holder_metrics.HolderMetrics`):
    every ``observe_every_s`` the shell asks the broker for the merge lag on ``.resp`` and the
    committed offsets on ``.out`` of the consumer groups ``<prefix>.<kind>`` for each prefix of
    ``executor_group_prefixes`` and each kind the spec binds (the executors' and actuator
    gateways' ``group_prefix``), for ``fx_workload_unread_requests``.

    Signatures (``check_signatures``; off by default here, on in ``fx workload run`` unless
    ``--no-signature-check``): the shell checks the signature of every response it reads from
    ``.resp`` once resumed, as an observation only (nothing merged, replayed or simulated
    depends on it), with the rule of ``fx why``/``fx audit``
    (:func:`workload_sdk._observe.check_signatures`): against the keys on ``sys.facts``, read
    again every ``observe_every_s``, or, given ``fleet_keys`` (the fleet public keys, as
    ``--fleet-key``), against the key history they certify on ``sys.keys``. A response that
    does not verify is checked once more after the keys are read again; failures are counted
    (``fx_holder_signature_failures_total``) and logged at WARNING.
    """

    bootstrap: str
    workload_id: str
    holder_id: str
    check_module: bool = True
    max_batch: int = 500
    poll_ms: int = 100
    tick_ms: int = 20
    trim_every_s: float | None = None
    chunk_dir: str | None = None
    ref_wait_s: float = 30.0
    force_placement: bool = False
    placement_wait_s: float | None = 30.0
    facts_max_age_s: float = 300.0
    executor_group_prefixes: tuple[str, ...] = DEFAULT_GROUP_PREFIXES
    observe_every_s: float = 3.0
    check_signatures: bool = False
    fleet_keys: tuple[bytes, ...] = ()
    #: Sign every record written on ``.out`` (header ``fx-holder-sig``) with a key made for
    #: this holder, named in its claims (``holder_key``): executors answer only requests its
    #: epoch's holder signed (issue 30). Off: claims name no key, executors check nothing.
    sign_requests: bool = True


@dataclass
class HolderStats:
    """Counters of a running holder (and effect round trips, for benchmarks)."""

    steps: int = 0
    passed_over: int = 0
    outputs: int = 0
    transactions: int = 0
    ticks: int = 0
    outcomes_written: int = 0
    #: alarms written with at-most-once ``unknown`` outcomes (``sys.alarms``)
    alarms: int = 0
    rewritten_outputs: int = 0
    #: Snapshots written (``chunk_snapshots`` of them over the inline limit, their state a
    #: chunk), and snapshots that could not be made.
    snapshots: int = 0
    chunk_snapshots: int = 0
    snapshots_skipped: int = 0
    #: Referenced bodies (chunks, stream records) read before the step saw them.
    refs_resolved: int = 0
    #: Where this holder started reading ``.in``/``.resp``/``.out`` on resume.
    resumed_from: dict[str, int] = field(default_factory=dict)
    #: In-process restarts from the log after a broker outage or a coordinator fence.
    broker_restarts: int = 0
    #: Specs appended while running: adopted from a later step, or refused (they would have
    #: rebound a step already taken).
    specs_adopted: int = 0
    specs_refused: int = 0
    #: Periodic trims run (``HolderConfig.trim_every_s``), and those that failed.
    trims: int = 0
    trims_failed: int = 0
    #: Response signatures checked (``HolderConfig.check_signatures``), and those that failed.
    signatures_checked: int = 0
    signature_failures: int = 0
    #: Responses left unchecked because the checks fell too far behind (logged).
    signatures_unchecked: int = 0
    #: ticks on ``.resp`` not written by their epoch's holder (rejected to ``sys.rejects``)
    foreign_ticks: int = 0
    #: Request append time (broker) to the step seeing its answer (local wall clock), in ms.
    roundtrips_ms: list[float] = field(default_factory=list)


def check_restart(claims: list[ClaimRecord], *, epoch: int, holder_id: str,
                  fenced: bool) -> None:
    """May a holder that held ``epoch`` restart itself? Raises :class:`Replaced` when a higher
    claim exists; after a fence (``fenced``) also unless the highest claim is its own: then the
    fence came from the transaction coordinator (a transaction aborted on timeout), not from a
    successor. A committed claim is unique per epoch (claims are written transactionally)."""
    highest = _highest(claims)
    if highest is not None and highest.epoch > epoch:
        raise Replaced(f"epoch {highest.epoch} was claimed by {highest.holder_id} after this "
                       f"holder's epoch {epoch}")
    if fenced and (highest is None or (highest.epoch, highest.holder_id) != (epoch, holder_id)):
        raise Replaced(f"fenced at epoch {epoch}, and the latest claim is not this holder's")


def rejoin_epoch(claims: list[ClaimRecord], *, epoch: int, holder_id: str,
                 spec_offset: int) -> int | None:
    """The epoch a restarting holder keeps: ``epoch`` when the highest claim on ``.claims`` is
    its own (same epoch, same holder) and names the latest spec (``spec_offset``); None when it
    must claim anew (its claim never committed, or the spec changed). Raises :class:`Replaced`
    when a higher claim exists."""
    check_restart(claims, epoch=epoch, holder_id=holder_id, fenced=False)
    highest = _highest(claims)
    if (highest is not None and (highest.epoch, highest.holder_id) == (epoch, holder_id)
            and highest.spec_offset == spec_offset):
        return epoch
    return None


def _highest(claims: list[ClaimRecord]) -> ClaimRecord | None:
    """The latest claim of the highest epoch (its holder's latest spec adoption, if any)."""
    top = max((c.epoch for c in claims), default=None)
    return None if top is None else [c for c in claims if c.epoch == top][-1]


def _claims_of(view: Any) -> list[ClaimRecord]:
    """The claims on ``.claims`` every reader goes by (:func:`broker_schema.binding.
    accepted_claims`): one too far above the highest before it is logged and left out."""
    claims: list[ClaimRecord] = []
    highest = 0
    for rec in view:
        try:
            record = decode(rec.value)
        except DecodeError:
            continue
        if isinstance(record, ClaimRecord):
            problem = claim_problem(record, highest)
            if problem is not None:
                log.warning("refused claim at %s@%d: %s", view.topic, rec.offset, problem)
                continue
            claims.append(record)
            highest = max(highest, record.epoch)
    return claims


def _retrieve(fut: Any) -> None:
    if not fut.cancelled():
        fut.exception()


#: Fences in a row (no transaction committed between them) after which a holder stops.
MAX_FENCES_IN_A_ROW = 3
#: How long a fenced holder waits before it reads ``.claims`` to learn whether a successor fenced
#: it (a successor claims within moments of its InitProducerId).
FENCE_SETTLE_S = 2.0


@dataclass
class _Req:
    offset: int
    time_ms: int
    reissue_of: str | None = None


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
                 metrics: HolderMetrics | None = None) -> None:
        self.workload = workload
        self.config = config
        #: updated by this shell from what the pure code returns (None: no metrics)
        self.metrics = metrics
        self.epoch = 0
        self.spec: SpecRecord | None = None
        self.core: Core | None = None
        self.stats = HolderStats()
        self.ready = asyncio.Event()
        self._requests: dict[str, _Req] = {}
        #: effect id -> the node of its latest ``accepted`` read (for alarms: people only)
        self._accepted_by: dict[str, str] = {}
        self._written_outcomes: set[str] = set()
        self._now_resp_ms: int | None = None
        self._clock: tuple[int, float] | None = None  # (broker ms, local monotonic s)
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
        self._refs: RefResolver | None = None
        # signature checks (an observation of the shell: kept across restarts from the log)
        self._holder_ids: set[str] = {config.holder_id}
        self._sig_facts: list[FactsRecord] = []
        self._sig_facts_next: int | None = None
        self._sig_history: KeyHistory | None = None
        self._sig_keys_read = False
        self._sig_queue: deque[tuple[int, ResponseRecord]] = deque()
        self._sig_queued = asyncio.Event()
        self._sig_pending: list[tuple[int, ResponseRecord]] = []
        self._sig_wake = asyncio.Event()
        self._sig_said: dict[tuple[str, str], tuple[float, int]] = {}
        #: why this holder cannot go on now (e.g. no epoch left to claim), for ``/readyz``
        self.problem: str | None = None
        #: the key this holder signs its records on .out with (None: ``sign_requests`` off),
        #: made for this holder and named in its claims
        self._holder_key = SigningKey.generate() if config.sign_requests else None
        self._holder_key_text = (None if self._holder_key is None
                                 else self._holder_key.public_key_b64)
        #: epoch -> its holder id, from ``.claims`` (whose ticks are the holder's own)
        self._epoch_holders: dict[int, str] = {}
        #: rejects to write to ``sys.rejects`` (ticks not written by their epoch's holder)
        self._rejects: list[RejectedRecord] = []
        self._rejects_topic = False

    def status(self) -> dict[str, Any]:
        """For ``/readyz``: ``ready`` (the lease claimed, the log resumed and merging), the
        role (``leader`` or ``starting``: claiming, resuming, or restarting from the log after
        a broker outage), the epoch and the next merge seq."""
        ready = self.ready.is_set()
        body = {"ready": ready, "role": "leader" if ready else "starting",
                "workload": self.config.workload_id, "holder_id": self.config.holder_id,
                "epoch": self.epoch, "seq": None if self.core is None else self.core.seq}
        if self.problem is not None:
            body["problem"] = self.problem
        return body

    # -- start-up ------------------------------------------------------------------------------
    async def _latest_spec(self) -> tuple[int, SpecRecord]:
        """The latest spec on ``.spec`` and its offset; :class:`NoSpec` when there is none."""
        cfg = self.config
        spec_view = await read_topic(cfg.bootstrap, topics.spec(cfg.workload_id))
        spec: tuple[int, SpecRecord] | None = None
        for rec in spec_view:
            try:
                record = decode(rec.value)
            except DecodeError:
                continue
            if isinstance(record, SpecRecord) and record.workload_id == cfg.workload_id:
                spec = (rec.offset, record)
        if spec is None:
            raise NoSpec(f"no spec on {spec_view.topic}")
        return spec

    async def _claim(self, rejoin: int | None = None, forced: list[str] | None = None) -> None:
        """Claim the next epoch (or keep ``rejoin``); ``forced``: what placement found missing
        when claiming with ``force_placement`` (recorded in the claim)."""
        cfg = self.config
        spec_offset, self.spec = await self._latest_spec()
        self._spec_offset = spec_offset
        if cfg.check_module and module_hash(self.workload) != self.spec.module_hash:
            raise NoSpec(f"module hash {module_hash(self.workload)} differs from the spec's "
                         f"{self.spec.module_hash} (spec at offset {spec_offset})")
        # the broker must not delete what the spec's audit horizon keeps
        await check_workload_topics(cfg.bootstrap, cfg.workload_id,
                                    audit_horizon_ms=self.spec.audit_horizon_ms)
        claims = _claims_of(await read_topic(cfg.bootstrap, topics.claims(cfg.workload_id)))
        self._holder_ids.update(c.holder_id for c in claims)  # whose timeouts are unsigned
        self._epoch_holders = {c.epoch: c.holder_id for c in claims if c.from_seq is None}
        if rejoin is not None:
            try:
                kept = rejoin_epoch(claims, epoch=rejoin, holder_id=cfg.holder_id,
                                    spec_offset=spec_offset)
            except Replaced as exc:
                # A successor's claim committed between the check in _run_once and this
                # holder's InitProducerId, which has fenced that successor for good: yielding
                # now would leave no holder at all. Claim anew, as any successor would.
                log.warning("%s; its producer is fenced by this one: claiming a new epoch", exc)
                kept = None
            top = _highest(claims)
            if kept is not None and top is not None and top.holder_key != self._holder_key_text:
                kept = None  # that claim names another key: this holder cannot sign for it
            if kept is not None:
                self.epoch = kept
                log.info("rejoined %s at epoch %d (spec offset %d)", cfg.workload_id,
                         self.epoch, spec_offset)
                self._lease_held(True)
                return
        epoch = next_epoch(claims)
        while epoch is None:
            # every epoch is taken (the highest accepted claim is MAX_EPOCH): no claim of this
            # holder can win; say so (/readyz, the log) and look again, never crash
            self.problem = (f"cannot win an epoch of {cfg.workload_id}: the highest claim on "
                            f"{topics.claims(cfg.workload_id)} is epoch {MAX_EPOCH}, the "
                            "highest there is")
            log.error("%s (looking again in 5 s)", self.problem)
            await asyncio.sleep(5.0)
            claims = _claims_of(await read_topic(cfg.bootstrap, topics.claims(cfg.workload_id)))
            epoch = next_epoch(claims)
        self.problem = None
        self.epoch = epoch
        self._epoch_holders[epoch] = cfg.holder_id
        claim = ClaimRecord(workload_id=cfg.workload_id, epoch=self.epoch, holder_id=cfg.holder_id,
                            spec_hash=record_hash(self.spec), spec_offset=spec_offset,
                            forced=tuple(forced or ()), holder_key=self._holder_key_text)
        await self._write([(topics.claims(cfg.workload_id), encode(claim))])
        log.info("claimed %s at epoch %d (spec offset %d)", cfg.workload_id, self.epoch,
                 spec_offset)
        self._lease_held(True)

    async def _placement(self, spec: SpecRecord) -> list[str]:
        """Wait until live nodes serve what ``spec`` binds (:func:`placement_missing`); return
        what is missing when claiming with ``force_placement`` (recorded in the claim), else
        raise :class:`Unplaced` once ``placement_wait_s`` has passed."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        give_up = None if cfg.placement_wait_s is None else loop.time() + cfg.placement_wait_s
        said: list[str] | None = None
        while True:
            facts = await read_facts(cfg.bootstrap)
            missing = placement_missing(spec, facts, now_us=time.time_ns() // 1000,
                                        max_age_s=cfg.facts_max_age_s)
            if not missing:
                if said:
                    log.info("%s: placed (now served: %s)", cfg.workload_id, ", ".join(said))
                return []
            what = ", ".join(missing)
            if cfg.force_placement:
                log.warning("%s: claiming with --force although no live node serves %s "
                            "(recorded in the claim)", cfg.workload_id, what)
                return missing
            if give_up is not None and loop.time() >= give_up:
                raise Unplaced(f"not claiming {cfg.workload_id}: no live node on sys.facts "
                               f"serves {what} (waited {cfg.placement_wait_s:.0f} s; --force "
                               "claims anyway and records it in the claim)", missing)
            if missing != said:
                log.warning("%s: not claiming yet: no live node on sys.facts serves %s",
                            cfg.workload_id, what)
                said = missing
            await asyncio.sleep(1.0)

    async def _resume(self) -> None:
        cfg = self.config
        wl, positions = await read_resume_log(cfg.bootstrap, cfg.workload_id,
                                              resolver=self._refs)
        self.stats.resumed_from = dict(positions)
        result = replay(self.workload, wl)
        self.core = result.core
        self._out_end = wl["out"].end
        recorded = out_slots(wl, result.outputs)
        for offset, value in recorded.values():
            record = decode(value)
            if isinstance(record, EffectRequest):
                self._requests[record.effect_id] = _Req(
                    offset, wl["out"].records[offset].time_ms, record.reissue_of)
        for rec in wl["resp"]:
            # a timeout/unknown an earlier holder wrote that the fold has not merged yet: do not
            # write a second one
            try:
                answer = decode(rec.value)
            except DecodeError:
                continue
            if (isinstance(answer, ResponseRecord) and answer.outcome in ("timeout", "unknown")
                    and answer.effect_id in self.core.pending):
                self._written_outcomes.add(answer.effect_id)
            elif isinstance(answer, AcceptedRecord):
                self._accepted_by[answer.effect_id] = answer.node_id
        missing = resume_outputs(result, wl)
        if missing:
            log.warning("%d output slots computed by replay are not on .out: writing them",
                        len(missing))
            self.stats.rewritten_outputs += len(missing)
            metas = await self._write([(topics.out(cfg.workload_id), encode(o)) for o in missing])
            self._note_outputs(missing, metas)
        for rec in wl["resp"]:
            self._observe_clock(rec.time_ms)
        if self.metrics is not None:
            for rec in reversed(list(wl["merge"])):  # the newest snapshot resumed from
                with contextlib.suppress(DecodeError):
                    if isinstance(decode(rec.value), SnapshotRecord):
                        self.metrics.snapshot(cfg.workload_id, rec.time_ms / 1000)
                        break
            self._observe_outstanding()
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
            self._observe_clock(meta.timestamp)
            if meta.topic == out_topic:
                self._out_end = max(self._out_end, meta.offset + 1)
        return metas

    def _observe_clock(self, broker_ms: int) -> None:
        if broker_ms >= 0 and (self._clock is None or broker_ms >= self._clock[0]):
            self._clock = (broker_ms, time.monotonic())

    def _broker_now_estimate(self) -> float:
        if self._clock is None:
            return time.time() * 1000
        return self._clock[0] + (time.monotonic() - self._clock[1]) * 1000

    def _note_outputs(self, outs: list[OutRecord], metas: list[Any]) -> None:
        for out, meta in zip(outs, metas, strict=True):
            if isinstance(out, EffectRequest):
                self._requests[out.effect_id] = _Req(meta.offset, meta.timestamp, out.reissue_of)

    # -- the loop ------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Claim the workload, resume it, and merge until ``stop`` is set; restart from the log
        in this process after a broker outage (see the module docstring)."""
        try:
            await self._run(stop or asyncio.Event())
        finally:
            self._lease_held(False)

    async def _run(self, stop: asyncio.Event) -> None:
        rejoin: int | None = None
        attempt = fences = 0
        fenced = False
        while True:
            transactions = self.stats.transactions
            try:
                await self._run_once(stop, rejoin, fenced=fenced)
                return
            except Replaced:
                raise
            except Fenced as exc:
                fences = 1 if self.stats.transactions > transactions else fences + 1
                if fences >= MAX_FENCES_IN_A_ROW:
                    raise
                reason: BaseException = exc
                fenced = True
            except (KafkaError, TimeoutError) as exc:
                if isinstance(exc, KafkaError) and not broker_unavailable(exc):
                    raise
                reason = exc
                fenced = False
            if self.stats.transactions > transactions or self.ready.is_set():
                attempt = 0  # it ran: the outage is new
            attempt += 1
            rejoin = self.epoch or None
            self._forget()
            self.stats.broker_restarts += 1
            delay = backoff_s(attempt, cap_s=5.0)
            if fenced:  # a successor writes its claim right after fencing: let it land first
                delay = max(delay, FENCE_SETTLE_S)
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
        self._lease_held(False)
        self.spec = None
        self.core = None
        self._requests = {}
        self._accepted_by = {}
        self._written_outcomes = set()
        self._now_resp_ms = None
        self._inputs_waiting = False
        self._clock = None
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
        forced = None if rejoin is not None else await self._placement(
            (await self._latest_spec())[1])
        if rejoin is not None:
            # before a new producer fences whoever holds the transactional id now: a holder that
            # claimed after this one is the rightful one
            claims = _claims_of(await read_topic(cfg.bootstrap, topics.claims(cfg.workload_id)))
            check_restart(claims, epoch=rejoin, holder_id=cfg.holder_id, fenced=fenced)
        self._producer = make_producer(cfg.bootstrap,
                                       transactional_id=transactional_id_for(cfg.workload_id))
        await self._producer.start()
        self._refs = RefResolver(cfg.bootstrap, chunk_dir=cfg.chunk_dir)
        consumer = None
        trimmer: asyncio.Task[None] | None = None
        observer: asyncio.Task[None] | None = None
        keys: asyncio.Task[None] | None = None
        checker: asyncio.Task[None] | None = None
        try:
            await self._claim(rejoin, forced)
            await self._resume()
            assert self.core is not None and self.spec is not None
            consumer = make_consumer(cfg.bootstrap)
            await consumer.start()
            tp_in = TopicPartition(topics.inputs(cfg.workload_id), 0)
            tp_resp = TopicPartition(topics.resp(cfg.workload_id), 0)
            tp_spec = TopicPartition(topics.spec(cfg.workload_id), 0)
            consumer.assign([tp_in, tp_resp, tp_spec])
            consumer.seek(tp_in, self.core.positions["in"])
            consumer.seek(tp_resp, self.core.positions["resp"])
            consumer.seek(tp_spec, self._spec_offset + 1)  # specs written from now on
            self.ready.set()
            if cfg.trim_every_s is not None:
                trimmer = asyncio.create_task(self._trim_loop(cfg.trim_every_s, stop))
            if self.metrics is not None:
                observer = asyncio.create_task(self._observe_loop(consumer, tp_resp, stop))
            if cfg.check_signatures:
                if self.metrics is not None:
                    self.metrics.signatures_on(cfg.workload_id)
                keys = asyncio.create_task(self._keys_loop(stop))
                checker = asyncio.create_task(self._signature_loop(stop))
            await self._loop(consumer, tp_in, tp_resp, stop)
        finally:
            for task in (trimmer, observer, keys, checker):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            if consumer is not None:
                await consumer.stop()
            with contextlib.suppress(KafkaError, TimeoutError):
                await asyncio.wait_for(self._refs.close(), timeout=10.0)
            try:
                # bounded: stop() flushes, which waits for a broker that may be down; what it
                # leaves unsent is of an aborted transaction (the next InitProducerId fences it)
                await asyncio.wait_for(self._producer.stop(), timeout=10.0)
            except (KafkaError, TimeoutError) as exc:  # a fenced producer may not close cleanly
                log.debug("producer stop: %r", exc)

    async def _trim_loop(self, every_s: float, stop: asyncio.Event) -> None:
        """Every ``every_s`` seconds until ``stop``: trim the log (a failure is logged and
        retried next time; it never stops the holder)."""
        cfg = self.config
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=every_s)
                return
            except TimeoutError:
                pass
            try:
                plan = await trim_workload(cfg.bootstrap, cfg.workload_id)
            except (KafkaError, OSError, TimeoutError) as exc:
                self.stats.trims_failed += 1
                log.warning("trim of %s failed (retried in %.0f s): %r", cfg.workload_id,
                            every_s, exc)
                continue
            self.stats.trims += 1
            if not plan.changes:
                log.debug("trim of %s: nothing to delete (%s)", cfg.workload_id,
                          plan.note or "at the floor")

    # -- metrics (the shell's; nothing here is decided on) -------------------------------------
    def _lease_held(self, held: bool) -> None:
        if self.metrics is not None:
            self.metrics.lease(self.config.workload_id, held=held, epoch=self.epoch)

    def _pending_requests(self) -> list[PendingRequest]:
        assert self.core is not None
        return [PendingRequest(p.effect_kind, self._requests[eid].offset)
                for eid, p in self.core.pending.items() if eid in self._requests]

    def _observe_outstanding(self) -> None:
        if self.metrics is None or self.core is None or self.spec is None:
            return
        self.metrics.set_outstanding(self.config.workload_id, outstanding_by_kind(
            self.spec.effect_kinds, (p.effect_kind for p in self.core.pending.values())))

    # -- signatures (an observation: nothing merged depends on it) ------------------------------
    #: Responses checked in one go before the event loop runs something else (a few ms).
    SIGNATURE_CHUNK = 32
    #: Most responses waiting to be checked; past it new ones are left unchecked (logged).
    SIGNATURE_QUEUE_MAX = 50_000

    def _check_signatures(self, responses: list[tuple[int, ResponseRecord]]) -> None:
        """Queue what one read of ``.resp`` brought for :meth:`_signature_loop`: the merge
        never waits for a signature check."""
        room = self.SIGNATURE_QUEUE_MAX - len(self._sig_queue)
        if room < len(responses):
            self.stats.signatures_unchecked += len(responses) - max(room, 0)
            log.warning("signature checks of %s behind by %d responses: %d left unchecked",
                        self.config.workload_id, len(self._sig_queue),
                        len(responses) - max(room, 0))
            responses = responses[:max(room, 0)]
        self._sig_queue.extend(responses)
        self._sig_queued.set()

    async def _signature_loop(self, stop: asyncio.Event) -> None:
        """Check the queued responses, :attr:`SIGNATURE_CHUNK` at a time, yielding between
        chunks; what does not verify waits for the keys to be read again (:meth:`_keys_loop`)."""
        queue = self._sig_queue
        while not stop.is_set():
            await self._sig_queued.wait()
            self._sig_queued.clear()
            while queue:
                chunk = [queue.popleft() for _ in range(min(len(queue), self.SIGNATURE_CHUNK))]
                if not self._sig_keys_read:
                    self._sig_pending.extend(chunk)
                    self._sig_wake.set()
                    continue
                tally = check_signatures(chunk, self._sig_facts, self._sig_history,
                                         holder_ids=self._holder_ids, final=False)
                self._count_signatures(tally)
                if tally.retry:
                    self._sig_pending.extend(tally.retry)
                    self._sig_wake.set()
                await asyncio.sleep(0)

    def _count_signatures(self, tally: SignatureTally) -> None:
        self.stats.signatures_checked += tally.checked
        self.stats.signature_failures += len(tally.failures)
        if self.metrics is not None:
            self.metrics.signatures(self.config.workload_id, tally.checked,
                                    Counter(f.reason for f in tally.failures))
        for failure in tally.failures:
            self._warn_signature(failure)

    #: At most one WARNING a node and reason this often (the rest are counted in the next).
    SIGNATURE_WARN_EVERY_S = 10.0

    def _warn_signature(self, f: SignatureFailure) -> None:
        key = (f.node_id, f.reason)
        now = time.monotonic()
        last, suppressed = self._sig_said.get(key, (-float("inf"), 0))
        if now - last < self.SIGNATURE_WARN_EVERY_S:
            self._sig_said[key] = (last, suppressed + 1)
            return
        self._sig_said[key] = (now, 0)
        more = (f" ({suppressed} more {f.reason} signature(s) of node {f.node_id!r} since the "
                "last line)" if suppressed else "")
        log.warning("signature %s: response for %s at %s@%d, node %r: %s%s", f.reason,
                    f.effect_id, topics.resp(self.config.workload_id), f.offset, f.node_id,
                    f.detail, more)

    async def _read_keys(self) -> None:
        cfg = self.config
        if cfg.fleet_keys:
            from fx_kafka.keys import read_history

            self._sig_history = await read_history(cfg.bootstrap, list(cfg.fleet_keys))
            return
        facts, self._sig_facts_next = await read_facts_since(cfg.bootstrap,
                                                             self._sig_facts_next)
        if facts:
            self._sig_facts = latest_keys([*self._sig_facts, *facts])

    async def _keys_loop(self, stop: asyncio.Event) -> None:
        """Read the keys (``sys.facts``, or ``sys.keys`` with fleet keys) every
        ``observe_every_s``, and at once (at most once a second) when a response waits for a
        re-read; then settle those that waited since before the read began. A failed read is
        logged (WARNING the first time in a row) and tried again: signatures never stop the
        holder."""
        cfg = self.config
        failing = False
        while not stop.is_set():
            started = time.monotonic()
            todo, self._sig_pending = self._sig_pending, []
            self._sig_wake.clear()
            try:
                await asyncio.wait_for(self._read_keys(), timeout=30.0)
                read = True
            except asyncio.CancelledError:  # stopping or restarting: keep them for the next run
                self._sig_pending[:0] = todo
                raise
            except (KafkaError, OSError, TimeoutError) as exc:
                # the first failure of a run at WARNING (a denied sys.keys would else go
                # unseen), the rest at DEBUG
                (log.debug if failing else log.warning)(
                    "reading the keys for the signature checks of %s failed (tried again "
                    "every %.0f s): %r", cfg.workload_id, cfg.observe_every_s, exc)
                read = False
            failing = not read
            if read:
                self._sig_keys_read = True
            if todo and (read or len(todo) + len(self._sig_pending) > 10_000):
                # settled with the keys held now (a long outage: bounded memory)
                while todo:
                    chunk, todo = todo[:self.SIGNATURE_CHUNK], todo[self.SIGNATURE_CHUNK:]
                    self._count_signatures(check_signatures(
                        chunk, self._sig_facts, self._sig_history,
                        holder_ids=self._holder_ids, final=True))
                    try:
                        await asyncio.sleep(0)
                    except asyncio.CancelledError:
                        self._sig_pending[:0] = todo
                        raise
            elif todo:
                self._sig_pending[:0] = todo
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sig_wake.wait(), timeout=cfg.observe_every_s)
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))

    async def _observe_loop(self, consumer: Any, tp_resp: TopicPartition,
                            stop: asyncio.Event) -> None:
        """Every ``observe_every_s``: the merge lag on ``.resp`` and the executor groups'
        unread requests on ``.out`` (one admin client for the holder's run). A failed round is
        logged at DEBUG and tried again next time: metrics never stop the holder."""
        cfg = self.config
        admin = make_admin(cfg.bootstrap, request_timeout_ms=10_000)
        started = False
        try:
            while not stop.is_set():
                try:
                    if not started:
                        await asyncio.wait_for(admin.start(), timeout=15.0)
                        started = True
                    await asyncio.wait_for(self._observe_once(admin, consumer, tp_resp),
                                           timeout=15.0)
                except (KafkaError, OSError, TimeoutError) as exc:
                    log.debug("metrics round of %s failed (next in %.0f s): %r",
                              cfg.workload_id, cfg.observe_every_s, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=cfg.observe_every_s)
        finally:
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                await asyncio.wait_for(admin.close(), timeout=5.0)

    async def _observe_once(self, admin: Any, consumer: Any, tp_resp: TopicPartition) -> None:
        cfg, metrics = self.config, self.metrics
        assert metrics is not None
        wid = cfg.workload_id
        ends = await consumer.end_offsets([tp_resp])
        lag = merge_lag(ends.get(tp_resp), await consumer.position(tp_resp))
        if lag is not None:
            metrics.set_merge_lag(wid, lag)
        self._observe_outstanding()
        if self.core is None or self.spec is None:
            return
        existing = {g[0] for g in await admin.list_consumer_groups()}
        groups = executor_groups(cfg.executor_group_prefixes, self.spec.effect_kinds,
                                 existing)
        tp_out = TopicPartition(topics.out(wid), 0)
        committed: dict[str, int | None] = {}
        for group in groups:
            if group not in existing:
                committed[group] = None
                continue
            offsets = await admin.list_consumer_group_offsets(group, partitions=[tp_out])
            meta = offsets.get(tp_out)
            committed[group] = None if meta is None else meta.offset
        if self.core is not None:
            metrics.set_unread(wid, unread_requests(groups, committed,
                                                    self._pending_requests()))

    async def _loop(self, consumer: Any, tp_in: TopicPartition, tp_resp: TopicPartition,
                    stop: asyncio.Event) -> None:
        core, spec, cfg = self.core, self.spec, self.config
        assert core is not None and spec is not None
        bufs: dict[str, deque[Item]] = {"in": deque(), "resp": deque()}
        topic_source = {tp_in: "in", tp_resp: "resp"}
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=self._poll_timeout_ms())
            responses: list[tuple[int, ResponseRecord]] = []
            for tp, msgs in batch.items():
                if tp not in topic_source:  # .spec: a binding change to adopt, or refuse
                    for msg in msgs:
                        await self._spec_written(msg.offset, msg.value)
                    continue
                source = topic_source[tp]
                for msg in msgs:
                    item = self._decode(source, msg)
                    if item is not None and isinstance(item.record, ResponseRecord):
                        responses.append((msg.offset, item.record))
                    if item is not None:
                        item = await self._resolved(item, msg.topic, stop,
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
                self._check_signatures(responses)
            if self._rejects:
                rejects, self._rejects = self._rejects, []
                if not self._rejects_topic:
                    await ensure_rejects_topic(cfg.bootstrap)
                    self._rejects_topic = True
                await self._write([(topics.REJECTS, encode(r)) for r in rejects])
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
        assert core is not None and self.spec is not None
        try:
            record = decode(value)
        except DecodeError as exc:
            log.warning("skipping undecodable record on .spec@%d: %s", offset, exc)
            return
        if not isinstance(record, SpecRecord) or record.workload_id != cfg.workload_id:
            return
        problem = switch_problem(self.spec, record, core.seq)
        if problem is not None:
            self.stats.specs_refused += 1
            log.error("spec at %s@%d not adopted: %s", topics.spec(cfg.workload_id), offset,
                      problem)
            return
        adoption = ClaimRecord(workload_id=cfg.workload_id, epoch=self.epoch,
                               holder_id=cfg.holder_id, spec_hash=record_hash(record),
                               spec_offset=offset, from_seq=core.seq,
                               holder_key=self._holder_key_text)
        await self._write([(topics.claims(cfg.workload_id), encode(adoption))])
        self.spec, self._spec_offset = record, offset
        self.stats.specs_adopted += 1
        log.info("adopted the spec at .spec@%d from step %d (models at it: %s)", offset,
                 core.seq, record.models_at(core.seq))

    def _decode(self, source: str, msg: Any) -> Item | None:
        assert self.core is not None
        try:
            record = decode(msg.value)
        except DecodeError as exc:
            log.warning("skipping undecodable record at %s@%d: %s", msg.topic, msg.offset, exc)
            if source == "resp" and self.metrics is not None:
                self.metrics.skipped(self.config.workload_id, "undecodable")
            return None
        ok = (InputRecord,) if source == "in" else (AcceptedRecord, ResponseRecord, TickRecord)
        if not isinstance(record, ok):
            log.warning("skipping a %s record on %s@%d", record.kind, msg.topic, msg.offset)
            if source == "resp" and self.metrics is not None:
                self.metrics.skipped(self.config.workload_id, "wrong_record")
            return None
        if source == "resp":
            self._observe_clock(msg.timestamp)
            if isinstance(record, TickRecord):
                problem = tick_problem(record, self._epoch_holders)
                if problem is not None:
                    self._reject_tick(msg, problem)
                    return None
            if isinstance(record, AcceptedRecord):
                self._accepted_by[record.effect_id] = record.node_id
        return Item("in" if source == "in" else "resp", msg.offset, msg.timestamp, record)

    def _reject_tick(self, msg: Any, problem: str) -> None:
        """A tick its epoch's holder did not write: logged, counted and queued for
        ``sys.rejects`` (written by :meth:`_loop` after the read), never taken as the clock."""
        wid = self.config.workload_id
        log.warning("rejected tick at %s@%d: %s", msg.topic, msg.offset, problem)
        self.stats.foreign_ticks += 1
        if self.metrics is not None:
            self.metrics.skipped(wid, "foreign_tick")
        value = msg.value or b""
        self._rejects.append(RejectedRecord(
            topic=msg.topic, partition=msg.partition, offset=msg.offset, code="foreign_tick",
            detail=problem[:4096], size=len(value), value_hash=sha256_hex(value),
            seen_by=self.config.holder_id))

    async def _resolved(self, item: Item, topic: str, stop: asyncio.Event,
                        merge_buffered: Callable[[], Awaitable[None]]) -> Item | None:
        """``item`` with the bytes of its referenced body, if the step may read it: an input's,
        or an answer's that may still be delivered (:meth:`Core.may_deliver`), and only what
        the spec in force lets the workload read (else the core hands the step the reference
        and why). What is not there yet is read again with backoff, up to ``ref_wait_s``
        (``merge_buffered`` first: what was read before it is merged, not held up); then
        :class:`RefGap` naming it. None when ``stop`` is set while waiting."""
        core, cfg = self.core, self.config
        assert core is not None and self.spec is not None and self._refs is not None
        ref = referenced_body(item.record)
        if ref is None or (isinstance(item.record, ResponseRecord)
                           and not core.may_deliver(item.record.effect_id)):
            return item
        key = (item.source, item.offset)
        give_up = time.monotonic() + cfg.ref_wait_s
        attempt = 0
        while True:
            res = await self._refs.resolve([(key, ref)], workload=cfg.workload_id,
                                           specs=[self.spec])
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

    async def _merge_available(self, bufs: dict[str, deque[Item]]) -> None:
        """Merge what is buffered, one transaction per :func:`~workload_sdk._round.merge_batch`
        (the decisions are there; this writes them and keeps the books)."""
        core, spec, cfg = self.core, self.spec, self.config
        assert core is not None and spec is not None
        wid = cfg.workload_id
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
            for ref, data in list(batch.chunks):
                # stored before the transaction that names it commits (an aborted one leaves
                # an unnamed chunk behind: content-addressed, harmless)
                try:
                    stored = await self._refs.write_chunk(data, workload=wid,
                                                          media_type=ref.media_type)
                except (TopicAuthorizationFailedError, OSError) as exc:
                    batch.drop_snapshot(ref, f"snapshot with chunk state {ref.hash} "
                                        f"({ref.size} B) skipped: cannot store the chunk in "
                                        f"{self._refs.where}: {exc!r}")
                    continue
                assert stored.hash == ref.hash
                self.stats.chunk_snapshots += 1
            self.stats.snapshots += batch.snapshots
            self.stats.snapshots_skipped += len(batch.snapshots_skipped)
            for why in batch.snapshots_skipped:
                log.warning("%s", why)
            if batch.records:
                topic = {"merge": topics.merge(wid), "out": topics.out(wid)}
                metas = await self._write([(topic[stream], encode(rec))
                                           for stream, rec in batch.records])
                self.stats.outputs += len(batch.output_at)
                self._note_outputs(batch.outputs, [metas[i] for i in batch.output_at])
            if self.metrics is not None:
                # after the commit: what the merge log now says
                self.metrics.merged(wid, batch.answers, batch.passed_over_by, round_trips)
                snaps = [metas[i] for i, (_, rec) in enumerate(batch.records)
                         if isinstance(rec, SnapshotRecord)] if batch.records else []
                if snaps:
                    self.metrics.snapshot(wid, snaps[-1].timestamp / 1000)
                self._observe_outstanding()
            if batch.failure is not None:
                raise batch.failure
            if not batch.records:
                return

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
                        broker_now_ms=self._broker_now_estimate(), tick_in_flight=in_flight):
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
        wait = nxt - self._broker_now_estimate() + 1
        return int(max(1, min(self.config.poll_ms, wait)))
