"""Record kinds of the wire contract: one frozen pydantic model per kind.

Every record carries ``kind`` (the discriminator) and ``v`` (its schema version). Models forbid
extra fields and validate strictly, so a producer that drifts from the contract is caught at the
first consumer. Lists are tuples so a decoded record cannot be changed in place.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from broker_schema._errors import DecodeCode
from broker_schema.canonical import HASH_PATTERN, canonical_json, json_string, sha256_hex
from broker_schema.limits import INLINE_MAX_BYTES, MAX_WORKLOAD_ID_LEN

SCHEMA_VERSION: Literal[1] = 1

#: ``sha256:<64 lowercase hex>``: models, chunks, specs, modules, states.
Hash = Annotated[str, Field(pattern=HASH_PATTERN)]
WorkloadId = Annotated[
    str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=MAX_WORKLOAD_ID_LEN)
]
#: A topic a spec may grant to its requests' stream references: a workload stream.
InputTopic = Annotated[
    str,
    Field(pattern=r"^wl\.[A-Za-z0-9][A-Za-z0-9_-]*\.(in|spec|claims|out|resp|merge)$",
          max_length=MAX_WORKLOAD_ID_LEN + 10),
]
#: An effect kind with its interface version, e.g. ``ninelives:inference/run@0.1.0``.
_NAME = r"[a-z0-9][a-z0-9._-]*"
EffectKind = Annotated[str, Field(pattern=rf"^{_NAME}:{_NAME}(/{_NAME})*@\d+\.\d+\.\d+$")]
ShadowName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)]
NodeId = Annotated[str, Field(min_length=1, max_length=200)]
Offset = Annotated[int, Field(ge=0, le=2**53 - 1)]
Epoch = Annotated[int, Field(ge=1, le=2**53 - 1)]
Millis = Annotated[int, Field(ge=0, le=2**53 - 1)]
Micros = Annotated[int, Field(ge=0, le=2**53 - 1)]

#: The inference interface served by executors.
INFERENCE_KIND = "ninelives:inference/run@0.1.0"

Outcome = Literal["ok", "error", "timeout", "unknown", "backpressure"]
#: The outcomes only a lease holder writes (unsigned by design: its transactional producer and
#: the ACLs on ``.resp`` vouch for them, not a node key); the one home of that list.
HolderOutcome = Literal["timeout", "unknown"]
HOLDER_OUTCOMES: frozenset[str] = frozenset(get_args(HolderOutcome))

#: What repeating an actuation command can do, declared per effect kind by a spec
#: (``SpecRecord.guarantees``) and by the node that serves it (``KindServed.guarantee``);
#: docs/actuation.md. ``idempotent``: repeating it is harmless (an absolute set-point);
#: ``fenced``: the gateway remembers the highest epoch per device and workload and refuses lower
#: ones; ``at-most-once``: the gateway remembers the effect ids it attempted and refuses a repeat,
#: and an ``unknown`` outcome raises an alarm on ``sys.alarms`` instead of anything that retries.
Guarantee = Literal["idempotent", "fenced", "at-most-once"]

#: Closed set of error codes carried by ``error`` outcomes.
ErrorCode = Literal[
    "model_unknown",  # the executor holds no model with that hash
    "model_hash_mismatch",  # the stored model file does not hash to its name (tampered, truncated)
    "model_unbound",  # the workload's spec does not bind that model hash
    "kind_unbound",  # the workload's spec does not bind that effect kind
    "kind_unsupported",  # this executor does not serve the kind
    "stale_epoch",  # the request's epoch is lower than the highest claim seen
    "deadline_passed",  # the request's deadline had passed when the executor read it
    "no_spec",  # the executor has seen no spec for the workload
    "shadow_unknown",  # a shadow request names an evaluation with no definition on its .eval
    "input_missing",  # a referenced input (chunk, stream record) could not be read
    "input_forbidden",  # the input names a stream the request may not read (not its own .in)
    "input_hash_mismatch",  # a referenced input did not hash to its reference
    "input_invalid",  # the input is not what the model's interface expects
    "params_invalid",  # a parameter is unknown or out of range for the interface
    "engine_error",  # the engine failed while running
    "parity_gate_refused",  # the node's backend failed its parity gate and it serves no fallback
    "output_too_large",  # the output could not be stored inline or as a chunk
    "shutdown",  # the executor was stopping and abandoned the request explicitly
    "guarantee_mismatch",  # the spec declares another guarantee for the kind than served here
    "duplicate_effect",  # an at-most-once command (or a reissue of it) was already attempted
    "device_unreachable",  # the device could not be reached; nothing was written to it
    "device_refused",  # the device answered the write with an exception; nothing changed
    "readback_mismatch",  # the device took the write but reads back another value
    "ledger_refused",  # the node's receipt ledger holds a leaf it did not append: no receipt
    "internal",  # a bug; the message says more
]

#: The error codes after which reissuing the request can succeed (another node, or this one
#: once fixed or restarted, may serve it); every other :data:`ErrorCode` is final.
_RETRIABLE_CODES: frozenset[ErrorCode] = frozenset({
    "model_unknown",
    "model_hash_mismatch",
    "kind_unsupported",
    "deadline_passed",
    "no_spec",
    "engine_error",
    "parity_gate_refused",
    "shutdown",
    "device_unreachable",
    "ledger_refused",
    "internal",
})
#: Whether reissuing a request that ended in this error can succeed (as data, not as classes),
#: for every :data:`ErrorCode` in its order.
ERROR_RETRIABLE: dict[str, bool] = {code: code in _RETRIABLE_CODES for code in get_args(ErrorCode)}

#: Why the lease holder passed over a response instead of merging it.
PassOverReason = Literal[
    "duplicate",  # an answer for this effect id was already merged
    "after_outcome",  # a timeout or unknown for this effect id was already merged
    "unknown_effect",  # no request with this effect id was ever written
    "not_an_answer",  # an accepted record: it is bookkeeping, the step never sees it
    # an answer (or accepted) to a request the holder did not write for this effect id: its
    # request_hash is not the hash of the holder's request (a front-running stray's answer)
    "foreign_request",
    # an executor's answer without a signature, under the spec's ``unsigned = "refuse"``
    "unsigned",
    # a signed answer whose signature does not verify with a key the spec's ``signers`` trusts
    # for the answering node (or from a node it does not list)
    "untrusted_key",
    # an input skipped on the record (:class:`SkipNote` says why: its reference could not be
    # read within the spec's ``input_policy``, its step raised, or an operator skipped it)
    "quarantined",
]

#: Why an input was skipped (``MergeEntry.skip``): ``unresolvable`` (its chunk or stream
#: reference could not be read by the deadline of the spec's ``input_policy``), ``step_raised``
#: (the step raised on it; the state is as before it), ``operator`` (``fx workload skip``).
SkipCause = Literal["unresolvable", "step_raised", "operator"]

#: Where a workload's chunks are stored, one store for every service (docs/operations.md,
#: "One chunk store"): ``kafka`` (the compacted ``sys.chunks``) or ``fs`` (a directory every
#: service shares).
ChunkStoreKind = Literal["kafka", "fs"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


# --------------------------------------------------------------------------------------- bodies


#: Base64 strings that passed the strict check, by ``id`` (the string itself kept, so the id
#: cannot be another string's while it is here). Pydantic runs a model's after-validator again on
#: an instance passed as a field, so the same body object is checked each time a record holding it
#: is built (a step's request that passes an input's body on, in the holder and in replay); the
#: check is a pure function of the (immutable) string, so a string already checked is not checked
#: again. Only successes are kept; the table is emptied when full (64 strings of at most 64 KiB).
_BASE64_CHECKED: dict[int, str] = {}
_BASE64_CHECKED_MAX = 64


_BASE64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _check_base64(text: str) -> None:
    """Raise :class:`binascii.Error` unless ``text`` is strict base64 (standard alphabet, padded):
    ``base64.b64decode(text, validate=True)``, done once per string object.

    A string of whole quads of the alphabet, with at most ``==`` at its end, is strict base64
    (a subset of what the decoder accepts, checked exhaustively against it by a unit test); it
    is recognised in one C pass (``bytes.translate``) without decoding. Anything else goes to
    the decoder, which accepts it or raises its own error."""
    if _BASE64_CHECKED.get(id(text)) is text:
        return
    plain = False
    if text.isascii() and len(text) % 4 == 0:
        data = text.encode("ascii")
        rest = data.translate(None, _BASE64_ALPHABET)
        plain = rest == b"" or (rest in (b"=", b"==") and data.endswith(rest))
    if not plain:
        base64.b64decode(text, validate=True)
    if len(_BASE64_CHECKED) >= _BASE64_CHECKED_MAX:
        _BASE64_CHECKED.clear()
    _BASE64_CHECKED[id(text)] = text


def inline_size(encoding: Literal["json", "utf8", "base64"], data: Any) -> int:
    """How many bytes an inline body of ``encoding`` and ``data`` counts against
    ``INLINE_MAX_BYTES``: the canonical JSON bytes of ``data`` (base64 needs no escaping: its
    canonical bytes are the text in quotes)."""
    if encoding == "base64":
        return len(str(data)) + 2
    return len(json_string(data)) if isinstance(data, str) else len(canonical_json(data))


class InlineBody(_Model):
    """A body carried in the record, up to ``INLINE_MAX_BYTES``.

    ``encoding`` says how ``data`` is to be read: ``json`` (any JSON value), ``utf8`` (a string of
    text) or ``base64`` (bytes, standard alphabet with padding).
    """

    type: Literal["inline"] = "inline"
    encoding: Literal["json", "utf8", "base64"]
    data: JsonValue
    media_type: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.encoding in ("utf8", "base64") and not isinstance(self.data, str):
            raise ValueError(f"{self.encoding} body data must be a string")
        if self.encoding == "base64":
            try:
                _check_base64(str(self.data))
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"base64 body data is not valid base64: {exc}") from exc
        size = inline_size(self.encoding, self.data)
        if size > INLINE_MAX_BYTES:
            raise ValueError(f"inline body is {size} bytes, limit is {INLINE_MAX_BYTES}")
        return self

    @classmethod
    def of_json(cls, value: JsonValue, *, media_type: str | None = None) -> InlineBody:
        """An inline JSON body."""
        return cls(encoding="json", data=value, media_type=media_type)

    @classmethod
    def of_text(cls, text: str, *, media_type: str | None = None) -> InlineBody:
        """An inline UTF-8 text body."""
        return cls(encoding="utf8", data=text, media_type=media_type)

    @classmethod
    def of_bytes(cls, data: bytes, *, media_type: str | None = None) -> InlineBody:
        """An inline binary body (base64 on the wire)."""
        return cls(encoding="base64", data=base64.b64encode(data).decode("ascii"),
                   media_type=media_type)

    def raw(self) -> bytes:
        """The body as bytes: decoded base64, UTF-8 text, or canonical JSON."""
        if self.encoding == "base64":
            return base64.b64decode(str(self.data))
        if self.encoding == "utf8":
            return str(self.data).encode("utf-8")
        return canonical_json(self.data)


class ChunkRef(_Model):
    """A body stored in the chunk store, named by the sha256 of its bytes.

    Chunks are stored per workload: a chunk belongs to the workload it was stored for, and a
    request reads it only from there. ``workload`` names the owner when it is not the
    workload the reference is read in (the request's, or for a reference inside a stream
    record, the workload of that record's topic); reading another workload's chunks needs that
    workload in the reader's ``SpecRecord.chunks_from``. Left out of the canonical bytes when
    None, so references written before the field existed keep their bytes and hash.
    """

    type: Literal["chunk"] = "chunk"
    hash: Hash
    size: Annotated[int, Field(ge=0, le=2**53 - 1)]
    media_type: str | None = None
    workload: WorkloadId | None = Field(default=None, exclude_if=lambda v: v is None)


class StreamRef(_Model):
    """A body that is another record: topic, partition and offset (and optionally its hash)."""

    type: Literal["stream"] = "stream"
    topic: Annotated[str, Field(min_length=1, max_length=249)]
    partition: Annotated[int, Field(ge=0)] = 0
    offset: Offset
    hash: Hash | None = None


Body = Annotated[InlineBody | ChunkRef | StreamRef, Field(discriminator="type")]


# --------------------------------------------------------------------------------------- parts


class EffectHeader(_Model):
    """Where an output came from. It *is* the effect id: see :attr:`effect_id`.

    ``input_offset`` is the merge position (``seq`` of the merge entry) of the step input that
    produced the output; ``index`` is the output's position among that step's outputs; ``epoch``
    is the lease epoch of the holder that wrote it. Shadow evaluations set ``shadow`` to the
    evaluation's name so their ids never collide with live ones.
    """

    workload_id: WorkloadId
    input_offset: Offset
    index: Annotated[int, Field(ge=0, le=2**31 - 1)]
    epoch: Epoch
    shadow: ShadowName | None = None

    @property
    def effect_id(self) -> str:
        """``<workload>/<input_offset>/<index>@<epoch>``; shadows prefix ``shadow:<name>/``.

        The one place the effect id is spelled; :func:`parse_effect_id` reads it back."""
        base = f"{self.workload_id}/{self.input_offset}/{self.index}@{self.epoch}"
        return f"shadow:{self.shadow}/{base}" if self.shadow else base

    @property
    def slot(self) -> tuple[int, int]:
        """``(input_offset, index)``: the output slot, written exactly once across fail-over."""
        return (self.input_offset, self.index)


_EFFECT_ID_RE = re.compile(
    r"^(?:shadow:(?P<shadow>[A-Za-z0-9][A-Za-z0-9_.-]*)/)?(?P<workload_id>[A-Za-z0-9][A-Za-z0-9_-]*)"
    r"/(?P<input_offset>0|[1-9][0-9]*)/(?P<index>0|[1-9][0-9]*)@(?P<epoch>[1-9][0-9]*)$"
)


def parse_effect_id(effect_id: str) -> EffectHeader:
    """The header an effect id spells (the inverse of :attr:`EffectHeader.effect_id`).

    Raises ``ValueError`` for anything :attr:`EffectHeader.effect_id` would not have written
    (leading zeros, signs, white space, out-of-range numbers, a bad workload or shadow name)."""
    match = _EFFECT_ID_RE.fullmatch(effect_id) if len(effect_id) <= 512 else None
    if match is None:
        raise ValueError(f"{effect_id[:120]!r} is not an effect id "
                         "(<workload>/<input_offset>/<index>@<epoch>)")
    try:
        header = EffectHeader(
            workload_id=match["workload_id"], input_offset=int(match["input_offset"]),
            index=int(match["index"]), epoch=int(match["epoch"]), shadow=match["shadow"])
    except ValidationError as exc:
        raise ValueError(f"{effect_id[:120]!r} is not an effect id: "
                         f"{exc.errors(include_url=False)[0]['msg']}") from None
    return header


def _effect_id_mismatch(effect_id: str, header: EffectHeader) -> PydanticCustomError:
    return PydanticCustomError(
        "effect_id_mismatch",
        "effect_id {effect_id} is not the id its header spells ({expected})",
        {"effect_id": effect_id[:120], "expected": header.effect_id},
    )


class BindingSwitch(_Model):
    """New model bindings that take effect for step inputs at or after ``at_input_offset``."""

    at_input_offset: Offset
    models: dict[str, Hash]


#: A Python class name (``fx workload deploy --module file.py:Class``).
ClassName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=100)]
#: Largest workload module source kept in the module store (one record on ``sys.modules``).
MODULE_SOURCE_MAX_CHARS = 512 * 1024


#: A registered model's name (``fx models register NAME@VERSION``).
ModelNameText = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=100)]
#: A registered model's version (after the ``@``).
ModelVersion = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$", max_length=64)]
#: An alias of one version of a model (``prod``, ``canary``).
ModelAlias = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]*$", max_length=40)]
#: Largest licence notice kept with a registered model.
LICENCE_MAX_CHARS = 64 * 1024


class ModelName(_Model):
    """The registry name a hash was given by when a spec, upgrade, rollback or shadow was
    written (``NAME@VERSION``, or ``NAME@ALIAS`` with ``alias`` set): resolved once, at write
    time, and kept on the record beside the hash, so replay never resolves again. Only the
    hash is ever compared; the name is for people."""

    name: ModelNameText
    version: ModelVersion
    alias: ModelAlias | None = Field(default=None, exclude_if=lambda v: v is None)

    def text(self) -> str:
        """``name@version`` (``name@alias=version`` when it was named by an alias)."""
        if self.alias is not None:
            return f"{self.name}@{self.alias}={self.version}"
        return f"{self.name}@{self.version}"


def _names_cover(names: dict[str, ModelName], hashes: set[str], where: str) -> None:
    stray = sorted(set(names) - hashes)
    if stray:
        raise ValueError(f"model_names names hashes {where} does not bind: {stray}")


class ModuleSwitch(_Model):
    """Workload code that runs the steps from ``at_step`` on (``fx workload deploy``): the
    module's hash (:func:`workload_sdk.module_hash`; its source is a :class:`ModuleRecord` on
    ``sys.modules``) and the workload class in it. The rule: :meth:`SpecRecord.module_at`."""

    at_step: Offset
    module_hash: Hash
    workload_class: ClassName


class ErrorInfo(_Model):
    """The error of an ``error`` outcome: a code from the closed set and a message for people."""

    code: ErrorCode
    message: Annotated[str, Field(max_length=4096)] = ""

    @property
    def retriable(self) -> bool:
        """Whether reissuing the request can succeed (see :data:`ERROR_RETRIABLE`)."""
        return ERROR_RETRIABLE[self.code]


class ExecutorInfo(_Model):
    """Which executor produced a response, with what."""

    node_id: NodeId
    engine: str
    engine_version: str
    device_class: str
    #: The execution provider that ran the model, where the engine has several (ONNX Runtime:
    #: ``CUDAExecutionProvider`` or ``CPUExecutionProvider``). Optional and left out of the
    #: canonical bytes when null (engines without providers write what they wrote before).
    provider: Annotated[str, Field(min_length=1, max_length=60)] | None = Field(
        default=None, exclude_if=lambda v: v is None)


class Timing(_Model):
    """Executor-clock times in microseconds since the epoch. For people only; never compared."""

    received_us: Micros
    started_us: Micros | None = None
    finished_us: Micros | None = None


class Signature(_Model):
    """A signature over the record's canonical bytes with ``signature`` set to null: ``alg`` is
    the signing key's type (:mod:`broker_schema.signatures`), ``value`` the base64 of the 64
    signature bytes."""

    alg: Literal["ed25519", "secp256k1"] = "ed25519"
    key_id: Hash
    value: Annotated[str, Field(pattern=r"^[A-Za-z0-9+/]+={0,2}$", max_length=200)]


class KindServed(_Model):
    """An effect kind (with its version) an executor serves, and its queue limit.

    ``guarantee``: what repeating one of its commands can do, for an actuation kind served by a
    gateway (None for inference and other kinds without side effects). Left out of the
    canonical bytes when None, so facts written before the field existed keep their bytes."""

    kind: EffectKind
    queue_limit: Annotated[int, Field(ge=1)]
    guarantee: Guarantee | None = Field(default=None, exclude_if=lambda v: v is None)


# --------------------------------------------------------------------------------------- records


class InputRecord(_Model):
    """An input on ``wl.<id>.in``. Its time is the broker's append time, not a field."""

    kind: Literal["input"] = "input"
    v: Literal[1] = SCHEMA_VERSION
    workload_id: WorkloadId
    body: Body
    source: str | None = None


