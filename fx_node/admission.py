"""The admission rules of a node (the executor's, and under the actuator gateway's own,
:func:`actuator.core.decide`): what to do with each record, and which records to write.

No I/O and no clock reads happen here: the service passes the time in (``now_ms`` for decisions,
``now_us`` for the people-only timing fields) and writes whatever records come back. That keeps
every fencing, deadline and backpressure rule testable without a broker, and the aiokafka loop in
:mod:`fx_node.shell` short.

The rules, in the order they are checked for an effect request on ``wl.<id>.out``
(each refusal is one ``response`` record with outcome ``error`` and no ``accepted`` before it):

1. a kind this executor does not serve, or a plain output: **ignored** (another executor group may
   serve it); an effect id already in flight here: ignored (it will be answered once);
2. ``stale_epoch``: ``header.epoch`` is lower than the highest claim epoch seen on ``.claims``;
3. ``no_spec``: no spec seen on ``.spec`` for the workload;
4. ``kind_unbound``: the latest spec does not list the effect kind;
5. ``model_unbound``: the request's model hash is not among ``spec.models_at(input_offset)``;
6. ``input_forbidden``: its input is a stream reference to a topic other than the workload's own
   ``wl.<id>.in`` and the spec's ``input_topics``, or a chunk of another workload than its own
   and the spec's ``chunks_from`` (see :func:`input_problem`): refused before anything of that
   topic or chunk is asked of the broker or the chunk store;
7. ``deadline_passed``: ``now_ms > append_ms + deadline_ms`` (append time of the request on
   ``.out``: per-workload topics use LogAppendTime);
8. ``model_unknown`` / ``model_hash_mismatch``: the model store's answer for the hash;
9. ``backpressure`` (outcome, not an error): the kind's queue (waiting + running) is full;
10. otherwise **admitted**: an ``accepted`` record, and a job in the in-flight table.

A **shadow** request (header ``shadow`` set, read from ``wl.<id>.shadow.<eval>.out``) is a
recorded or live request re-issued by a shadow evaluation; it acts on nothing. It is judged by the
same rules with two differences: rule 2 does not apply (an evaluation re-issues requests of past
epochs), and in rule 5 the model must be bound by the step's spec with the evaluation's rebinding
applied (:func:`broker_schema.binding.shadow_models`, the evaluation's definition read from its
``.eval``); ``shadow_unknown`` when no definition is there. Its answers go to the evaluation's
``.resp`` (:func:`broker_schema.topics.resp_for`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import JsonValue

from broker_schema.binding import claim_problem, shadow_models, spec_in_force
from broker_schema.records import (
    AcceptedRecord,
    Body,
    ChunkRef,
    ClaimRecord,
    EffectRequest,
    ErrorCode,
    ErrorInfo,
    ExecutorInfo,
    ResponseRecord,
    ShadowEvalRecord,
    SpecRecord,
    StreamRef,
    Timing,
)
from broker_schema.refs import chunk_owner, chunk_problem, stream_problem
from broker_schema.signatures import holder_signature_problem

__all__ = [
    "RENEW_FRACTION",
    "Admit",
    "Decision",
    "ExecutorState",
    "Ignore",
    "InFlight",
    "ModelStatus",
    "OffsetTracker",
    "Refuse",
    "WorkloadView",
    "chunk_owner",
    "chunk_problem",
    "decide",
    "error_response",
    "holder_problem",
    "input_problem",
    "ok_response",
    "redact",
    "refusal",
    "renewal_due",
    "renewed",
]

#: What the model store says about a hash, computed by the service before :func:`decide`.
#: ``ready``: present and its bytes hash to the name; ``absent``: not held; ``corrupt``: held, but
#: the file does not hash to its name.
ModelStatus = Literal["ready", "absent", "corrupt"]


@dataclass
class WorkloadView:
    """What the executor knows of one workload from ``.claims`` and ``.spec``."""

    highest_epoch: int = 0
    #: The latest spec on ``wl.<id>.spec`` (a spec read again at a lower offset is ignored).
    spec: SpecRecord | None = None
    spec_offset: int = -1
    #: Every claim seen, in log order, and every spec by offset: which spec binds a request is
    #: the one rule of :mod:`broker_schema.binding` (the holder's claim or spec adoption in
    #: force at the request's step), so executor and holder agree on every offset.
    claims: list[ClaimRecord] = field(default_factory=list)
    specs: dict[int, SpecRecord] = field(default_factory=dict)

    def binding(self, epoch: int, input_offset: int) -> tuple[int, SpecRecord] | None:
        """The spec (and its offset) binding step ``input_offset`` of ``epoch``: the rule of
        :func:`broker_schema.binding.spec_in_force`; the latest spec when this executor has
        seen no claim of that epoch (nothing to disagree with); None without any spec."""
        found = spec_in_force(self.claims, self.specs, epoch, input_offset)
        if found is not None:
            claim, spec = found
            return claim.spec_offset, spec
        if self.spec is None:
            return None
        return self.spec_offset, self.spec


@dataclass(frozen=True)
class InFlight:
    """One admitted request: accepted, waiting for or in the engine, not yet answered."""

    effect_id: str
    request: EffectRequest
    topic: str
    partition: int
    request_offset: int
    #: Broker append time of the request plus its ``deadline_ms``.
    deadline_at_ms: int
    received_us: int
    #: ``sha256:`` of the request's bytes on ``.out`` (:func:`broker_schema.request_hash`),
    #: carried by its ``accepted`` and response: the holder merges only the answer to its own
    #: request (issue 30). None when the service did not give it.
    request_hash: str | None = None


@dataclass(frozen=True)
class Ignore:
    """Nothing to write; the offset may be committed."""

    reason: str


@dataclass(frozen=True)
class Refuse:
    """Write ``response`` (an ``error`` or ``backpressure`` outcome, unsigned) and move on."""

    response: ResponseRecord


@dataclass(frozen=True)
class Admit:
    """Write ``accepted`` (acks=all), then run ``job`` and answer it with :func:`ok_response` or
    :func:`error_response`."""

    accepted: AcceptedRecord
    job: InFlight


Decision = Ignore | Refuse | Admit


class InFlightTable(dict[str, "InFlight"]):
    """The in-flight table (effect id -> job) with its depth per kind and per workload kept as
    it changes, so a queue-depth question is O(1) (a scan per request is quadratic in a burst).
    Only ``[]=``, ``del``, :meth:`pop` and :meth:`clear` change it (``setdefault``/``update``
    are not used on it)."""

    def __init__(self) -> None:
        super().__init__()
        #: effect kind -> jobs in the table
        self.by_kind: dict[str, int] = {}
        #: workload id -> jobs in the table
        self.by_workload: dict[str, int] = {}

    def _count(self, job: InFlight, step: int) -> None:
        kind, wid = job.request.effect_kind, job.request.header.workload_id
        self.by_kind[kind] = self.by_kind.get(kind, 0) + step
        self.by_workload[wid] = self.by_workload.get(wid, 0) + step

    def __setitem__(self, effect_id: str, job: InFlight) -> None:
        old = self.get(effect_id)
        if old is not None:
            self._count(old, -1)
        super().__setitem__(effect_id, job)
        self._count(job, 1)

    def __delitem__(self, effect_id: str) -> None:
        job = self[effect_id]
        super().__delitem__(effect_id)
        self._count(job, -1)

    def pop(self, effect_id: str, *default: InFlight | None) -> InFlight | None:  # type: ignore[override]
        """Remove and return the job of ``effect_id`` (``default`` if it is not there)."""
        if effect_id not in self:
            if default:
                return default[0]
            raise KeyError(effect_id)
        job = super().pop(effect_id)
        self._count(job, -1)
        return job

    def clear(self) -> None:
        """Empty the table (and its counts)."""
        super().clear()
        self.by_kind.clear()
        self.by_workload.clear()


class ExecutorState:
    """The executor's state, changed only through the methods below.

    Who touches it: the service's event-loop thread, and only that thread (the consumer loop calls
    :meth:`observe_claim`, :meth:`observe_spec` and :func:`decide`; the worker tasks call
    :meth:`finish` once a response is acknowledged; the HTTP and facts code only read). Engine
    threads never see it. Nothing here does I/O, so no method awaits and no lock is needed.
    """

    def __init__(
        self,
        *,
        node_id: str,
        kinds: Mapping[str, int],
        engine_info: ExecutorInfo,
        private_paths: Iterable[str] = (),
    ) -> None:
        #: This node's id (``written_by`` and ``accepted.node_id``).
        self.node_id = node_id
        #: Directories of this machine that no answer names (model store, chunk store, key):
        #: :func:`redact` takes them out of every error message written.
        # longest first (a path inside another is redacted before it), then by name: the
        # order never depends on the set's hash seed
        self.private_paths = tuple(sorted({p.rstrip("/") for p in private_paths
                                           if p.startswith("/") and p.strip("/")},
                                          key=lambda p: (-len(p), p)))
        #: Effect kinds served -> queue limit (requests waiting plus running).
        self.queue_limits: dict[str, int] = dict(kinds)
        #: What refusals name as their executor: no engine ran for them.
        self.refusal_executor = engine_info
        #: Workload id -> what its ``.claims`` and ``.spec`` said so far.
        self.workloads: dict[str, WorkloadView] = {}
        #: The in-flight table: effect id -> job. Entered by :func:`decide` (on admit), left by
        #: :meth:`finish` (after the response is acknowledged) or :meth:`abandon` (shutdown).
        self.in_flight: InFlightTable = InFlightTable()
        #: (workload id, evaluation id) -> the shadow evaluation's definition (first record).
        self.shadows: dict[tuple[str, str], ShadowEvalRecord] = {}

    # -- observations ---------------------------------------------------------------------------
    def workload(self, workload_id: str) -> WorkloadView:
        """The view of ``workload_id`` (created empty on first use)."""
        return self.workloads.setdefault(workload_id, WorkloadView())

    def claim_refused(self, claim: ClaimRecord) -> str | None:
        """Why ``claim`` (read next on its workload's ``.claims``) is refused, or None: its
        epoch is too far above the highest seen (:func:`broker_schema.binding.claim_problem`).
        A refused claim is not observed; the service writes it to ``sys.rejects``."""
        return claim_problem(claim, self.workload(claim.workload_id).highest_epoch)

    def observe_claim(self, claim: ClaimRecord) -> bool:
        """Record a lease claim; True when it raised the workload's highest epoch. The caller
        asks :meth:`claim_refused` first."""
        view = self.workload(claim.workload_id)
        if claim not in view.claims:
            view.claims.append(claim)
        if claim.epoch > view.highest_epoch:
            view.highest_epoch = claim.epoch
            return True
        return False

    def observe_spec(self, spec: SpecRecord, offset: int) -> bool:
        """Record a spec read at ``offset`` of ``.spec``; the latest offset wins. True if used."""
        view = self.workload(spec.workload_id)
        view.specs[offset] = spec
        if offset <= view.spec_offset:
            return False
        view.spec, view.spec_offset = spec, offset
        return True

    def observe_shadow(self, record: ShadowEvalRecord) -> bool:
        """Record a shadow evaluation's definition; the first one read wins. True if used."""
        key = (record.workload_id, record.eval_id)
        if key in self.shadows:
            return False
        self.shadows[key] = record
        return True

    # -- the in-flight table ----------------------------------------------------------------------
    def queue_depth(self, kind: str) -> int:
        """Requests of ``kind`` admitted and not yet answered (waiting or running)."""
        return self.in_flight.by_kind.get(kind, 0)

    def depth_by_workload(self) -> dict[str, int]:
        """Admitted, unanswered requests per workload id."""
        return {wid: n for wid, n in self.in_flight.by_workload.items() if n}

    def finish(self, effect_id: str) -> InFlight | None:
        """Remove a job once its response is acknowledged; returns it (None if not there)."""
        return self.in_flight.pop(effect_id, None)

    def abandon(self) -> list[InFlight]:
        """Empty the table at shutdown; the returned jobs were accepted and get no response from
        this process (the lease holder writes ``unknown`` after the executor lease lapses)."""
        jobs = list(self.in_flight.values())
        self.in_flight.clear()
        return jobs


def refusal(
    state: ExecutorState,
    request: EffectRequest,
    request_offset: int,
    received_us: int,
    *,
    code: ErrorCode | None,
    message: str = "",
    request_hash: str | None = None,
) -> Refuse:
    """A refusal of ``request`` (read at ``request_offset``): an unsigned ``error`` response
    with ``code``, or ``backpressure`` when ``code`` is None. No ``accepted`` precedes it."""
    return Refuse(
        ResponseRecord(
            effect_id=request.effect_id,
            header=request.header,
            request_offset=request_offset,
            outcome="error" if code is not None else "backpressure",
            error=(ErrorInfo(code=code, message=redact(message, state.private_paths))
                   if code is not None else None),
            model_hash=None,
            executor=state.refusal_executor,
            timing=Timing(received_us=received_us),
            written_by=state.node_id,
            request_hash=request_hash,
        )
    )


def decide(
    state: ExecutorState,
    request: EffectRequest,
    *,
    topic: str,
    partition: int,
    offset: int,
    append_ms: int,
    now_ms: int,
    now_us: int,
    model_status: ModelStatus,
    request_hash: str | None = None,
) -> Decision:
    """Apply the rules of this module's docstring to one request read at ``offset``.

    ``append_ms`` is the record's broker append time; ``now_ms``/``now_us`` the executor clock at
    reading time; ``model_status`` the store's answer for ``request.model`` (``ready`` when the
    request names no model); ``request_hash`` the hash of the request's bytes as read
    (:func:`broker_schema.request_hash`), put in every record written for it. On
    :class:`Admit` the job is entered into the in-flight table.
    """
    kind = request.effect_kind
    if kind not in state.queue_limits:
        return Ignore(f"kind {kind} is not served here")
    if request.effect_id in state.in_flight:
        return Ignore("already in flight here")

    def refuse(code: ErrorCode, message: str) -> Refuse:
        return refusal(state, request, offset, now_us, code=code, message=message,
                       request_hash=request_hash)

    header = request.header
    view = state.workload(header.workload_id)
    shadow: ShadowEvalRecord | None = None
    if header.shadow is not None:
        shadow = state.shadows.get((header.workload_id, header.shadow))
        if shadow is None:
            return refuse("shadow_unknown", f"no shadow evaluation {header.shadow} of workload "
                          f"{header.workload_id} (nothing on its .eval)")
    elif header.epoch < view.highest_epoch:
        return refuse(
            "stale_epoch", f"request epoch {header.epoch} < highest claim {view.highest_epoch}"
        )
    bound_by = view.binding(header.epoch, header.input_offset)
    if bound_by is None:
        return refuse("no_spec", f"no spec seen for workload {header.workload_id}")
    spec_offset, spec = bound_by
    if kind not in spec.effect_kinds:
        return refuse("kind_unbound", f"spec at offset {spec_offset} does not bind {kind}")
    if request.model is not None:
        bound = spec.models_at(header.input_offset)
        if shadow is not None:
            bound = shadow_models(bound, shadow.models)
        if request.model not in bound.values():
            return refuse(
                "model_unbound",
                f"{request.model} is not bound at input offset {header.input_offset} (spec at "
                f"offset {spec_offset})",
            )
    problem = input_problem(request, spec)
    if problem is not None:
        return refuse("input_forbidden", problem)
    deadline_at = append_ms + request.deadline_ms
    if now_ms > deadline_at:
        return refuse(
            "deadline_passed", f"read {now_ms - deadline_at} ms after the deadline {deadline_at}"
        )
    if model_status == "absent":
        return refuse("model_unknown", f"this executor holds no model {request.model}")
    if model_status == "corrupt":
        return refuse("model_hash_mismatch", f"stored file for {request.model} fails its hash")
    limit = state.queue_limits[kind]
    if state.queue_depth(kind) >= limit:
        return refusal(state, request, offset, now_us, code=None, request_hash=request_hash)
    job = InFlight(
        effect_id=request.effect_id,
        request=request,
        topic=topic,
        partition=partition,
        request_offset=offset,
        deadline_at_ms=deadline_at,
        received_us=now_us,
        request_hash=request_hash,
    )
    state.in_flight[job.effect_id] = job
    lease_ms = spec.executor_lease_ms
    accepted = AcceptedRecord(
        effect_id=job.effect_id,
        header=header,
        request_offset=offset,
        node_id=state.node_id,
        lease_ms=lease_ms,
        accepted_us=now_us,
        request_hash=request_hash,
    )
    return Admit(accepted=accepted, job=job)


#: An executor re-writes a request's ``accepted`` once this fraction of its lease has passed
#: since the last one, while the request is still in flight: a lease renewal.
RENEW_FRACTION = 3


def renewal_due(accepted: AcceptedRecord, now_us: int) -> bool:
    """Whether the lease of ``accepted`` is due a renewal at ``now_us``: a third of
    ``lease_ms`` has passed since its ``accepted_us``. Pure."""
    return now_us - accepted.accepted_us >= accepted.lease_ms * 1000 // RENEW_FRACTION


def renewed(accepted: AcceptedRecord, now_us: int) -> AcceptedRecord:
    """The renewal of ``accepted`` at ``now_us``: the same record (effect, request, node,
    lease) with a later ``accepted_us``. The lease holder takes the latest ``accepted`` merged
    as the start of the lease (``workload_sdk._core``), so ``unknown`` is written only
    ``lease_ms`` after the last renewal: when the executor is really gone."""
    return accepted.model_copy(update={"accepted_us": now_us})


def holder_problem(state: ExecutorState, request: EffectRequest, value: bytes,
                   signature: bytes | None) -> str | None:
    """Why ``request`` (its bytes ``value``, its ``fx-holder-sig`` header ``signature``) is not
    the current holder's, or None. The first claim of the request's epoch names the holder's
    key (``holder_key``): the request must carry that key's signature over its bytes. A claim
    without one (written before the field existed) and a shadow request (written by
    ``fx shadow``) are not checked; an epoch no claim names is refused when the workload's
    holders sign (any claim names a key), else left to :func:`decide`. The
    service writes a refused request to ``sys.rejects`` (``not_holder``) and never answers it
    (issue 30: a front-running request is not run). Pure."""
    header = request.header
    if header.shadow is not None:
        return None
    view = state.workloads.get(header.workload_id)
    if view is None:
        return None
    claim = next((c for c in view.claims if c.epoch == header.epoch and c.from_seq is None),
                 None)
    if claim is None:
        # the service reads .claims up to its end before judging a request, and a holder
        # claims before it writes: no claim of the epoch where holders sign is not a holder's
        if any(c.holder_key is not None for c in view.claims):
            return (f"request {request.effect_id}: no claim of epoch {header.epoch} names its "
                    "holder (this workload's holders sign their requests)")
        return None
    if claim.holder_key is None:
        return None
    problem = holder_signature_problem(value, signature, claim.holder_key)
    if problem is None:
        return None
    return (f"request {request.effect_id} is not the epoch {header.epoch} holder's "
            f"({claim.holder_id!r}): {problem}")


def input_problem(request: EffectRequest, spec: SpecRecord | None) -> str | None:
    """Why ``request``'s input may not be read (the ``input_forbidden`` message), or None.

    A request reads only what belongs to its workload (``request.header.workload_id``, which the
    service has checked is the workload of the ``.out`` topic it was read from):

    - an inline body, or no input: always;
    - a chunk reference: a chunk of its own workload, or of a workload the spec lists in
      ``chunks_from`` (see :func:`chunk_problem`). Chunks are stored per workload, so this
      decides where the store is looked in: a chunk stored for another workload is never read
      for this one, even when its hash is known;
    - a stream reference: only the workload's own ``wl.<id>.in``, or a topic the spec lists in
      ``input_topics`` (workload topics only; the spec's validation refuses ``sys.*``). Nothing
      else: ``sys.facts``, ``sys.chunks``, another workload's topics, the workload's own ``.out``,
      ``.resp``, ``.merge``, ``.claims`` and ``.spec``, and any malformed name.

    Pure: no I/O. The service asks it (through :func:`decide`) before anything of the named
    topic is asked of the broker, so a forbidden or malformed name never reaches it. The rules
    are :mod:`broker_schema.refs` (the lease holder and replay read references by them too).
    """
    body = request.input
    if isinstance(body, ChunkRef):
        return chunk_problem(body, reader=request.header.workload_id, spec=spec,
                             context=request.header.workload_id)
    if not isinstance(body, StreamRef):
        return None
    return stream_problem(body, reader=request.header.workload_id, spec=spec)


def ok_response(
    state: ExecutorState,
    job: InFlight,
    *,
    output: Body,
    model_hash: str | None,
    executor: ExecutorInfo,
    started_us: int,
    finished_us: int,
    receipt: dict[str, JsonValue] | None = None,
) -> ResponseRecord:
    """The unsigned ``ok`` response for ``job`` from an engine result.

    Built without validating again what is validated already (the request's header, the body,
    the executor info: all records or parts of records), when the receipt holds only JSON
    scalars (the executor's own ``batch_size``, ``manifest_hash``...); an engine's nested receipt
    goes through validation. The bytes are the same either way (a unit test compares them)."""
    if not _plain_receipt(receipt) or job.effect_id != job.request.header.effect_id:
        return ResponseRecord(
            effect_id=job.effect_id, header=job.request.header,
            request_offset=job.request_offset, outcome="ok", output=output,
            model_hash=model_hash, executor=executor, written_by=state.node_id, receipt=receipt,
            timing=Timing(received_us=job.received_us, started_us=started_us,
                          finished_us=finished_us), request_hash=job.request_hash)
    timing = Timing.model_construct(received_us=job.received_us, started_us=started_us,
                                    finished_us=finished_us)
    return ResponseRecord.model_construct(
        effect_id=job.effect_id, header=job.request.header, request_offset=job.request_offset,
        outcome="ok", output=output, model_hash=model_hash, executor=executor,
        written_by=state.node_id, receipt=receipt, timing=timing, error=None, signature=None,
        request_hash=job.request_hash)


#: What :func:`redact` writes for a server path.
REDACTED_PATH = "<server path>"


def redact(message: str, paths: Iterable[str]) -> str:
    """``message`` with every one of ``paths`` (and what lies under it) replaced by
    :data:`REDACTED_PATH`: an answer is read by whoever may read ``.resp``, and says nothing of
    the executor's file system (issue 30: ``input_missing`` named its ``chunk_dir``). Longest
    paths first. Pure."""
    for path in paths:
        if path and path in message:
            message = re.sub(re.escape(path) + r"[^\s'\")]*", REDACTED_PATH, message)
    return message


def _plain_receipt(receipt: Mapping[str, object] | None) -> bool:
    """A receipt of str keys and JSON scalars only (no float: a float is checked by
    validation for NaN and infinity)."""
    return receipt is None or all(
        isinstance(k, str) and (v is None or type(v) in (str, int, bool))
        for k, v in receipt.items())


def error_response(
    state: ExecutorState,
    job: InFlight,
    *,
    code: ErrorCode,
    message: str,
    model_hash: str | None,
    executor: ExecutorInfo | None,
    started_us: int | None,
    finished_us: int | None,
) -> ResponseRecord:
    """The unsigned ``error`` response for an admitted ``job`` (engine error, bad input...)."""
    return ResponseRecord(
        effect_id=job.effect_id,
        header=job.request.header,
        request_offset=job.request_offset,
        outcome="error",
        error=ErrorInfo(code=code, message=redact(message, state.private_paths)[:4096]),
        model_hash=model_hash,
        executor=executor or state.refusal_executor,
        timing=Timing(received_us=job.received_us, started_us=started_us, finished_us=finished_us),
        written_by=state.node_id,
        request_hash=job.request_hash,
    )


@dataclass
class OffsetTracker:
    """Which consumer offsets may be committed: only past records whose outcome is settled.

    The consumer loop calls :meth:`track` for every record it reads (in order) and :meth:`done`
    when the record needs nothing more (ignored, refused and acknowledged, or answered and
    acknowledged). :meth:`committable` gives, per partition, the offset to commit: the lowest
    offset still pending, or one past the highest read when none is. Partitions are ``(topic,
    partition)`` pairs. Touched only by the service's event-loop thread.
    """

    pending: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    next_offset: dict[tuple[str, int], int] = field(default_factory=dict)
    committed: dict[tuple[str, int], int] = field(default_factory=dict)

    def track(self, tp: tuple[str, int], offset: int) -> None:
        """A record at ``offset`` was read and is not settled yet."""
        self.pending.setdefault(tp, set()).add(offset)
        self.next_offset[tp] = max(self.next_offset.get(tp, 0), offset + 1)

    def done(self, tp: tuple[str, int], offset: int) -> None:
        """The record at ``offset`` is settled."""
        self.pending.get(tp, set()).discard(offset)

    def committable(self) -> dict[tuple[str, int], int]:
        """Partitions whose commit position moved since the last :meth:`mark_committed`."""
        result: dict[tuple[str, int], int] = {}
        for tp, nxt in self.next_offset.items():
            waiting = self.pending.get(tp)
            position = min(waiting) if waiting else nxt
            if position > self.committed.get(tp, -1):
                result[tp] = position
        return result

    def mark_committed(self, positions: Mapping[tuple[str, int], int]) -> None:
        """The broker acknowledged a commit of ``positions``."""
        for tp, pos in positions.items():
            self.committed[tp] = max(self.committed.get(tp, -1), pos)

    def pending_in(self, tps: Iterable[tuple[str, int]]) -> int:
        """How many unsettled records sit in the partitions ``tps``."""
        return sum(len(self.pending.get(tp, ())) for tp in tps)

    def forget(self, tps: Iterable[tuple[str, int]]) -> None:
        """Drop partitions this consumer no longer owns (after a rebalance)."""
        for tp in tps:
            self.pending.pop(tp, None)
            self.next_offset.pop(tp, None)
            self.committed.pop(tp, None)
