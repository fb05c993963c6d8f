"""References resolved before the step (no broker): what the step reads of a chunk or stream
reference, what the core does with one the shell did not read, replay naming a missing chunk,
snapshots over the inline limit kept as a chunk and read back, the chunk format's one home, and
the filesystem store the holder can share with executors."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from broker_schema import (
    ChunkRef,
    EffectHeader,
    EffectRequest,
    InlineBody,
    InputRecord,
    OutputRecord,
    ResponseRecord,
    SnapshotRecord,
    StreamRef,
    canonical_json,
    decode,
    encode,
    sha256_hex,
)
from broker_schema.chunks import (
    PART_BYTES,
    ChunkProblem,
    assemble,
    chunk_ref_of,
    fs_relpath,
    parse_part_key,
    part_key,
    split_parts,
)
from executor.chunks import FsChunkStore
from fx_kafka.workload_log import LogGap, RefGap
from tests.unit.workload_sdk.sim import WID, Sim, make_spec
from workload_sdk import (
    Core,
    EffectResult,
    InputEvent,
    Item,
    Output,
    State,
    Workload,
    emit,
    infer,
    replay,
)
from workload_sdk._kafka_io import resolve_log
from workload_sdk._refs_io import RefResolver
from workload_sdk._replay import compare_outputs
from workload_sdk._round import merge_batch


class Reader(Workload):
    """Emits what it reads of each input (its JSON), and asks the model with the input's body
    passed on as it is (a reference stays a reference); records the answers' JSON."""

    def initial_state(self) -> State:
        return {"read": [], "answers": []}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        if isinstance(event, EffectResult):
            return dict(state, answers=[*state["answers"], event.json()]), []
        value = event.json()
        return dict(state, read=[*state["read"], value]), [
            emit({"read": value}), infer(model="m", input=event.body, deadline_ms=60_000)]


class Hoarder(Workload):
    """Keeps every input's text: the state outgrows the inline limit."""

    def initial_state(self) -> State:
        return {"kept": []}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        assert isinstance(event, InputEvent)
        kept = [*state["kept"], "x" * int(event.json())]
        return {"kept": kept}, [emit({"kept": len(kept)})]


def _spec(**kw: Any) -> Any:
    return make_spec().model_copy(update=kw)


def _big(n: int = 70_000) -> bytes:
    return canonical_json({"pad": "p" * n})


# ----------------------------------------------------------------------------- the step's view


def test_json_text_and_bytes_read_what_a_reference_names() -> None:
    data = json.dumps({"a": [1, 2]}).encode()
    ref = chunk_ref_of(data)
    event = InputEvent(seq=0, time_ms=1, offset=0, body=ref, resolved=data)
    assert event.json() == {"a": [1, 2]}
    assert event.text() == data.decode() and event.bytes() == data
    assert event.body == ref  # still the reference, to pass on
    answer = EffectResult(seq=1, time_ms=2, effect_id="e", input_offset=0, index=0,
                          outcome="ok", output=ref, resolved=data)
    assert answer.json() == {"a": [1, 2]} and answer.bytes() == data
    assert "resolved" not in repr(event)  # the bytes stay out of the repr


def test_a_reference_not_read_raises_type_error_saying_why() -> None:
    ref = ChunkRef(hash=sha256_hex(b"x"), size=1)
    with pytest.raises(TypeError, match="chunk reference the runtime did not read"):
        InputEvent(seq=0, time_ms=1, offset=0, body=ref).json()
    forbidden = InputEvent(seq=0, time_ms=1, offset=0, body=ref, unreadable="not yours")
    with pytest.raises(TypeError, match="did not read: not yours; pass it on as is"):
        forbidden.bytes()


# ----------------------------------------------------------------------------- the core


def _input_item(offset: int, body: Any, resolved: bytes | None = None) -> Item:
    return Item("in", offset, 1_000 + offset, InputRecord(workload_id=WID, body=body), resolved)


def test_the_core_hands_the_step_the_resolved_bytes_and_the_reference() -> None:
    data = b'{"v":7}'
    ref = chunk_ref_of(data)
    core = Core.initial(Reader(), WID)
    applied = core.apply(_input_item(0, ref, data), epoch=1, spec=_spec())
    out, req = applied.outputs
    assert isinstance(out, OutputRecord) and out.body.data == {"read": {"v": 7}}
    assert isinstance(req, EffectRequest) and req.input == ref
    # an answer whose output is a chunk: read the same way
    answer = b'{"label":"pdf"}'
    resp = ResponseRecord(effect_id=req.effect_id, header=req.header, request_offset=0,
                          outcome="ok", output=chunk_ref_of(answer), written_by="e")
    core.apply(Item("resp", 0, 1_001, resp, answer), epoch=1, spec=_spec())
    assert core.state["answers"] == [{"label": "pdf"}]


