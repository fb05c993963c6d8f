"""The step API: what a workload author writes against.

A workload is a deterministic fold ``step(state, event) -> (state, outputs)``. The event is either
an :class:`InputEvent` (a record from ``wl.<id>.in``) or an :class:`EffectResult` (the one answer
merged for a request the workload issued earlier). The step gets no clock and no randomness: time is
``event.time_ms``, the broker's append time of the record that was merged.

Outputs are built with :func:`emit` (a plain output), :func:`infer` (an inference request) and
:func:`actuate` (an actuation request with an absolute set-point), or :func:`request` for any other
effect kind the spec binds.
"""

from __future__ import annotations

import inspect
import json
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from broker_schema import (
    INFERENCE_KIND,
    Body,
    ChunkRef,
    ErrorInfo,
    InlineBody,
    Outcome,
    StreamRef,
    canonical_json,
    content_hash,
    sha256_hex,
)

#: A workload state: any JSON value (dicts, lists, str, int, float, bool, None).
State: TypeAlias = Any

__all__ = [
    "EffectResult",
    "Emit",
    "Event",
    "InputEvent",
    "Output",
    "Request",
    "State",
    "Workload",
    "WorkloadError",
    "actuate",
    "body_of",
    "emit",
    "infer",
    "module_hash",
    "recall",
    "request",
    "state_bytes",
    "state_hash",
]


class WorkloadError(Exception):
    """A workload broke a rule of the fold (unbound model, unbound kind, outstanding limit...).

    It is deterministic: the same log raises it at the same ``seq`` live and in replay, so the
    holder stops rather than guess. ``code`` is stable; the message is for people.
    """

    def __init__(self, code: str, message: str, *, seq: int | None = None) -> None:
        where = f" (step at seq {seq})" if seq is not None else ""
        super().__init__(f"{code}: {message}{where}")
        self.code = code
        self.seq = seq


def _body_bytes(body: Body, resolved: bytes | None, unreadable: str | None) -> bytes:
    if isinstance(body, InlineBody):
        return body.raw()
    if resolved is not None:
        return resolved
    why = f": {unreadable}" if unreadable else ""
    raise TypeError(f"body is a {body.type} reference the runtime did not read{why}; pass it on "
                    "as is")


def _json_value(body: Body, resolved: bytes | None, unreadable: str | None) -> Any:
    if isinstance(body, InlineBody) and body.encoding == "json":
        return body.data
    return json.loads(_body_bytes(body, resolved, unreadable))


@dataclass(frozen=True, slots=True)
class InputEvent:
    """A record from ``wl.<id>.in`` as the step sees it.

    ``seq`` is the merge position (the ``input_offset`` of any output this step returns),
    ``offset`` the record's offset on ``.in``, ``time_ms`` its broker append time.

    A chunk or stream reference in ``body`` stays a reference (a request can pass it on as its
    input), and the runtime has read what it names before the step runs: ``resolved`` holds those
    bytes, hash-checked, and :meth:`json`, :meth:`text` and :meth:`bytes` read them as they read
    an inline body. A reference the workload may not read (another workload's chunk or stream,
    unless the spec grants it) is not read: ``unreadable`` says why, and those methods raise
    ``TypeError``.
    """

    seq: int
    time_ms: int
    offset: int
    body: Body
    source: str | None = None
    resolved: bytes | None = field(default=None, repr=False)
    unreadable: str | None = None

    def json(self) -> Any:
        """The body's JSON value (inline ``json`` bodies), or its bytes parsed as JSON."""
        return _json_value(self.body, self.resolved, self.unreadable)

    def text(self) -> str:
        """The body as UTF-8 text."""
        return self.bytes().decode("utf-8")

    def bytes(self) -> bytes:
        """The body's bytes (decoded base64, UTF-8 text, canonical JSON, or what a reference
        names)."""
        return _body_bytes(self.body, self.resolved, self.unreadable)


