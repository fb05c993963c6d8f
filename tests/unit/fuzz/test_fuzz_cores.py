"""Fuzzing the request handling of the executor and the lease holder through their pure cores.

Each test decodes a sequence of hostile records (tests/unit/fuzz/hostile.py) as the service would
and feeds what decodes to the core. Properties: no exception; every refusal carries a code from
the closed set (read from the code); every record a core asks to write encodes under the cap and
decodes to itself; no effect id is delivered twice; the broker-free simulation of holder plus a
rogue executor merges exactly one answer per effect and replays to the same bytes.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import broker_schema as bs
from tests.unit.fuzz.hostile import (
    FUZZ,
    ExecutorHarness,
    HolderHarness,
    decode_outcome,
    dumps,
    hostile_valid_dicts,
    mutated_dicts,
    record_bytes,
)
from tests.unit.workload_sdk.sim import WID as SIM_WID
from tests.unit.workload_sdk.sim import Sim, make_spec
from workload_sdk import Item, replay

TALLY: Counter[str] = Counter()


def _decoded(raws: list[bytes]) -> list[Any]:
    out = []
    for raw in raws:
        outcome, record = decode_outcome(raw)
        TALLY[outcome] += 1
        if record is not None:
            out.append(record)
    return out


def _raw(value: Any) -> bytes:
    return dumps(value).encode("utf-8", "surrogatepass")


hostile_streams = st.lists(
    st.one_of(record_bytes(), mutated_dicts(hostile_valid_dicts()).map(
        lambda d: _raw(d))),
    min_size=1, max_size=8)


@FUZZ
@given(hostile_streams, st.lists(st.sampled_from(["ready", "absent", "corrupt"]), min_size=12,
                                 max_size=12), st.integers(0, 2))
def test_executor_core_refuses_typed_and_writes_only_valid_records(
        raws: list[bytes], statuses: list[str], finish: int) -> None:
    harness = ExecutorHarness()
    for i, record in enumerate(_decoded(raws)):
        TALLY["executor " + harness.feed(record, model_status=statuses[i % len(statuses)],
                                         finish=finish + i)] += 1
    # the in-flight table only ever holds this workload's admitted requests
    assert all(j.request.header.workload_id == "fz-1" for j in harness.state.in_flight.values())


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["in", "resp"]), hostile_valid_dicts().map(
    lambda d: _raw(d))), min_size=1, max_size=10))
def test_holder_core_merges_hostile_records_without_crashing(
        stream: list[tuple[str, bytes]]) -> None:
    harness = HolderHarness()
    for source, raw in stream:
        outcome, record = decode_outcome(raw)
        TALLY[outcome] += 1
        if record is None:
            continue
        TALLY["holder " + harness.feed(record, source=source)] += 1
        # a delivered response names a pending effect of this workload's slots: its effect id
        # (what merging keys on) was issued by this fold
    assert harness.core.seq >= 0


def test_response_naming_another_workload_is_passed_over() -> None:
    """Found by fuzzing (issue 9): a merge entry may name another workload's effect id (it
    records what was passed over), so the pass-over is recorded, never a crash."""
    header = bs.EffectHeader(workload_id="fz-2", input_offset=0, index=0, epoch=1)
    raw = bs.encode(bs.ResponseRecord(effect_id=header.effect_id, header=header,
                                      request_offset=0, outcome="ok",
                                      output=bs.InlineBody.of_json(1), written_by="rogue"))
    record = bs.decode(raw)  # a foreign producer's bytes on wl.fz-1.resp decode
    harness = HolderHarness()
    item = Item("resp", 0, 1, record)  # type: ignore[arg-type]
    applied = harness.core.apply(item, epoch=1, spec=harness.spec)
    assert applied.decision.action == "pass_over"
    assert applied.decision.reason == "unknown_effect"


def _rogue(sim: Sim, draw: Any) -> None:
    """One record from a rogue executor on ``.resp``: an answer for a real request with a
    mismatched header or another workload's id, a duplicate, an answer nobody asked for."""
    reqs = sim.requests()
    choice = draw(st.sampled_from(["dup", "mismatch", "other", "stray", "accepted"]))
    if not reqs or choice == "stray":
        sim.stray()
        return
    offset, req = reqs[draw(st.integers(0, len(reqs) - 1))]
    header = req.header
    if choice == "mismatch":  # the right effect id over another slot's header
        header = header.model_copy(update={"input_offset": header.input_offset + 1000,
                                           "index": 7})
    elif choice == "other":
        header = header.model_copy(update={"workload_id": "someone-else"})
    # built without validation, as a foreign producer would: the decoder is the judge
    if choice == "accepted":
        rec: Any = bs.AcceptedRecord.model_construct(
            effect_id=req.effect_id, header=header, request_offset=offset, node_id="rogue",
            lease_ms=1, accepted_us=0)
    else:
        rec = bs.ResponseRecord.model_construct(
            effect_id=req.effect_id, header=header, request_offset=offset, outcome="ok",
            output=bs.InlineBody.of_json({"rogue": True}), written_by="rogue", error=None,
            model_hash=None, executor=None, timing=None, receipt=None, signature=None)
    outcome, decoded = decode_outcome(bs.encode(rec))
    if decoded is None:  # the schema refuses it: the real holder skips what does not decode
        TALLY[f"sim rogue {choice} {outcome}"] += 1
        return
    sim.append("resp", decoded)
    TALLY[f"sim rogue {choice} appended"] += 1


@settings(FUZZ, max_examples=60)
@given(st.data())
def test_simulated_holder_with_a_rogue_executor(data: st.DataObject) -> None:
    """Inputs, an honest executor answering late or twice, and a rogue writing answers for the
    same effect ids (mismatched headers, other workloads, strays, undecodable bytes): the holder
    keeps merging, each effect id is delivered once, and replay reproduces the run."""
    sim = Sim(make_spec(limit=3, snapshot_every=2))
    sim.start()
    assert sim.holder is not None
    for _ in range(data.draw(st.integers(1, 10))):
        op = data.draw(st.sampled_from(["input", "input", "answer", "accept", "rogue", "tick"]))
        if op == "input":
            sim.input(data.draw(st.integers(-3, 9)))
        elif op == "answer":
            sim.answer(data.draw(st.integers(0, 5)), data.draw(st.sampled_from(
                ["ok", "error", "ok"])))
        elif op == "accept":
            sim.accept(data.draw(st.integers(0, 5)))
        elif op == "rogue":
            _rogue(sim, data.draw)
        sim.now += data.draw(st.integers(0, 40))
        sim.holder.pump()
    sim.holder.drain()
    merged: Counter[str] = Counter()
    for rec in sim.log["merge"]:
        entry = bs.decode(rec.value)
        if isinstance(entry, bs.MergeEntry) and entry.action == "deliver" and entry.effect_id:
            merged[entry.effect_id] += 1
    assert all(n == 1 for n in merged.values()), merged
    again = replay(sim.workload, sim.log)
    assert again.core.state_hash == sim.holder.core.state_hash
    assert again.core.seq == sim.holder.core.seq
    assert sim.spec.workload_id == SIM_WID
