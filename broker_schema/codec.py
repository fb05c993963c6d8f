"""Encode and decode records: the only way records get on and off the wire.

``encode`` returns the record's canonical bytes (RFC 8785) and refuses a record over the broker
frame cap before any producer sees it. ``decode`` turns any bytes into a record or raises one
:class:`DecodeError` with a stable code, and nothing else. A record's value *is* its canonical
bytes: ``decode`` refuses any other spelling of a valid record (``not_canonical``) unless the
caller asks for a lenient read with ``strict=False``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from broker_schema import streams
from broker_schema._errors import DecodeError, EncodeError, RecordTooLarge
from broker_schema.canonical import (
    canonical_json,
    canonical_json_plain,
    canonical_record_json,
    sha256_hex,
)
from broker_schema.construct import ConstructError, construct
from broker_schema.limits import MAX_JSON_DEPTH, MAX_RECORD_BYTES
from broker_schema.records import RECORD_TYPES, SUPPORTED_VERSIONS, Record, Signature
from broker_schema.trusted_parse import parse_trusted

RECORD_ADAPTER: TypeAdapter[Record] = TypeAdapter(Record)


def encode(record: BaseModel, *, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The canonical bytes of ``record``; :class:`RecordTooLarge` if they exceed ``limit``."""
    if type(record) not in RECORD_TYPES.values():
        raise EncodeError("unknown_kind", f"{type(record).__name__} is not a record kind")
    # one pass: nesting depth, the float domain and the canonical bytes together
    data = canonical_record_json(record.model_dump(mode="json"), max_depth=MAX_JSON_DEPTH,
                                 max_float=_SAFE)
    if len(data) > limit:
        raise RecordTooLarge(len(data), limit)
    return data


def encode_signed(record: BaseModel, sign: Callable[[bytes], Signature], *,
                  limit: int = MAX_RECORD_BYTES) -> tuple[Signature, bytes, bytes]:
    """Sign ``record`` (a record kind with a ``signature`` field) and encode it, from one
    canonical pass over its members: ``(its signature, the signed record's canonical bytes, the
    signing bytes)``. Writers need only the bytes, so no signed copy of the record is made here
    (``record.model_copy(update={"signature": signature})`` is it).

    The signing bytes are the record's canonical bytes with ``signature`` null (what
    :meth:`~broker_schema.records.ResponseRecord.signing_bytes` gives); ``sign`` turns them into
    the :class:`~broker_schema.records.Signature`. The members other than ``signature`` are
    encoded once, in the two runs that sort before and after it, and both byte strings are
    spliced from them: the same bytes as :func:`encode` of the signed record (property-tested
    over every response). :class:`RecordTooLarge` if the signed record exceeds ``limit``."""
    if type(record) not in RECORD_TYPES.values():
        raise EncodeError("unknown_kind", f"{type(record).__name__} is not a record kind")
    if "signature" not in type(record).model_fields:
        raise EncodeError("unknown_kind", f"a {type(record).__name__} carries no signature")
    members = record.model_dump(mode="json")
    del members["signature"]
    # field names are ASCII, so Python's order is RFC 8785's (UTF-16 code units) here
    before = {k: v for k, v in members.items() if k < "signature"}
    after = {k: v for k, v in members.items() if k > "signature"}
    head = (canonical_record_json(before, max_depth=MAX_JSON_DEPTH, max_float=_SAFE)[:-1] + b","
            if before else b"{")
    tail = (b"," + canonical_record_json(after, max_depth=MAX_JSON_DEPTH, max_float=_SAFE)[1:]
            if after else b"}")
    signing = head + b'"signature":null' + tail
    signature = sign(signing)
    data = head + b'"signature":' + canonical_json(signature.model_dump(mode="json")) + tail
    if len(data) > limit:
        raise RecordTooLarge(len(data), limit)
    return signature, data, signing


def request_hash(value: bytes) -> str:
    """``sha256:<hex>`` of a request record's bytes as written on ``.out``: what an executor
    puts in the ``request_hash`` of its ``accepted`` and response, and what the lease holder
    compares with the hash of the request it wrote (``encode(request)``: canonical, so equal to
    :func:`record_hash` of it)."""
    return sha256_hex(value)


