"""The hot-path records decoded and encoded with ``msgspec`` structs, to the same bytes and the
same verdicts as :mod:`broker_schema.codec`.

The records an executor and a lease holder handle per effect (:data:`HOT_RECORDS`: the request
an executor reads from ``.out``, the ``accepted`` and ``response`` it writes to ``.resp``, the
response the holder reads back) are decoded by :func:`decode` and encoded by :func:`encode` and
:func:`encode_signed` here: the same signatures, results and errors as the codec's.

The structs are not a second definition: :func:`struct_for` derives each one, at import, from
the pydantic model of the record (its fields, defaults, ``Literal`` tags, patterns, lengths and
ranges, the fields left out of the canonical bytes when None); a model construct it cannot
carry over exactly (a validator on a field, an alias, an ``exclude_if`` other than "when None")
raises :class:`TypeError` at import, so the two cannot drift apart silently.

How a fast verdict stays the codec's:

* :func:`decode` accepts a record only when msgspec read it into its struct (types, patterns,
  lengths, ranges, no unknown field, every number within +-(2^53 - 1)), its JSON values nest
  within ``MAX_JSON_DEPTH`` with every number in RFC 8785's exact domain and nothing msgspec
  prints otherwise than RFC 8785 (a float outside plain decimal notation, a key above U+FFFF),
  no field left out when None is an explicit null, the struct encodes back to exactly the bytes
  read (so they are canonical), and the models' own after-validators
  (:meth:`~broker_schema.records.ResponseRecord._check_outcome`, the inline body's base64 and
  size check...) pass on the record built from it (the same frozen objects validation builds,
  made by code generated per struct). Anything else, the bytes of any other kind included, is
  handed to :func:`broker_schema.codec.decode`, which gives the record or the typed
  :class:`~broker_schema.DecodeError` it always gave: a record is never refused here that the
  codec would accept, and every error is the codec's own.
* :func:`encode` and :func:`encode_signed` make the struct from the model's field values and
  encode it sorted; a JSON value msgspec would print otherwise is put in as its RFC 8785 bytes;
  what the fast path is unsure of (an integer beyond +-(2^53 - 1), nesting near the limit, a
  value of an unexpected type, a record of another kind) goes to the codec's encoder, which
  gives the bytes or the :class:`~broker_schema.EncodeError`.

tests/unit/broker_schema/test_fast_codec.py holds both paths to the same bytes, records, fields
set and error codes over random records, random mutations of them and hostile bytes.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

import msgspec
from pydantic import BaseModel, JsonValue
from pydantic.fields import FieldInfo

from broker_schema import codec, streams
from broker_schema._errors import EncodeError, RecordTooLarge
from broker_schema.canonical import canonical_json
from broker_schema.limits import MAX_JSON_DEPTH, MAX_RECORD_BYTES
from broker_schema.records import (
    AcceptedRecord,
    EffectRequest,
    Record,
    ResponseRecord,
    Signature,
)

__all__ = ["HOT_RECORDS", "decode", "encode", "encode_signed", "struct_for"]

#: The record kinds with a fast path: what an executor and a lease holder handle per effect.
HOT_RECORDS: tuple[type[BaseModel], ...] = (EffectRequest, AcceptedRecord, ResponseRecord)

#: Every number on the wire lies strictly within +-2^53 (RFC 8785's exact domain).
_SAFE = 2**53
_TAGS = ("kind", "type")

# ----------------------------------------------------------------------------- the structs


class _Plan:
    """What the fast path walks in a struct: its JSON-value fields (any JSON: scanned, maybe
    encoded by the canonical encoder) and its fields that may hold structs."""

    __slots__ = ("json_fields", "struct_fields")

    def __init__(self, json_fields: tuple[str, ...], struct_fields: tuple[str, ...]) -> None:
        self.json_fields = json_fields
        self.struct_fields = struct_fields


_STRUCTS: dict[type[BaseModel], type[msgspec.Struct]] = {}
_MODELS: dict[type[msgspec.Struct], type[BaseModel]] = {}
_PLANS: dict[type[msgspec.Struct], _Plan] = {}


def _tag_of(cls: type[BaseModel]) -> tuple[str, str] | None:
    """``(field, value)`` of the one-value ``Literal`` that tells ``cls`` apart (``kind`` of a
    record, ``type`` of a body), with that value as its default; None when it has none."""
    for name in _TAGS:
        info = cls.model_fields.get(name)
        if info is None:
            continue
        args = typing.get_args(info.annotation)
        if (typing.get_origin(info.annotation) is Literal and len(args) == 1
                and isinstance(args[0], str) and info.default == args[0] and not info.metadata):
            return name, args[0]
    return None


def _pattern(pattern: str) -> str:
    """A pydantic (Rust regex) pattern as Python's ``re`` reads it the same way: an end anchor
    ``$`` matches only at the very end (Python's also matches before a final newline)."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    re.compile(pattern)
    return pattern


#: pydantic's bounds (``annotated_types``: Ge, Le...) by class name -> the msgspec Meta argument
#: of the same name (and attribute)
_BOUNDS = {"Ge": "ge", "Le": "le", "Gt": "gt", "Lt": "lt", "MinLen": "min_length",
           "MaxLen": "max_length"}


def _meta(metadata: list[Any], base: Any) -> Any:
    """``base`` annotated with the msgspec ``Meta`` of the pydantic constraints ``metadata``."""
    kw: dict[str, Any] = {}
    for m in metadata:
        bound = _BOUNDS.get(type(m).__name__) if type(m).__module__ == "annotated_types" else None
        if bound is not None:
            kw[bound] = getattr(m, bound)
        elif type(m).__name__ == "_PydanticGeneralMetadata" and set(vars(m)) == {"pattern"}:
            kw["pattern"] = _pattern(vars(m)["pattern"])
        else:
            raise TypeError(f"no msgspec form for the constraint {m!r}")
    if base is int:
        # the codec's number domain, on every integer field
        kw["ge"] = max(kw.get("ge", -_SAFE + 1), -_SAFE + 1)
        kw["le"] = min(kw.get("le", _SAFE - 1), _SAFE - 1)
    elif kw and base is not str and typing.get_origin(base) not in (dict, tuple):
        raise TypeError(f"constraints {kw} on {base!r}")
    return Annotated[base, msgspec.Meta(**kw)] if kw else base


def _has_json(tp: Any) -> bool:
    """Whether an annotation holds a JSON value (``JsonValue``: scanned, not typed)."""
    return tp is JsonValue or tp is Any or any(_has_json(a) for a in typing.get_args(tp))


def _mtype(tp: Any, metadata: list[Any]) -> Any:
    """The msgspec type of a pydantic annotation with its constraints."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *extra = typing.get_args(tp)
        meta = list(metadata)
        for e in extra:
            if isinstance(e, FieldInfo):
                if e.discriminator is not None and e.discriminator not in _TAGS:
                    raise TypeError(f"discriminator {e.discriminator!r}")
                meta.extend(e.metadata)
            else:
                meta.append(e)
        return _mtype(base, meta)
    if tp is JsonValue or tp is Any:
        if metadata:
            raise TypeError("constraints on a JSON value")
        return Any
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if metadata:
            raise TypeError(f"constraints on {tp.__name__}")
        return struct_for(tp)
    if origin is Literal:
        if metadata:
            raise TypeError(f"constraints on {tp!r}")
        return tp
    if origin is Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        options = tuple(_mtype(a, metadata) for a in args)
        if len(args) != len(typing.get_args(tp)):
            options += (type(None),)
        return Union[options]  # noqa: UP007  (built from a tuple)
    if tp in (str, int, bool):
        return _meta(metadata, tp)
    if origin is dict:
        key, value = typing.get_args(tp)
        if key is not str:
            raise TypeError(f"dict keys {key!r}")
        return _meta(metadata, dict[str, _mtype(value, [])])  # type: ignore[misc]
    raise TypeError(f"no msgspec form for {tp!r}")


def _holds_struct(tp: Any) -> bool:
    if isinstance(tp, type):
        return issubclass(tp, msgspec.Struct)
    return any(_holds_struct(a) for a in typing.get_args(tp))


def struct_for(cls: type[BaseModel]) -> type[msgspec.Struct]:
    """The msgspec struct of the pydantic model ``cls`` (made once; see the module docstring):
    the same fields, defaults, constraints and tag; a field the model leaves out of the
    canonical bytes when None is :data:`msgspec.UNSET` when absent (an explicit null stays
    None, and encodes as null: not canonical, as with the model)."""
    made = _STRUCTS.get(cls)
    if made is not None:
        return made
    decorators = cls.__pydantic_decorators__
    if (decorators.field_validators or decorators.field_serializers
            or decorators.model_serializers or decorators.root_validators
            or any(d.info.mode != "after" for d in decorators.model_validators.values())
            or cls.__pydantic_post_init__ or cls.model_config.get("extra") != "forbid"
            or not cls.model_config.get("strict")):
        raise TypeError(f"{cls.__name__}: a validator or setting msgspec cannot carry over")
    tag = _tag_of(cls)
    fields: list[tuple[Any, ...]] = []
    json_fields, struct_fields = [], []
    for name, info in cls.model_fields.items():
        if tag is not None and name == tag[0]:
            continue
        if info.alias not in (None, name) or info.validation_alias not in (None, name):
            raise TypeError(f"{cls.__name__}.{name} has an alias")
        tp = _mtype(info.annotation, list(info.metadata))
        if _has_json(info.annotation):
            json_fields.append(name)
        elif _holds_struct(tp):
            struct_fields.append(name)
        if info.exclude_if is not None:
            if info.default is not None or not _left_out_when_none(info.exclude_if):
                raise TypeError(f"{cls.__name__}.{name}: exclude_if other than 'when None'")
            fields.append((name, Union[tp, msgspec.UnsetType], msgspec.UNSET))  # noqa: UP007
        elif info.is_required():
            fields.append((name, tp))
        elif info.default_factory is not None:
            factory = typing.cast(Callable[[], Any], info.default_factory)
            fields.append((name, tp, msgspec.field(default_factory=factory)))
        else:
            fields.append((name, tp, info.default))
    struct = msgspec.defstruct(
        cls.__name__, fields, kw_only=True, forbid_unknown_fields=True, module=__name__,
        tag_field=tag[0] if tag is not None else None,
        tag=tag[1] if tag is not None else None)
    _STRUCTS[cls], _MODELS[struct] = struct, cls
    _PLANS[struct] = _Plan(tuple(json_fields), tuple(struct_fields))
    return struct


_FALSY_AND_SOME: tuple[Any, ...] = ("", 0, False, (), {}, "x", 1)


def _left_out_when_none(exclude_if: Callable[[Any], bool]) -> bool:
    """Whether ``exclude_if`` leaves a value out exactly when it is None (on samples: None and
    the falsy values a ``not v`` would leave out too)."""
    try:
        return bool(exclude_if(None)) and not any(
            exclude_if(v) for v in _FALSY_AND_SOME)
    except Exception:
        return False


_RECORD_STRUCTS = tuple(struct_for(cls) for cls in HOT_RECORDS)
_HOT_TYPES = frozenset(HOT_RECORDS)
#: the kind of each record struct
_KINDS = {s: s.__struct_config__.tag for s in _RECORD_STRUCTS}
_DECODER = msgspec.json.Decoder(Union[_RECORD_STRUCTS])  # noqa: UP007
_ENCODER = msgspec.json.Encoder(order="sorted")
#: per struct, the fields left out of the canonical bytes when None (UNSET when absent)
_UNSET_WHEN_NONE: dict[type[msgspec.Struct], tuple[str, ...]] = {
    s: tuple(n for n in s.__struct_fields__
             if _MODELS[s].model_fields[n].exclude_if is not None)
    for s in _MODELS}
_SIGNATURE = struct_for(Signature)

# ----------------------------------------------------------------------------- JSON values


class _Unsure(Exception):
    """The fast path cannot vouch for the value: the codec decides."""


def _scan(value: Any, left: int) -> bool:
    """Check a JSON value (decoded or to be encoded): numbers in the exact domain, at most
    ``left`` levels of nesting (``_Unsure`` otherwise). True when msgspec would not print it as
    RFC 8785 does: it holds a float msgspec prints otherwise than ECMAScript (an integral one,
    an exponent), or a key above U+FFFF (sorted otherwise)."""
    t = type(value)
    if t is str or t is bool or value is None:
        return False
    if t is int:
        if not -_SAFE < value < _SAFE:
            raise _Unsure
        return False
    if t is float:
        if not -_SAFE < value < _SAFE:
            raise _Unsure
        # ECMAScript prints the shortest round-trip digits, in decimal notation within
        # 1e-6 <= |f| < 1e21, with no ".0" (an integral float is printed as an integer): where
        # msgspec prints decimal notation too (its digits are the same: property-tested), the
        # text is the same
        text = _ENCODER.encode(value)
        return (b"e" in text or text.endswith(b".0")
                or not 1e-6 <= (value if value > 0 else -value) < 1e21)
    if left <= 0:
        raise _Unsure
    special = False
    if t is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise _Unsure
            if not key.isascii() and max(key) > "\uffff":
                special = True
            if type(item) is not str and _scan(item, left - 1):
                special = True
        return special
    if t is list or t is tuple:
        for item in value:
            if type(item) is not str and _scan(item, left - 1):
                special = True
        return special
    raise _Unsure


def _structs_in(tp: Any) -> list[type[msgspec.Struct]]:
    if isinstance(tp, type):
        return [tp] if issubclass(tp, msgspec.Struct) else []
    return [s for a in typing.get_args(tp) for s in _structs_in(a)]


def _needs_view(struct: type[msgspec.Struct]) -> bool:
    """Whether a struct holds (or may hold, below) a JSON value or a field left out when None:
    the view looks only into those."""
    return bool(_PLANS[struct].json_fields or _UNSET_WHEN_NONE[struct]) or any(
        _needs_view(inner) for f in msgspec.structs.fields(struct) for inner in _structs_in(f.type))


#: per struct, its fields that may hold a struct the view looks into
_VIEW_FIELDS: dict[type[msgspec.Struct], tuple[str, ...]] = {
    s: tuple(f.name for f in msgspec.structs.fields(s)
             if any(_needs_view(inner) for inner in _structs_in(f.type)))
    for s in _MODELS}


def _canonical_view(struct: msgspec.Struct, level: int, encoding: bool) -> None:
    """Check ``struct`` (at nesting ``level``: a record is 1) before it is compared with the
    bytes read or (``encoding``) encoded. A JSON value msgspec would print otherwise than
    RFC 8785: when decoding, ``_Unsure``; when encoding, its RFC 8785 bytes
    (:class:`msgspec.Raw`) are put in its place (the struct is a fresh one). A field left out
    of the canonical bytes when None: an explicit null read is ``_Unsure`` (not canonical);
    None to encode becomes UNSET (left out)."""
    plan = _PLANS[type(struct)]
    for name in _UNSET_WHEN_NONE[type(struct)]:
        if getattr(struct, name) is None:  # left out of the canonical bytes when None
            if not encoding:
                raise _Unsure  # an explicit null: not canonical (the codec says so)
            setattr(struct, name, msgspec.UNSET)
    for name in plan.json_fields:
        value = getattr(struct, name)
        if value is None or value is msgspec.UNSET:
            continue
        if _scan(value, MAX_JSON_DEPTH - level):
            if not encoding:
                raise _Unsure
            setattr(struct, name, msgspec.Raw(canonical_json(value)))
    for name in _VIEW_FIELDS[type(struct)]:
        value = getattr(struct, name)
        if isinstance(value, msgspec.Struct):
            _canonical_view(value, level + 1, encoding)


def _model_builder(struct: type[msgspec.Struct]) -> Callable[[Any], BaseModel]:
    """Builds the model of a struct read and checked by the fast path, without validating it
    again (like :func:`broker_schema.construct.construct`, from the struct's values): every
    field as read, an absent one its default (None), ``fields_set`` what the bytes held."""
    cls = _MODELS[struct]
    tag = _tag_of(cls)
    unset = _UNSET_WHEN_NONE[struct]
    nested = _PLANS[struct].struct_fields
    # generated once per struct, from its fields: one dict display, no loop per record
    items = [f"{tag[0]!r}: {tag[1]!r}"] if tag is not None else []
    lines = ["def build(s):"]
    for i, name in enumerate(struct.__struct_fields__):
        if not name.isidentifier():
            raise TypeError(f"field name {name!r}")
        lines.append(f"    v{i} = s.{name}")
        if name in unset:
            lines.append(f"    if v{i} is UNSET: v{i} = None; fs = fs - {{{name!r}}}")
        if name in nested:
            lines.append(f"    if v{i} is not None: v{i} = BUILDERS[type(v{i})](v{i})")
        items.append(f"{name!r}: v{i}")
    lines[1:1] = ["    fs = EVERY"]
    lines += ["    m = new(cls)",
              f"    set_attr(m, '__dict__', {{{', '.join(items)}}})",
              "    set_attr(m, '__pydantic_fields_set__', set(fs))",
              "    set_attr(m, '__pydantic_extra__', None)",
              "    set_attr(m, '__pydantic_private__', None)",
              "    return m"]
    scope: dict[str, Any] = {"UNSET": msgspec.UNSET, "BUILDERS": _BUILDERS, "new": cls.__new__,
                             "cls": cls, "set_attr": object.__setattr__,
                             "EVERY": frozenset(cls.model_fields)}
    exec("\n".join(lines), scope)
    build: Callable[[Any], BaseModel] = scope["build"]
    return build


# ----------------------------------------------------------------------------- decode


def _after_validators(cls: type[BaseModel]) -> tuple[Callable[[Any], Any], ...]:
    return tuple(d.func for d in cls.__pydantic_decorators__.model_validators.values())


_BUILDERS: dict[type[msgspec.Struct], Callable[[Any], BaseModel]] = {}
_BUILDERS.update({s: _model_builder(s) for s in _MODELS})
_VALIDATORS: dict[type[BaseModel], tuple[Callable[[Any], Any], ...]] = {
    cls: _after_validators(cls) for cls in _STRUCTS}


def _validate(model: BaseModel, struct: msgspec.Struct) -> None:
    """Run the models' own after-validators on ``model`` and the models it holds (the checks
    no msgspec constraint expresses): the one place they run on the fast path."""
    for check in _VALIDATORS[type(model)]:
        check(model)
    for name in _PLANS[type(struct)].struct_fields:
        inner = getattr(struct, name)
        if isinstance(inner, msgspec.Struct):
            _validate(getattr(model, name), inner)


#: :func:`broker_schema.streams.kinds_on` (a pure function of the topic name), remembered for
#: the topics a consumer reads again and again
_kinds_on = functools.lru_cache(maxsize=4096)(streams.kinds_on)


def _fast_decode(raw: bytes, topic: str | None) -> Record | None:
    """The record when the fast path vouches for it, else None."""
    if len(raw) > MAX_RECORD_BYTES:
        return None
    try:
        struct = _DECODER.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    if topic is not None:
        kind = _KINDS[type(struct)]
        allowed = _kinds_on(topic)
        if allowed is not None and kind not in allowed:
            return None
    try:
        _canonical_view(struct, 1, False)
        if _ENCODER.encode(struct) != raw:
            return None
    except (_Unsure, TypeError, ValueError, OverflowError, RecursionError):
        return None
    record = _BUILDERS[type(struct)](struct)
    try:
        _validate(record, struct)
    except (ValueError, TypeError, AttributeError):
        return None
    return record  # type: ignore[return-value]


def decode(data: bytes | bytearray | memoryview | None, *, strict: bool = True,
           topic: str | None = None) -> Record:
    """:func:`broker_schema.codec.decode`, fast for the :data:`HOT_RECORDS` in canonical form:
    the same record, or the same :class:`~broker_schema.DecodeError` (from the codec itself)."""
    if data is not None:
        raw = data if type(data) is bytes else bytes(data)
        record = _fast_decode(raw, topic)
        if record is not None:
            return record
    return codec.decode(data, strict=strict, topic=topic)


# ----------------------------------------------------------------------------- encode


def _struct_maker(struct: type[msgspec.Struct]) -> Callable[[Any], msgspec.Struct]:
    """Makes the struct of a (validated) model from its field values, without validating them
    again (generated once per struct, like :func:`_model_builder`): a field left out of the
    canonical bytes when None is UNSET when None, a nested model its struct, and a scalar
    that is not a string, None, a bool or an integer in the codec's number domain ``_Unsure``
    (the codec then encodes or refuses it)."""
    unset = _UNSET_WHEN_NONE[struct]
    nested = _PLANS[struct].struct_fields
    lines = ["def make(m):", "    d = m.__dict__"]
    args = []
    for i, f in enumerate(msgspec.structs.fields(struct)):
        if not f.name.isidentifier():
            raise TypeError(f"field name {f.name!r}")
        lines.append(f"    v{i} = d[{f.name!r}]")
        if f.name in unset:
            lines.append(f"    if v{i} is None: v{i} = UNSET")
        if f.name in nested:
            lines.append(f"    if v{i} is not None and v{i} is not UNSET:"
                         f" v{i} = MAKERS[type(v{i})](v{i})")
        elif f.name not in _PLANS[struct].json_fields:
            # a scalar: anything but a string, None, a bool or an integer in the domain (a
            # model made without validation may hold it) is left to the codec
            lines.append(f"    t = type(v{i})")
            lines.append(f"    if t is not str and v{i} is not None and t is not bool and"
                         f" (t is not int or not -SAFE < v{i} < SAFE): raise Unsure")
        args.append(f"{f.name}=v{i}")
    lines.append(f"    return S({', '.join(args)})")
    scope: dict[str, Any] = {"UNSET": msgspec.UNSET, "MAKERS": _MAKERS, "S": struct,
                             "SAFE": _SAFE, "Unsure": _Unsure}
    exec("\n".join(lines), scope)
    make: Callable[[Any], msgspec.Struct] = scope["make"]
    return make


_MAKERS: dict[type[BaseModel], Callable[[Any], msgspec.Struct]] = {}
_MAKERS.update({_MODELS[s]: _struct_maker(s) for s in _MODELS})


def _struct_of(record: BaseModel) -> msgspec.Struct:
    """The struct of a hot record (a pydantic model is validated when it is made)."""
    return _MAKERS[type(record)](record)


def _viewed(record: BaseModel) -> msgspec.Struct:
    """The struct of ``record`` ready to encode (a fresh one: nothing is put back)."""
    struct = _struct_of(record)
    _canonical_view(struct, 1, True)
    return struct


def encode(record: BaseModel, *, limit: int = MAX_RECORD_BYTES) -> bytes:
    """:func:`broker_schema.codec.encode`, fast for the :data:`HOT_RECORDS`: the same bytes, or
    the same :class:`~broker_schema.EncodeError` (from the codec itself)."""
    if type(record) in _HOT_TYPES:
        try:
            data = _ENCODER.encode(_viewed(record))
        except (_Unsure, msgspec.ValidationError, EncodeError, TypeError, ValueError,
                OverflowError, RecursionError, KeyError):
            return codec.encode(record, limit=limit)
        if len(data) > limit:
            raise RecordTooLarge(len(data), limit)
        return data
    return codec.encode(record, limit=limit)


def encode_signed(record: BaseModel, sign: Callable[[bytes], Signature], *,
                  limit: int = MAX_RECORD_BYTES) -> tuple[Signature, bytes, bytes]:
    """:func:`broker_schema.codec.encode_signed`, fast for a :class:`ResponseRecord`:
    ``(its signature, the signed record's canonical bytes, the signing bytes)``, the same as
    the codec's."""
    if type(record) is not ResponseRecord:
        return codec.encode_signed(record, sign, limit=limit)
    try:
        struct = _viewed(record)
        struct.signature = None  # type: ignore[attr-defined]
        signing = _ENCODER.encode(struct)
    except (_Unsure, msgspec.ValidationError, EncodeError, TypeError, ValueError,
            OverflowError, RecursionError, KeyError):
        return codec.encode_signed(record, sign, limit=limit)
    signature = sign(signing)
    # the signature's fields as they are, as the codec writes them
    struct.signature = _SIGNATURE(  # type: ignore[attr-defined]
        alg=signature.alg, key_id=signature.key_id, value=signature.value)
    data = _ENCODER.encode(struct)
    if len(data) > limit:
        raise RecordTooLarge(len(data), limit)
    return signature, data, signing