@dataclass(frozen=True, slots=True)
class EffectResult:
    """The one answer the step sees for a request it issued.

    ``input_offset`` and ``index`` are the request's slot: the ``seq`` of the step that issued it
    and its position among that step's outputs, so a step can find what it asked for. ``outcome``
    is ``ok``, ``error`` (see ``error.code`` and ``error.retriable``), ``timeout`` (nobody accepted
    it by its deadline; nothing was done), ``unknown`` (accepted, then the executor's lease lapsed;
    it may have acted) or ``backpressure``. A chunk or stream reference in ``output`` is read by
    the runtime before the step runs, as for :class:`InputEvent` (``resolved``, ``unreadable``).
    """

    seq: int
    time_ms: int
    effect_id: str
    input_offset: int
    index: int
    outcome: Outcome
    output: Body | None = None
    error: ErrorInfo | None = None
    model_hash: str | None = None
    written_by: str = ""
    resolved: bytes | None = field(default=None, repr=False)
    unreadable: str | None = None

    @property
    def ok(self) -> bool:
        """True for an ``ok`` outcome."""
        return self.outcome == "ok"

    @property
    def slot(self) -> tuple[int, int]:
        """``(input_offset, index)`` of the request this answers."""
        return (self.input_offset, self.index)

    def json(self) -> Any:
        """The output's JSON value (``ok`` outcomes)."""
        if self.output is None:
            raise ValueError(f"a {self.outcome} outcome has no output")
        return _json_value(self.output, self.resolved, self.unreadable)

    def bytes(self) -> bytes:
        """The output's bytes (``ok`` outcomes)."""
        if self.output is None:
            raise ValueError(f"a {self.outcome} outcome has no output")
        return _body_bytes(self.output, self.resolved, self.unreadable)


Event: TypeAlias = InputEvent | EffectResult


@dataclass(frozen=True, slots=True)
class Emit:
    """A plain output (a decision, a log line...): becomes an ``output`` record on ``.out``."""

    body: Body


@dataclass(frozen=True, slots=True)
class Request:
    """An effect request: becomes a ``request`` record on ``.out``; its header is its id.

    ``model`` is a model name (resolved through the spec's bindings in force at the step's
    ``seq``) or a ``sha256:`` hash (which the spec must bind). ``deadline_ms`` of None means the
    spec's ``deadline_default_ms``. ``reissue_of``: the effect id of the original request when
    this one re-asks it after ``unknown`` (:func:`workload_sdk.reissue`; docs/actuation.md).
    """

    effect_kind: str
    model: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    input: Body | None = None
    deadline_ms: int | None = None
    reissue_of: str | None = None


Output: TypeAlias = Emit | Request

#: The outcomes :func:`reask` re-asks after by default: nothing was done (``timeout``: nobody
#: accepted it; ``backpressure``: refused for a full queue), so asking again is always safe.
REASK_ON: tuple[str, ...] = ("backpressure", "timeout")


def remember(req: Request) -> dict[str, Any]:
    """``req`` as a JSON value to keep in the state, for :func:`reask` (or
    :func:`workload_sdk.reissue`) to issue again."""
    kept = {
        "effect_kind": req.effect_kind, "model": req.model, "params": dict(req.params),
        "input": None if req.input is None else req.input.model_dump(mode="json"),
        "deadline_ms": req.deadline_ms, "attempt": 1,
    }
    if req.reissue_of is not None:
        kept["reissue_of"] = req.reissue_of
    return kept


def recall(remembered: Mapping[str, Any], *, reissue_of: str | None = None) -> Request:
    """The request :func:`remember` made ``remembered`` of (kind, model name, params, input,
    deadline), as a reissue of ``reissue_of`` when given."""
    raw_input = remembered.get("input")
    body: Body | None = None
    if raw_input is not None:
        from pydantic import TypeAdapter

        body = TypeAdapter(Body).validate_python(raw_input)
    return Request(effect_kind=str(remembered["effect_kind"]), model=remembered.get("model"),
                   params=dict(remembered.get("params") or {}), input=body,
                   deadline_ms=remembered.get("deadline_ms"), reissue_of=reissue_of)


def reask(event: EffectResult, remembered: Mapping[str, Any] | None, *,
          max_attempts: int = 3, on: Sequence[str] = REASK_ON
          ) -> tuple[Request, dict[str, Any]] | None:
    """Ask again after ``backpressure`` or ``timeout``, in one line::

        if (again := reask(event, asked.get(slot))) is not None:
            request, asked[f"{event.seq}/0"] = again
            return new, [request]

    ``remembered`` is what :func:`remember` made of the request ``event`` answers (None: nothing
    to re-ask). Returns the same request (kind, model name, params, input, deadline) and what to
    remember of it (its attempt count one higher) when ``event.outcome`` is in ``on`` and fewer
    than ``max_attempts`` attempts were made; otherwise None (an ``ok``, an ``error``, an
    ``unknown``, or attempts used up). ``unknown`` is not re-asked by default: the executor may
    have acted (add it to ``on`` only for idempotent kinds). The new request is another effect
    (another slot, another id); the holder paces inputs after ``backpressure``
    (docs/workloads.md), so re-asking does not feed a storm."""
    if remembered is None or event.outcome not in on:
        return None
    attempt = int(remembered.get("attempt", 1))
    if attempt >= max_attempts:
        return None
    return recall(remembered), dict(remembered, attempt=attempt + 1)


