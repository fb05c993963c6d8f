"""What a lease holder does before it merges, and the rules of its restarts: the latest spec on
``.spec``, the claims on ``.claims`` every reader goes by, may a restarting holder keep its epoch,
is the workload placed (``sys.facts``), is there an epoch left to claim. The holder
(:mod:`workload_sdk._holder`) calls these and keeps what they return.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError

from broker_schema import (
    HOLDER_OUTCOMES,
    AcceptedRecord,
    ClaimRecord,
    DecodeError,
    EffectRequest,
    LocalEngineBuild,
    ResponseRecord,
    SpecRecord,
    decode,
    topics,
)
from broker_schema.binding import MAX_EPOCH, claim_problem, next_epoch, switch_problem
from broker_schema.streams import OutRecord
from fx_kafka.retry import broker_unavailable, jittered_backoff_s
from fx_kafka.workload_log import WorkloadLog, read_facts, read_topic
from workload_sdk._api import Workload
from workload_sdk._code import Code, ModuleUnavailable
from workload_sdk._holder_config import HOLDER_LOG as log
from workload_sdk._holder_config import HolderConfig
from workload_sdk._placement import chunk_store_problem, placement_missing
from workload_sdk._replay import ReplayResult, out_slots, replay, resume_outputs

__all__ = [
    "FENCE_SETTLE_S",
    "MAX_FENCES_IN_A_ROW",
    "ChunkStoreMismatch",
    "EngineBuildMismatch",
    "Fenced",
    "NoSpec",
    "Replaced",
    "RequestAt",
    "Restarts",
    "Resumed",
    "Unplaced",
    "adoptable_spec",
    "check_restart",
    "claim_engine",
    "claims_of",
    "engine_build_check",
    "highest_claim",
    "keep_epoch",
    "latest_spec",
    "read_claims",
    "rejoin_epoch",
    "resumed_state",
    "transactional_id_for",
    "wait_for_epoch",
    "wait_for_placement",
]


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


class EngineBuildMismatch(NoSpec):
    """Mode A: this holder's integer engine build is not the one the last claim recorded
    (:mod:`workload_sdk._local_build`), and ``--force`` was not given."""


class ChunkStoreMismatch(NoSpec):
    """This holder's chunk store, or a live executor's, is not the one the spec names
    (``SpecRecord.chunk_store``): the one line says which and how to fix it."""


def transactional_id_for(workload_id: str) -> str:
    """The transactional id of the lease holder of ``workload_id`` (one per workload)."""
    return f"fx-holder.{topics.check_workload_id(workload_id)}"


def check_restart(claims: list[ClaimRecord], *, epoch: int, holder_id: str,
                  fenced: bool) -> None:
    """May a holder that held ``epoch`` restart itself? Raises :class:`Replaced` when a higher
    claim exists; after a fence (``fenced``) also unless the highest claim is its own: then the
    fence came from the transaction coordinator (a transaction aborted on timeout), not from a
    successor. A committed claim is unique per epoch (claims are written transactionally)."""
    highest = highest_claim(claims)
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
    highest = highest_claim(claims)
    if (highest is not None and (highest.epoch, highest.holder_id) == (epoch, holder_id)
            and highest.spec_offset == spec_offset):
        return epoch
    return None


def keep_epoch(claims: list[ClaimRecord], *, epoch: int, holder_id: str, spec_offset: int,
               holder_key: str | None) -> int | None:
    """The epoch a holder restarting from the log keeps (:func:`rejoin_epoch`), or None: claim
    anew. A successor's claim committed between the restart check and this holder's
    ``InitProducerId`` (which has fenced that successor for good): claim anew, as any successor
    would, rather than yield and leave no holder at all. A highest claim that names another
    holder key than ``holder_key``: claim anew (this holder cannot sign for it)."""
    try:
        kept = rejoin_epoch(claims, epoch=epoch, holder_id=holder_id, spec_offset=spec_offset)
    except Replaced as exc:
        log.warning("%s; its producer is fenced by this one: claiming a new epoch", exc)
        return None
    top = highest_claim(claims)
    if kept is not None and top is not None and top.holder_key != holder_key:
        return None
    return kept


def highest_claim(claims: list[ClaimRecord]) -> ClaimRecord | None:
    """The latest claim of the highest epoch (its holder's latest spec adoption, if any)."""
    top = max((c.epoch for c in claims), default=None)
    return None if top is None else [c for c in claims if c.epoch == top][-1]


def claims_of(view: Any) -> list[ClaimRecord]:
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


#: Fences in a row (no transaction committed between them) after which a holder stops.
MAX_FENCES_IN_A_ROW = 3
#: How long a fenced holder waits before it reads ``.claims`` to learn whether a successor fenced
#: it (a successor claims within moments of its InitProducerId).
FENCE_SETTLE_S = 2.0


class Restarts:
    """A holder's restarts from the log in one :meth:`LeaseHolder.run`: which failures it rides
    out (a broker outage, a fence while its own claim is still the highest) and how long it waits
    before the next start (backoff; after a fence at least :data:`FENCE_SETTLE_S`)."""

    def __init__(self) -> None:
        self.attempt = 0
        self.fences = 0  # fences in a row without a committed transaction between them
        #: the last failure was a fence (the next start checks ``.claims`` for a successor)
        self.fenced = False

    def survivable(self, exc: BaseException, *, committed: bool, ran: bool) -> bool:
        """May the holder restart after ``exc``? ``committed``: a transaction committed since
        the last start; ``ran``: the holder got ready (both: the outage is new, the backoff
        starts over). False for :class:`Replaced`, for the :data:`MAX_FENCES_IN_A_ROW` th fence
        in a row, and for a Kafka error other than the broker being unavailable."""
        if isinstance(exc, Replaced):
            return False
        if isinstance(exc, Fenced):
            self.fences = 1 if committed else self.fences + 1
            if self.fences >= MAX_FENCES_IN_A_ROW:
                return False
            self.fenced = True
        elif isinstance(exc, KafkaError) and not broker_unavailable(exc):
            return False
        else:
            self.fenced = False
        if committed or ran:
            self.attempt = 0  # it ran: the outage is new
        self.attempt += 1
        return True

    def delay_s(self) -> float:
        """How long to wait before the next start."""
        delay = jittered_backoff_s(self.attempt, cap_s=5.0)
        if self.fenced:  # a successor writes its claim right after fencing: let it land first
            delay = max(delay, FENCE_SETTLE_S)
        return delay


@dataclass
class RequestAt:
    """A request of this workload on ``.out``: its offset and append time, and the effect it
    re-issues (for alarms)."""

    offset: int
    time_ms: int
    reissue_of: str | None = None


@dataclass
class Resumed:
    """What a holder resumes with, from the log it read (:func:`resumed_state`)."""

    result: ReplayResult
    #: effect id -> its request on ``.out`` (every request replay computed that is there)
    requests: dict[str, RequestAt]
    #: pending effects a ``timeout``/``unknown`` is on ``.resp`` for (not merged yet: do not
    #: write a second one)
    written_outcomes: set[str]
    #: effect id -> the node of its latest ``accepted`` (for alarms)
    accepted_by: dict[str, str]
    #: output slots replay computed that are not on ``.out`` (to write)
    missing: list[OutRecord]


def resumed_state(workload: Workload, wl: WorkloadLog, *, code: Code | None = None) -> Resumed:
    """Replay ``wl`` (:func:`~workload_sdk._replay.replay`, each step with the code ``code``
    gives for it; raises as it does) and gather what the holder keeps besides the fold.
    Pure. :class:`NoSpec` when a step's code cannot be had."""
    try:
        result = replay(workload, wl, code=code)
    except ModuleUnavailable as exc:
        raise NoSpec(f"cannot replay the log: {exc}") from exc
    core = result.core
    requests: dict[str, RequestAt] = {}
    for offset, value in out_slots(wl, result.outputs).values():
        record = decode(value)
        if isinstance(record, EffectRequest):
            requests[record.effect_id] = RequestAt(
                offset, wl["out"].records[offset].time_ms, record.reissue_of)
    written: set[str] = set()
    accepted_by: dict[str, str] = {}
    for rec in wl["resp"]:
        # a timeout/unknown an earlier holder wrote that the fold has not merged yet: do not
        # write a second one
        try:
            answer = decode(rec.value)
        except DecodeError:
            continue
        if (isinstance(answer, ResponseRecord) and answer.outcome in HOLDER_OUTCOMES
                and answer.effect_id in core.pending):
            written.add(answer.effect_id)
        elif isinstance(answer, AcceptedRecord):
            accepted_by[answer.effect_id] = answer.node_id
    return Resumed(result, requests, written, accepted_by, resume_outputs(result, wl))


def adoptable_spec(offset: int, value: bytes, *, workload_id: str, spec: SpecRecord,
                   seq: int) -> tuple[SpecRecord | None, str | None]:
    """A record appended to ``.spec`` while the holder runs at step ``seq`` under ``spec``:
    ``(record, None)`` to adopt it from the next step; ``(None, problem)`` when it would rebind
    a step already taken (:func:`~broker_schema.binding.switch_problem`); ``(None, None)``
    when it is no spec of this workload (an undecodable one is logged)."""
    try:
        record = decode(value)
    except DecodeError as exc:
        log.warning("skipping undecodable record on .spec@%d: %s", offset, exc)
        return None, None
    if not isinstance(record, SpecRecord) or record.workload_id != workload_id:
        return None, None
    problem = switch_problem(spec, record, seq)
    return (None, problem) if problem is not None else (record, None)


async def read_claims(bootstrap: str, workload_id: str) -> list[ClaimRecord]:
    """The claims on ``.claims`` every reader goes by (:func:`claims_of`)."""
    return claims_of(await read_topic(bootstrap, topics.claims(workload_id)))


async def latest_spec(bootstrap: str, workload_id: str) -> tuple[int, SpecRecord]:
    """The latest spec on ``.spec`` and its offset; :class:`NoSpec` when there is none."""
    spec_view = await read_topic(bootstrap, topics.spec(workload_id))
    spec: tuple[int, SpecRecord] | None = None
    for rec in spec_view:
        try:
            record = decode(rec.value)
        except DecodeError:
            continue
        if isinstance(record, SpecRecord) and record.workload_id == workload_id:
            spec = (rec.offset, record)
    if spec is None:
        raise NoSpec(f"no spec on {spec_view.topic}")
    return spec


async def wait_for_epoch(bootstrap: str, workload_id: str, claims: list[ClaimRecord],
                         say: Callable[[str | None], None]) -> int:
    """The next epoch to claim after ``claims``. While every epoch is taken (the highest
    accepted claim is ``MAX_EPOCH``) no claim can win: ``say`` why (``/readyz``, the log) and
    look again every 5 s, never crash; ``say(None)`` once an epoch is free."""
    epoch = next_epoch(claims)
    while epoch is None:
        problem = (f"cannot win an epoch of {workload_id}: the highest claim on "
                   f"{topics.claims(workload_id)} is epoch {MAX_EPOCH}, the highest there is")
        say(problem)
        log.error("%s (looking again in 5 s)", problem)
        await asyncio.sleep(5.0)
        epoch = next_epoch(await read_claims(bootstrap, workload_id))
    say(None)
    return epoch


async def wait_for_placement(cfg: HolderConfig, spec: SpecRecord) -> list[str]:
    """Wait until live nodes serve what ``spec`` binds (:func:`placement_missing`); return
    what is missing when claiming with ``force_placement`` (recorded in the claim), else
    raise :class:`Unplaced` once ``placement_wait_s`` has passed. First, whatever ``--force``
    says: :class:`ChunkStoreMismatch` when this holder's chunk store, or that of every live node
    serving one of the spec's kinds, is not the spec's ``chunk_store``
    (:func:`chunk_store_problem`)."""
    engine = await engine_build_check(cfg, spec)
    missing = await _wait_placed(cfg, spec)
    return [*missing, *engine]


async def engine_build_check(cfg: HolderConfig, spec: SpecRecord) -> list[str]:
    """Mode A: refuse (:class:`EngineBuildMismatch`) to take over ``spec``'s workload on
    another integer engine build than the last claim recorded, unless ``force_placement``
    (``--force``); then the change, to record in the claim's ``forced``. Nothing to check
    without mode A models."""
    if not spec.local_models:
        return []
    from workload_sdk._local_build import (
        engine_build_change,
        forced_note,
        last_engine_build,
        this_engine_build,
    )

    change = engine_build_change(
        spec, last_engine_build(await read_claims(cfg.bootstrap, cfg.workload_id)),
        this_engine_build())
    if change is None:
        return []
    if not cfg.force_placement:
        raise EngineBuildMismatch(
            f"not claiming {cfg.workload_id}: its mode A models last ran on another integer "
            f"engine build ({change}); --force takes over anyway and records it in the claim")
    log.warning("%s: taking over on another engine build (%s): recorded in the claim",
                cfg.workload_id, change)
    return [forced_note(change)]


def claim_engine(spec: SpecRecord) -> LocalEngineBuild | None:
    """The engine build to record in a claim of ``spec``: this one when it binds mode A
    models, else None (nothing runs in the step)."""
    if not spec.local_models:
        return None
    from workload_sdk._local_build import this_engine_build

    return this_engine_build()


async def _wait_placed(cfg: HolderConfig, spec: SpecRecord) -> list[str]:
    loop = asyncio.get_running_loop()
    give_up = None if cfg.placement_wait_s is None else loop.time() + cfg.placement_wait_s
    said: list[str] | None = None
    checked_store = False
    while True:
        facts = await read_facts(cfg.bootstrap)
        if not checked_store:
            problem, strays = chunk_store_problem(
                spec, facts, holder_store="kafka" if cfg.chunk_dir is None else "fs",
                holder_where=(topics.CHUNKS if cfg.chunk_dir is None
                              else f"the directory {cfg.chunk_dir}"),
                now_us=time.time_ns() // 1000, max_age_s=cfg.facts_max_age_s)
            if problem is not None:
                raise ChunkStoreMismatch(f"not claiming {cfg.workload_id}: {problem}")
            if strays:
                log.warning("%s: live nodes serving its kinds keep chunks in another store than "
                            "the spec's chunk_store = %s: %s (fine only if they serve other "
                            "workloads)", cfg.workload_id, spec.chunk_store, ", ".join(strays))
            checked_store = True
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
