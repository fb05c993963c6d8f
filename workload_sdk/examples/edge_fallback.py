"""The edge pattern: ask the big model as an effect (mode B); when that fails, answer locally.

Every text input becomes a question to the model bound as ``llm`` (mode B: an executor, maybe in
a data center). If the answer does not come (``timeout``: the link is down or nobody serves it;
``unknown``, ``backpressure`` or an error), the step answers with its own mode A model
``llm-local`` (``SpecRecord.local_models``), in the step itself. The timeout is recorded, the
fallback is recomputed bit for bit by replay, and the emitted answer says where it came from.
Mode A is experimental (``workload_sdk._local``).
"""

from __future__ import annotations

from collections.abc import Sequence

from workload_sdk import (
    EffectResult,
    InputEvent,
    Output,
    State,
    Workload,
    emit,
    infer,
    local_generate,
)

REMOTE_DEADLINE_MS = 2_000
MAX_TOKENS = 6


class EdgeFallback(Workload):
    """Asks ``llm`` (mode B); falls back to ``llm-local`` (mode A) when no answer comes."""

    def initial_state(self) -> State:
        return {"asked": {}, "remote": 0, "local": 0}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                                Sequence[Output]]:
        asked = dict(state["asked"])
        if isinstance(event, InputEvent):
            question = event.text()
            params = {"prompt": question, "chat": True, "max_tokens": MAX_TOKENS,
                      "temperature": 0}
            asked[f"{event.seq}/0"] = question
            return dict(state, asked=asked), [infer(model="llm", params=params,
                                                     deadline_ms=REMOTE_DEADLINE_MS)]
        question = asked.pop(f"{event.input_offset}/{event.index}", "?")
        if event.ok:
            answer = event.json()
            return dict(state, asked=asked, remote=state["remote"] + 1), [emit({
                "question": question, "answer": answer.get("text"), "source": "remote",
                "model": event.model_hash})]
        local = local_generate("llm-local", question, max_tokens=MAX_TOKENS)
        return dict(state, asked=asked, local=state["local"] + 1), [emit({
            "question": question, "answer": local.text, "tokens": list(local.tokens),
            "source": "local", "because": event.outcome, "model": local.model_hash})]