class InputPolicy(_Model):
    """What the lease holder does with an input it cannot step (``SpecRecord.input_policy``).

    An input whose chunk or stream reference cannot be read is read again until ``wait_ms``
    after the input's broker append time; then, with ``then = "quarantine"``, it is skipped on
    the record (a ``quarantined`` merge entry, ``skip.cause = "unresolvable"``) and an alarm is
    raised, and later inputs are merged as ever; with ``then = "stop"`` the holder stops there
    naming it (nothing is merged past it). A reference that can never be read (bytes that are
    not the reference's) is not waited for. ``on_step_error``: an input whose step raises is
    skipped on the record (``step_raised``: the state is as before it) with ``quarantine``, or
    the holder stops with ``stop``."""

    wait_ms: Annotated[int, Field(ge=0, le=2**53 - 1)] = 30_000
    then: Literal["quarantine", "stop"] = "quarantine"
    on_step_error: Literal["quarantine", "stop"] = "quarantine"


class SkipNote(_Model):
    """Why an input was skipped on the record (``MergeEntry.skip``): the cause, what was wrong
    (the reference and why it cannot be read, the exception the step raised, the operator's
    reason), and for an operator's skip who ordered it and where (``.spec`` offset of the
    ``skip_order``)."""

    cause: SkipCause
    detail: Annotated[str, Field(max_length=4096)]
    principal: NodeId | None = Field(default=None, exclude_if=lambda v: v is None)
    order_offset: Offset | None = Field(default=None, exclude_if=lambda v: v is None)