def test_a_reference_the_shell_did_not_read_is_a_ref_gap_naming_it() -> None:
    ref = ChunkRef(hash=sha256_hex(b"gone"), size=4)
    core = Core.initial(Reader(), WID)
    with pytest.raises(RefGap) as caught:
        core.apply(_input_item(3, ref), epoch=1, spec=_spec())
    assert isinstance(caught.value, LogGap) and caught.value.why == "unresolved"
    text = str(caught.value)
    assert f"wl.{WID}.in offset 3 is unresolved" in text
    assert f"chunk {ref.hash} (4 B) of workload {WID}" in text


def test_a_reference_the_workload_may_not_read_is_handed_over_unread() -> None:
    """Another workload's chunk, or a system topic: the step gets the reference and why (the
    same live and in replay); granted by the spec, the bytes are read."""
    other = ChunkRef(hash=sha256_hex(b"theirs"), size=6, workload="someone-else")
    seen: list[InputEvent] = []

    class Peek(Workload):
        def initial_state(self) -> State:
            return {}

        def step(self, state: State, event: Any) -> tuple[State, Sequence[Output]]:
            seen.append(event)
            return state, []

    Core.initial(Peek(), WID).apply(_input_item(0, other, b"theirs"), epoch=1, spec=_spec())
    assert seen[-1].resolved is None and "someone-else" in str(seen[-1].unreadable)
    Core.initial(Peek(), WID).apply(_input_item(0, StreamRef(topic="sys.facts", offset=0)),
                                    epoch=1, spec=_spec())
    assert "system topic" in str(seen[-1].unreadable)
    granted = _spec(chunks_from=("someone-else",))
    Core.initial(Peek(), WID).apply(_input_item(0, other, b"theirs"), epoch=1, spec=granted)
    assert seen[-1].bytes() == b"theirs" and seen[-1].unreadable is None


def test_may_deliver_tells_which_answers_the_shell_must_read() -> None:
    core = Core.initial(Reader(), WID)
    core.apply(_input_item(0, InlineBody.of_json(1)), epoch=1, spec=_spec())
    (eid,) = core.pending
    assert core.may_deliver(eid)
    assert core.may_deliver(EffectHeader(workload_id=WID, input_offset=5, index=0,
                                         epoch=1).effect_id)  # a step not taken yet
    assert not core.may_deliver(EffectHeader(workload_id=WID, input_offset=0, index=3,
                                             epoch=1).effect_id)  # a past slot: passed over
    assert not core.may_deliver(EffectHeader(workload_id="other", input_offset=9, index=0,
                                             epoch=1).effect_id)


# ----------------------------------------------------------------------------- replay


def _reader_sim() -> tuple[Sim, ChunkRef]:
    sim = Sim(make_spec(), workload=Reader())
    sim.start()
    assert sim.holder is not None
    ref = sim.put_chunk(b'{"big":true}')
    sim.input_body(InlineBody.of_json(1))
    sim.input_body(ref)
    sim.holder.pump()
    return sim, ref


def test_replay_reads_referenced_bodies_from_the_log() -> None:
    sim, ref = _reader_sim()
    assert sim.holder is not None and sim.holder.core.state["read"] == [1, {"big": True}]
    result = replay(Reader(), sim.log, use_snapshots=False)
    assert result.core.state == sim.holder.core.state
    assert compare_outputs(result, sim.log) == []
    requests = [r for r in result.outputs.values() if isinstance(r, EffectRequest)]
    assert [r.input for r in requests][-1] == ref


def test_replay_stops_naming_a_chunk_that_is_gone() -> None:
    sim, ref = _reader_sim()
    del sim.log.resolved[("in", 1)]
    sim.log.unresolved[("in", 1)] = (f"no chunk {ref.hash} ({ref.size} B) of workload {WID} "
                                     "on sys.chunks (read to offset 9)")
    with pytest.raises(RefGap) as caught:
        replay(Reader(), sim.log, use_snapshots=False)
    text = str(caught.value)
    assert f"wl.{WID}.in offset 1 is unresolved: its chunk reference cannot be read" in text
    assert ref.hash in text and "sys.chunks (read to offset 9)" in text