def body_of(value: Body | bytes | str | Any, *, media_type: str | None = None) -> Body:
    """A body from a value: bodies and references pass through, ``bytes`` become base64,
    ``str`` UTF-8 text, anything else inline JSON."""
    if isinstance(value, InlineBody | ChunkRef | StreamRef):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return InlineBody.of_bytes(bytes(value), media_type=media_type)
    if isinstance(value, str):
        return InlineBody.of_text(value, media_type=media_type)
    return InlineBody.of_json(value, media_type=media_type)


def emit(value: Body | bytes | str | Any, *, media_type: str | None = None) -> Emit:
    """A plain output carrying ``value`` (see :func:`body_of` for how values become bodies)."""
    return Emit(body=body_of(value, media_type=media_type))


def infer(
    *,
    model: str,
    params: Mapping[str, Any] | None = None,
    input: Body | bytes | str | Any = None,
    deadline_ms: int | None = None,
    media_type: str | None = None,
) -> Request:
    """An inference request (``ninelives:inference/run@0.1.0``).

    ``model`` is a bound model name or a ``sha256:`` hash; ``params`` every parameter that
    changes the result (missing ones mean the interface's documented default); ``input`` the
    input (inline value, or a chunk/stream reference); ``deadline_ms`` counts from the request's
    broker append time.
    """
    body = None if input is None else body_of(input, media_type=media_type)
    return Request(effect_kind=INFERENCE_KIND, model=model, params=dict(params or {}),
                   input=body, deadline_ms=deadline_ms)


def actuate(
    kind: str,
    *,
    set_point: Any,
    device: str | None = None,
    params: Mapping[str, Any] | None = None,
    deadline_ms: int | None = None,
) -> Request:
    """An actuation request of effect kind ``kind`` with an absolute ``set_point``.

    Prefer absolute set-points to deltas: a reissue after ``unknown`` is then safe to repeat.
    ``set_point`` travels in ``params["set_point"]``, ``device`` (a device the gateway's kind
    may set; its first by default) in ``params["device"]``.
    """
    merged = dict(params or {})
    merged["set_point"] = set_point
    if device is not None:
        merged["device"] = device
    return Request(effect_kind=kind, params=merged, deadline_ms=deadline_ms)


def request(
    kind: str,
    *,
    model: str | None = None,
    params: Mapping[str, Any] | None = None,
    input: Body | bytes | str | Any = None,
    deadline_ms: int | None = None,
) -> Request:
    """A request of any effect kind the spec binds."""
    body = None if input is None else body_of(input)
    return Request(effect_kind=kind, model=model, params=dict(params or {}), input=body,
                   deadline_ms=deadline_ms)


class Workload(ABC):
    """Base class of a workload: a deterministic fold over merged inputs and answers.

    Subclasses implement :meth:`initial_state` and :meth:`step`. The step must be a pure function
    of ``(state, event)``: no clock, no randomness, no I/O, no model calls. Treat ``state`` as
    immutable (return a new value). The holder checks that the state is JSON (canonical bytes)
    after every step.
    """

    @abstractmethod
    def initial_state(self) -> State:
        """The state before the first step (a JSON value)."""

    @abstractmethod
    def step(self, state: State, event: Event) -> tuple[State, Sequence[Output]]:
        """Fold one merged event into the state; return the new state and the outputs."""


def state_bytes(state: State) -> bytes:
    """The canonical bytes (RFC 8785) of a state."""
    return canonical_json(state)


def state_hash(state: State) -> str:
    """``sha256:<hex>`` of the state's canonical bytes."""
    return content_hash(state)


def module_hash(workload: Workload | type[Workload]) -> str:
    """``sha256:<hex>`` of the source file that defines the workload's class.

    This is what a spec's ``module_hash`` names; the holder refuses to run a module whose hash
    differs from the spec's.
    """
    cls = workload if isinstance(workload, type) else type(workload)
    module = sys.modules[cls.__module__]
    try:
        path = inspect.getsourcefile(module)
    except TypeError:
        path = None
    if path is None:
        source = inspect.getsource(cls).encode("utf-8")
    else:
        with open(path, "rb") as fh:
            source = fh.read()
    return sha256_hex(source)