class SpecRecord(_Model):
    """A workload spec on ``wl.<id>.spec``: module, effect kinds and models bound, limits."""

    kind: Literal["spec"] = "spec"
    v: Literal[1] = SCHEMA_VERSION
    workload_id: WorkloadId
    module_hash: Hash
    effect_kinds: tuple[EffectKind, ...]
    #: model name -> content hash, in force from input offset 0 until the first switch.
    models: dict[str, Hash] = Field(default_factory=dict)
    binding_switches: tuple[BindingSwitch, ...] = ()
    outstanding_limit: Annotated[int, Field(ge=1, le=1_000_000)] = 16
    deadline_default_ms: Annotated[int, Field(ge=1, le=2**53 - 1)] = 5_000
    #: How long after ``accepted`` the lease holder waits before writing ``unknown``.
    executor_lease_ms: Annotated[int, Field(ge=1, le=2**53 - 1)] = 30_000
    #: Response and merge records are kept at least this long (None: forever).
    audit_horizon_ms: Millis | None = None
    snapshot_every: Annotated[int, Field(ge=1, le=1_000_000)] = 100
    #: Topics beyond the workload's own ``wl.<id>.in`` that its requests' stream references may
    #: name (workload topics only, ``wl.<id>.<stream>``; never ``sys.*``). Optional and left out
    #: of the canonical bytes when empty, so a spec granting nothing keeps the bytes and hash it
    #: had before the field existed; a decoder that predates it refuses a spec that grants
    #: (``invalid_record``): it fails closed, never reads a grant as nothing.
    input_topics: tuple[InputTopic, ...] = Field(default=(), exclude_if=lambda v: not v,
                                                 max_length=64)
    #: Workloads beyond this one whose chunks its requests' chunk references may name (with
    #: ``ChunkRef.workload``). Optional and left out of the canonical bytes when empty, like
    #: ``input_topics``.
    chunks_from: tuple[WorkloadId, ...] = Field(default=(), exclude_if=lambda v: not v,
                                                max_length=64)
    #: Mode A (experimental): integer models the step runs itself, name -> content hash of the
    #: integer artifact. The holder and replay load exactly these bytes (hash-checked), so the
    #: spec's hash covers the weights. Left out of the canonical bytes when empty.
    local_models: dict[str, Hash] = Field(default_factory=dict, exclude_if=lambda v: not v,
                                          max_length=16)
    #: Mode A limit: tokens a step may have the local models generate or score, in all, so
    #: every node fails at the same input (``local_limit``). Left out when local_models is.
    local_max_tokens_per_step: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=64, exclude_if=lambda v: v == 64)
    #: The guarantee each actuation kind it binds must be served with (:data:`Guarantee`,
    #: docs/actuation.md): a gateway refuses a request whose kind it serves with another
    #: (``guarantee_mismatch``), placement looks for a node that serves it so, and the lease
    #: holder raises an alarm when an ``at-most-once`` request ends ``unknown``. Optional and
    #: left out of the canonical bytes when empty, like ``input_topics``.
    guarantees: dict[EffectKind, Guarantee] = Field(default_factory=dict,
                                                    exclude_if=lambda v: not v)
    #: What the lease holder does with an executor's answer that carries no signature:
    #: ``count`` (merge it; the holder counts it, ``fx audit`` reports it) or ``refuse`` (pass
    #: it over as ``unsigned``: issue 30). ``fx workload spec`` writes ``refuse`` when it
    #: writes to a secured broker. Left out of the canonical bytes when ``count``.
    unsigned: Literal["count", "refuse"] = Field(default="count",
                                                 exclude_if=lambda v: v == "count")
    #: Node id -> the public keys (:func:`broker_schema.signatures.public_key_text`) whose
    #: signatures the holder trusts on that node's answers. When set, a signed answer that
    #: does not verify with one of its node's keys, or from a node not listed, is passed over
    #: as ``untrusted_key`` (the rule: :func:`broker_schema.signatures.answer_refusal`). Left
    #: out of the canonical bytes when empty.
    signers: dict[NodeId, tuple[Annotated[str, Field(max_length=200)], ...]] = Field(
        default_factory=dict, exclude_if=lambda v: not v, max_length=256)
    #: Model hashes written with ``--force`` although no node on ``sys.facts`` and no model
    #: store named held them when the spec was written (``fx workload spec``, ``fx upgrade``):
    #: the override, on the record. Left out of the canonical bytes when empty.
    unchecked_models: tuple[Hash, ...] = Field(default=(), exclude_if=lambda v: not v,
                                               max_length=64)
    #: New workload code from a step on (``fx workload deploy``): before the first switch the
    #: steps run ``module_hash``, from a switch's ``at_step`` on its module
    #: (:meth:`module_at`). Left out of the canonical bytes when empty, so a workload that
    #: never deployed new code keeps its spec bytes and hash.
    module_switches: tuple[ModuleSwitch, ...] = Field(default=(), exclude_if=lambda v: not v,
                                                      max_length=1000)
    #: What the holder does with an input it cannot step (:class:`InputPolicy`: wait 30 s for a
    #: reference, then skip it on the record; skip an input whose step raises). Left out of the
    #: canonical bytes at its default.
    input_policy: InputPolicy = Field(default_factory=InputPolicy,
                                      exclude_if=lambda v: v == InputPolicy())
    #: The chunk store every service of this workload uses (:data:`ChunkStoreKind`): a holder
    #: whose store is another refuses to start, naming both. Left out of the canonical bytes
    #: at its default, ``kafka``.
    chunk_store: ChunkStoreKind = Field(default="kafka", exclude_if=lambda v: v == "kafka")
    #: The registry names (``sys.models``) the operator gave for bound hashes, resolved when
    #: the spec was written (``fx workload spec --model NAME=smollm2@prod``, ``fx upgrade``,
    #: ``fx rollback``): hash -> :class:`ModelName`. For people (why, audit, the console,
    #: ``fx log``); only the hash is compared. Left out of the canonical bytes when empty.
    model_names: dict[Hash, ModelName] = Field(default_factory=dict, exclude_if=lambda v: not v,
                                               max_length=256)
    #: Every input must be redactable (``fx redact``): :class:`workload_sdk.InputWriter` (and
    #: ``fx workload input``) store every input body as a chunk, sealed under the workload's
    #: tenant key, however small, instead of inline (docs/security.md). Left out of the
    #: canonical bytes when false.
    redactable_inputs: bool = Field(default=False, exclude_if=lambda v: v is False)

    @model_validator(mode="after")
    def _check_switches(self) -> Self:
        offsets = [s.at_input_offset for s in self.binding_switches]
        if offsets != sorted(set(offsets)):
            raise ValueError("binding_switches must have strictly increasing at_input_offset")
        steps = [s.at_step for s in self.module_switches]
        if steps != sorted(set(steps)):
            raise ValueError("module_switches must have strictly increasing at_step")
        unbound = sorted(set(self.guarantees) - set(self.effect_kinds))
        if unbound:
            raise ValueError(f"guarantees names kinds the spec does not bind: {unbound}")
        _names_cover(self.model_names, self.bound_hashes(), "the spec")
        return self

    def bound_hashes(self) -> set[str]:
        """Every model hash the spec binds at some step (models, switches, local models)."""
        return {*self.models.values(), *self.local_models.values(),
                *(h for s in self.binding_switches for h in s.models.values())}

    def models_at(self, input_offset: int) -> dict[str, Hash]:
        """The model bindings in force for a step input at ``input_offset``."""
        bound = dict(self.models)
        for switch in self.binding_switches:
            if switch.at_input_offset <= input_offset:
                bound = dict(switch.models)
        return bound

    def module_at(self, seq: int) -> tuple[str, str | None]:
        """Which code runs step ``seq`` under this spec: ``(module hash, workload class)``,
        the class None before the first module switch (the spec's ``module_hash``, whose class
        the code at hand or the module store names). The one rule of which module runs a
        step: the holder, replay, diff, audit, ``fx why`` and shadow evaluations call it on the
        spec in force for the step (:func:`broker_schema.binding.spec_in_force`)."""
        found: tuple[str, str | None] = (self.module_hash, None)
        for switch in self.module_switches:
            if switch.at_step <= seq:
                found = (switch.module_hash, switch.workload_class)
        return found

    def module_hashes(self) -> tuple[str, ...]:
        """Every module this spec runs at some step: ``module_hash`` and each switch's, in
        order, without repeats."""
        return tuple(dict.fromkeys([self.module_hash,
                                    *(s.module_hash for s in self.module_switches)]))


