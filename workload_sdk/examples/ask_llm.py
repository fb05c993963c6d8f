"""Ask a language model: every text input becomes a question to the model bound as ``llm``.

A question answered ``backpressure`` or ``timeout`` is asked again (:func:`workload_sdk.reask`, at
most three attempts); the answer names the attempt it came from.

Meant for the integer engine (SmolLM2-135M in integer fixed point), whose answers carry signed,
hash-chained receipts that ``fx verify --workload ID`` re-executes on any CPU. Greedy decoding
(temperature 0) and a fixed token budget are parameters of the request, so they are on the record.
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
    reask,
    remember,
)

MAX_TOKENS = 12
DEADLINE_MS = 120_000


class AskLLM(Workload):
    """Asks ``llm`` each input's text as a chat question; emits the answer with its outcome."""

    def initial_state(self) -> State:
        return {"questions": {}, "answered": 0}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                                Sequence[Output]]:
        questions = dict(state["questions"])
        if isinstance(event, InputEvent):
            question = event.text()
            params = {"prompt": question, "chat": True, "max_tokens": MAX_TOKENS,
                      "temperature": 0}
            req = infer(model="llm", params=params, deadline_ms=DEADLINE_MS)
            questions[f"{event.seq}/0"] = remember(req)
            return dict(state, questions=questions), [req]
        asked = questions.pop(f"{event.input_offset}/{event.index}", None)
        if (again := reask(event, asked)) is not None:  # backpressure or timeout: ask again
            req, questions[f"{event.seq}/0"] = again
            return dict(state, questions=questions), [req]
        question = asked["params"]["prompt"] if asked else "?"
        attempt = asked["attempt"] if asked else 1
        new = dict(state, questions=questions, answered=state["answered"] + 1)
        if not event.ok:
            return new, [emit({"question": question, "outcome": event.outcome, "attempt": attempt,
                               "error": None if event.error is None else event.error.code})]
        answer = event.json()
        return new, [emit({"question": question, "answer": answer.get("text"),
                           "tokens": answer.get("output_tokens"), "model": event.model_hash,
                           "attempt": attempt})]
