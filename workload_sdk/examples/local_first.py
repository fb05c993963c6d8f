"""Local first: a small mode A answer, and a mode B request only when the local model is unsure.

For every text input the step scores its own integer model ``llm-local`` (mode A,
``SpecRecord.local_models``) on the question: the margin between the two highest next-token
logits (exact Q.16 integers). A margin of at least ``SURE_MARGIN`` means the local model is sure:
the step answers locally at once, with no round trip. Otherwise it asks the model bound as
``llm`` (mode B) and emits that answer, or the local one if the request fails. Replay recomputes
the local scores and answers bit for bit. Mode A is experimental (``workload_sdk._local``).
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
    local_logits,
    local_tokenize,
)

#: 2.0 in Q.16: the top next-token logit must lead the second by this much
SURE_MARGIN = 2 << 16
MAX_TOKENS = 6


def margin(row: Sequence[int]) -> int:
    """Top logit minus the second (integers)."""
    top = sorted(row, reverse=True)[:2]
    return top[0] - top[1] if len(top) == 2 else 0


class LocalFirst(Workload):
    """Answers locally when sure; asks ``llm`` otherwise."""

    def initial_state(self) -> State:
        return {"asked": {}, "local": 0, "remote": 0, "fallback": 0}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                                Sequence[Output]]:
        asked = dict(state["asked"])
        if isinstance(event, InputEvent):
            question = event.text()
            ids = local_tokenize("llm-local", question)
            m = margin(local_logits("llm-local", ids)[-1])
            if m >= SURE_MARGIN:
                local = local_generate("llm-local", token_ids=ids, max_tokens=MAX_TOKENS)
                return dict(state, local=state["local"] + 1), [emit({
                    "question": question, "answer": local.text, "source": "local",
                    "margin": m, "model": local.model_hash})]
            asked[f"{event.seq}/0"] = {"question": question, "margin": m}
            params = {"prompt": question, "chat": True, "max_tokens": MAX_TOKENS,
                      "temperature": 0}
            return dict(state, asked=asked), [infer(model="llm", params=params,
                                                     deadline_ms=120_000)]
        what = asked.pop(f"{event.input_offset}/{event.index}", {"question": "?", "margin": 0})
        if event.ok:
            return dict(state, asked=asked, remote=state["remote"] + 1), [emit({
                "question": what["question"], "answer": event.json().get("text"),
                "source": "remote", "margin": what["margin"], "model": event.model_hash})]
        local = local_generate("llm-local", what["question"], max_tokens=MAX_TOKENS)
        return dict(state, asked=asked, fallback=state["fallback"] + 1), [emit({
            "question": what["question"], "answer": local.text, "source": "local",
            "because": event.outcome, "margin": what["margin"], "model": local.model_hash})]