class LocalEngineBuild(_Model):
    """The integer engine build a holder runs mode A on (``SpecRecord.local_models``): the
    engine and its version, the backend, and the CPU's instruction set (the machine and the
    SIMD extensions the float32 block dot products may use). Recorded in the holder's claim; a
    holder whose build differs from the last claim's refuses to take over unless ``--force``
    (recorded in ``ClaimRecord.forced``): docs/modes.md."""

    engine: Annotated[str, Field(min_length=1, max_length=100)]
    version: Annotated[str, Field(min_length=1, max_length=100)]
    backend: Annotated[str, Field(min_length=1, max_length=100)]
    #: ``<machine>:<extensions, sorted, comma-separated>``, e.g. ``x86_64:avx,avx2,fma``
    isa: Annotated[str, Field(min_length=1, max_length=300)]

    def text(self) -> str:
        """``engine version backend isa``, one line."""
        return f"{self.engine} {self.version} {self.backend} {self.isa}"


class ClaimRecord(_Model):
    """A lease claim on ``wl.<id>.claims``: epochs only grow; executors refuse lower ones."""

    kind: Literal["claim"] = "claim"
    v: Literal[1] = SCHEMA_VERSION
    workload_id: WorkloadId
    epoch: Epoch
    holder_id: NodeId
    spec_hash: Hash
    #: Offset of the spec record on ``wl.<id>.spec`` that ``spec_hash`` names.
    spec_offset: Offset
    #: None: the epoch's claim, its spec in force from the epoch's first step. Set: a spec
    #: *adoption* by the holder of this epoch (same epoch, a newer spec), in force from step
    #: ``from_seq`` on (:mod:`broker_schema.binding`). Left out of the canonical bytes when
    #: None, so claims written before the field existed keep their bytes and hash.
    from_seq: Offset | None = Field(default=None, exclude_if=lambda v: v is None)
    #: Set when the holder claimed with ``--force`` although no live node on ``sys.facts``
    #: served everything the spec binds: what was missing (``kind <kind>``, ``model <hash>``,
    #: ``kind <kind> as <guarantee>``), for the record. Left out of the canonical bytes when
    #: empty.
    forced: tuple[Annotated[str, Field(max_length=300)], ...] = Field(
        default=(), exclude_if=lambda v: not v, max_length=256)
    #: The public key (:func:`broker_schema.signatures.public_key_text`) of the holder of this
    #: epoch: every record it writes on ``.out`` carries its signature in the record header
    #: ``fx-holder-sig`` (:func:`broker_schema.signatures.holder_signature_problem`), and an
    #: executor answers only a request that does (issue 30: front-running). Left out of the
    #: canonical bytes when None (claims written before the field existed: no check).
    holder_key: Annotated[str, Field(max_length=200)] | None = Field(
        default=None, exclude_if=lambda v: v is None)
    #: Mode A: the integer engine build this holder runs the spec's ``local_models`` on
    #: (:class:`LocalEngineBuild`). Left out of the canonical bytes when None (no mode A
    #: models, or claims written before the field existed: no check).
    local_engine: LocalEngineBuild | None = Field(default=None, exclude_if=lambda v: v is None)


