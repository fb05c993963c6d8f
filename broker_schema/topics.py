"""Topic names, in one place. One partition each per workload topic, so order is total."""

from __future__ import annotations

import re

from broker_schema.limits import MAX_WORKLOAD_ID_LEN

#: Compacted topic keyed by executor node id.
FACTS = "sys.facts"
#: Records that could not be decoded, with where they were found and why (see RejectedRecord).
REJECTS = "sys.rejects"
#: Compacted chunk store topic (content-addressed bodies over the inline limit).
CHUNKS = "sys.chunks"
#: Node key certificates and revocations signed by a fleet key (never compacted: the history).
KEYS = "sys.keys"
#: Prefix of the per-node receipt ledgers (``sys.ledger.<node id>``, never compacted).
LEDGER_PREFIX = "sys.ledger."
#: Characters Kafka allows in a topic name (and so in a node id that has a ledger).
_TOPIC_CHARS_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_MAX_TOPIC_LEN = 249

WORKLOAD_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
STREAMS = ("in", "spec", "claims", "out", "resp", "merge")
#: Pattern an executor subscribes to for effect requests.
OUT_PATTERN = r"^wl\.[A-Za-z0-9][A-Za-z0-9_-]*\.out$"


def check_workload_id(workload_id: str) -> str:
    """Return ``workload_id`` if it is usable in topic names, else raise ``ValueError``."""
    if not WORKLOAD_ID_RE.fullmatch(workload_id) or len(workload_id) > MAX_WORKLOAD_ID_LEN:
        raise ValueError(
            f"invalid workload id {workload_id!r}: letters, digits, '_' and '-', "
            f"starting with a letter or digit, at most {MAX_WORKLOAD_ID_LEN} characters"
        )
    return workload_id


def _topic(workload_id: str, stream: str) -> str:
    return f"wl.{check_workload_id(workload_id)}.{stream}"


def stream(workload_id: str, name: str) -> str:
    """``wl.<id>.<name>`` for one of :data:`STREAMS` (``ValueError`` for any other name)."""
    if name not in STREAMS:
        raise ValueError(f"not a workload stream: {name!r} (one of {', '.join(STREAMS)})")
    return _topic(workload_id, name)


def prefix(workload_id: str) -> str:
    """``wl.<id>.``: the prefix of every topic of one workload and of no other (an id never
    holds a ``.``), for prefixed ACLs."""
    return f"wl.{check_workload_id(workload_id)}."


def out_pattern(workload_id: str | None = None) -> str:
    """The regex an executor subscribes to: every workload's ``.out`` (:data:`OUT_PATTERN`), or
    only ``workload_id``'s."""
    if workload_id is None:
        return OUT_PATTERN
    return rf"^wl\.{re.escape(check_workload_id(workload_id))}\.out$"


def inputs(workload_id: str) -> str:
    """``wl.<id>.in``: input records from producers (sensors, gateways)."""
    return _topic(workload_id, "in")


def spec(workload_id: str) -> str:
    """``wl.<id>.spec``: spec records written by operators."""
    return _topic(workload_id, "spec")


def claims(workload_id: str) -> str:
    """``wl.<id>.claims``: lease claims (epoch, holder, spec hash)."""
    return _topic(workload_id, "claims")


def out(workload_id: str) -> str:
    """``wl.<id>.out``: the step's outputs, effect requests among them."""
    return _topic(workload_id, "out")


def resp(workload_id: str) -> str:
    """``wl.<id>.resp``: accepted, response, timeout and unknown records."""
    return _topic(workload_id, "resp")


def merge(workload_id: str) -> str:
    """``wl.<id>.merge``: the recorded merge order."""
    return _topic(workload_id, "merge")


def ledger(node_id: str) -> str:
    """``sys.ledger.<node id>``: every receipt the node signed, with its signed checkpoints
    (:mod:`executor.integer.ledger`). ``ValueError`` for a node id Kafka cannot name a topic
    after."""
    name = LEDGER_PREFIX + node_id
    if not _TOPIC_CHARS_RE.fullmatch(node_id) or len(name) > _MAX_TOPIC_LEN:
        raise ValueError(f"node id {node_id!r} cannot name a ledger topic: letters, digits, "
                         f"'.', '_' and '-', at most {_MAX_TOPIC_LEN - len(LEDGER_PREFIX)}")
    return name


def all_topics(workload_id: str) -> list[str]:
    """Every per-workload topic, in the order of :data:`STREAMS`."""
    return [_topic(workload_id, s) for s in STREAMS]


#: Which record kinds belong on each workload stream (docs/records.md, "Topics").
STREAM_KINDS: dict[str, frozenset[str]] = {
    "in": frozenset({"input"}),
    "spec": frozenset({"spec"}),
    "claims": frozenset({"claim"}),
    "out": frozenset({"output", "request"}),
    "resp": frozenset({"accepted", "response", "tick"}),
    "merge": frozenset({"merge", "snapshot"}),
}
#: Which record kinds belong on the system topics that hold records.
SYSTEM_KINDS: dict[str, frozenset[str]] = {
    FACTS: frozenset({"facts"}),
    REJECTS: frozenset({"rejected"}),
    KEYS: frozenset({"key_cert", "key_revoke"}),
}


def kinds_on(topic: str) -> frozenset[str] | None:
    """The record kinds that belong on ``topic``; None when the topic is not one of ours."""
    if topic in SYSTEM_KINDS:
        return SYSTEM_KINDS[topic]
    try:
        return STREAM_KINDS[parse(topic)[1]]
    except ValueError:
        return None


def parse(topic: str) -> tuple[str, str]:
    """Split ``wl.<id>.<stream>`` into ``(workload_id, stream)``; ``ValueError`` otherwise."""
    parts = topic.split(".")
    if len(parts) != 3 or parts[0] != "wl" or parts[2] not in STREAMS:
        raise ValueError(f"not a workload topic: {topic!r}")
    return check_workload_id(parts[1]), parts[2]
