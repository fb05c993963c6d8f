"""Encode and decode records: the only way records get on and off the wire.

``encode`` returns the record's canonical bytes (RFC 8785) and refuses a record over the broker
frame cap before any producer sees it. ``decode`` turns any bytes into a record or raises one
:class:`DecodeError` with a stable code, and nothing else.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from broker_schema._errors import DecodeError, EncodeError, RecordTooLarge
from broker_schema.canonical import canonical_json, sha256_hex
from broker_schema.limits import MAX_RECORD_BYTES
from broker_schema.records import RECORD_TYPES, SUPPORTED_VERSIONS, Record

RECORD_ADAPTER: TypeAdapter[Record] = TypeAdapter(Record)


def encode(record: BaseModel, *, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The canonical bytes of ``record``; :class:`RecordTooLarge` if they exceed ``limit``."""
    if type(record) not in RECORD_TYPES.values():
        raise EncodeError("unknown_kind", f"{type(record).__name__} is not a record kind")
    data = canonical_json(record.model_dump(mode="json"))
    if len(data) > limit:
        raise RecordTooLarge(len(data), limit)
    return data


def record_hash(record: BaseModel) -> str:
    """``sha256:<hex>`` of the record's canonical bytes (spec hashes, state hashes...)."""
    return sha256_hex(canonical_json(record.model_dump(mode="json")))


_SAFE = 2**53


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


def _summarise(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc or '<record>'}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def decode(data: bytes | bytearray | memoryview | None, *, strict: bool = False) -> Record:
    """Decode one record value.

    Raises :class:`DecodeError` with code ``oversize``, ``not_json``, ``not_object``,
    ``unknown_kind``, ``unsupported_version`` or ``invalid_record``; with ``strict=True`` also
    ``not_canonical`` when the bytes are valid but not the canonical encoding (a record that was
    re-serialised on the way, so a signature over it would not check).
    """
    if data is None:
        raise DecodeError("not_json", "record has no value (a tombstone?)")
    raw = bytes(data)
    if len(raw) > MAX_RECORD_BYTES:
        raise DecodeError("oversize", f"record is {len(raw)} bytes, limit is {MAX_RECORD_BYTES}")
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant,
                         parse_int=_parse_int, parse_float=_parse_float)
    except _OutOfDomain as exc:
        raise DecodeError("invalid_record", str(exc)) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise DecodeError("not_json", f"{type(exc).__name__}: {str(exc)[:200]}") from None
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
    try:
        record = RECORD_ADAPTER.validate_json(raw)
    except ValidationError as exc:
        raise DecodeError("invalid_record", f"{kind}: {_summarise(exc)}") from None
    except (ValueError, TypeError, RecursionError) as exc:  # defensive: never leak another type
        raise DecodeError("invalid_record", f"{kind}: {type(exc).__name__}: {exc}") from None
    # Every number was checked to be within RFC 8785's exact domain while parsing, so the record
    # can always be re-encoded; only strict mode pays for doing it.
    if strict:
        try:
            canonical = canonical_json(record.model_dump(mode="json"))
        except EncodeError as exc:
            raise DecodeError("invalid_record", f"{kind}: {exc.detail}") from None
        if canonical != raw:
            raise DecodeError("not_canonical", f"{kind} record is valid but not in canonical "
                              "form")
    return record