class OutputRecord(_Model):
    """A plain output of a step on ``wl.<id>.out`` (a decision, a log line, a set-point...)."""

    kind: Literal["output"] = "output"
    v: Literal[1] = SCHEMA_VERSION
    header: EffectHeader
    body: Body


class EffectRequest(_Model):
    """An effect request on ``wl.<id>.out``: its header is its id.

    ``params`` holds every parameter that changes the result; a missing one means the interface's
    documented default, never the engine's. ``deadline_ms`` counts from the broker append time of
    this record: it is a determinism input.
    """

    kind: Literal["request"] = "request"
    v: Literal[1] = SCHEMA_VERSION
    header: EffectHeader
    effect_kind: EffectKind
    model: Hash | None = None
    params: dict[str, JsonValue] = Field(default_factory=dict)
    input: Body | None = None
    deadline_ms: Annotated[int, Field(ge=1, le=2**53 - 1)]
    #: A reissue after ``unknown``: the effect id of the *original* request (the first of the
    #: chain, never a reissue's own id). The reissue is an effect of its own (its own slot, id
    #: and answer); a deduplicating gateway keys its memory on ``reissue_of`` so it can tell the
    #: command is the same one (docs/actuation.md). Left out of the canonical bytes when None.
    reissue_of: str | None = Field(default=None, exclude_if=lambda v: v is None,
                                   max_length=512)

    @model_validator(mode="after")
    def _check_reissue(self) -> Self:
        if self.reissue_of is not None:
            original = parse_effect_id(self.reissue_of)  # ValueError: invalid_record
            if (original.workload_id != self.header.workload_id
                    or original.shadow != self.header.shadow
                    or original.slot >= self.header.slot):
                raise ValueError(f"reissue_of {self.reissue_of} is not an earlier effect of "
                                 f"the same workload as {self.header.effect_id}")
        return self

    @property
    def effect_id(self) -> str:
        """The request's effect id (from its header)."""
        return self.header.effect_id

    @property
    def original_id(self) -> str:
        """The effect id a deduplicating gateway remembers: ``reissue_of``, else its own."""
        return self.reissue_of or self.header.effect_id


class AcceptedRecord(_Model):
    """Written by an executor to ``wl.<id>.resp`` before it runs a request."""

    kind: Literal["accepted"] = "accepted"
    v: Literal[1] = SCHEMA_VERSION
    effect_id: str
    header: EffectHeader
    request_offset: Offset
    node_id: NodeId
    #: The executor promises a response within this long of its accept (else: ``unknown``).
    lease_ms: Annotated[int, Field(ge=1, le=2**53 - 1)]
    accepted_us: Micros
    #: ``sha256:`` of the bytes of the request accepted (:func:`~broker_schema.codec.
    #: request_hash`): binds the accept to one request, not just to its effect id (issue 30).
    #: Left out of the canonical bytes when None (records written before the field existed).
    request_hash: Hash | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _check_effect_id(self) -> Self:
        if self.effect_id != self.header.effect_id:
            raise _effect_id_mismatch(self.effect_id, self.header)
        return self


class ResponseRecord(_Model):
    """An outcome on ``wl.<id>.resp``: from an executor, or ``timeout``/``unknown`` from the holder.

    ``model_hash`` is the hash of the model the executor actually loaded. ``signature`` covers the
    canonical bytes of this record with ``signature`` set to null (see :meth:`signing_bytes`).
    """

    kind: Literal["response"] = "response"
    v: Literal[1] = SCHEMA_VERSION
    effect_id: str
    header: EffectHeader
    request_offset: Offset
    outcome: Outcome
    error: ErrorInfo | None = None
    output: Body | None = None
    model_hash: Hash | None = None
    executor: ExecutorInfo | None = None
    timing: Timing | None = None
    #: Who wrote the record: an executor node id or a lease holder id.
    written_by: NodeId
    #: Engine-specific proof, e.g. the integer engine's hash-chained receipt.
    receipt: dict[str, JsonValue] | None = None
    signature: Signature | None = None
    #: ``sha256:`` of the bytes of the request answered (:func:`~broker_schema.codec.
    #: request_hash`), covered by the signature: the lease holder merges an answer only when it
    #: is the hash of the request it wrote for the effect id (``foreign_request`` otherwise).
    #: Left out of the canonical bytes when None (records written before the field existed).
    request_hash: Hash | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _check_outcome(self) -> Self:
        if self.effect_id != self.header.effect_id:
            raise _effect_id_mismatch(self.effect_id, self.header)
        if (self.outcome == "error") != (self.error is not None):
            raise ValueError("error is required exactly when outcome is 'error'")
        if self.outcome != "ok" and self.output is not None:
            raise ValueError("only an 'ok' outcome carries output")
        return self

    def signing_bytes(self) -> bytes:
        """Canonical bytes of this record with ``signature`` set to null: what is signed."""
        return canonical_json(self.model_copy(update={"signature": None}).model_dump(mode="json"))


class MergeEntry(_Model):
    """One position of the merge order on ``wl.<id>.merge``.

    ``seq`` is the logical merge position (0, 1, 2, ...), also the ``input_offset`` of the step
    that saw it. ``action`` is ``deliver`` (the step saw it) or ``pass_over`` with a ``reason``.
    Passed-over entries do not consume a ``seq``: they carry the ``seq`` of the next delivery.
    """

    kind: Literal["merge"] = "merge"
    v: Literal[1] = SCHEMA_VERSION
    workload_id: WorkloadId
    seq: Offset
    epoch: Epoch
    source: Literal["in", "resp"]
    source_offset: Offset
    effect_id: str | None = None
    action: Literal["deliver", "pass_over"]
    reason: PassOverReason | None = None
    #: Why an input was skipped (``reason = "quarantined"``, and only then): replay follows
    #: the recorded skip (and checks that a ``step_raised`` step raises again). Left out of
    #: the canonical bytes when None.
    skip: SkipNote | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _check_reason(self) -> Self:
        if (self.action == "pass_over") != (self.reason is not None):
            raise ValueError("reason is required exactly when action is 'pass_over'")
        if (self.reason == "quarantined") != (self.skip is not None):
            raise ValueError("skip is required exactly when reason is 'quarantined'")
        if self.skip is not None and self.source != "in":
            raise ValueError("only an input (source 'in') is skipped")
        # a well-formed effect id; it may name another workload: a pass-over records a response
        # on this workload's .resp whatever id it carries (``unknown_effect``)
        if self.effect_id is not None:
            try:
                parse_effect_id(self.effect_id)
            except ValueError as exc:
                raise PydanticCustomError("effect_id_mismatch", "{detail}",
                                          {"detail": str(exc)}) from None
        return self


class SnapshotRecord(_Model):
    """The workload state after the step inputs before ``seq``, on ``wl.<id>.merge``."""

    kind: Literal["snapshot"] = "snapshot"
    v: Literal[1] = SCHEMA_VERSION
    workload_id: WorkloadId
    seq: Offset
    epoch: Epoch
    state_hash: Hash
    state: Body
    #: Offsets on the source topics read so far, for resuming: {"in": n, "resp": m}.
    positions: dict[str, Offset] = Field(default_factory=dict)


class TickRecord(_Model):
    """A clock marker the lease holder appends to ``wl.<id>.resp``.

    The step never sees it. Its broker append time tells the holder how far the response stream has
    been read in time: every record before it on ``.resp`` was appended no later, so a deadline
    before that time with no ``accepted`` ahead of the tick is a ``timeout`` judged on the log, not
    on a timer (and an open executor transaction before it holds the tick back under
    ``read_committed``, so an ``accepted`` cannot be overtaken).
    """

    kind: Literal["tick"] = "tick"
    v: Literal[1] = SCHEMA_VERSION
    workload_id: WorkloadId
    epoch: Epoch
    holder_id: NodeId