def record_hash(record: BaseModel) -> str:
    """``sha256:<hex>`` of the record's canonical bytes (spec hashes, state hashes...)."""
    return sha256_hex(canonical_json(record.model_dump(mode="json")))


#: Floats (and integers) must lie strictly within +-2^53: ``encode`` refuses a float ``decode``
#: would refuse to read back (RFC 8785 prints an integral one as an integer beyond the exact
#: domain).
_SAFE = 2**53

#: The lead bytes of a 4-byte UTF-8 sequence: a character above U+FFFF.
_FOUR_BYTE_LEADS = (b"\xf0", b"\xf1", b"\xf2", b"\xf3", b"\xf4")


def json_depth(value: Any, *, stop: int = MAX_JSON_DEPTH) -> int:
    """How deep ``value`` nests (a scalar is 0, ``{}`` and ``[]`` are 1); iterative, so any depth
    is measured without recursion. Counting stops a level past ``stop``."""
    deepest = 0
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if depth > stop:
            return deepest
        todo.extend((child, depth + 1) for child in children
                    if isinstance(child, (dict, list, tuple)))
    return deepest


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _OutOfDomain(ValueError):
    """A number RFC 8785 cannot carry exactly (so the record could not be re-encoded)."""


def _parse_int(text: str) -> int:
    value = int(text)
    if not -_SAFE < value < _SAFE:
        raise _OutOfDomain(f"integer {text[:40]} is beyond +-(2^53 - 1)")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if not -_SAFE < value < _SAFE:
        raise _OutOfDomain(f"number {text[:40]} is beyond +-2^53 (or not finite)")
    return value


