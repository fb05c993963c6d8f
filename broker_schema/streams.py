"""Which records belong on which topic, declared once (docs/records.md, "Topics").

The typed unions below are the declaration: what a workload's ``.resp`` holds is
:data:`RespRecord`, and so on. Every other table is derived from them: the record classes per
stream (:data:`STREAM_RECORDS`, for ``isinstance`` checks), the kinds per stream
(:data:`STREAM_KINDS`, for messages and the console), the kinds per topic (:func:`kinds_on`, which
:func:`broker_schema.decode` checks for ``wrong_stream``). Stream names are
:data:`broker_schema.topics.STREAMS`.
"""

from __future__ import annotations

from typing import get_args

from pydantic import BaseModel

from broker_schema import topics
from broker_schema.records import (
    AcceptedRecord,
    ActuatorMemoryRecord,
    AlarmAckRecord,
    AlarmRecord,
    ClaimRecord,
    EffectRequest,
    FactsRecord,
    InputRecord,
    KeyCertRecord,
    KeyRevokeRecord,
    MergeEntry,
    ModelAliasRecord,
    ModelRecord,
    ModuleRecord,
    OutputRecord,
    RedactionRecord,
    RejectedRecord,
    ResponseRecord,
    ShadowEvalRecord,
    ShadowReportRecord,
    SkipAlarmRecord,
    SkipOrderRecord,
    SnapshotRecord,
    SpecRecord,
    TickRecord,
    kind_of,
)

__all__ = [
    "SHADOW_KINDS",
    "SHADOW_RECORDS",
    "STREAM_KINDS",
    "STREAM_RECORDS",
    "SYSTEM_KINDS",
    "InRecord",
    "MergeRecord",
    "OutRecord",
    "RespRecord",
    "ShadowRespRecord",
    "SourceRecord",
    "kinds_on",
    "stream_kinds",
]

# ------------------------------------------------------------------------- the declaration
#: ``wl.<id>.in``: the step inputs.
InRecord = InputRecord
#: ``wl.<id>.out``: the step's requests and outputs (a request first: the timeline's order).
OutRecord = EffectRequest | OutputRecord
#: A shadow evaluation's ``.resp``: the executors' answers (no holder writes there).
ShadowRespRecord = AcceptedRecord | ResponseRecord
#: ``wl.<id>.resp``: the executors' answers and the holder's clock ticks.
RespRecord = AcceptedRecord | ResponseRecord | TickRecord
#: ``wl.<id>.merge``: the merge order and the snapshots.
MergeRecord = MergeEntry | SnapshotRecord
#: What the merge order names: a record of ``.in`` or of ``.resp``.
SourceRecord = InRecord | RespRecord

#: The record classes on each workload stream, in the order of :data:`topics.STREAMS`.
STREAM_RECORDS: dict[str, tuple[type[BaseModel], ...]] = {
    "in": (InRecord,),
    "spec": (SpecRecord, SkipOrderRecord),
    "claims": (ClaimRecord,),
    "out": get_args(OutRecord),
    "resp": get_args(RespRecord),
    "merge": get_args(MergeRecord),
}
#: The record classes on each shadow evaluation stream (:data:`topics.SHADOW_STREAMS`).
SHADOW_RECORDS: dict[str, tuple[type[BaseModel], ...]] = {
    "eval": (ShadowEvalRecord, ShadowReportRecord),
    "out": (EffectRequest,),
    "resp": get_args(ShadowRespRecord),
}
#: The record classes on the system topics that hold records.
SYSTEM_RECORDS: dict[str, tuple[type[BaseModel], ...]] = {
    topics.FACTS: (FactsRecord,),
    topics.REJECTS: (RejectedRecord,),
    topics.KEYS: (KeyCertRecord, KeyRevokeRecord),
    topics.ALARMS: (AlarmRecord, AlarmAckRecord, SkipAlarmRecord),
    topics.MODULES: (ModuleRecord,),
    topics.MODELS: (ModelRecord, ModelAliasRecord),
    # beside the chunks' parts and key entries (raw bytes, not records): the redactions
    topics.CHUNKS: (RedactionRecord,),
}
#: What each actuator gateway's memory topic (``sys.actuator.<node id>``) holds.
ACTUATOR_RECORDS: tuple[type[BaseModel], ...] = (ActuatorMemoryRecord,)


# ------------------------------------------------------------------------- derived tables
def _kinds(models: tuple[type[BaseModel], ...]) -> frozenset[str]:
    return frozenset(kind_of(m) for m in models)


def stream_kinds(models: tuple[type[BaseModel], ...]) -> tuple[str, ...]:
    """The kinds of ``models``, in their declared order."""
    return tuple(kind_of(m) for m in models)


#: Which record kinds belong on each workload stream.
STREAM_KINDS: dict[str, frozenset[str]] = {s: _kinds(m) for s, m in STREAM_RECORDS.items()}
#: Which record kinds belong on each shadow evaluation stream.
SHADOW_KINDS: dict[str, frozenset[str]] = {s: _kinds(m) for s, m in SHADOW_RECORDS.items()}
#: Which record kinds belong on the system topics that hold records.
SYSTEM_KINDS: dict[str, frozenset[str]] = {t: _kinds(m) for t, m in SYSTEM_RECORDS.items()}
_ACTUATOR_KINDS = _kinds(ACTUATOR_RECORDS)


def kinds_on(topic: str) -> frozenset[str] | None:
    """The record kinds that belong on ``topic``; None when the topic is not one of ours."""
    if topic in SYSTEM_KINDS:
        return SYSTEM_KINDS[topic]
    if topic.startswith(topics.ACTUATOR_PREFIX):
        return _ACTUATOR_KINDS
    try:
        return STREAM_KINDS[topics.parse(topic)[1]]
    except ValueError:
        pass
    try:
        return SHADOW_KINDS[topics.parse_shadow(topic)[2]]
    except ValueError:
        return None