class ParityGateFact(_Model):
    """One parity gate run (integer engine, docs/integer-engine.md "The parity gate"): the
    backend's canary runs against the numpy oracle's, byte for byte. ``serving`` is the backend
    that answers the model's requests: the gated one when it ``passed``; after a refusal the
    ``oracle`` (fallback) or null (``--parity-failure refuse``: ``parity_gate_refused``)."""

    model: Hash
    backend: Annotated[str, Field(min_length=1, max_length=40)]
    result: Literal["passed", "refused"]
    canary_set_hash: Hash
    serving: Annotated[str, Field(min_length=1, max_length=40)] | None
    #: the first difference (canary, step, what, detail) or the backend's error; null if passed
    mismatch: Annotated[str, Field(max_length=2000)] | None = None
    checked_us: Micros


class AcceleratorDevice(_Model):
    """One accelerator device as the node's probe found it (CUDA: CuPy's runtime API; fields
    the driver did not report are null)."""

    kind: Annotated[str, Field(min_length=1, max_length=40)]  # "cuda"
    index: Annotated[int, Field(ge=0, le=1024)]
    name: Annotated[str, Field(max_length=200)]
    memory_bytes: Annotated[int, Field(ge=0, le=2**53 - 1)] | None = None
    compute_capability: Annotated[str, Field(pattern=r"^[0-9]{1,3}\.[0-9]{1,3}$")] | None = None
    multiprocessors: Annotated[int, Field(ge=0, le=1 << 20)] | None = None
    driver_version: Annotated[str, Field(max_length=40)] | None = None
    runtime_version: Annotated[str, Field(max_length=40)] | None = None


class OnnxProviderFact(_Model):
    """The ONNX Runtime execution provider an executor runs its ONNX models with: what its
    config asked (``onnx_provider``: ``auto``, ``cuda`` or ``cpu``), what runs, and why that is
    not what was asked (CUDA asked but absent or failing: the CPU provider runs instead)."""

    asked: Literal["auto", "cuda", "cpu"]
    running: Annotated[str, Field(min_length=1, max_length=60)]
    reason: Annotated[str, Field(max_length=1000)] | None = None


class FactsRecord(_Model):
    """What an executor node serves, on ``sys.facts`` (compacted, keyed by node id).

    ``accelerators`` is the word list (``["cuda"]``) kept for older readers;
    ``accelerator_devices`` says what each device is; ``parity_gates`` the parity gate runs of
    the integer engine's models (one per model, the latest)."""

    kind: Literal["facts"] = "facts"
    v: Literal[1] = SCHEMA_VERSION
    node_id: NodeId
    kinds: tuple[KindServed, ...]
    models_present: tuple[Hash, ...] = ()
    models_loaded: tuple[Hash, ...] = ()
    engines: dict[str, str] = Field(default_factory=dict)
    accelerators: tuple[str, ...] = ()
    #: (absent when empty: a node that has none writes the facts an older node wrote)
    accelerator_devices: tuple[AcceleratorDevice, ...] = Field(
        default=(), exclude_if=lambda v: not v, max_length=64)
    parity_gates: tuple[ParityGateFact, ...] = Field(
        default=(), exclude_if=lambda v: not v, max_length=256)
    public_key: Annotated[str, Field(pattern=r"^[A-Za-z0-9+/]+={0,2}$", max_length=200)]
    key_id: Hash
    updated_us: Micros
    #: The chunk store this node reads and writes chunks in (:data:`ChunkStoreKind`): a lease
    #: holder refuses to start when a live node serving its kinds uses another than its spec's
    #: ``chunk_store``. Left out of the canonical bytes at its default, ``kafka``.
    chunk_store: ChunkStoreKind = Field(default="kafka", exclude_if=lambda v: v == "kafka")
    #: The ONNX Runtime provider its ONNX models run on (null: no ONNX engine built yet). Left
    #: out of the canonical bytes when null.
    onnx_provider: OnnxProviderFact | None = Field(default=None, exclude_if=lambda v: v is None)


PublicKeyText = Annotated[str, Field(pattern=r"^[A-Za-z0-9+/]+={0,2}$", max_length=200)]


class KeyCertRecord(_Model):
    """A node key certified by a fleet key, on ``sys.keys`` (never compacted: the history).

    The fleet key (an Ed25519 or secp256k1 key an operator holds; verifiers are given its public
    key) signs :meth:`signing_bytes`, the canonical bytes with ``signature`` null. A node's
    trusted keys are every certified key of it not revoked (:mod:`broker_schema.key_history`):
    a rotated key stays trusted for what it signed, and ``sys.facts`` decides nothing."""

    kind: Literal["key_cert"] = "key_cert"
    v: Literal[1] = SCHEMA_VERSION
    node_id: NodeId
    #: base64 of the raw public key (:mod:`broker_schema.signatures`).
    public_key: PublicKeyText
    key_id: Hash
    #: Signatures on records the broker appended before this (µs) are not covered (0: any);
    #: not judged for a receipt in a file, which has no such time (docs/receipts.md).
    not_before_us: Micros = 0
    issued_us: Micros
    issuer_key_id: Hash
    signature: Signature | None = None

    def signing_bytes(self) -> bytes:
        """Canonical bytes with ``signature`` null: what the fleet key signs."""
        return canonical_json(self.model_copy(update={"signature": None}).model_dump(mode="json"))


class KeyRevokeRecord(_Model):
    """A node key revoked by the fleet key, on ``sys.keys``: what the key signed on a record the
    broker appended at or after ``revoked_us`` is no longer trusted (0: nothing it ever signed
    is); a receipt in a file, only when a checkpoint appended before it includes the receipt."""

    kind: Literal["key_revoke"] = "key_revoke"
    v: Literal[1] = SCHEMA_VERSION
    node_id: NodeId
    key_id: Hash
    revoked_us: Micros
    reason: Annotated[str, Field(max_length=1000)] = ""
    issued_us: Micros
    issuer_key_id: Hash
    signature: Signature | None = None

    def signing_bytes(self) -> bytes:
        """Canonical bytes with ``signature`` null: what the fleet key signs."""
        return canonical_json(self.model_copy(update={"signature": None}).model_dump(mode="json"))


#: Why a record was rejected: a decode error code, or ``wrong_workload`` (a request whose header
#: names another workload than the topic it is on).
#: ``epoch_jump``: a claim whose epoch is too far above the highest accepted before it
#: (:func:`broker_schema.binding.claim_problem`); ``foreign_tick``: a tick on ``.resp`` that
#: the holder of its epoch did not write (the lease holder's reject).
#: ``not_holder``: a request on ``.out`` without a valid signature of its epoch's holder.
RejectCode = DecodeCode | Literal["wrong_workload", "epoch_jump", "foreign_tick", "not_holder"]


class ShadowEvalRecord(_Model):
    """The definition of a shadow evaluation, the first record on ``wl.<id>.shadow.<eval>.eval``.

    ``models`` rebinds model names of the workload's spec to other hashes for the evaluation's
    requests only: an executor answers a shadow request (header ``shadow`` = ``eval_id``) when its
    model is what the step's spec binds with this rebinding applied
    (:func:`broker_schema.binding.shadow_models`). ``history``: the recorded requests of steps
    ``from_seq``..``to_seq`` re-issued; ``live``: the live requests from step ``from_seq`` on, for
    ``window_ms``. Nothing of the live workload reads these streams."""

    kind: Literal["shadow_eval"] = "shadow_eval"
    v: Literal[1] = SCHEMA_VERSION
    eval_id: WorkloadId
    workload_id: WorkloadId
    #: the rebinding (may be empty only when ``module_hash`` is set)
    models: dict[str, Hash]
    mode: Literal["history", "live"]
    from_seq: Offset
    to_seq: Offset | None = None
    window_ms: Millis | None = None
    #: the deadline of every shadow request (from its append time on the shadow ``.out``)
    deadline_ms: Annotated[int, Field(ge=1, le=2**31 - 1)]
    created_ms: Millis
    created_by: NodeId
    #: A module change shadowed (``fx shadow --module NEW`` with code other than the steps
    #: ran): steps ``from_seq`` on fold with this module and ``workload_class`` instead of the
    #: recorded code (the steps before with the code recorded for them). Left out of the
    #: canonical bytes when None, as is ``workload_class``.
    module_hash: Hash | None = Field(default=None, exclude_if=lambda v: v is None)
    workload_class: ClassName | None = Field(default=None, exclude_if=lambda v: v is None)
    #: The registry names the rebound hashes were given by (``fx shadow --model
    #: NAME=smollm2@canary``), as on :attr:`SpecRecord.model_names`. Left out of the canonical
    #: bytes when empty.
    model_names: dict[Hash, ModelName] = Field(default_factory=dict, exclude_if=lambda v: not v,
                                               max_length=64)

    @model_validator(mode="after")
    def _check_mode(self) -> Self:
        _names_cover(self.model_names, set(self.models.values()), "the evaluation")
        if not self.models and self.module_hash is None:
            raise ValueError("an evaluation rebinds a model or shadows a module (or both)")
        if (self.module_hash is None) != (self.workload_class is None):
            raise ValueError("module_hash and workload_class go together")
        if self.mode == "history" and (self.to_seq is None or self.to_seq < self.from_seq):
            raise ValueError("a history evaluation needs to_seq >= from_seq")
        if self.mode == "live" and self.window_ms is None:
            raise ValueError("a live evaluation needs window_ms")
        return self


