"""A file-type gate: ask a model what each uploaded file is, then open or close a gate.

Input: a file's bytes on ``wl.<id>.in``. The step asks the model bound as ``filetype`` (for
example magika on an executor) what it is; when the answer comes back, it emits a decision and
asks the gate actuator for an absolute set-point (``open`` for allowed types, ``closed`` for the
rest). A model answer of ``backpressure`` or ``timeout`` is asked again (:func:`workload_sdk.reask`,
at most three attempts); one that errs, is lost or runs out of attempts leaves the gate as it is
and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workload_sdk import (
    EffectResult,
    InputEvent,
    Output,
    State,
    Workload,
    actuate,
    emit,
    infer,
    reask,
    remember,
)

GATE_KIND = "acme:gate/set@1.0.0"
ALLOWED = ("pdf", "png", "jpeg", "txt", "markdown", "json", "csv")
INFER_DEADLINE_MS = 10_000
GATE_DEADLINE_MS = 1_000


def label_of(output: Any) -> str:
    """The file-type label in a model output: ``{"label": ...}``, ``{"output": {"label": ...}}``
    or a bare string."""
    if isinstance(output, str):
        return output
    if isinstance(output, dict):
        for key in ("label", "ct_label", "output_label"):
            if isinstance(output.get(key), str):
                return str(output[key])
        for value in output.values():
            if isinstance(value, dict):
                found = label_of(value)
                if found:
                    return found
    return ""


class FiletypeGate(Workload):
    """Asks ``filetype`` about every input; sets the gate from the answer."""

    def initial_state(self) -> State:
        return {"asked": {}, "files": 0, "decisions": 0, "gate": "closed", "answers": []}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                                Sequence[Output]]:
        asked = dict(state["asked"])
        new = dict(state, asked=asked)
        if isinstance(event, InputEvent):
            new["files"] = state["files"] + 1
            req = infer(model="filetype", input=event.body, deadline_ms=INFER_DEADLINE_MS)
            asked[f"{event.seq}/0"] = {"what": "infer", "input_offset": event.offset,
                                       "request": remember(req)}
            return new, [req]
        what = asked.pop(f"{event.input_offset}/{event.index}", {"what": "?"})
        new["answers"] = [*state["answers"], event.effect_id][-20:]
        if what["what"] == "infer" and (again := reask(event, what.get("request"))) is not None:
            req, remembered = again  # backpressure or timeout: ask again
            asked[f"{event.seq}/0"] = dict(what, request=remembered)
            return new, [req]
        if what["what"] == "infer":
            new["decisions"] = state["decisions"] + 1
            if not event.ok:
                return new, [emit({"file_offset": what["input_offset"], "decision": "hold",
                                   "because": event.outcome,
                                   "error": None if event.error is None else event.error.code})]
            label = label_of(event.json())
            set_point = "open" if label in ALLOWED else "closed"
            new["gate"] = set_point
            asked[f"{event.seq}/1"] = {"what": "gate", "set_point": set_point}
            return new, [
                emit({"file_offset": what["input_offset"], "label": label,
                      "decision": set_point, "model": event.model_hash}),
                actuate(GATE_KIND, set_point=set_point, deadline_ms=GATE_DEADLINE_MS),
            ]
        return new, [emit({"gate": what.get("set_point"), "outcome": event.outcome})]