def _parse_slowly(raw: bytes) -> Any:
    """The standard library's parse, which names what is wrong (and reads a lone surrogate
    escape, which orjson refuses, the way the decoder always has)."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant,
                          parse_int=_parse_int, parse_float=_parse_float)
    except _OutOfDomain as exc:
        raise DecodeError("invalid_record", str(exc)) from None
    except RecursionError:
        raise DecodeError("too_deep", f"JSON nests deeper than {MAX_JSON_DEPTH} levels "
                          "(deeper than the parser's own limit)") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise DecodeError("not_json", f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _check_parsed(obj: Any) -> bool:
    """One pass over parsed JSON: every number within RFC 8785's exact domain (``invalid_record``,
    reported before depth, as the parser would) and nesting at most ``MAX_JSON_DEPTH``
    (``too_deep``). True when it holds a float."""
    too_deep = has_float = False
    todo: list[tuple[Any, int]] = [([obj], 0)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if type(item) is dict else item
        if depth > MAX_JSON_DEPTH:
            too_deep = True
        for child in children:
            t = type(child)
            if t is int or t is float:
                has_float = has_float or t is float
                if not -_SAFE < child < _SAFE:
                    raise DecodeError("invalid_record", f"number {str(child)[:40]} is beyond "
                                      "+-(2^53 - 1) (or not finite)")
            elif t is dict or t is list:
                todo.append((child, depth + 1))
    if too_deep:
        raise DecodeError("too_deep", f"JSON nests more than {MAX_JSON_DEPTH} levels deep")
    return has_float


def _summarise(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc or '<record>'}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _kind_of(obj: Any, topic: str | None) -> str:
    """The kind of a parsed record value: an object of a known kind and schema version that
    belongs on ``topic`` (when given), else the :class:`DecodeError` saying which it is not."""
    if not isinstance(obj, dict):
        raise DecodeError("not_object", f"top-level JSON is {type(obj).__name__}, not an object")
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind not in RECORD_TYPES:
        raise DecodeError("unknown_kind", f"kind {str(kind)[:80]!r} is not one of "
                          f"{sorted(RECORD_TYPES)}")
    version = obj.get("v")
    if type(version) is not int or version not in SUPPORTED_VERSIONS[kind]:
        raise DecodeError("unsupported_version", f"{kind} record has schema version "
                          f"{str(version)[:40]!r}; this decoder reads "
                          f"{sorted(SUPPORTED_VERSIONS[kind])}")
    if topic is not None:
        allowed = streams.kinds_on(topic)
        if allowed is not None and kind not in allowed:
            raise DecodeError("wrong_stream", f"a {kind} record does not belong on {topic[:249]} "
                              f"(it holds {', '.join(sorted(allowed))})")
    return kind


def decode(data: bytes | bytearray | memoryview | None, *, strict: bool = True,
           topic: str | None = None) -> Record:
    """Decode one record value.

    Raises :class:`DecodeError` with code ``oversize``, ``not_json``, ``too_deep`` (nested deeper
    than ``MAX_JSON_DEPTH``), ``not_object``, ``unknown_kind``, ``unsupported_version``,
    ``invalid_record`` or ``effect_id_mismatch`` (an ``effect_id`` field that is not the id its
    header spells); ``not_canonical`` when the bytes are a valid record but not its canonical
    encoding (a record re-serialised on the way: what was hashed or signed is not what was read),
    unless ``strict=False``; and, given the ``topic`` the bytes were read from, ``wrong_stream``
    for a kind that does not belong there (:func:`broker_schema.streams.kinds_on`), e.g. a claim
    written to ``.out``.
    """
    if data is None:
        raise DecodeError("not_json", "record has no value (a tombstone?)")
    raw = bytes(data)
    if len(raw) > MAX_RECORD_BYTES:
        raise DecodeError("oversize", f"record is {len(raw)} bytes, limit is {MAX_RECORD_BYTES}")
    try:
        obj = orjson.loads(raw)  # C speed; anything it refuses is classified by the slow parse
    except orjson.JSONDecodeError:
        obj = _parse_slowly(raw)
    has_float = _check_parsed(obj)
    kind = _kind_of(obj, topic)
    try:
        record = RECORD_ADAPTER.validate_json(raw)
    except ValidationError as exc:
        if any(err["type"] == "effect_id_mismatch" for err in exc.errors(include_url=False)):
            raise DecodeError("effect_id_mismatch", f"{kind}: {_summarise(exc)}") from None
        raise DecodeError("invalid_record", f"{kind}: {_summarise(exc)}") from None
    except (ValueError, TypeError, RecursionError) as exc:  # defensive: never leak another type
        raise DecodeError("invalid_record", f"{kind}: {type(exc).__name__}: {exc}") from None
    # Every number was checked to be within RFC 8785's exact domain and the nesting depth bounded
    # while parsing, so the record can always be re-encoded; a lenient read skips doing it.
    if strict:
        # No record field is a float, so the dump holds a float only where the bytes did; with
        # no float and no character above U+FFFF (no 4-byte UTF-8 sequence) orjson's sorted
        # output is RFC 8785 as it is. Either way the comparison is with the canonical bytes.
        plain = not has_float and (raw.isascii() or not any(b in raw for b in _FOUR_BYTE_LEADS))
        try:
            dumped = record.model_dump(mode="json")
            canonical = canonical_json_plain(dumped) if plain else canonical_json(dumped)
        except EncodeError as exc:
            raise DecodeError("invalid_record", f"{kind}: {exc.detail}") from None
        if canonical != raw:
            raise DecodeError("not_canonical", f"{kind} record is valid but not in canonical "
                              "form (RFC 8785, every field present)")
    return record


def decode_trusted(data: bytes | bytearray | memoryview | None, *,
                   topic: str | None = None) -> Record:
    """Decode one record value from a log that was validated when it was written, without
    validating it again: for ``replay(..., trust_log=True)``.

    The JSON is parsed (orjson), the kind, schema version and (given ``topic``) stream are
    checked, and the record is built by
    :func:`broker_schema.construct.construct`. Not checked: field types, patterns and ranges,
    extra fields, the effect id against its header, base64 bodies, canonical form (an input's
    long inline body string is taken as it is: :func:`broker_schema.trusted_parse.
    parse_trusted`). For a valid
    record in canonical form the result equals :func:`decode`'s. Raises :class:`DecodeError`
    (the same codes as :func:`decode` for what it checks; ``invalid_record`` when the JSON has
    not the shape of its kind)."""
    if data is None:
        raise DecodeError("not_json", "record has no value (a tombstone?)")
    raw = bytes(data)
    try:
        obj = parse_trusted(raw)  # orjson.loads, a long base64 input body taken as it is
    except orjson.JSONDecodeError:
        obj = _parse_slowly(raw)
    kind = _kind_of(obj, topic)
    try:
        return construct(RECORD_TYPES[kind], obj)  # type: ignore[return-value]
    except (ConstructError, AttributeError, TypeError) as exc:
        raise DecodeError("invalid_record", f"{kind}: {exc}") from None