class ShadowReportRecord(_Model):
    """The result of a shadow evaluation, appended to its ``.eval`` when it ends. The figures
    summarize the full report (``report_hash``: ``sha256:`` of its canonical JSON), which
    ``fx shadow show`` recomputes from the records and compares."""

    kind: Literal["shadow_report"] = "shadow_report"
    v: Literal[1] = SCHEMA_VERSION
    eval_id: WorkloadId
    workload_id: WorkloadId
    from_seq: Offset
    to_seq: Offset
    requests: Annotated[int, Field(ge=0)]
    answered: Annotated[int, Field(ge=0)]
    steps: Annotated[int, Field(ge=0)]
    decisions: Annotated[int, Field(ge=0)]
    decisions_differ: Annotated[int, Field(ge=0)]
    first_differing_seq: Offset | None = None
    requests_diverged_at: Offset | None = None
    #: where each topic the report was computed from was read up to (stream -> end offset:
    #: ``in``, ``spec``, ``claims``, ``out``, ``resp``, ``merge`` of the workload, ``shadow.out``
    #: and ``shadow.resp`` of the evaluation): what ``fx shadow show`` cuts at to recompute it
    ends: dict[str, Offset]
    report_hash: Hash
    written_ms: Millis


class RejectedRecord(_Model):
    """A record that could not be decoded, with where it was found and why (``sys.rejects``)."""

    kind: Literal["rejected"] = "rejected"
    v: Literal[1] = SCHEMA_VERSION
    topic: str
    partition: Annotated[int, Field(ge=0)]
    offset: Offset
    code: RejectCode
    detail: Annotated[str, Field(max_length=4096)]
    size: Annotated[int, Field(ge=0)]
    value_hash: Hash
    seen_by: NodeId


class DeviceReadBack(_Model):
    """What a gateway read back from a device's register when a command to it was in doubt
    (docs/actuation.md, "Alarms"): the device, the register's address, the value the command
    wanted and the value read (None: the register could not be read)."""

    device: Annotated[str, Field(max_length=200)]
    #: the holding register's address
    address: Annotated[int, Field(ge=0, le=65535)]
    wanted: int
    value: int | None = None


class AlarmRecord(_Model):
    """An alarm for a person, on ``sys.alarms``: an actuation command that may not have done
    what it asked (docs/actuation.md, "Alarms").

    Written by the lease holder in the same transaction as the outcome it judged: an
    ``at-most-once`` command that ended ``unknown``, or any actuation command (a kind the spec
    declares a guarantee for) that ended ``timeout`` (so there is exactly one alarm per such
    outcome, and never one without it); and by a gateway whose device did not confirm a write
    in time, with what it read back from the device (``read_back``). Never retried, never read
    by a fold. ``fx alarms`` lists the alarms no ``alarm_ack`` has acknowledged
    (docs/actuation.md). ``alarm_id`` is the effect id: one alarm per effect (the first one
    written counts)."""

    kind: Literal["alarm"] = "alarm"
    v: Literal[1] = SCHEMA_VERSION
    alarm_id: str
    workload_id: WorkloadId
    header: EffectHeader
    effect_kind: EffectKind
    guarantee: Guarantee
    #: offset of the request on ``wl.<id>.out``
    request_offset: Offset
    #: the original effect id when the request was a reissue (``EffectRequest.reissue_of``)
    reissue_of: str | None = None
    #: the node whose ``accepted`` was the last one before the lease lapsed, if known
    accepted_by: NodeId | None = None
    reason: Annotated[str, Field(max_length=4096)]
    raised_by: NodeId
    #: the holder's clock, for people only
    raised_us: Micros
    #: what the outcome was: ``unknown`` (accepted, lease lapsed), ``timeout`` (no accept by
    #: the deadline) or ``device_timeout`` (a gateway's device did not confirm the write).
    #: Left out of the canonical bytes when ``unknown`` (the only cause before it existed).
    cause: Literal["unknown", "timeout", "device_timeout"] = Field(
        default="unknown", exclude_if=lambda v: v == "unknown")
    #: the device's register as the gateway read it back (``device_timeout``); left out of the
    #: canonical bytes when None
    read_back: DeviceReadBack | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _check_alarm_id(self) -> Self:
        if self.alarm_id != self.header.effect_id:
            raise _effect_id_mismatch(self.alarm_id, self.header)
        return self


class AlarmAckRecord(_Model):
    """An operator's acknowledgement of an alarm (``fx alarms ack``), on ``sys.alarms``."""

    kind: Literal["alarm_ack"] = "alarm_ack"
    v: Literal[1] = SCHEMA_VERSION
    alarm_id: str
    acked_by: NodeId
    note: Annotated[str, Field(max_length=4096)] = ""
    acked_us: Micros


class SkipOrderRecord(_Model):
    """An operator's order to skip one input (``fx workload skip``), on ``wl.<id>.spec`` beside
    the specs (the operator's instructions to the workload; the holder reads both).

    The lease holder skips input ``input_offset`` of ``.in`` when it reaches it, recording a
    ``quarantined`` merge entry whose ``skip`` names the operator (``principal``), the reason
    and this order's offset. An order for an input already merged changes nothing."""

    kind: Literal["skip_order"] = "skip_order"
    v: Literal[1] = SCHEMA_VERSION
    workload_id: WorkloadId
    input_offset: Offset
    reason: Annotated[str, Field(min_length=1, max_length=4096)]
    #: who ordered it: the SASL user on a secured broker, else the operator's name
    principal: NodeId
    ordered_us: Micros


class RedactionRecord(_Model):
    """An operator's redaction of one input's chunk (``fx redact``), on ``sys.chunks`` keyed
    ``<workload>/<hash>/redaction`` (:func:`broker_schema.chunk_crypto.redaction_key`; never
    tombstoned, so compaction keeps it), and in a filesystem store beside the chunk.

    The chunk's key entry is destroyed with it: the sealed chunk no longer opens, its content
    address (``chunk_hash``, the plaintext's sha256) still verifies every record that names it.
    Replay, ``fx why``, the audit, shadow and the console meet the input as ``Redacted``.
    ``whole_tenant``: the tenant's keys were destroyed (every chunk of the workload)."""

    kind: Literal["redaction"] = "redaction"
    v: Literal[1] = SCHEMA_VERSION
    workload_id: WorkloadId
    #: the input's offset on ``.in`` (None for a whole tenant)
    input_offset: Offset | None = None
    chunk_hash: Hash | None = None
    reason: Annotated[str, Field(min_length=1, max_length=4096)]
    #: who redacted it: the SASL user on a secured broker, else the operator's name
    principal: NodeId
    whole_tenant: bool = Field(default=False, exclude_if=lambda v: v is False)
    redacted_us: Micros


