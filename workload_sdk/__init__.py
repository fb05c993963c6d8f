"""The workload SDK: write a deterministic step, run it under a lease holder, replay and audit it.

A workload is a fold ``step(state, event) -> (state, outputs)`` (see :class:`Workload`). Its
effects (model inference, actuation) are requests on ``wl.<id>.out``; their answers come back
through the recorded merge order on ``wl.<id>.merge``, so replay reads them and never calls a model.

This package never imports ``executor``: the two meet only on the log.
"""

from workload_sdk._actuation import (
    ReadBack,
    await_read_back,
    read_back,
    reissue,
    telemetry_of,
)
from workload_sdk._api import (
    EffectResult,
    Emit,
    Event,
    InputEvent,
    Output,
    Request,
    State,
    Workload,
    WorkloadError,
    actuate,
    emit,
    infer,
    module_hash,
    reask,
    recall,
    remember,
    request,
    state_bytes,
    state_hash,
)
from workload_sdk._audit import AuditReport, InvariantResult, audit
from workload_sdk._core import Core, Decision, Item, choose_next, due_outcomes
from workload_sdk._election import ElectionConfig, HolderElection
from workload_sdk._holder import Fenced, HolderConfig, LeaseHolder, NoSpec, transactional_id_for
from workload_sdk._loader import load_workload
from workload_sdk._local import (
    LocalAnswer,
    LocalModelUnavailable,
    local_generate,
    local_logits,
    local_tokenize,
)
from workload_sdk._logview import LogGap, LogRecord, TopicView, WorkloadLog
from workload_sdk._replay import DiffReport, ReplayError, ReplayResult, diff, replay
from workload_sdk._trim import TopicTrim, TrimPlan, plan_trim
from workload_sdk._trim_io import trim_workload
from workload_sdk._why import why

__all__ = [
    "AuditReport",
    "Core",
    "Decision",
    "DiffReport",
    "EffectResult",
    "ElectionConfig",
    "Emit",
    "Event",
    "Fenced",
    "HolderConfig",
    "HolderElection",
    "InputEvent",
    "InvariantResult",
    "Item",
    "LeaseHolder",
    "LocalAnswer",
    "LocalModelUnavailable",
    "LogGap",
    "LogRecord",
    "NoSpec",
    "Output",
    "ReadBack",
    "ReplayError",
    "ReplayResult",
    "Request",
    "State",
    "TopicTrim",
    "TopicView",
    "TrimPlan",
    "Workload",
    "WorkloadError",
    "WorkloadLog",
    "actuate",
    "audit",
    "await_read_back",
    "choose_next",
    "diff",
    "due_outcomes",
    "emit",
    "infer",
    "load_workload",
    "local_generate",
    "local_logits",
    "local_tokenize",
    "module_hash",
    "plan_trim",
    "read_back",
    "reask",
    "recall",
    "reissue",
    "remember",
    "replay",
    "request",
    "state_bytes",
    "state_hash",
    "telemetry_of",
    "transactional_id_for",
    "trim_workload",
    "why",
]
