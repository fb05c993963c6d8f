"""The fold's shortcuts (issue 29, replay at log speed) change no byte: the merge entry built
when first read is the entry validated at once, the step's effect headers built from the fold's
own values are the validated headers, and the state hash from the kept canonical bytes is the
hash of the state serialized again, through steps, skips and a quarantined step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker_schema import (
    EffectHeader,
    EffectRequest,
    MergeEntry,
    OutputRecord,
    content_hash,
    decode,
    encode,
)
from tests.unit.workload_sdk.sim import Sim, make_spec
from workload_sdk import EffectResult, InputEvent, Output, State, Workload, emit, infer, replay
from workload_sdk._core import Applied, Decision


class Sometimes(Workload):
    """Asks on even inputs, raises on multiples of 5 (quarantined), emits otherwise."""

    def initial_state(self) -> State:
        return {"n": 0, "seen": []}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        if isinstance(event, InputEvent):
            value = event.json()
            if value % 5 == 0:
                state["n"] = -1  # changed in place, then raises: the state is restored
                raise RuntimeError("five")
            outs: list[Output] = [emit({"v": value})]
            if value % 2 == 0:
                outs.append(infer(model="m", input={"v": value}))
            return {"n": state["n"] + 1, "seen": [*state["seen"], value]}, outs
        return dict(state, n=state["n"] + 1), [emit({"answer": event.outcome})]


def _run() -> Sim:
    spec = make_spec(limit=50, snapshot_every=4).model_copy(
        update={"input_policy": make_spec().input_policy.model_copy(
            update={"on_step_error": "quarantine"})})
    sim = Sim(spec=spec, workload=Sometimes())
    sim.start()
    holder = sim.holder
    assert holder is not None
    for value in range(1, 13):
        sim.input(value)
        holder.pump()
        assert holder.core is not None
        assert holder.core.state_hash == content_hash(holder.core.state)
    for pick in range(6):
        sim.answer(pick, "ok")
        holder.pump()
    holder.drain()
    return sim


def test_the_lazy_entry_and_fast_headers_write_the_validated_bytes() -> None:
    sim = _run()
    entries = [decode(r.value) for r in sim.log["merge"]]
    merges = [e for e in entries if isinstance(e, MergeEntry)]
    assert any(e.reason == "quarantined" for e in merges)
    for entry in merges:  # every written entry is what validation builds from its fields
        assert encode(MergeEntry.model_validate(entry.model_dump())) == encode(entry)
    outs = [decode(r.value) for r in sim.log["out"]]
    assert any(isinstance(o, EffectRequest) for o in outs)
    for out in outs:
        assert isinstance(out, (EffectRequest, OutputRecord))
        header = EffectHeader(**out.header.model_dump(exclude_none=True))
        assert header == out.header and encode(out) == encode(type(out).model_validate(
            out.model_dump()))
    for trusted in (False, True):
        result = replay(sim.workload, sim.log, use_snapshots=False, trust_log=trusted)
        assert result.core.state_hash == content_hash(result.core.state)
        assert result.core.state_hash == sim.holder.core.state_hash  # type: ignore[union-attr]
        for out in result.outputs.values():
            assert out.header == EffectHeader.model_validate(out.header.model_dump())


def test_an_entry_given_as_fields_is_built_and_validated_when_read() -> None:
    fields: dict[str, Any] = {"workload_id": "w", "seq": 3, "epoch": 1, "source": "in",
                              "source_offset": 7, "effect_id": None, "action": "deliver",
                              "reason": None, "skip": None}
    applied = Applied(Decision("deliver"), fields)
    assert applied.entry == MergeEntry(**fields)
    assert applied.entry is applied.entry  # built once
    bad = Applied(Decision("deliver"), {**fields, "action": "pass_over"})  # no reason
    try:
        _ = bad.entry
    except ValueError as exc:
        assert "reason is required" in str(exc)
    else:
        raise AssertionError("an invalid entry was built")
    assert Applied(Decision("skip"), None).entry is None
