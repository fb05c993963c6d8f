"""The pure core: merge decisions, the fold, timeout and unknown judgement. No I/O anywhere.

The live lease holder and replay both drive one :class:`Core`. The holder feeds it records as they
arrive and writes what it returns; replay feeds it the records the merge log names and checks that
it decides the same. Who calls what:

- :func:`choose_next` (holder only): which buffered record is merged next (the recorded rule).
- :meth:`Core.classify` (holder and replay): deliver or pass over a record, and why.
- :meth:`Core.apply` (holder and replay): classify, run the step on a delivery, build the merge
  entry and the output records; advances ``seq`` and ``positions``.
- :func:`due_outcomes` (holder only): which pending effects are due a ``timeout`` or ``unknown``
  record, judged against a broker append time read from ``.resp``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Set
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import orjson

from broker_schema import (
    HOLDER_OUTCOMES,
    INLINE_MAX_BYTES,
    MAX_JSON_DEPTH,
    AcceptedRecord,
    Body,
    ChunkRef,
    EffectHeader,
    EffectRequest,
    HolderOutcome,
    InlineBody,
    InputRecord,
    MergeEntry,
    OutputRecord,
    PassOverReason,
    ResponseRecord,
    SkipNote,
    SnapshotRecord,
    SpecRecord,
    StreamRef,
    TickRecord,
    canonical_json,
    content_hash,
    is_hash,
    json_depth,
    parse_effect_id,
    request_hash,
    sha256_hex,
    topics,
)
from broker_schema import (
    EncodeError as _EncodeError,
)
from broker_schema.chunks import check_chunk, chunk_ref_of
from broker_schema.construct import construct, construct_values
from broker_schema.refs import chunk_owner, ref_problem
from broker_schema.request_bytes import request_bytes
from broker_schema.signatures import answer_refusal
from broker_schema.streams import OutRecord, SourceRecord
from fx_kafka.workload_log import RefGap
from workload_sdk._api import (
    EffectResult,
    Emit,
    Event,
    InputEvent,
    Request,
    State,
    Workload,
    WorkloadError,
)

Source = Literal["in", "resp"]

#: Outcomes after which a later answer for the same effect id is passed over as ``after_outcome``.


@dataclass(frozen=True, slots=True)
class Item:
    """A decoded record from ``.in`` or ``.resp`` with its offset and broker append time.

    ``resolved``: the bytes of the record's one referenced body (:func:`referenced_body`: an
    input's ``body``, an answer's ``output``, when it is a chunk or stream reference), read and
    hash-checked by the I/O shell (the holder's fetch loop, replay's log reader) before the item
    reaches :meth:`Core.apply`; None for inline bodies.

    ``skip``: an input the I/O shell skips on the record instead of stepping it (its reference
    could not be read by the spec's ``input_policy`` deadline, or an operator ordered it: the
    holder; replay sets the note the merge log recorded). The fold records it as a
    ``quarantined`` pass-over and never reads the body."""

    source: Source
    offset: int
    time_ms: int
    record: SourceRecord
    resolved: bytes | None = field(default=None, repr=False)
    skip: SkipNote | None = None


def referenced_body(record: SourceRecord) -> ChunkRef | StreamRef | None:
    """The chunk or stream reference the step would read of ``record`` (an input's ``body``, an
    answer's ``output``), or None (inline, no body, or a record the step never sees)."""
    body: Body | None
    if isinstance(record, InputRecord):
        body = record.body
    elif isinstance(record, ResponseRecord):
        body = record.output
    else:
        return None
    return body if isinstance(body, ChunkRef | StreamRef) else None


def describe_ref(ref: ChunkRef | StreamRef, context: str) -> str:
    """A reference for people: ``chunk sha256:... (N B) of workload W`` or a stream record."""
    if isinstance(ref, ChunkRef):
        return f"chunk {ref.hash} ({ref.size} B) of workload {chunk_owner(ref, context)}"
    return f"stream record {ref.topic}/{ref.partition}@{ref.offset}"


@dataclass(slots=True)
class Pending:
    """An effect the fold issued and has not had its answer for yet.

    ``accepted_ms``/``lease_ms`` come from the latest ``accepted`` record merged (as passed over)
    for it: the log's facts, so replay rebuilds them too.
    """

    effect_id: str
    input_offset: int
    index: int
    epoch: int
    effect_kind: str
    deadline_ms: int
    accepted_ms: int | None = None
    lease_ms: int | None = None
    #: ``sha256:`` of the request the step issued (its canonical bytes, what the holder writes
    #: on ``.out``): only an answer carrying this ``request_hash`` is the answer to it (issue 30).
    #: None only in a pending effect restored from a snapshot written before the field existed.
    request_hash: str | None = None

    def answers_it(self, record: AcceptedRecord | ResponseRecord) -> bool:
        """Whether ``record`` answers (or accepts) the request this effect issued: its
        ``request_hash`` is the request's, or it names none (a record written before the field
        existed). Pure.

        A record that names none is not refused here: the hash is the writer's claim, so a
        forger who may write ``.resp`` can name the right one as easily as none; what binds a
        genuine executor's answer is that it names the request it read, and the signature over
        it (``unsigned = refuse``). What this refuses is the genuine answer to another request
        with the same effect id: a stray written first on ``.out`` (issue 30, front-running)."""
        return (self.request_hash is None or record.request_hash is None
                or record.request_hash == self.request_hash)


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one record: deliver it to the step, pass it over (with why), or skip it
    (a tick: a clock marker that is not recorded in the merge log). An input passed over as
    ``quarantined`` carries the :class:`~broker_schema.SkipNote` recorded with it."""

    action: Literal["deliver", "pass_over", "skip"]
    reason: PassOverReason | None = None
    effect_id: str | None = None
    skip: SkipNote | None = None


class Applied:
    """The result of :meth:`Core.apply`: the merge entry (None for a tick), the step's output
    records (empty unless delivered), and whether a snapshot is due after it.

    The merge entry is built (and validated) when it is first read: the live holder and the
    simulator write it, replay only checks the decision against the recorded entry and never
    reads it (one pydantic record less a step). ``entry`` may be given as the entry itself or
    as its fields."""

    __slots__ = ("_entry", "_fields", "decision", "outputs", "snapshot_due")

    def __init__(self, decision: Decision, entry: MergeEntry | Mapping[str, Any] | None,
                 outputs: tuple[OutRecord, ...] = (), snapshot_due: bool = False) -> None:
        self.decision = decision
        self.outputs = outputs
        self.snapshot_due = snapshot_due
        self._entry = entry if entry is None or isinstance(entry, MergeEntry) else None
        self._fields = None if entry is None or isinstance(entry, MergeEntry) else entry

    @property
    def entry(self) -> MergeEntry | None:
        """The merge entry to write (None for a tick)."""
        if self._entry is None and self._fields is not None:
            self._entry = MergeEntry(**self._fields)
        return self._entry

    def __repr__(self) -> str:
        return (f"Applied(decision={self.decision!r}, entry={self.entry!r}, "
                f"outputs={self.outputs!r}, snapshot_due={self.snapshot_due!r})")


def _live_effect(effect_id: str) -> EffectHeader | None:
    """The header of a live effect id (:func:`broker_schema.parse_effect_id`); None for a
    shadow evaluation's id or anything that is not an effect id."""
    try:
        header = parse_effect_id(effect_id)
    except ValueError:
        return None
    return header if header.shadow is None else None


#: Backpressure pacing: the first ``backpressure`` answer in a row pauses inputs this long (broker
#: time), each further one doubles the pause, up to the cap; any other answer ends the streak.
PACE_BASE_MS = 100
PACE_CAP_MS = 5_000


@dataclass(slots=True)
class Pacing:
    """When the holder may merge inputs again after ``backpressure`` answers. Pure.

    An executor answers ``backpressure`` when its queue is full. Each answer frees room under the
    outstanding limit, so without a pause the holder would issue the next request straight into
    the same full queue, and a backlog would turn into a storm of ``backpressure`` answers. After
    the ``k``-th ``backpressure`` answer in a row merged at broker time ``t``, inputs wait until
    ``t + min(PACE_CAP_MS, PACE_BASE_MS * 2**(k-1))``; answers are merged as ever. Only the order
    of merging changes, and that order is what ``.merge`` records, so replay does not depend on
    the pause. (Broker time moves with the records merged from ``.resp``; the holder writes a
    tick when a pause is over and nothing else would show it.)"""

    streak: int = 0
    until_ms: int = 0

    def note(self, outcome: str, time_ms: int) -> None:
        """An answer with ``outcome`` merged at broker time ``time_ms``."""
        if outcome == "backpressure":
            self.streak += 1
            pause = min(PACE_CAP_MS, PACE_BASE_MS * 2 ** min(self.streak - 1, 20))
            self.until_ms = max(self.until_ms, time_ms + pause)
        else:
            self.streak = 0

    def allows(self, now_ms: int) -> bool:
        """Whether inputs may be merged at broker time ``now_ms``."""
        return now_ms >= self.until_ms

    def resumes_at(self) -> int | None:
        """The broker time the current pause ends, or None when there is none in force."""
        return self.until_ms if self.until_ms > 0 else None


@dataclass
class Core:
    """The fold's whole state: the workload state, the next ``seq``, pending effects, the effect
    ids that ended in ``timeout``/``unknown``, and the next offsets to read on each source."""

    workload: Workload
    workload_id: str
    state: State
    seq: int = 0
    pending: dict[str, Pending] = field(default_factory=dict)
    guessed: dict[str, str] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=lambda: {"in": 0, "resp": 0})
    #: Backpressure pacing (holder only; see :class:`Pacing`): not in snapshots, so a resumed
    #: holder starts unpaced.
    pacing: Pacing = field(default_factory=lambda: Pacing())
    #: Mode A: where the step's local models are loaded from (:mod:`workload_sdk._local`);
    #: None: the process default (``FX_MODEL_DIR``). Not in snapshots.
    local: Any = None
    #: Merge an answer only when it names the request the step issued (``request_hash``,
    #: ``foreign_request`` otherwise): the live holder and replay. A shadow fold, whose
    #: requests may differ from the recorded ones the recorded answers stand for, turns it off.
    bind_answers: bool = True
    #: Which code runs each step (:class:`workload_sdk._code.Code`: the module the spec in
    #: force names for it, ``fx workload deploy``); None: ``workload`` runs every step.
    code: Any = None
    #: The state and its canonical bytes as the last step left them (to restore the state
    #: when a step raises: :meth:`_step_or_skip`). Not in snapshots.
    _canon: tuple[Any, bytes] | None = field(default=None, repr=False, compare=False)

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def initial(cls, workload: Workload, workload_id: str) -> Core:
        """A core before the first step."""
        state = _normalized_state(workload.initial_state(), None)
        return cls(workload=workload, workload_id=workload_id, state=state)

    @classmethod
    def from_snapshot(cls, workload: Workload, snap: SnapshotRecord, *,
                      resolved: bytes | None = None) -> Core:
        """A core restored from a snapshot record (see :meth:`snapshot`). A snapshot whose state
        is a chunk reference (:meth:`snapshot_record`) needs the chunk's bytes: ``resolved``,
        read by the I/O shell; they are checked against the reference here."""
        if isinstance(snap.state, ChunkRef):
            if resolved is None:
                raise ValueError(f"snapshot at seq {snap.seq}: its state is chunk "
                                 f"{snap.state.hash}, which was not read")
            check_chunk(snap.state, resolved)  # a ChunkProblem is a ValueError
            try:
                data = json.loads(resolved)
            except ValueError as exc:
                raise ValueError(f"snapshot at seq {snap.seq}: chunk {snap.state.hash} is not "
                                 f"JSON: {exc}") from None
        elif isinstance(snap.state, InlineBody) and snap.state.encoding == "json":
            data = snap.state.data
        else:
            raise ValueError("snapshot state must be an inline JSON body or a chunk reference")
        if not isinstance(data, dict):
            raise ValueError("snapshot state body is not an object")
        state = data.get("state")
        if content_hash(state) != snap.state_hash:
            raise ValueError(f"snapshot at seq {snap.seq}: state does not hash to state_hash")
        pending_raw = data.get("pending", [])
        guessed_raw = data.get("guessed", {})
        if not isinstance(pending_raw, list) or not isinstance(guessed_raw, dict):
            raise ValueError("snapshot state body is malformed")
        pending = {}
        for entry in pending_raw:
            if not isinstance(entry, dict):
                raise ValueError("snapshot pending entry is not an object")
            p = Pending(**entry)
            pending[p.effect_id] = p
        return cls(
            workload=workload,
            workload_id=snap.workload_id,
            state=state,
            seq=snap.seq,
            pending=pending,
            guessed={str(k): str(v) for k, v in guessed_raw.items()},
            positions={"in": snap.positions.get("in", 0), "resp": snap.positions.get("resp", 0)},
        )

    def snapshot(self, epoch: int, *, out_position: int | None = None) -> SnapshotRecord:
        """A snapshot record of this core (the state before step ``seq``), its state inline
        (``ValueError`` when it does not fit the inline limit: see :meth:`snapshot_record`).

        ``out_position`` (holder only): the lowest ``.out`` offset a resume from this snapshot
        still needs, recorded as ``positions["out"]``; replay does not use it."""
        return self._snapshot(epoch, InlineBody.of_json(self._snapshot_body()), out_position)

    def snapshot_record(self, epoch: int, *, out_position: int | None = None
                        ) -> tuple[SnapshotRecord, bytes | None]:
        """A snapshot record of this core, and the chunk to store first (None when none is).

        The snapshot body (state, pending effects, guessed outcomes) goes inline when its
        canonical bytes fit the inline limit (64 KiB) and the record's nesting limit; otherwise
        the record's ``state`` is a :class:`~broker_schema.ChunkRef` to those bytes (computed
        from them: ``sha256:`` and size; the owner is this workload), and the bytes are the chunk
        the holder stores before it commits the transaction that holds the record."""
        body = self._snapshot_body()
        data = canonical_json(body)
        # the record nests the body 2 levels down (record -> state -> data)
        if len(data) <= INLINE_MAX_BYTES and json_depth(body) + 2 <= MAX_JSON_DEPTH:
            return self._snapshot(epoch, InlineBody.of_json(body), out_position), None
        ref = chunk_ref_of(data, media_type="application/json")
        return self._snapshot(epoch, ref, out_position), data

    def _snapshot_body(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "pending": [asdict(p) for p in self.pending.values()],
            "guessed": dict(self.guessed),
        }

    def _snapshot(self, epoch: int, state: InlineBody | ChunkRef,
                  out_position: int | None) -> SnapshotRecord:
        positions = dict(self.positions)
        if out_position is not None:
            positions["out"] = out_position
        return SnapshotRecord(
            workload_id=self.workload_id,
            seq=self.seq,
            epoch=epoch,
            state_hash=content_hash(self.state),
            state=state,
            positions=positions,
        )

    @property
    def state_hash(self) -> str:
        """``sha256:<hex>`` of the workload state's canonical bytes (those kept from the last
        step's normalization: the state is not serialized again to hash it)."""
        return sha256_hex(self._state_bytes())

    # -- decisions -----------------------------------------------------------------------------
    def input_allowed(self, spec: SpecRecord, now_ms: int | None = None) -> bool:
        """Inputs from ``.in`` are merged only while fewer than ``spec.outstanding_limit``
        requests are pending and, given the broker time ``now_ms`` (the append time of the
        latest ``.resp`` record merged), while no backpressure pause is in force
        (:class:`Pacing`); answers are always merged (they free room)."""
        if len(self.pending) >= spec.outstanding_limit:
            return False
        return now_ms is None or self.pacing.allows(now_ms)

    def may_deliver(self, effect_id: str) -> bool:
        """Whether an answer for ``effect_id`` read now may still be delivered to the step:
        the effect is pending, or it names a step of this workload not taken yet. (An effect
        that is neither is passed over whenever its answer is merged: pending effects are only
        ever added by the step that issues them, under their own ``seq``.)"""
        if effect_id in self.pending:
            return True
        header = _live_effect(effect_id)
        return (header is not None and header.workload_id == self.workload_id
                and header.input_offset >= self.seq)

    def classify(self, item: Item, spec: SpecRecord | None = None) -> Decision:
        """Deliver or pass over ``item``, without changing anything.

        Inputs are always delivered. On ``.resp``: a tick is skipped; an ``accepted`` is passed
        over as ``not_an_answer``; a response for a pending effect is delivered (the first answer
        merged is the one the step sees) when it answers the request the step issued (its
        ``request_hash``), else it is a ``foreign_request``; one for an effect that ended in
        ``timeout`` or ``unknown`` is ``after_outcome``; one for another of this workload's
        past slots is a ``duplicate``; anything else is an ``unknown_effect``. Given the
        ``spec`` in force, an answer it does not trust (:func:`broker_schema.signatures.
        answer_refusal`: ``unsigned``, ``untrusted_key``) is passed over too.
        """
        record = item.record
        if isinstance(record, InputRecord):
            if item.skip is not None:
                return Decision("pass_over", "quarantined", skip=item.skip)
            return Decision("deliver")
        if isinstance(record, TickRecord):
            return Decision("skip")
        effect_id = record.effect_id
        if isinstance(record, AcceptedRecord):
            return Decision("pass_over", "not_an_answer", effect_id)
        if effect_id in self.pending:
            if self.bind_answers and not self.pending[effect_id].answers_it(record):
                return Decision("pass_over", "foreign_request", effect_id)
            refused = None if spec is None else answer_refusal(record, spec)
            if refused is not None:
                return Decision("pass_over", refused[0], effect_id)
            return Decision("deliver", None, effect_id)
        if effect_id in self.guessed:
            return Decision("pass_over", "after_outcome", effect_id)
        header = _live_effect(effect_id)
        if (header is not None and header.workload_id == self.workload_id
                and header.input_offset < self.seq):
            return Decision("pass_over", "duplicate", effect_id)
        return Decision("pass_over", "unknown_effect", effect_id)

    def _body_bytes(self, item: Item, spec: SpecRecord) -> tuple[bytes | None, str | None]:
        """The bytes the step reads of ``item``'s referenced body, or why it may not read them.

        A reference the workload may not read under ``spec`` (:func:`broker_schema.refs.
        ref_problem`: another workload's chunk or stream) is handed over unread, with why (the
        event's ``json()``/``bytes()`` raise ``TypeError`` saying so): the same live and in
        replay. Any other reference must have been resolved by the I/O shell: :class:`RefGap`
        when it was not."""
        ref = referenced_body(item.record)
        if ref is None:
            return None, None
        problem = ref_problem(ref, reader=self.workload_id, spec=spec)
        if problem is not None:
            return None, problem
        if item.resolved is None:
            raise RefGap(topics.stream(self.workload_id, item.source), item.offset, ref,
                         f"its {describe_ref(ref, self.workload_id)} was not read before the "
                         f"step at seq {self.seq}")
        return item.resolved, None

    def apply(self, item: Item, *, epoch: int, spec: SpecRecord,
              decision: Decision | None = None) -> Applied:
        """Merge ``item``: classify it, run the step on a delivery, and return the merge entry and
        output records to write. Raises :class:`WorkloadError` when the step breaks a rule, and
        :class:`RefGap` when the step may read a referenced body the shell did not resolve.

        ``decision``: what :meth:`classify` just said of ``item`` and ``spec`` on this core, when
        the caller asked it first (replay, to check it against the log): not asked again."""
        if decision is None:
            decision = self.classify(item, spec)
        self.positions[item.source] = max(self.positions[item.source], item.offset + 1)
        if decision.action == "skip":
            return Applied(decision, None)
        entry = dict(
            workload_id=self.workload_id, seq=self.seq, epoch=epoch, source=item.source,
            source_offset=item.offset, effect_id=decision.effect_id, action=decision.action,
            reason=decision.reason, skip=decision.skip,
        )
        record = item.record
        if decision.action == "pass_over":
            if isinstance(record, AcceptedRecord) and record.effect_id in self.pending:
                p = self.pending[record.effect_id]
                if not self.bind_answers or p.answers_it(record):  # a stray's is no lease of ours
                    p.accepted_ms = item.time_ms
                    p.lease_ms = record.lease_ms
            return Applied(decision, entry)
        event: Event
        if isinstance(record, InputRecord):
            if not self.input_allowed(spec):
                raise WorkloadError("outstanding_limit", "an input was merged while "
                                    f"{len(self.pending)} requests were pending", seq=self.seq)
            resolved, unreadable = self._body_bytes(item, spec)
            event = InputEvent(seq=self.seq, time_ms=item.time_ms, offset=item.offset,
                               body=record.body, source=record.source, resolved=resolved,
                               unreadable=unreadable)
            if spec.input_policy.on_step_error == "quarantine":
                return self._step_or_skip(event, entry, epoch=epoch, spec=spec)
        else:
            assert isinstance(record, ResponseRecord)
            resolved, unreadable = self._body_bytes(item, spec)
            self.pending.pop(record.effect_id)
            self.pacing.note(record.outcome, item.time_ms)
            if record.outcome in HOLDER_OUTCOMES:
                self.guessed[record.effect_id] = record.outcome
            event = EffectResult(
                seq=self.seq, time_ms=item.time_ms, effect_id=record.effect_id,
                input_offset=record.header.input_offset, index=record.header.index,
                outcome=record.outcome, output=record.output, error=record.error,
                model_hash=record.model_hash, written_by=record.written_by,
                resolved=resolved, unreadable=unreadable,
            )
        outputs = self._step(event, epoch=epoch, spec=spec)
        self.seq += 1
        return Applied(decision, entry, outputs, snapshot_due=self.seq % spec.snapshot_every == 0)

    def _step_or_skip(self, event: InputEvent, entry: dict[str, Any], *, epoch: int,
                      spec: SpecRecord) -> Applied:
        """Step an input under ``on_step_error = "quarantine"``: when the step itself raises
        (anything but a :class:`WorkloadError`), the input is skipped on the record
        (``step_raised``, the exception in the detail) with the state as it was before the
        step (restored from its canonical bytes, in case the step changed it in place), no
        output and no ``seq`` consumed. Replay raises again at the same input: the same
        decision."""
        before = self._state_bytes()
        try:
            outputs = self._step(event, epoch=epoch, spec=spec)
        except _StepRaised as raised:
            self.state = orjson.loads(before)
            self._canon = (self.state, before)
            exc = raised.exc
            note = SkipNote(cause="step_raised",
                            detail=f"{type(exc).__name__}: {exc}"[:4096])
            decision = Decision("pass_over", "quarantined", skip=note)
            return Applied(decision, {**entry, "action": "pass_over", "reason": "quarantined",
                                      "skip": note})
        self.seq += 1
        return Applied(Decision("deliver"), entry, outputs,
                       snapshot_due=self.seq % spec.snapshot_every == 0)

    def _state_bytes(self) -> bytes:
        """The canonical bytes of the state (kept from the last step's normalization)."""
        if self._canon is None or self._canon[0] is not self.state:
            self._canon = (self.state, canonical_json(self.state))
        return self._canon[1]

    def _step(self, event: Event, *, epoch: int, spec: SpecRecord) -> tuple[OutRecord, ...]:
        seq = self.seq
        workload = self.workload if self.code is None else self.code.at(spec, seq)
        try:
            if spec.local_models:
                from workload_sdk._local import default_runtime, step_context

                with step_context(self.local or default_runtime(), spec.local_models,
                                  spec.local_max_tokens_per_step, seq):
                    result = workload.step(self.state, event)
            else:
                result = workload.step(self.state, event)
        except WorkloadError:
            raise
        except Exception as exc:
            if (isinstance(event, InputEvent) and spec.input_policy.on_step_error == "quarantine"
                    and not _unavailable(exc, spec)):
                raise _StepRaised(exc) from exc
            raise
        if not isinstance(result, tuple) or len(result) != 2:
            raise WorkloadError("bad_step", "step must return (state, outputs)", seq=seq)
        new_state, outs = result
        new_bytes = _canonical_state(new_state, seq)
        new_state = orjson.loads(new_bytes)
        room = spec.outstanding_limit - len(self.pending)
        records: list[OutRecord] = []
        issued: list[Pending] = []
        models = spec.models_at(seq)
        # the body of the record stepped (decoded already: strictly, or trusted by the caller)
        known = event.body if isinstance(event, InputEvent) else event.output
        for index, out in enumerate(outs):
            # the fold's own values (its workload id, seq and epoch, a count): built without
            # validating them again (the same object pydantic would build)
            header = _header({"workload_id": self.workload_id, "input_offset": seq,
                              "index": index, "epoch": epoch})
            if isinstance(out, Emit):
                records.append(_output(header, out.body, known))
                continue
            if not isinstance(out, Request):
                raise WorkloadError("bad_output", f"output {index} is a {type(out).__name__}, "
                                    "not emit()/infer()/actuate()/request()", seq=seq)
            if out.effect_kind not in spec.effect_kinds:
                raise WorkloadError("kind_unbound", f"effect kind {out.effect_kind!r} is not "
                                    f"bound by the spec (bound: {list(spec.effect_kinds)})",
                                    seq=seq)
            model = _resolve_model(out.model, models, seq)
            deadline = out.deadline_ms if out.deadline_ms is not None else spec.deadline_default_ms
            if out.reissue_of is not None:
                _check_reissue(out.reissue_of, self.workload_id, seq, index)
            try:
                req = _request(header, out, model, deadline, known)
            except (ValueError, _EncodeError) as exc:
                raise WorkloadError("bad_output", f"request {index}: {exc}", seq=seq) from exc
            records.append(req)
            issued.append(Pending(effect_id=header.effect_id, input_offset=seq, index=index,
                                  epoch=epoch, effect_kind=out.effect_kind, deadline_ms=deadline,
                                  request_hash=request_hash(request_bytes(req))))
        if len(issued) > room:
            raise WorkloadError("outstanding_limit", f"the step issued {len(issued)} requests "
                                f"with room for {room} (spec outstanding_limit "
                                f"{spec.outstanding_limit})", seq=seq)
        self.state = new_state
        self._canon = (new_state, new_bytes)
        for p in issued:
            self.pending[p.effect_id] = p
        return tuple(records)


