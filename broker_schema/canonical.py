"""Canonical bytes and content hashes.

Canonical bytes are RFC 8785 (JSON Canonicalization Scheme): UTF-8, object keys sorted by UTF-16
code units, no insignificant white space, numbers in their shortest ECMAScript form. Every record
on the wire *is* its canonical bytes, so the bytes a producer hashed or signed are exactly the bytes
a consumer reads. RFC 8785 numbers are IEEE doubles: integers must stay within +-(2^53 - 1), and
NaN and infinities are refused. An integral float of magnitude 2^53 or more is printed as an
integer that no decoder may read back exactly, so keep float parameters below 2^53 too.

The encoder runs at C speed: structure, strings and integers go through ``orjson`` (keys sorted,
53-bit integers enforced), and only what orjson does not print the RFC 8785 way is done here:
each float is formatted by ECMAScript's Number-to-String (handed to orjson as a pre-formatted
``orjson.Fragment``), and an object with a key above U+FFFF (where UTF-16 order differs from
code point order) is sorted by UTF-16 code units. A value orjson cannot take as it is (nesting
deeper than orjson's limit, a subclass of a JSON type) goes through the reference algorithm in
pure Python. tests/unit/test_canonical.py proves the bytes identical to the ``rfc8785`` package
(the reference implementation, a test dependency) over the whole record domain.

Content hashes are ``sha256:<64 lowercase hex>`` over the canonical bytes (records) or the raw
bytes (model files, chunks).
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import orjson

from broker_schema._errors import EncodeError

HASH_PREFIX = "sha256:"
HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
HASH_PATTERN = HASH_RE.pattern

_INT_MAX = 2**53 - 1
_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER
_Fragment = orjson.Fragment
_dumps = orjson.dumps


class _Refused(ValueError):
    """A value RFC 8785 cannot carry (raised inside the encoder, reported as EncodeError)."""


class _TooDeep(Exception):
    """Nesting beyond the caller's limit (canonical_record_json)."""


def canonical_json(value: Any) -> bytes:
    """Return the RFC 8785 canonical bytes of a JSON-compatible value.

    Raises :class:`EncodeError` (code ``not_canonicalizable``) for values JSON cannot carry exactly:
    integers beyond 2^53, NaN, infinities, non-string keys.
    """
    try:
        return _dumps(_prepare(value), option=_OPTIONS)
    except orjson.JSONEncodeError as exc:
        if "Recursion limit" not in str(exc):
            raise EncodeError("not_canonicalizable", f"{type(exc).__name__}: {exc}") from exc
    except (_Refused, TypeError, ValueError, RecursionError) as exc:
        raise EncodeError("not_canonicalizable", f"{type(exc).__name__}: {exc}") from exc
    # nested deeper than orjson goes (255 levels): the same bytes, by the reference algorithm
    try:
        out: list[bytes] = []
        _py_dump(value, out)
        return b"".join(out)
    except (_Refused, TypeError, ValueError, RecursionError) as exc:
        raise EncodeError("not_canonicalizable", f"{type(exc).__name__}: {exc}") from exc


def canonical_record_json(value: Any, *, max_depth: int, max_float: float) -> bytes:
    """:func:`canonical_json` of a record's value, checked in the same pass: nesting deeper than
    ``max_depth`` (a scalar is depth 0, ``{}`` and ``[]`` are 1) raises :class:`EncodeError`
    ``too_deep``; a float of magnitude ``max_float`` or more, like any value RFC 8785 cannot
    carry, ``not_canonicalizable``. The same bytes as :func:`canonical_json`."""
    try:
        return _dumps(_prepare(value, max_depth, max_float), option=_OPTIONS)
    except _TooDeep:
        raise EncodeError("too_deep", f"record nests more than {max_depth} levels deep") from None
    except (_Refused, TypeError, ValueError, RecursionError) as exc:
        raise EncodeError("not_canonicalizable", f"{type(exc).__name__}: {exc}") from exc


def canonical_json_plain(value: Any) -> bytes:
    """:func:`canonical_json` of a value the caller knows holds no float and no character above
    U+FFFF, of exact JSON types only (``decode`` knows it from the parse): then orjson's sorted
    output *is* RFC 8785, with no pass over the value here. Raises :class:`EncodeError` like
    :func:`canonical_json` for what orjson refuses (integers beyond 2^53...)."""
    try:
        return _dumps(value, option=_OPTIONS)
    except TypeError:
        return canonical_json(value)


def json_string(text: str) -> bytes:
    """The canonical bytes of one string (RFC 8785 strings are orjson's)."""
    try:
        return _dumps(text)
    except TypeError as exc:
        raise EncodeError("not_canonicalizable", f"{type(exc).__name__}: {exc}") from exc


# ------------------------------------------------------------------------------- numbers


