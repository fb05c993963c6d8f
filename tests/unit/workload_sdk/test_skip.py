"""Inputs skipped on the record (no broker): an input whose step raises, one whose reference the
holder could not read by the policy's deadline, one an operator ordered skipped. The simulated
holder drives the live holder's decisions (``merge_batch``); replay reproduces each skip; the
records hold their bytes at their defaults."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from pydantic import ValidationError

from broker_schema import (
    ChunkRef,
    InputPolicy,
    MergeEntry,
    OutputRecord,
    SkipAlarmRecord,
    SkipNote,
    SkipOrderRecord,
    SpecRecord,
    decode,
    encode,
    sha256_hex,
    skip_alarm_id,
)
from tests.unit.workload_sdk.sim import WID, Sim
from workload_sdk import EffectResult, InputEvent, Output, State, Workload, emit, module_hash
from workload_sdk._holder_skips import SkipOrders, order_note
from workload_sdk._replay import ReplayError, diff, replay
from workload_sdk._round import skip_alarms


class Adder(Workload):
    """Sums its inputs; on 13 it changes its state in place and raises (a bug); a chunk input
    adds its size."""

    def initial_state(self) -> State:
        return {"sum": 0, "n": 0}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        assert isinstance(event, InputEvent)
        value = len(event.bytes()) if isinstance(event.body, ChunkRef) else int(event.json())
        if value == 13:
            state["sum"] = -1  # in place, then raise: the fold must not keep it
            raise ValueError("thirteen is unlucky")
        new = {"sum": state["sum"] + value, "n": state["n"] + 1}
        return new, [emit(new)]


class FixedAdder(Adder):
    """The same, without the bug."""

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        assert isinstance(event, InputEvent)
        value = int(event.json())
        new = {"sum": state["sum"] + value, "n": state["n"] + 1}
        return new, [emit(new)]


def _spec(**fields: object) -> SpecRecord:
    return SpecRecord(workload_id=WID, module_hash=module_hash(Adder), effect_kinds=(),
                      **fields)  # type: ignore[arg-type]


def _entries(sim: Sim) -> list[MergeEntry]:
    return [r for r in (decode(rec.value) for rec in sim.log["merge"])
            if isinstance(r, MergeEntry)]


def _outputs(sim: Sim) -> list[object]:
    return [r.body.data for r in (decode(rec.value) for rec in sim.log["out"])
            if isinstance(r, OutputRecord)]


def _sim(spec: SpecRecord) -> Sim:
    sim = Sim(spec=spec, workload=Adder())
    sim.start()
    return sim


def test_a_step_that_raises_is_skipped_on_the_record_and_replay_reproduces_it() -> None:
    sim = _sim(_spec())
    for value in (1, 13, 2):
        sim.input(value)
    assert sim.holder is not None
    sim.holder.pump()
    entries = _entries(sim)
    assert [(e.source_offset, e.seq, e.action, e.reason) for e in entries] == [
        (0, 0, "deliver", None), (1, 1, "pass_over", "quarantined"), (2, 1, "deliver", None)]
    skip = entries[1].skip
    assert skip is not None and skip.cause == "step_raised"
    assert skip.detail == "ValueError: thirteen is unlucky"
    # the state is as before the step (the in-place change undone); later inputs go on
    assert sim.holder.core.state == {"sum": 3, "n": 2}
    assert _outputs(sim) == [{"sum": 1, "n": 1}, {"sum": 3, "n": 2}]
    result = replay(Adder(), sim.log, use_snapshots=False)
    assert result.core.state == {"sum": 3, "n": 2} and result.core.seq == 2
    # a resumed holder folds the same
    sim.start()
    sim.input(4)
    sim.holder.pump()
    assert sim.holder.core.state == {"sum": 7, "n": 3}
    # code that no longer raises there does not reproduce the log: replay refuses, diff says
    with pytest.raises(ReplayError, match=r"quarantined \(step_raised\).*deliver"):
        replay(FixedAdder(), sim.log, use_snapshots=False)
    report = diff(FixedAdder(), sim.log)
    assert report.kind == "error" and "recorded step raised on in@1" in report.detail


def test_with_on_step_error_stop_a_raising_step_stops_the_fold() -> None:
    sim = _sim(_spec(input_policy=InputPolicy(on_step_error="stop")))
    sim.input(13)
    assert sim.holder is not None
    with pytest.raises(ValueError, match="thirteen"):
        sim.holder.pump()
    assert _entries(sim) == []


def test_an_input_marked_skipped_is_recorded_with_its_note_and_replay_follows_the_log() -> None:
    """What the holder's shell does past the policy's deadline (``unresolvable``) or on an
    operator's order: the item is marked; the fold records the note and never reads the body.
    Replay follows the recorded skip even once the chunk is there."""
    sim = _sim(_spec())
    data = b"late bytes"
    missing = ChunkRef(hash=sha256_hex(data), size=len(data))
    sim.input(1)
    at = sim.input_body(missing)  # not in the store: nothing resolved
    sim.input(2)
    assert sim.holder is not None
    sim.holder._fetch()
    note = SkipNote(cause="unresolvable", detail=f"chunk {missing.hash} cannot be read")
    bufs = sim.holder.bufs["in"]
    bufs[1] = replace(bufs[1], skip=note)
    sim.holder.pump()
    entries = _entries(sim)
    assert [(e.source_offset, e.reason) for e in entries] == [
        (0, None), (at, "quarantined"), (2, None)]
    assert entries[1].skip == note
    # the chunk is there now: replay still follows the log (the body is never read)
    sim.log.resolved[("in", at)] = data
    assert replay(Adder(), sim.log, use_snapshots=False).core.state == {"sum": 3, "n": 2}
    # a log that says an input was delivered where the fold is told to skip it is refused
    alarms = skip_alarms([entries[1]], holder_id="h1", now_us=5)
    assert alarms == [SkipAlarmRecord(alarm_id=f"{WID}/in@{at}", workload_id=WID,
                                      input_offset=at, seq=1, skip=note, raised_by="h1",
                                      raised_us=5)]
    assert skip_alarm_id(WID, at) == f"{WID}/in@{at}"


def test_skip_orders_mark_the_inputs_they_name_the_first_order_counting() -> None:
    orders = SkipOrders("unused:9092", WID)
    first = SkipOrderRecord(workload_id=WID, input_offset=3, reason="bad scan", principal="ann",
                            ordered_us=1)
    second = first.model_copy(update={"reason": "again", "principal": "bob"})
    other = first.model_copy(update={"workload_id": "other-1"})
    assert orders.note(5, encode(first)) == first
    assert orders.note(6, encode(second)) is None
    assert orders.note(7, encode(other)) is None
    assert orders.note(8, b"not a record") is None
    assert orders.by_input == {3: order_note(first, 5)}
    assert orders.by_input[3] == SkipNote(cause="operator", detail="bad scan", principal="ann",
                                          order_offset=5)
    sim = _sim(_spec())
    for value in (1, 2, 3, 4):
        sim.input(value)
    assert sim.holder is not None
    sim.holder._fetch()
    orders.mark_buffered(sim.holder.bufs["in"])
    sim.holder.pump()
    entries = _entries(sim)
    assert entries[3].skip == order_note(first, 5)
    assert sim.holder.core.state == {"sum": 6, "n": 3}
    orders.forget_merged(4)
    assert orders.by_input == {}


def test_the_new_fields_keep_old_bytes_at_their_defaults_and_are_checked() -> None:
    spec = _spec()
    assert b"input_policy" not in encode(spec) and b"chunk_store" not in encode(spec)
    assert b'"chunk_store":"fs"' in encode(_spec(chunk_store="fs"))
    entry = MergeEntry(workload_id=WID, seq=0, epoch=1, source="in", source_offset=0,
                       action="deliver")
    assert b"skip" not in encode(entry)
    with pytest.raises(ValidationError, match="skip is required"):
        MergeEntry(workload_id=WID, seq=0, epoch=1, source="in", source_offset=0,
                   action="pass_over", reason="quarantined")
    with pytest.raises(ValidationError, match="only an input"):
        MergeEntry(workload_id=WID, seq=0, epoch=1, source="resp", source_offset=0,
                   action="pass_over", reason="quarantined",
                   skip=SkipNote(cause="operator", detail="x"))
    with pytest.raises(ValidationError, match="alarm_id"):
        SkipAlarmRecord(alarm_id="x", workload_id=WID, input_offset=1, seq=0,
                        skip=SkipNote(cause="operator", detail="x"), raised_by="h",
                        raised_us=0)


def test_one_chunk_store_a_holder_or_a_live_node_using_another_is_named() -> None:
    from broker_schema import INFERENCE_KIND, FactsRecord, KindServed
    from workload_sdk._placement import chunk_store_problem

    spec = SpecRecord(workload_id=WID, module_hash=module_hash(Adder),
                      effect_kinds=(INFERENCE_KIND,))

    def node(name: str, store: str, kind: str = INFERENCE_KIND, at: int = 4_500_000) -> FactsRecord:
        return FactsRecord(node_id=name, kinds=(KindServed(kind=kind, queue_limit=1),),
                           public_key="MCowBQYDK2VwAyEA", key_id="sha256:" + "0" * 64,
                           updated_us=at, chunk_store=store)  # type: ignore[arg-type]

    def problem(facts: list[FactsRecord], holder: str = "kafka",
                on: SpecRecord = spec) -> str | None:
        return check(facts, holder, on)[0]

    def check(facts: list[FactsRecord], holder: str = "kafka",
              on: SpecRecord = spec) -> tuple[str | None, list[str]]:
        return chunk_store_problem(on, facts, holder_store=holder, holder_where="sys.chunks"
                                   if holder == "kafka" else "the directory /d",
                                   now_us=5_000_000, max_age_s=1.0)

    assert check([node("a", "kafka")]) == (None, [])
    said = problem([], holder="fs")
    assert said is not None and "the directory /d (fs)" in said and "chunk_store = kafka" in said
    # every node serving a bound kind elsewhere: refused, naming them
    said = problem([node("b", "fs"), node("b2", "fs")])
    assert said is not None and "b (fs), b2 (fs)" in said and INFERENCE_KIND in said
    assert "docs/operations.md" in said
    # some serve it with the spec's store: the others may serve other workloads (a warning)
    assert check([node("a", "kafka"), node("b", "fs")]) == (None, ["b (fs)"])
    # a node serving other kinds, or not live, is not asked
    assert problem([node("c", "fs", kind="x:y@1.0.0")]) is None
    assert problem([node("d", "fs", at=0)]) is None
    fs_spec = spec.model_copy(update={"chunk_store": "fs"})
    assert problem([node("e", "fs")], holder="fs", on=fs_spec) is None
    assert b'"chunk_store"' not in encode(node("a", "kafka"))
