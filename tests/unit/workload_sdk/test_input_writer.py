"""What :func:`workload_sdk._input_writer.plan_input` decides: inline up to the limit, exactly
where :class:`~broker_schema.InlineBody` would refuse, and a chunk of the bytes the step would have
read inline beyond it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from broker_schema import ChunkRef, InlineBody, StreamRef
from broker_schema.limits import INLINE_MAX_BYTES
from workload_sdk import InputTooLarge, body_of
from workload_sdk._input_writer import ChunkPlan, plan_input


def _inline_accepts(value: Any) -> bool:
    try:
        body_of(value)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("value", [
    *(b"\x01" * n for n in (0, 1, 49_149, 49_150, 49_151, 200_000)),
    *("a" * n for n in (65_533, 65_534, 65_535)),
    *("é" * n for n in (32_766, 32_767, 32_768)),
    "\n" * 40_000,
    {"k": "v" * 65_525}, {"k": "v" * 65_526}, list(range(20_000)),
])
def test_inline_exactly_when_the_record_accepts_it(value: Any) -> None:
    planned = plan_input(value)
    if _inline_accepts(value):
        assert planned == body_of(value)
    else:
        assert isinstance(planned, ChunkPlan)
        assert planned.inline_size > INLINE_MAX_BYTES


@pytest.mark.parametrize(("value", "raw", "media"), [
    (b"\x00\xff" * 60_000, b"\x00\xff" * 60_000, None),
    ("é" * 40_000, ("é" * 40_000).encode(), "text/plain; charset=utf-8"),
    ({"rows": list(range(30_000))}, json.dumps({"rows": list(range(30_000))},
                                               separators=(",", ":")).encode(),
     "application/json"),
])
def test_a_chunk_holds_what_the_step_would_have_read_inline(value: Any, raw: bytes,
                                                            media: str | None) -> None:
    planned = plan_input(value)
    assert isinstance(planned, ChunkPlan)
    assert planned.data == raw
    assert planned.media_type == media
    assert plan_input(value, media_type="x/y") == ChunkPlan(raw, "x/y", planned.inline_size)


def test_bodies_and_references_pass_through() -> None:
    ref = ChunkRef(hash="sha256:" + "ab" * 32, size=5)
    stream = StreamRef(topic="wl.a.in", partition=0, offset=3)
    inline = InlineBody.of_text("hi")
    for body in (ref, stream, inline):
        assert plan_input(body) is body


def test_the_refusal_names_the_size_the_limit_and_the_remedy() -> None:
    exc = InputTooLarge(6_771_114, "drop --inline to store it as a chunk")
    text = str(exc)
    assert "6771114 bytes" in text and str(INLINE_MAX_BYTES) in text
    assert text.endswith("drop --inline to store it as a chunk")
    assert "\n" not in text
    assert isinstance(exc, ValueError) and exc.limit == INLINE_MAX_BYTES
    assert "chunk=True" in str(InputTooLarge(70_000))


def test_redactable_inputs_always_go_through_chunks() -> None:
    """The spec's ``redactable_inputs``: even a small value is a chunk (so ``fx redact`` can
    remove its bytes), holding exactly what the inline body's ``raw()`` would have been; a
    reference stays as it is."""
    small = {"name": "Jane Roe"}
    inline = plan_input(small)
    assert isinstance(inline, InlineBody)
    planned = plan_input(small, redactable=True)
    assert isinstance(planned, ChunkPlan)
    assert planned.data == inline.raw() and planned.media_type == "application/json"
    text = plan_input("hello", redactable=True)
    assert isinstance(text, ChunkPlan) and text.data == b"hello"
    raw = plan_input(b"\x00\x01", redactable=True, media_type="image/png")
    assert isinstance(raw, ChunkPlan) and raw.data == b"\x00\x01"
    assert raw.media_type == "image/png"
    given = plan_input(InlineBody.of_text("x"), redactable=True)
    assert isinstance(given, ChunkPlan) and given.data == b"x"
    ref = ChunkRef(hash="sha256:" + "ab" * 32, size=3)
    assert plan_input(ref, redactable=True) is ref
