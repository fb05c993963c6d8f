"""Size limits of the wire contract (one place; the broker config and the docs follow these)."""

from __future__ import annotations

#: Largest inline body (request input, response output), measured as the canonical JSON bytes of
#: the body's data. Anything larger goes by reference (a chunk hash and size, or stream + offset).
INLINE_MAX_BYTES = 64 * 1024

#: Largest encoded record value. deploy/local-kafka sets the broker's message.max.bytes to this plus
#: 64 KiB of room for keys, headers and batch overhead; encode() refuses anything larger before it
#: reaches a producer.
MAX_RECORD_BYTES = 1024 * 1024

#: The broker's own frame cap as configured by deploy/local-kafka (message.max.bytes).
BROKER_MESSAGE_MAX_BYTES = MAX_RECORD_BYTES + 64 * 1024

#: Longest workload id: topic names are at most 249 characters and ours add a prefix and suffix.
MAX_WORKLOAD_ID_LEN = 200

#: Deepest nesting of a record's JSON (the record object itself is depth 1). Deeper values are
#: refused by decode (code ``too_deep``) and by encode, so every decoded record re-encodes.
MAX_JSON_DEPTH = 64
