"""Canonical bytes and content hashes.

Canonical bytes are RFC 8785 (JSON Canonicalization Scheme): UTF-8, object keys sorted by UTF-16
code units, no insignificant white space, numbers in their shortest ECMAScript form. Every record
on the wire *is* its canonical bytes, so the bytes a producer hashed or signed are exactly the bytes
a consumer reads. RFC 8785 numbers are IEEE doubles: integers must stay within +-(2^53 - 1), and
NaN and infinities are refused. An integral float of magnitude 2^53 or more is printed as an
integer that no decoder may read back exactly, so keep float parameters below 2^53 too.

Content hashes are ``sha256:<64 lowercase hex>`` over the canonical bytes (records) or the raw
bytes (model files, chunks).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import rfc8785

from broker_schema._errors import EncodeError

HASH_PREFIX = "sha256:"
HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
HASH_PATTERN = HASH_RE.pattern


def canonical_json(value: Any) -> bytes:
    """Return the RFC 8785 canonical bytes of a JSON-compatible value.

    Raises :class:`EncodeError` (code ``not_canonicalizable``) for values JSON cannot carry exactly:
    integers beyond 2^53, NaN, infinities, non-string keys.
    """
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise EncodeError("not_canonicalizable", f"{type(exc).__name__}: {exc}") from exc


def sha256_hex(data: bytes) -> str:
    """``sha256:<hex>`` of raw bytes."""
    return HASH_PREFIX + hashlib.sha256(data).hexdigest()


_HEX_RE = re.compile(r"^[0-9a-f]{64}$")


def hash_from_hex(hexdigest: str) -> str:
    """``sha256:<hexdigest>`` for a 64-character lowercase hex digest (``ValueError`` for
    anything else): for digests computed elsewhere (a file hashed in blocks, the integer engine's
    bare-hex modelHash)."""
    if not _HEX_RE.fullmatch(hexdigest):
        raise ValueError(f"not a sha256 hex digest: {hexdigest[:80]!r}")
    return HASH_PREFIX + hexdigest


def hex_of_hash(content_hash: str) -> str:
    """The 64 hex digits of a ``sha256:<hex>`` reference (``ValueError`` if it is not one): for
    file names and the integer engine's bare-hex modelHash."""
    if not HASH_RE.fullmatch(content_hash):
        raise ValueError(f"not a sha256:<hex> reference: {content_hash[:80]!r}")
    return content_hash[len(HASH_PREFIX):]


def content_hash(value: Any) -> str:
    """``sha256:<hex>`` of the canonical bytes of a JSON-compatible value."""
    return sha256_hex(canonical_json(value))


def is_hash(text: str) -> bool:
    """True when ``text`` is a well-formed ``sha256:<hex>`` reference."""
    return bool(HASH_RE.fullmatch(text))
