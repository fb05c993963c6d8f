"""The canonical bytes of an effect request, written out directly for the common request.

A step's request is hashed (its ``request_hash``) each time the fold issues it, live and in
replay; :func:`~broker_schema.codec.encode` serializes it through pydantic and walks every member
(the input's 16 KB string of a file included) to find what RFC 8785 prints differently. A
request with no parameters and no ``reissue_of`` whose input is an inline text or base64 body, a
reference or none, holds only strings and integers in fixed places: :func:`request_bytes`
writes its canonical bytes from its fields (keys in their sorted order, each string by orjson,
which prints strings as RFC 8785 does). Any other request, and every request should the record
kinds gain or lose a field (checked once, at import), goes to :func:`encode`.

The same bytes as :func:`encode` (property-tested over generated requests), and the same
:class:`~broker_schema.RecordTooLarge` for a request over the frame cap.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
from pydantic import BaseModel

from broker_schema._errors import RecordTooLarge
from broker_schema.canonical import canonical_json
from broker_schema.codec import encode
from broker_schema.limits import MAX_RECORD_BYTES
from broker_schema.records import (
    SCHEMA_VERSION,
    ChunkRef,
    EffectHeader,
    EffectRequest,
    InlineBody,
    StreamRef,
)

__all__ = ["request_bytes"]

_dumps: Callable[[object], bytes] = orjson.dumps

#: The fields this module writes, per class: the fast path is off if a class has others.
_WRITES: dict[type[BaseModel], set[str]] = {
    EffectRequest: {"kind", "v", "header", "effect_kind", "model", "params", "input",
                    "deadline_ms", "reissue_of"},
    EffectHeader: {"workload_id", "input_offset", "index", "epoch", "shadow"},
    InlineBody: {"type", "encoding", "data", "media_type"},
}
_ON = SCHEMA_VERSION == 1 and all(set(cls.model_fields) == names
                                  for cls, names in _WRITES.items())


def _string(value: str | None) -> bytes:
    return b"null" if value is None else _dumps(value)


def request_bytes(req: EffectRequest, *, limit: int = MAX_RECORD_BYTES) -> bytes:
    """``encode(req)``: written out directly when ``req`` is a request the module docstring
    names, else by :func:`encode`."""
    h = req.header
    if (not _ON or req.params or req.reissue_of is not None or type(req) is not EffectRequest
            or type(h) is not EffectHeader or not (_int(req.deadline_ms) and _int(h.epoch)
                                                   and _int(h.index) and _int(h.input_offset))):
        return encode(req, limit=limit)
    try:
        data = _written(req, h)
    except orjson.JSONEncodeError:  # a string orjson refuses (a lone surrogate): encode says why
        return encode(req, limit=limit)
    if data is None:
        return encode(req, limit=limit)
    if len(data) > limit:
        raise RecordTooLarge(len(data), limit)
    return data


def _input(body: object) -> tuple[bytes, ...] | None:
    """The canonical bytes of a request's input, in parts (joined once, with the record's: the
    body's string may be 64 KiB), or None when it is not written out here."""
    if body is None:
        return (b"null",)
    if type(body) is InlineBody and body.encoding != "json" and type(body.data) is str:
        return (b'{"data":', _dumps(body.data), b',"encoding":"', body.encoding.encode(),
                b'","media_type":', _string(body.media_type), b',"type":"inline"}')
    if type(body) is ChunkRef or type(body) is StreamRef:
        return (canonical_json(body.model_dump(mode="json")),)  # small: no shortcut
    return None


def _written(req: EffectRequest, h: EffectHeader) -> bytes | None:
    input_parts = _input(req.input)
    if input_parts is None:
        return None
    return b"".join((
        b'{"deadline_ms":', str(req.deadline_ms).encode(),
        b',"effect_kind":', _dumps(req.effect_kind),
        b',"header":{"epoch":', str(h.epoch).encode(), b',"index":', str(h.index).encode(),
        b',"input_offset":', str(h.input_offset).encode(), b',"shadow":', _string(h.shadow),
        b',"workload_id":', _dumps(h.workload_id),
        b'},"input":', *input_parts,
        b',"kind":"request","model":', _string(req.model),
        b',"params":{},"v":1}',
    ))


def _int(value: object) -> bool:
    """An integer JSON carries exactly (RFC 8785), printed as Python prints it."""
    return type(value) is int and -(2**53) < value < 2**53
