"""Re-asking after backpressure or timeout in one line (workload_sdk.reask), and the shipped
examples that use it."""

from __future__ import annotations

import pytest

from broker_schema import ChunkRef, ErrorInfo, InlineBody
from workload_sdk import EffectResult, InputEvent, Request, infer, reask, remember
from workload_sdk.examples.ask_llm import AskLLM
from workload_sdk.examples.filetype_gate import FiletypeGate


def _result(outcome: str, *, seq: int = 5, input_offset: int = 0, **kw: object) -> EffectResult:
    return EffectResult(seq=seq, time_ms=1, effect_id=f"w/{input_offset}/0@1",
                        input_offset=input_offset, index=0, outcome=outcome,  # type: ignore[arg-type]
                        **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("body", [None, InlineBody.of_bytes(b"\x00\x01"),
                                  ChunkRef(hash="sha256:" + "a" * 64, size=9, workload="w2")])
def test_the_request_comes_back_the_same_with_one_more_attempt(body: object) -> None:
    req = infer(model="llm", params={"prompt": "hi", "max_tokens": 3}, input=body,
                deadline_ms=700)
    kept = remember(req)
    for outcome in ("backpressure", "timeout"):
        again = reask(_result(outcome), kept)
        assert again is not None
        new, kept2 = again
        assert new == req and kept2["attempt"] == 2
    assert reask(_result("ok"), kept) is None
    assert reask(_result("error", error=ErrorInfo(code="engine_error")), kept) is None
    assert reask(_result("unknown"), kept) is None  # it may have acted
    assert reask(_result("unknown"), kept, on=("unknown",)) is not None
    assert reask(_result("timeout"), None) is None


def test_attempts_run_out() -> None:
    kept = remember(Request(effect_kind="acme:x/y@1.0.0", params={"set_point": 3}))
    tries = 1
    while (again := reask(_result("backpressure"), kept)) is not None:
        _, kept = again
        tries += 1
    assert tries == 3 and kept["attempt"] == 3
    assert reask(_result("timeout"), remember(Request(effect_kind="k:a@1.0.0")),
                 max_attempts=1) is None


def test_ask_llm_asks_again_then_reports_the_attempt() -> None:
    wl = AskLLM()
    state = wl.initial_state()
    state, outs = wl.step(state, InputEvent(seq=0, time_ms=1, offset=0,
                                            body=InlineBody.of_text("Why?")))
    (first,) = outs
    assert isinstance(first, Request)
    state, outs = wl.step(state, _result("backpressure", seq=1, input_offset=0))
    (second,) = outs
    assert second == first  # asked again, the same question
    state, outs = wl.step(state, _result("ok", seq=2, input_offset=1, output=InlineBody.of_json(
        {"text": "Because.", "output_tokens": [1]})))
    (answer,) = outs
    assert answer.body.data == {  # type: ignore[union-attr]
        "question": "Why?", "answer": "Because.", "tokens": [1], "model": None, "attempt": 2}


def test_filetype_gate_asks_again_after_a_timeout_and_holds_after_three() -> None:
    wl = FiletypeGate()
    state = wl.initial_state()
    state, outs = wl.step(state, InputEvent(seq=0, time_ms=1, offset=0,
                                            body=InlineBody.of_bytes(b"%PDF-1.4")))
    (req,) = outs
    slot = 0
    for seq in (1, 2):
        state, outs = wl.step(state, _result("timeout", seq=seq, input_offset=slot))
        assert outs == [req]
        slot = seq
    state, outs = wl.step(state, _result("timeout", seq=3, input_offset=slot))
    (held,) = outs
    assert held.body.data["decision"] == "hold"  # type: ignore[union-attr]
    assert held.body.data["file_offset"] == 0  # type: ignore[union-attr]