def es_number(f: float) -> bytes:
    """ECMAScript Number-to-String of a finite double, as RFC 8785 section 3.2.2.3 prints it
    (``1.0`` -> ``1``, ``-0.0`` -> ``0``, ``1e21`` -> ``1e+21``, ``1e-6`` -> ``0.000001``,
    ``1e-7`` -> ``1e-7``); :class:`ValueError` for NaN and infinities."""
    if f != f or f in (math.inf, -math.inf):
        raise _Refused(f"{f} is not representable in JCS")
    if f == 0:
        return b"0"
    text = repr(f)  # the shortest round-trip digits, as ECMAScript's
    if "e" not in text:  # 1e-4 <= |f| < 1e16: the same form as ECMAScript's, but for ".0"
        if text.endswith(".0"):
            text = text[:-2]
        return text.encode("ascii")
    sign = ""
    if text[0] == "-":
        sign, text = "-", text[1:]
    mantissa, _, exp_text = text.partition("e")
    exponent = int(exp_text)
    digits = mantissa.replace(".", "")
    if mantissa.endswith(".0"):
        digits = digits[:-1]
    if 0 < exponent < 21:  # integers up to 21 digits are printed in full
        return (sign + digits + "0" * (exponent + 1 - len(digits))).encode("ascii")
    if -7 < exponent < 0:  # 0.000001 and up are printed without an exponent
        return (sign + "0." + "0" * (-exponent - 1) + digits).encode("ascii")
    head, tail = digits[0], digits[1:]
    return (f"{sign}{head}{'.' if tail else ''}{tail}e{'+' if exponent > 0 else '-'}"
            f"{abs(exponent)}").encode("ascii")


# ------------------------------------------------------------------------------- structure


def _prepare(value: Any, left: int = 1 << 30, limit: float = math.inf) -> Any:
    """``value`` as orjson should see it: the same object when orjson prints it the RFC 8785
    way already (no float, no key above U+FFFF, only exact JSON types), else a copy in which each
    float is a pre-formatted fragment and each object with a key above U+FFFF a fragment sorted
    by UTF-16 code units. ``left``: how many more levels of nesting are allowed (``_TooDeep``
    past them); ``limit``: floats must lie strictly within +-``limit`` (``_Refused``)."""
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return value
    if t is dict:
        if left <= 0:
            raise _TooDeep
        copy: dict[str, Any] | None = None
        for key, item in value.items():
            if type(key) is not str:
                return _prepare(_str_keys(value), left, limit)
            ti = type(item)
            if ti is str or ti is int or ti is bool or item is None:
                continue
            new = _float(item, limit) if ti is float else _prepare(item, left - 1, limit)
            if new is not item:
                if copy is None:
                    copy = dict(value)
                copy[key] = new
        for key in value:
            if not key.isascii() and max(key) > "\uffff":
                return _Fragment(_utf16_object(copy if copy is not None else value))
        return value if copy is None else copy
    if t is list:
        if left <= 0:
            raise _TooDeep
        new_list: list[Any] | None = None
        for i, item in enumerate(value):
            ti = type(item)
            if ti is str or ti is int or ti is bool or item is None:
                continue
            new = _float(item, limit) if ti is float else _prepare(item, left - 1, limit)
            if new is not item:
                if new_list is None:
                    new_list = list(value)
                new_list[i] = new
        return value if new_list is None else new_list
    if t is float:
        return _float(value, limit)
    return _prepare(_exact(value), left, limit)


def _float(number: float, limit: float) -> Any:
    if not -limit < number < limit and number == number and limit != math.inf:
        raise _Refused(f"number {number!r} is beyond +-2^53 (or not finite): no decoder reads "
                       "it back exactly")
    return _Fragment(es_number(number))


def _exact(value: Any) -> Any:
    """A subclass of a JSON type (a str or int enum member, a tuple...) as its exact base type,
    the way the reference reads it; anything else is refused."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    raise _Refused(f"unsupported type: {type(value)}")


def _str_keys(value: dict[Any, Any]) -> dict[str, Any]:
    items = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise _Refused("object keys must be strings")
        items[str.__str__(key)] = item
    return items


def _utf16_object(value: dict[str, Any]) -> bytes:
    """An object (already prepared) with its keys sorted by UTF-16 code units."""
    parts = [_dumps(key) + b":" + _dumps(item, option=_OPTIONS)
             for key, item in sorted(value.items(), key=lambda kv: kv[0].encode("utf-16be"))]
    return b"{" + b",".join(parts) + b"}"


# ---------------------------------------------------------------- the reference, in pure Python


def _py_dump(value: Any, out: list[bytes]) -> None:
    """RFC 8785 in pure Python (the same algorithm as the ``rfc8785`` package), for what orjson
    cannot take: nesting deeper than its limit."""
    if value is None:
        out.append(b"null")
    elif isinstance(value, bool):
        out.append(b"true" if value else b"false")
    elif isinstance(value, int):
        number = int(value)
        if not -_INT_MAX <= number <= _INT_MAX:
            raise _Refused(f"{number} exceeds safe integer domain for JSON floats")
        out.append(str(number).encode("ascii"))
    elif isinstance(value, str):
        out.append(_dumps(str.__str__(value)))
    elif isinstance(value, float):
        out.append(es_number(float(value)))
    elif isinstance(value, (list, tuple)):
        out.append(b"[")
        for i, item in enumerate(value):
            if i:
                out.append(b",")
            _py_dump(item, out)
        out.append(b"]")
    elif isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise _Refused("object keys must be strings")
        out.append(b"{")
        for i, (key, item) in enumerate(sorted(value.items(),
                                               key=lambda kv: kv[0].encode("utf-16be"))):
            if i:
                out.append(b",")
            out.append(_dumps(str.__str__(key)))
            out.append(b":")
            _py_dump(item, out)
        out.append(b"}")
    else:
        raise _Refused(f"unsupported type: {type(value)}")


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