# ----------------------------------------------------------------------------- big snapshots


def test_a_state_over_the_inline_limit_is_snapshotted_by_chunk_reference() -> None:
    core = Core.initial(Hoarder(), WID)
    core.apply(_input_item(0, InlineBody.of_json(70_000)), epoch=1, spec=_spec())
    with pytest.raises(ValueError, match="limit"):
        core.snapshot(1)  # inline only: too big
    snap, chunk = core.snapshot_record(1, out_position=4)
    assert isinstance(snap.state, ChunkRef) and chunk is not None
    assert snap.state == ChunkRef(hash=sha256_hex(chunk), size=len(chunk),
                                  media_type="application/json")
    assert snap.positions == {"in": 1, "resp": 0, "out": 4}
    wire = decode(encode(snap))
    assert isinstance(wire, SnapshotRecord)
    back = Core.from_snapshot(Hoarder(), wire, resolved=chunk)
    assert back.state == core.state and back.seq == core.seq
    with pytest.raises(ValueError, match="was not read"):
        Core.from_snapshot(Hoarder(), snap)
    with pytest.raises(ChunkProblem, match="read back as"):
        Core.from_snapshot(Hoarder(), snap, resolved=chunk[:-1] + b" ")
    small = Core.initial(Hoarder(), WID)
    assert small.snapshot_record(1)[1] is None


def test_a_state_nested_past_the_record_limit_goes_by_chunk() -> None:
    deep: Any = "leaf"
    for _ in range(70):
        deep = [deep]
    core = Core(workload=Hoarder(), workload_id=WID, state={"deep": deep})
    snap, chunk = core.snapshot_record(1)
    assert isinstance(snap.state, ChunkRef) and chunk is not None
    assert Core.from_snapshot(Hoarder(), snap, resolved=chunk).state == core.state


def test_big_snapshots_are_written_as_chunks_and_resumed_from() -> None:
    sim = Sim(make_spec(snapshot_every=2), workload=Hoarder())
    sim.start()
    assert sim.holder is not None
    for n in (40_000, 40_000, 10, 10):
        sim.input(n)
        sim.holder.pump()
    snaps = [(r.offset, decode(r.value)) for r in sim.log["merge"]
             if isinstance(decode(r.value), SnapshotRecord)]
    assert len(snaps) == 2
    assert all(isinstance(s.state, ChunkRef) for _, s in snaps)  # type: ignore[union-attr]
    assert len(sim.chunks) == 2
    full = replay(Hoarder(), sim.log, use_snapshots=False)
    result = replay(Hoarder(), sim.log)
    assert result.snapshot_seq == 4 and result.core.state_hash == full.core.state_hash
    # a new holder resumes from the chunk snapshot and carries on
    sim.start()
    assert sim.holder.core.seq == 4
    sim.input(5)
    sim.holder.pump()
    assert len(sim.holder.core.state["kept"]) == 5
    # the chunk of the latest snapshot deleted: replay from it names it
    last = snaps[-1][0]
    del sim.log.resolved[("merge", last)]
    with pytest.raises(RefGap, match="keeps its state in chunk sha256:") as caught:
        replay(Hoarder(), sim.log)
    assert "--from-start" in str(caught.value)
    assert replay(Hoarder(), sim.log, use_snapshots=False).core.seq == 5


def test_a_chunk_the_holder_cannot_store_drops_its_snapshot_only() -> None:
    core = Core.initial(Hoarder(), WID)
    spec = make_spec(snapshot_every=1)
    bufs = {"in": deque([_input_item(0, InlineBody.of_json(70_000)),
                         _input_item(1, InlineBody.of_json(1))]), "resp": deque[Item]()}
    batch = merge_batch(core, spec, bufs, epoch=1, now_resp_ms=None, max_batch=100)
    assert batch.snapshots == 2 and len(batch.chunks) == 2
    first, _ = batch.chunks[0]
    outputs = batch.outputs
    batch.drop_snapshot(first, "cannot store it")
    assert batch.snapshots == 1 and batch.snapshots_skipped == ["cannot store it"]
    assert [r for _, r in batch.chunks] != [] and batch.outputs == outputs
    assert [type(r).__name__ for _, r in batch.records] == [
        "MergeEntry", "OutputRecord", "MergeEntry", "OutputRecord", "SnapshotRecord"]