class SkipAlarmRecord(_Model):
    """An alarm for a person, on ``sys.alarms``: an input was skipped (``MergeEntry.skip``).

    Written by the lease holder in the transaction of the ``quarantined`` merge entry (one per
    skipped input, never one without it). ``alarm_id`` is ``<workload>/in@<offset>``; ``fx
    alarms`` lists it and ``fx alarms ack`` acknowledges it as it does an actuation's."""

    kind: Literal["skip_alarm"] = "skip_alarm"
    v: Literal[1] = SCHEMA_VERSION
    alarm_id: str
    workload_id: WorkloadId
    #: the skipped input's offset on ``wl.<id>.in``
    input_offset: Offset
    #: the merge position it was skipped at (the ``seq`` of its ``quarantined`` entry)
    seq: Offset
    skip: SkipNote
    raised_by: NodeId
    #: the holder's clock, for people only
    raised_us: Micros

    @model_validator(mode="after")
    def _check_alarm_id(self) -> Self:
        if self.alarm_id != skip_alarm_id(self.workload_id, self.input_offset):
            raise ValueError("alarm_id must be "
                             f"{skip_alarm_id(self.workload_id, self.input_offset)!r}")
        return self


def skip_alarm_id(workload_id: str, input_offset: int) -> str:
    """The id of the alarm raised when input ``input_offset`` of ``workload_id`` is skipped."""
    return f"{workload_id}/in@{input_offset}"


class ActuatorMemoryRecord(_Model):
    """What an actuator gateway remembers, on its own compacted ``sys.actuator.<node id>``.

    ``entry``: ``attempt`` (an ``at-most-once`` command about to be written to the device, keyed
    by its original effect id: written and acknowledged *before* the device write, so a
    restarted gateway never writes it twice), ``done`` (the same command, written and read back:
    ``output`` is what its response said), ``cleared`` (the same command ended without reaching
    the device, unreachable or refused by it: a later request with that id is no repeat),
    ``epoch`` (a ``fenced`` device's highest epoch for one workload, keyed by device and
    workload), ``recent`` (an ``idempotent`` command written and read back, with its output:
    one of the device's recent effect ids, forgotten again with ``cleared`` once more than the
    gateway's window of later ones were remembered for the device). The key of each record is
    :meth:`key`, so
    compaction keeps the latest per key; the gateway reads the topic back on start."""

    kind: Literal["actuator_memory"] = "actuator_memory"
    v: Literal[1] = SCHEMA_VERSION
    node_id: NodeId
    entry: Literal["attempt", "done", "cleared", "epoch", "recent"]
    device: Annotated[str, Field(min_length=1, max_length=200)]
    workload_id: WorkloadId
    epoch: Epoch
    #: the original effect id (``EffectRequest.original_id``); None for an ``epoch`` entry
    effect_id: str | None = None
    #: the request that carried it (its own id: the original's or a reissue's)
    request_effect_id: str | None = None
    output: InlineBody | None = None
    written_us: Micros

    @model_validator(mode="after")
    def _check_entry(self) -> Self:
        if (self.entry == "epoch") != (self.effect_id is None):
            raise ValueError("effect_id is required exactly when entry is not 'epoch'")
        if self.entry not in ("done", "recent") and self.output is not None:
            raise ValueError("only a 'done' or 'recent' entry carries output")
        for value in (self.effect_id, self.request_effect_id):
            if value is not None:
                parse_effect_id(value)
        return self

    def key(self) -> str:
        """The compaction key: ``effect/<original id>`` or ``epoch/<device>/<workload>``."""
        if self.entry == "epoch":
            return f"epoch/{self.device}/{self.workload_id}"
        return f"effect/{self.effect_id}"


class ModuleRecord(_Model):
    """Workload code in the module store ``sys.modules`` (compacted, keyed by the hash), written
    by ``fx workload deploy`` and ``fx workload spec``: the source of one module file whose
    ``sha256`` is ``module_hash`` (checked when the record is made or decoded), and the
    workload class it was deployed with. The holder, replay, audit, ``fx why`` and shadow
    evaluations load the code a step ran from here, by the hash its spec names."""

    kind: Literal["module"] = "module"
    v: Literal[1] = SCHEMA_VERSION
    module_hash: Hash
    workload_class: ClassName
    #: the file's name when it was deployed (for people, and for tracebacks)
    filename: Annotated[str, Field(min_length=1, max_length=200)]
    #: the file's bytes, as UTF-8 text
    source: Annotated[str, Field(max_length=MODULE_SOURCE_MAX_CHARS)]
    written_by: NodeId
    written_us: Micros

    @model_validator(mode="after")
    def _check_hash(self) -> Self:
        got = sha256_hex(self.source.encode("utf-8"))
        if got != self.module_hash:
            raise ValueError(f"the source hashes to {got}, not to module_hash "
                             f"{self.module_hash}")
        return self


class ModelRecord(_Model):
    """One version of a model in the registry ``sys.models`` (``fx models register
    NAME@VERSION HASH``): its content hash, the aliases it was registered with, its licence
    notice (the text its terms require to travel with it) and who registered it. A version is
    registered once: the same ``name@version`` with another hash is refused
    (:func:`broker_schema.registry.register_problem`). Keyed ``name@version`` (compacted)."""

    kind: Literal["model"] = "model"
    v: Literal[1] = SCHEMA_VERSION
    name: ModelNameText
    version: ModelVersion
    model_hash: Hash
    aliases: tuple[ModelAlias, ...] = Field(default=(), max_length=16)
    licence: Annotated[str, Field(max_length=LICENCE_MAX_CHARS)] | None = None
    registered_by: NodeId
    registered_us: Micros
    #: The operator's signature with a fleet key (``fx models register --fleet-key``) over
    #: :meth:`signing_bytes`; a resolver given fleet keys (``FX_FLEET_PUBLIC_KEY``) takes only
    #: records signed by one of them. Left out of the canonical bytes when None.
    signature: Signature | None = Field(default=None, exclude_if=lambda v: v is None)

    def signing_bytes(self) -> bytes:
        """The canonical bytes with ``signature`` left out (what the fleet key signs)."""
        return canonical_json(self.model_copy(update={"signature": None}).model_dump(mode="json"))


class ModelAliasRecord(_Model):
    """An alias of a model moved to one of its versions (``fx models alias NAME ALIAS
    VERSION``): from this record on, ``NAME@ALIAS`` resolves to that version's hash. Keyed
    ``name#alias`` (compacted: the latest move is the one kept)."""

    kind: Literal["model_alias"] = "model_alias"
    v: Literal[1] = SCHEMA_VERSION
    name: ModelNameText
    alias: ModelAlias
    version: ModelVersion
    set_by: NodeId
    set_us: Micros
    #: The operator's signature with a fleet key (``fx models register --fleet-key``) over
    #: :meth:`signing_bytes`; a resolver given fleet keys (``FX_FLEET_PUBLIC_KEY``) takes only
    #: records signed by one of them. Left out of the canonical bytes when None.
    signature: Signature | None = Field(default=None, exclude_if=lambda v: v is None)

    def signing_bytes(self) -> bytes:
        """The canonical bytes with ``signature`` left out (what the fleet key signs)."""
        return canonical_json(self.model_copy(update={"signature": None}).model_dump(mode="json"))


Record = Annotated[
    InputRecord
    | SpecRecord
    | ClaimRecord
    | OutputRecord
    | EffectRequest
    | AcceptedRecord
    | ResponseRecord
    | MergeEntry
    | SnapshotRecord
    | TickRecord
    | FactsRecord
    | RejectedRecord
    | KeyCertRecord
    | KeyRevokeRecord
    | ShadowEvalRecord
    | ShadowReportRecord
    | AlarmRecord
    | AlarmAckRecord
    | ActuatorMemoryRecord
    | ModuleRecord
    | ModelRecord
    | ModelAliasRecord
    | SkipOrderRecord
    | SkipAlarmRecord
    | RedactionRecord,
    Field(discriminator="kind"),
]



def kind_of(model: type[BaseModel]) -> str:
    """The ``kind`` a record class writes (its discriminator's one value)."""
    kind = model.model_fields["kind"].default
    assert isinstance(kind, str), model
    return kind


#: Record class by kind, in the order of :data:`Record` (the one list of record classes).
RECORD_TYPES: dict[str, type[BaseModel]] = {
    kind_of(model): model for model in get_args(get_args(Record)[0])}

#: Schema versions each kind's decoder understands.
SUPPORTED_VERSIONS: dict[str, frozenset[int]] = {k: frozenset({1}) for k in RECORD_TYPES}


def record_dict(record: BaseModel) -> dict[str, Any]:
    """The JSON-mode dict of a record (what canonical bytes are made of)."""
    return record.model_dump(mode="json")
