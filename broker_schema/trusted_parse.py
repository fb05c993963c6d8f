"""The JSON of a trusted record parsed without copying its long body string through the parser.

``replay(..., trust_log=True)`` reads records that a lease holder decoded strictly when it
merged them (:func:`broker_schema.codec.decode_trusted`). The largest of them are inputs with an
inline body (a file as base64, a text), whose one long string orjson scans and copies character
by character. :func:`parse_trusted` takes that string as it is instead: in an input record's
canonical bytes the body comes first and its ``data`` first in it (``{"body":{"data":"...``);
an ASCII string without a backslash has no JSON escape (canonical JSON escapes quotes and
control characters with one), so its characters are its bytes up to the next quote. The rest of
the record is parsed by orjson. Like every trusted read it checks no body (base64 included).

For every record in canonical form (no duplicate keys, control characters escaped) the value is
``orjson.loads(raw)``'s; anything else that is not taken so (another kind, a short or non-ASCII
string, one with an escape, malformed JSON) is parsed by ``orjson.loads`` as it is, which raises
its own ``orjson.JSONDecodeError``. Property-tested against ``orjson.loads``.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["parse_trusted"]

#: The canonical bytes of an input record with an inline body begin so (keys sorted: ``body``
#: first, and ``data`` first among an inline body's keys).
_INPUT_HEAD = b'{"body":{"data":"'
#: Shorter strings are parsed by orjson as they are (the shortcut saves nothing on them).
_MIN_DATA = 512


def parse_trusted(raw: bytes) -> Any:
    """``orjson.loads(raw)`` (see the module docstring for the shortcut and when it applies)."""
    start = len(_INPUT_HEAD)
    if len(raw) >= start + _MIN_DATA and raw.startswith(_INPUT_HEAD):
        end = raw.find(b'"', start)
        if end - start >= _MIN_DATA and raw.find(b"\\", start, end) < 0:
            try:
                text = str(memoryview(raw)[start:end], "ascii")
            except UnicodeDecodeError:
                return orjson.loads(raw)
            obj = orjson.loads(raw[:start] + raw[end:])  # the same record, its data ""
            body = obj.get("body") if type(obj) is dict else None
            if type(body) is dict and body.get("data") == "":
                body["data"] = text
                return obj
    return orjson.loads(raw)