# ----------------------------------------------------------------------------- the chunk format


def test_chunk_format_one_home() -> None:
    h = sha256_hex(b"abc")
    assert parse_part_key(part_key("wl-1", h, 2, 5)) == ("wl-1", h, 2, 5)
    assert parse_part_key(f"{h}/0/1".encode()) is None  # a key of the store before workloads
    assert parse_part_key(b"bad/key") is None and parse_part_key(None) is None
    data = b"a" * PART_BYTES + b"b" * PART_BYTES + b"cde"
    parts = split_parts(data)
    assert [len(p) for p in parts] == [PART_BYTES, PART_BYTES, 3] and split_parts(b"") == [b""]
    ref = chunk_ref_of(data)
    assert assemble(ref, "wl-1", dict(enumerate(parts)), 3, where="here") == data
    with pytest.raises(ChunkProblem, match=r"lacks part\(s\) \[1\] of 3 here") as caught:
        assemble(ref, "wl-1", {0: parts[0], 2: parts[2]}, 3, where="here")
    assert caught.value.why == "missing"
    with pytest.raises(ChunkProblem, match="no chunk") as caught:
        assemble(ref, "wl-1", {}, None, where="on sys.chunks")
    with pytest.raises(ChunkProblem) as caught:
        assemble(ref, "wl-1", {0: parts[1], 1: parts[0], 2: parts[2]}, 3, where="here")
    assert caught.value.why == "mismatch"
    assert fs_relpath("wl-1", h) == f"wl/wl-1/sha256/{h.split(':')[1]}"


async def test_the_holder_reads_what_an_executor_stored_in_a_shared_directory(
        tmp_path: Path) -> None:
    store = FsChunkStore(tmp_path)
    ref = store.put_sync(b"hello chunk", workload=WID)
    assert store.path(ref.hash, WID) == tmp_path / fs_relpath(WID, ref.hash)
    gone = ChunkRef(hash=sha256_hex(b"never"), size=5)
    other = store.put_sync(b"other's", workload="other")
    other_ref = other.model_copy(update={"workload": "other"})
    (tmp_path / fs_relpath(WID, sha256_hex(b"tampered"))).write_bytes(b"tamperex")
    tampered = ChunkRef(hash=sha256_hex(b"tampered"), size=8)
    async with RefResolver("unused:0", chunk_dir=tmp_path) as resolver:
        res = await resolver.resolve(
            [(("in", 0), ref), (("in", 1), gone), (("in", 2), other_ref), (("in", 3), tampered),
             (("in", 4), InlineBody.of_text("inline"))],
            workload=WID, specs=[make_spec()])
        assert res.resolved == {("in", 0): b"hello chunk", ("in", 4): b"inline"}
        assert res.problems[("in", 1)].why == "missing" and res.problems[("in", 1)].retry
        assert str(tmp_path) in res.problems[("in", 1)].message
        assert res.problems[("in", 2)].why == "forbidden"  # not in chunks_from: never read
        assert res.problems[("in", 3)].why == "mismatch"
        granted = make_spec().model_copy(update={"chunks_from": ("other",)})
        res = await resolver.resolve([(("in", 2), other_ref)], workload=WID, specs=[granted])
        assert res.resolved == {("in", 2): b"other's"}
        # the holder's own chunks (big snapshots) land where an executor would look
        mine = await resolver.write_chunk(b"snapshot bytes", workload=WID)
        assert store.get_sync(mine, workload=WID) == b"snapshot bytes"


async def test_resolve_log_fills_what_replay_needs(tmp_path: Path) -> None:
    sim, ref = _reader_sim()
    log = sim.log
    log.resolved.clear()
    store = FsChunkStore(tmp_path)
    async with RefResolver("unused:0", chunk_dir=tmp_path) as resolver:
        await resolve_log(log, resolver)
        assert ("in", 1) in log.unresolved and ref.hash in log.unresolved[("in", 1)]
        with pytest.raises(RefGap, match=str(tmp_path)):
            replay(Reader(), log, use_snapshots=False)
        store.put_sync(b'{"big":true}', workload=WID)
        log.unresolved.clear()
        await resolve_log(log, resolver)
    assert log.resolved == {("in", 1): b'{"big":true}'}
    assert replay(Reader(), log, use_snapshots=False).core.state["read"][-1] == {"big": True}