def _header(fields: dict[str, Any]) -> EffectHeader:
    """An effect header from the fold's own values, built as :func:`broker_schema.construct`
    builds a trusted record (no validation: the values are the fold's, not a step's)."""
    header = construct(EffectHeader, fields)
    assert isinstance(header, EffectHeader)
    return header


#: Parameter values a request's ``params`` holds as they are (JSON scalars without floats).
_PLAIN = (str, int, bool, type(None))
_MAX_DEADLINE = 2**53 - 1


def _body_as_is(body: Any, known: Body | None) -> bool:
    """Whether validating ``body`` as a record's body gives it back as it is, with no error: the
    stepped record's own body (``known``: decoded already, strictly or trusted by the caller),
    a reference, or an inline body whose check (the one validation runs again on an instance)
    passes here; a JSON body's data may have changed since the step made it, so it is checked
    again. False sends the caller to validation, which then raises its own error."""
    if body is known and body is not None:
        return True
    t = type(body)
    if t is InlineBody:
        try:
            body._check()
        except ValueError:
            return False
        return True
    return t is ChunkRef or t is StreamRef


def _request(header: EffectHeader, out: Request, model: str | None, deadline: Any,
             known: Body | None) -> EffectRequest:
    """The request record of step output ``out``: built without validation when each value is
    one validation keeps as it is (the fold's header, a kind the spec binds, a model from its
    bindings, a deadline in range, scalar parameters, a body :func:`_body_as_is`): the same
    object as ``EffectRequest(...)`` (tested); validated otherwise (its errors as ever)."""
    params = dict(out.params)
    if (out.reissue_of is None and type(deadline) is int and 1 <= deadline <= _MAX_DEADLINE
            and type(out.effect_kind) is str and (model is None or type(model) is str)
            and all(type(k) is str and type(v) in _PLAIN for k, v in params.items())
            and (out.input is None or _body_as_is(out.input, known))):
        req = construct_values(EffectRequest, {
            "header": header, "effect_kind": out.effect_kind, "model": model, "params": params,
            "input": out.input, "deadline_ms": deadline, "reissue_of": None})
        assert isinstance(req, EffectRequest)
        return req
    return EffectRequest(header=header, effect_kind=out.effect_kind, model=model,
                         params=params, input=out.input, deadline_ms=deadline,
                         reissue_of=out.reissue_of)


