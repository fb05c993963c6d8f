"""The workload SDK: write a deterministic step, run it under a lease holder, replay and audit it.

A workload is a fold ``step(state, event) -> (state, outputs)`` (see :class:`Workload`). Its
effects (model inference, actuation) are requests on ``wl.<id>.out``; their answers come back
through the recorded merge order on ``wl.<id>.merge``, so replay reads them and never calls a model.

Inputs of any size: :class:`InputWriter` (and ``fx workload input``) stores an input over the
inline limit as a chunk of the workload and writes its reference.

This package never imports ``executor``: the two meet only on the log.
"""

from fx_kafka.workload_log import LogGap, LogRecord, TopicView, WorkloadLog
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
    body_of,
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
from workload_sdk._commands import (
    MODULE_PLACEHOLDER,
    log_command,
    replay_command,
    show_command,
    why_command,
)
from workload_sdk._core import (
    Core,
    Decision,
    Item,
    Pending,
    choose_next,
    due_outcomes,
    holder_outcome,
    referenced_body,
)
from workload_sdk._election import ElectionConfig, HolderElection
from workload_sdk._holder import (
    Fenced,
    HolderConfig,
    LeaseHolder,
    NoSpec,
    Replaced,
    check_restart,
    rejoin_epoch,
    transactional_id_for,
)
from workload_sdk._input_writer import InputTooLarge, InputWriter, WrittenInput, write_input
from workload_sdk._kafka_io import read_workload_log
from workload_sdk._loader import load_workload
from workload_sdk._local import (
    LocalAnswer,
    LocalModelUnavailable,
    local_generate,
    local_logits,
    local_tokenize,
)
from workload_sdk._replay import (
    DiffReport,
    ReplayError,
    ReplayResult,
    compare_outputs,
    diff,
    out_slots,
    replay,
)
from workload_sdk._signature_tally import ReadResponse, check_signatures
from workload_sdk._trim import TopicTrim, TrimPlan, plan_trim
from workload_sdk._trim_io import trim_workload
from workload_sdk._why import why

__all__ = [
    "MODULE_PLACEHOLDER",
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
    "InputTooLarge",
    "InputWriter",
    "InvariantResult",
    "Item",
    "LeaseHolder",
    "LocalAnswer",
    "LocalModelUnavailable",
    "LogGap",
    "LogRecord",
    "NoSpec",
    "Output",
    "Pending",
    "ReadBack",
    "ReadResponse",
    "Replaced",
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
    "WrittenInput",
    "actuate",
    "audit",
    "await_read_back",
    "body_of",
    "check_restart",
    "check_signatures",
    "choose_next",
    "compare_outputs",
    "diff",
    "due_outcomes",
    "emit",
    "holder_outcome",
    "infer",
    "load_workload",
    "local_generate",
    "local_logits",
    "local_tokenize",
    "log_command",
    "module_hash",
    "out_slots",
    "plan_trim",
    "read_back",
    "read_workload_log",
    "reask",
    "recall",
    "referenced_body",
    "reissue",
    "rejoin_epoch",
    "remember",
    "replay",
    "replay_command",
    "request",
    "show_command",
    "state_bytes",
    "state_hash",
    "telemetry_of",
    "transactional_id_for",
    "trim_workload",
    "why",
    "why_command",
    "write_input",
]
