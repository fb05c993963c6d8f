"""Typed errors of the wire contract.

Every failure to decode or encode a record is a :class:`RecordError` with a stable ``code`` from a
closed set, so a consumer can count, log and route bad input by code and never by message text.
"""

from __future__ import annotations

from typing import Literal, get_args

DecodeCode = Literal[
    "oversize",  # the record is larger than MAX_RECORD_BYTES
    "not_json",  # not UTF-8 JSON at all (garbage bytes)
    "too_deep",  # JSON nested deeper than MAX_JSON_DEPTH
    "not_object",  # valid JSON but not an object
    "unknown_kind",  # missing or unknown "kind"
    "unsupported_version",  # missing or unknown schema version "v"
    "invalid_record",  # a known kind and version whose fields do not validate
    "effect_id_mismatch",  # an effect_id that is not the one its header (or workload) spells
    "not_canonical",  # valid, but the bytes are not the record's canonical encoding
    "wrong_stream",  # a valid record of a kind that does not belong on the topic it was read from
]

DECODE_CODES: tuple[str, ...] = get_args(DecodeCode)


class RecordError(Exception):
    """Base of every wire-contract error. ``code`` is stable; ``detail`` is for people."""

    code: str = "invalid_record"
    #: A retry with the same bytes can never succeed.
    retriable: bool = False

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class DecodeError(RecordError):
    """Raised by :func:`broker_schema.decode` for any bytes that are not a valid record."""

    code: DecodeCode

    def __init__(self, code: DecodeCode, detail: str) -> None:
        super().__init__(code, detail)


class EncodeError(RecordError):
    """Raised by :func:`broker_schema.encode` when a record cannot be put on the wire."""


class RecordTooLarge(EncodeError):
    """The encoded record exceeds the broker frame cap; it is refused before it is sent."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__("oversize", f"record is {size} bytes, limit is {limit}")
        self.size = size
        self.limit = limit