def _output(header: EffectHeader, body: Any, known: Body | None) -> OutputRecord:
    """The output record of an :class:`Emit`: built without validation when its body is
    :func:`_body_as_is` (the same object as ``OutputRecord(...)``), validated otherwise."""
    if _body_as_is(body, known):
        record = construct_values(OutputRecord, {"header": header, "body": body})
        assert isinstance(record, OutputRecord)
        return record
    return OutputRecord(header=header, body=body)


def _unavailable(exc: Exception, spec: SpecRecord) -> bool:
    """Whether ``exc`` says what this process lacks (a mode A model it cannot load), not what
    the step decided: never a reason to skip an input."""
    if not spec.local_models:
        return False
    from workload_sdk._local import LocalModelUnavailable

    return isinstance(exc, LocalModelUnavailable)


class _StepRaised(Exception):
    """The workload's step raised ``exc`` on an input (not a rule of the fold broken)."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


def _canonical_state(state: State, seq: int | None) -> bytes:
    """The canonical bytes of ``state`` (:class:`WorkloadError` ``bad_state`` if it has none)."""
    try:
        return canonical_json(state)
    except _EncodeError as exc:
        raise WorkloadError("bad_state", f"state is not canonical JSON: {exc.detail}",
                            seq=seq) from exc


def _normalized_state(state: State, seq: int | None) -> State:
    """``state`` as it reads back from its canonical bytes: what a snapshot restores.

    The live fold keeps this value, not the step's own object, so a step that returns a tuple,
    a float such as ``1.0`` (canonical ``1``) or keeps a reference to it sees the same value
    live, in replay from the start and in replay from a snapshot.
    """
    try:
        return orjson.loads(canonical_json(state))  # canonical bytes: the same value as json's
    except _EncodeError as exc:
        raise WorkloadError("bad_state", f"state is not canonical JSON: {exc.detail}",
                            seq=seq) from exc


def _check_reissue(original: str, workload_id: str, seq: int, index: int) -> None:
    """A reissue names an earlier request of this workload (the merge rule is unchanged: the
    reissue is an effect of its own, with its own id and answer; docs/actuation.md)."""
    header = _live_effect(original)
    if header is None or header.workload_id != workload_id or header.input_offset >= seq:
        raise WorkloadError("bad_output", f"request {index} names reissue_of {original!r}, "
                            f"which is not an earlier effect of workload {workload_id}", seq=seq)


def _resolve_model(model: str | None, models: Mapping[str, str], seq: int) -> str | None:
    if model is None:
        return None
    if is_hash(model):
        if model not in models.values():
            raise WorkloadError("model_unbound", f"model {model} is not bound at input offset "
                                f"{seq} (bound: {dict(models)})", seq=seq)
        return model
    if model not in models:
        raise WorkloadError("model_unbound", f"model name {model!r} is not bound at input "
                            f"offset {seq} (bound: {sorted(models)})", seq=seq)
    return models[model]


# ------------------------------------------------------------------------------- merge order


def choose_next(in_head: Item | None, resp_head: Item | None, *,
                input_allowed: bool) -> Source | None:
    """The recorded merge rule: which buffered head is merged next.

    The head with the earlier broker append time goes first; on a tie the response goes first
    (it may free room and it answers an older question). Inputs wait while the outstanding limit
    is reached. None: nothing can be merged now.
    """
    if resp_head is not None and (
        in_head is None or not input_allowed or resp_head.time_ms <= in_head.time_ms
    ):
        return "resp"
    if in_head is not None and input_allowed:
        return "in"
    return None


# ---------------------------------------------------------------------------- deadline judgement


@dataclass(frozen=True, slots=True)
class Due:
    """An effect due a holder-written outcome, and the append time it was judged against."""

    effect_id: str
    outcome: HolderOutcome
    due_at_ms: int


def due_at(p: Pending, request_time_ms: int) -> tuple[HolderOutcome, int]:
    """When ``p`` becomes due and what: ``timeout`` at the request's append time plus its
    deadline while nothing accepted it, else ``unknown`` at the latest accept plus its lease."""
    if p.accepted_ms is None or p.lease_ms is None:
        return "timeout", request_time_ms + p.deadline_ms
    return "unknown", p.accepted_ms + p.lease_ms


def due_outcomes(pending: Iterable[Pending], request_times: Mapping[str, int], now_ms: int,
                 *, already_written: Iterable[str] = ()) -> list[Due]:
    """Pending effects due a ``timeout`` or ``unknown`` record at broker time ``now_ms``.

    ``now_ms`` must be the append time of the latest record *merged from* ``.resp`` (an answer,
    an ``accepted`` or a tick): every ``accepted`` appended before it has then been merged, so
    "no accept by the deadline" is a fact of the log. Strictly later than the due time counts.
    Effects whose request time is not known yet (not read back) and those in ``already_written``
    are left alone.
    """
    written = set(already_written)
    due: list[Due] = []
    for p in pending:
        if p.effect_id in written or p.effect_id not in request_times:
            continue
        outcome, at = due_at(p, request_times[p.effect_id])
        if now_ms > at:
            due.append(Due(p.effect_id, outcome, at))
    return due


def next_due_ms(pending: Mapping[str, Pending], request_times: Mapping[str, int], *,
                already_written: Set[str], pacing: Pacing, inputs_waiting: bool,
                now_resp_ms: int | None) -> int | None:
    """The next broker time the holder must see to make progress: the earliest deadline or
    lease end among ``pending`` effects not yet given an outcome, and the end of a backpressure
    pause while inputs wait behind it and no ``.resp`` record merged shows it over. None when
    nothing is due. The holder (and the test simulator) write a tick when broker time passes it
    with nothing else on ``.resp``. Pure."""
    dues = [due_at(p, request_times[eid])[1] for eid, p in pending.items()
            if eid in request_times and eid not in already_written]
    end = pacing.resumes_at()
    if end is not None and inputs_waiting and (now_resp_ms is None or now_resp_ms < end):
        dues.append(end)
    return min(dues) if dues else None


def holder_outcome(p: Pending, *, request_offset: int, outcome: HolderOutcome,
                   holder_id: str, workload_id: str) -> ResponseRecord:
    """The ``timeout``/``unknown`` response the holder writes for pending effect ``p``."""
    header = EffectHeader(workload_id=workload_id, input_offset=p.input_offset, index=p.index,
                          epoch=p.epoch)
    return ResponseRecord(effect_id=p.effect_id, header=header, request_offset=request_offset,
                          outcome=outcome, written_by=holder_id, request_hash=p.request_hash)


def tick_problem(tick: TickRecord, holders: Mapping[int, str]) -> str | None:
    """Why ``tick`` (read on ``.resp``) is not the lease holder's, or None: ``holders`` maps
    each claimed epoch to its holder id (from ``.claims``), and a tick names an epoch and the
    holder of it. A tick written by anyone else is rejected (the holder logs it and writes it to
    ``sys.rejects``, never takes it as its clock). Pure."""
    holder = holders.get(tick.epoch)
    if holder is None:
        return f"tick of epoch {tick.epoch}, which no claim names"
    if holder != tick.holder_id:
        return (f"tick of epoch {tick.epoch} names holder {tick.holder_id!r}; the epoch's "
                f"holder is {holder!r}")
    return None


def pending_summary(core: Core) -> list[dict[str, Any]]:
    """The pending effects as plain dicts (for printing)."""
    return [asdict(p) for p in core.pending.values()]
