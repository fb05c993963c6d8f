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
#: Alarms for people (``alarm``, ``alarm_ack``): an at-most-once actuation that ended ``unknown``.
ALARMS = "sys.alarms"
#: The module store: workload code by content hash (``module``, compacted, keyed by the hash).
MODULES = "sys.modules"
#: The model registry: ``NAME@VERSION`` -> hash, aliases, licence notices (``model``,
#: ``model_alias``; compacted, keyed by ``name@version`` and ``name#alias``). Written by the
#: operator only (``fx models register``, ``fx models alias``).
MODELS = "sys.models"
#: Prefix of each actuator gateway's memory (``sys.actuator.<node id>``, compacted).
ACTUATOR_PREFIX = "sys.actuator."
#: Prefix of the per-node receipt ledgers (``sys.ledger.<node id>``, never compacted).
LEDGER_PREFIX = "sys.ledger."
#: Characters Kafka allows in a topic name (and so in a node id that has a ledger).
_TOPIC_CHARS_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_MAX_TOPIC_LEN = 249

WORKLOAD_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
STREAMS = ("in", "spec", "claims", "out", "resp", "merge")
#: The streams ``fx trim`` may delete records of (below the audit horizon), in the order plans
#: are printed; ``.spec`` and ``.claims`` are never trimmed. Also the only topics any role of
#: ``fx acl apply`` may DELETE (records, never the topic: see ``fx_kafka.acl``).
TRIMMED = ("in", "out", "resp", "merge")
#: The streams of one shadow evaluation (``wl.<id>.shadow.<eval>.<stream>``): its definition
#: and report (``eval``), the requests it re-issues (``out``) and the executors' answers
#: (``resp``). Never read by the live holder, never written by it.
SHADOW_STREAMS = ("eval", "out", "resp")
_ID = r"[A-Za-z0-9][A-Za-z0-9_-]*"
#: Pattern an executor subscribes to for effect requests: every workload's ``.out`` and every
#: shadow evaluation's ``.out``.
OUT_PATTERN = rf"^wl\.{_ID}\.(?:shadow\.{_ID}\.)?out$"


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
    """The regex an executor subscribes to: every workload's ``.out`` and its shadow
    evaluations' (:data:`OUT_PATTERN`), or only ``workload_id``'s."""
    if workload_id is None:
        return OUT_PATTERN
    return rf"^wl\.{re.escape(check_workload_id(workload_id))}\.(?:shadow\.{_ID}\.)?out$"


def check_eval_id(eval_id: str) -> str:
    """Return ``eval_id`` (a shadow evaluation's name) if it is usable in topic names and effect
    ids (the rule of workload ids: no ``.``), else raise ``ValueError``."""
    if not WORKLOAD_ID_RE.fullmatch(eval_id) or len(eval_id) > MAX_WORKLOAD_ID_LEN:
        raise ValueError(
            f"invalid shadow evaluation id {eval_id!r}: letters, digits, '_' and '-', "
            f"starting with a letter or digit, at most {MAX_WORKLOAD_ID_LEN} characters"
        )
    return eval_id


def shadow_prefix(workload_id: str) -> str:
    """``wl.<id>.shadow.``: the prefix of every shadow evaluation's topics of one workload."""
    return f"{prefix(workload_id)}shadow."


def shadow_stream(workload_id: str, eval_id: str, name: str) -> str:
    """``wl.<id>.shadow.<eval>.<name>`` for one of :data:`SHADOW_STREAMS`."""
    if name not in SHADOW_STREAMS:
        raise ValueError(f"not a shadow stream: {name!r} (one of {', '.join(SHADOW_STREAMS)})")
    return f"{shadow_prefix(workload_id)}{check_eval_id(eval_id)}.{name}"


def parse_shadow(topic: str) -> tuple[str, str, str]:
    """Split ``wl.<id>.shadow.<eval>.<stream>`` into ``(workload_id, eval_id, stream)``;
    ``ValueError`` otherwise."""
    parts = topic.split(".")
    if (len(parts) != 5 or parts[0] != "wl" or parts[2] != "shadow"
            or parts[4] not in SHADOW_STREAMS):
        raise ValueError(f"not a shadow evaluation topic: {topic!r}")
    return check_workload_id(parts[1]), check_eval_id(parts[3]), parts[4]


def request_topic(topic: str) -> tuple[str, str | None]:
    """Where a request read from ``topic`` belongs: ``(workload_id, None)`` for ``wl.<id>.out``,
    ``(workload_id, eval_id)`` for a shadow evaluation's ``.out``; ``ValueError`` for any other
    topic."""
    try:
        wid, stream = parse(topic)
        if stream == "out":
            return wid, None
    except ValueError:
        wid, eval_id, stream = parse_shadow(topic)
        if stream == "out":
            return wid, eval_id
    raise ValueError(f"not a request topic: {topic!r}")


def resp_for(workload_id: str, shadow: str | None) -> str:
    """Where answers to a request of ``workload_id`` go: ``wl.<id>.resp``, or the shadow
    evaluation's ``.resp`` when the request carries a shadow name (its header's ``shadow``)."""
    if shadow is None:
        return resp(workload_id)
    return shadow_stream(workload_id, shadow, "resp")


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
    (:mod:`fx_integer.ledger`). ``ValueError`` for a node id Kafka cannot name a topic
    after."""
    name = LEDGER_PREFIX + node_id
    if not _TOPIC_CHARS_RE.fullmatch(node_id) or len(name) > _MAX_TOPIC_LEN:
        raise ValueError(f"node id {node_id!r} cannot name a ledger topic: letters, digits, "
                         f"'.', '_' and '-', at most {_MAX_TOPIC_LEN - len(LEDGER_PREFIX)}")
    return name


def actuator_memory(node_id: str) -> str:
    """``sys.actuator.<node id>``: what the actuator gateway ``node_id`` remembers (effect ids it
    attempted, highest epochs per device), compacted. ``ValueError`` for a node id Kafka cannot
    name a topic after."""
    name = ACTUATOR_PREFIX + node_id
    if not _TOPIC_CHARS_RE.fullmatch(node_id) or len(name) > _MAX_TOPIC_LEN:
        raise ValueError(f"node id {node_id!r} cannot name a memory topic: letters, digits, "
                         f"'.', '_' and '-', at most {_MAX_TOPIC_LEN - len(ACTUATOR_PREFIX)}")
    return name


def all_topics(workload_id: str) -> list[str]:
    """Every per-workload topic, in the order of :data:`STREAMS`."""
    return [_topic(workload_id, s) for s in STREAMS]


def parse(topic: str) -> tuple[str, str]:
    """Split ``wl.<id>.<stream>`` into ``(workload_id, stream)``; ``ValueError`` otherwise."""
    parts = topic.split(".")
    if len(parts) != 3 or parts[0] != "wl" or parts[2] not in STREAMS:
        raise ValueError(f"not a workload topic: {topic!r}")
    return check_workload_id(parts[1]), parts[2]
