"""Pure tests of merge order, dedup, timeout/unknown and exactly-once outputs (no broker)."""

from __future__ import annotations

import base64
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_schema import (
    INFERENCE_KIND,
    AcceptedRecord,
    EffectHeader,
    EffectRequest,
    InlineBody,
    InputRecord,
    MergeEntry,
    ResponseRecord,
    Signature,
    TickRecord,
    canonical_json,
    decode,
    encode,
    request_hash,
)
from broker_schema.signatures import SigningKey, answer_refusal
from tests.unit.workload_sdk.sim import WID, Asker, Sim, make_spec
from workload_sdk import (
    Core,
    Item,
    ReplayError,
    Workload,
    WorkloadError,
    choose_next,
    due_outcomes,
    emit,
    infer,
    replay,
)
from workload_sdk._core import Pending, holder_outcome, tick_problem
from workload_sdk._replay import compare_outputs, missing_outputs, out_slots


def _item(source: str, offset: int, t: int, record: Any) -> Item:
    return Item(source, offset, t, record)  # type: ignore[arg-type]


def _input(v: Any) -> InputRecord:
    return InputRecord(workload_id=WID, body=InlineBody.of_json(v))


def _header(seq: int, index: int = 1, epoch: int = 1) -> EffectHeader:
    return EffectHeader(workload_id=WID, input_offset=seq, index=index, epoch=epoch)


def _resp(h: EffectHeader, outcome: str = "ok") -> ResponseRecord:
    return ResponseRecord(effect_id=h.effect_id, header=h, request_offset=0,
                          outcome=outcome, written_by="e",  # type: ignore[arg-type]
                          output=InlineBody.of_json(1) if outcome == "ok" else None)


# ------------------------------------------------------------------------------ examples


def test_choose_next_earlier_append_time_first_ties_to_responses() -> None:
    a = _item("in", 0, 10, _input(1))
    r = _item("resp", 0, 10, TickRecord(workload_id=WID, epoch=1, holder_id="h"))
    assert choose_next(a, r, input_allowed=True) == "resp"
    later = _item("resp", 1, 11, r.record)
    assert choose_next(a, later, input_allowed=True) == "in"
    assert choose_next(a, later, input_allowed=False) == "resp"
    assert choose_next(a, None, input_allowed=False) is None
    assert choose_next(None, None, input_allowed=True) is None


def test_first_answer_is_delivered_later_ones_are_passed_over_with_reasons() -> None:
    spec = make_spec()
    core = Core.initial(Asker(), WID)
    applied = core.apply(_item("in", 0, 5, _input(3)), epoch=1, spec=spec)
    req = applied.outputs[1]
    assert isinstance(req, EffectRequest) and req.model == spec.models["m"]
    h = req.header
    acc = AcceptedRecord(effect_id=h.effect_id, header=h, request_offset=1, node_id="e",
                         lease_ms=100, accepted_us=1)
    a1 = core.apply(_item("resp", 0, 6, acc), epoch=1, spec=spec)
    assert (a1.decision.action, a1.decision.reason) == ("pass_over", "not_an_answer")
    assert core.pending[h.effect_id].accepted_ms == 6
    first = core.apply(_item("resp", 1, 7, _resp(h)), epoch=1, spec=spec)
    assert first.decision.action == "deliver" and first.entry is not None
    assert first.entry.seq == 1 and first.entry.effect_id == h.effect_id
    dup = core.apply(_item("resp", 2, 8, _resp(h)), epoch=1, spec=spec)
    assert (dup.decision.action, dup.decision.reason) == ("pass_over", "duplicate")
    assert dup.entry is not None and dup.entry.seq == 2  # carries the next delivery's seq
    stray = core.apply(_item("resp", 3, 9, _resp(_header(99, 0))), epoch=1, spec=spec)
    assert stray.decision.reason == "unknown_effect"
    assert core.state["seen"] == [[h.effect_id, "ok"]]


def test_an_answer_to_another_request_with_the_same_effect_id_is_foreign() -> None:
    """Issue 30, front-running: a stray request written first on ``.out`` with the effect id
    the step will use next is answered by a genuine executor; that answer names the stray's
    hash, not the step's request's, so it is passed over (``foreign_request``), its accept
    starts no lease, and the answer to the step's own request is the one delivered."""
    spec = make_spec()
    core = Core.initial(Asker(), WID)
    req = core.apply(_item("in", 0, 5, _input(3)), epoch=1, spec=spec).outputs[1]
    assert isinstance(req, EffectRequest)
    h, own = req.header, request_hash(encode(req))
    assert core.pending[h.effect_id].request_hash == own
    stray = req.model_copy(update={"params": {"attacker": True}})
    theirs = request_hash(encode(stray))
    acc = AcceptedRecord(effect_id=h.effect_id, header=h, request_offset=0, node_id="e",
                         lease_ms=100, accepted_us=1, request_hash=theirs)
    a = core.apply(_item("resp", 0, 6, acc), epoch=1, spec=spec)
    assert a.decision.reason == "not_an_answer" and core.pending[h.effect_id].accepted_ms is None
    forged = _resp(h).model_copy(update={"request_hash": theirs})
    got = core.apply(_item("resp", 1, 7, forged), epoch=1, spec=spec)
    assert (got.decision.action, got.decision.reason) == ("pass_over", "foreign_request")
    assert got.entry is not None and got.entry.reason == "foreign_request" and not got.outputs
    assert h.effect_id in core.pending and core.state["seen"] == []
    mine = core.apply(_item("resp", 2, 8, _resp(h).model_copy(update={"request_hash": own})),
                      epoch=1, spec=spec)
    assert mine.decision.action == "deliver" and core.state["seen"] == [[h.effect_id, "ok"]]
    # the holder's own timeout/unknown names its request too
    p = Pending("w/0/1@1", 0, 1, 1, INFERENCE_KIND, deadline_ms=50, request_hash=own)
    assert holder_outcome(p, request_offset=3, outcome="timeout", holder_id="h",
                          workload_id="w").request_hash == own


def _signed(response: ResponseRecord, key: SigningKey) -> ResponseRecord:
    sig = Signature(alg=key.key_type, key_id=key.key_id,
                    value=base64.b64encode(key.sign(response.signing_bytes())).decode())
    return response.model_copy(update={"signature": sig})


def test_unsigned_refuse_and_signers_pass_untrusted_answers_over() -> None:
    """Issue 30, attack 3: under ``unsigned = "refuse"`` an executor's answer without a
    signature is passed over (``unsigned``); with ``signers``, one signed by a key the spec does
    not trust for its node (or by a node it does not list) is ``untrusted_key``; the holder's
    own timeout is merged; replay decides the same from the log."""
    trusted, rogue = SigningKey.generate(), SigningKey.generate()
    spec = make_spec().model_copy(update={"unsigned": "refuse",
                                          "signers": {"e": (trusted.public_key_b64,)}})
    assert decode(encode(spec)) == spec
    core = Core.initial(Asker(), WID)
    h = core.apply(_item("in", 0, 5, _input(1)), epoch=1, spec=spec).outputs[1].header
    cases = [(_resp(h), "unsigned"), (_signed(_resp(h), rogue), "untrusted_key"),
             (_signed(_resp(h).model_copy(update={"written_by": "other"}), trusted),
              "untrusted_key")]
    for offset, (answer, reason) in enumerate(cases):
        got = core.apply(_item("resp", offset, 6 + offset, answer), epoch=1, spec=spec)
        assert (got.decision.action, got.decision.reason) == ("pass_over", reason), reason
        assert answer_refusal(answer, spec) is not None
    assert core.state["seen"] == []
    good = core.apply(_item("resp", 9, 20, _signed(_resp(h), trusted)), epoch=1, spec=spec)
    assert good.decision.action == "deliver" and core.state["seen"] == [[h.effect_id, "ok"]]
    # the holder's own timeout: unsigned by design, merged under the policy
    timeout = ResponseRecord(effect_id=_header(0).effect_id, header=_header(0), request_offset=0,
                             outcome="timeout", written_by="holder")
    assert answer_refusal(timeout, spec) is None
    # the default policy counts and merges
    assert answer_refusal(_resp(h), make_spec()) is None


def test_answer_after_timeout_is_passed_over_as_after_outcome() -> None:
    spec = make_spec()
    core = Core.initial(Asker(), WID)
    h = core.apply(_item("in", 0, 5, _input(1)), epoch=1, spec=spec).outputs[1].header
    timeout = ResponseRecord(effect_id=h.effect_id, header=h, request_offset=1,
                             outcome="timeout", written_by="holder")
    got = core.apply(_item("resp", 0, 60, timeout), epoch=1, spec=spec)
    assert got.decision.action == "deliver"
    assert len(got.outputs) == 2  # the workload retries once under a new id
    late = core.apply(_item("resp", 1, 61, _resp(h)), epoch=1, spec=spec)
    assert (late.decision.action, late.decision.reason) == ("pass_over", "after_outcome")


def test_due_outcomes_timeout_without_accept_unknown_after_lease() -> None:
    p = Pending("w/0/1@1", 0, 1, 1, INFERENCE_KIND, deadline_ms=50)
    times = {p.effect_id: 1000}
    assert due_outcomes([p], times, 1050) == []  # strictly later than the deadline
    (d,) = due_outcomes([p], times, 1051)
    assert (d.outcome, d.due_at_ms) == ("timeout", 1050)
    p.accepted_ms, p.lease_ms = 1040, 100
    assert due_outcomes([p], times, 1100) == []  # accepted in time: no timeout
    (d,) = due_outcomes([p], times, 1141)
    assert (d.outcome, d.due_at_ms) == ("unknown", 1140)
    assert due_outcomes([p], times, 5000, already_written=[p.effect_id]) == []
    assert due_outcomes([p], {}, 5000) == []  # request time not read back yet


def test_outstanding_limit_holds_inputs_and_refuses_an_overfull_step() -> None:
    class Greedy(Workload):
        def initial_state(self) -> Any:
            return 0

        def step(self, state: Any, event: Any) -> tuple[Any, list[Any]]:
            return state + 1, [infer(model="m", input=i) for i in range(3)]

    spec = make_spec(limit=2)
    core = Core.initial(Greedy(), WID)
    with pytest.raises(WorkloadError) as err:
        core.apply(_item("in", 0, 1, _input(0)), epoch=1, spec=spec)
    assert err.value.code == "outstanding_limit" and core.seq == 0 and core.state == 0

    sim = Sim(spec=make_spec(limit=1))
    sim.start()
    assert sim.holder is not None
    for v in (1, 3, 5):
        sim.input(v)
    sim.holder.pump()
    assert len(sim.holder.core.pending) == 1 and len(sim.holder.bufs["in"]) == 2
    sim.answer(0, "ok")
    sim.holder.pump()
    assert len(sim.holder.bufs["in"]) == 1  # one more input merged after the answer freed room


def test_model_and_kind_must_be_bound_at_the_input_offset() -> None:
    from broker_schema import BindingSwitch

    class Ask(Workload):
        def initial_state(self) -> Any:
            return None

        def step(self, state: Any, event: Any) -> tuple[Any, list[Any]]:
            return state, [infer(model=event.json(), input="x")]

    other = "sha256:" + "cd" * 32
    spec = make_spec().model_copy(update={"binding_switches": (
        BindingSwitch(at_input_offset=1, models={"m": other}),)})
    core = Core.initial(Ask(), WID)
    first = core.apply(_item("in", 0, 1, _input("m")), epoch=1, spec=spec).outputs[0]
    second = core.apply(_item("in", 1, 2, _input("m")), epoch=1, spec=spec).outputs[0]
    assert isinstance(first, EffectRequest) and isinstance(second, EffectRequest)
    assert (first.model, second.model) == (spec.models["m"], other)
    with pytest.raises(WorkloadError, match="model_unbound"):
        core.apply(_item("in", 2, 3, _input("nope")), epoch=1, spec=spec)
    with pytest.raises(WorkloadError, match="model_unbound"):
        core.apply(_item("in", 2, 3, _input(spec.models["m"])), epoch=1, spec=spec)


def test_replay_refuses_a_merge_log_the_fold_disagrees_with() -> None:
    sim = Sim(spec=make_spec())
    sim.start()
    assert sim.holder is not None
    sim.input(1)
    sim.holder.pump()
    sim.answer(0, "ok")
    sim.answer(0, "ok")
    sim.holder.pump()
    # forge the second answer's entry into a delivery
    view = sim.log["merge"]
    for rec in view:
        entry = decode(rec.value)
        if isinstance(entry, MergeEntry) and entry.reason == "duplicate":
            forged = entry.model_copy(update={"action": "deliver", "reason": None})
            view.records[rec.offset] = type(rec)(rec.offset, rec.time_ms,
                                                 canonical_json(forged.model_dump(mode="json")))
    with pytest.raises(ReplayError, match="the fold decides pass_over/duplicate"):
        replay(Asker(), sim.log, use_snapshots=False)


def test_new_holder_writes_only_missing_slots() -> None:
    # no snapshot in range: a new holder recomputes the steps after its snapshot, and outputs
    # before a snapshot committed with it in one transaction
    sim = Sim(spec=make_spec(snapshot_every=100))
    sim.start()
    assert sim.holder is not None
    for v in (2, 4, 1):
        sim.input(v)
    sim.holder.pump()
    slots = out_slots(sim.log)
    assert missing_outputs(replay(Asker(), sim.log, use_snapshots=False), sim.log) == []
    # lose one output (as if its write never landed): only that slot is rewritten
    lost_slot = sorted(slots)[1]
    del sim.log["out"].records[slots[lost_slot][0]]
    sim.start()
    after = out_slots(sim.log)
    assert set(after) == set(slots)
    assert after[lost_slot][1] == slots[lost_slot][1]  # the same bytes as the lost one
    counts = Counter(decode(r.value).header.slot for r in sim.log["out"])  # type: ignore[union-attr]
    assert max(counts.values()) == 1


# ------------------------------------------------------------------------------ hypothesis

actions = st.lists(
    st.one_of(
        st.tuples(st.just("input"), st.integers(0, 9)),
        st.tuples(st.just("advance"), st.integers(1, 80)),
        st.tuples(st.just("pump"), st.just(0)),
        st.tuples(st.just("accept"), st.integers(0, 50)),
        st.tuples(st.just("answer"), st.integers(0, 50), st.sampled_from(
            ["ok", "ok", "error", "backpressure"])),
        st.tuples(st.just("dup"), st.integers(0, 50)),
        st.tuples(st.just("stray"), st.just(0)),
        st.tuples(st.just("failover"), st.just(0)),
    ),
    max_size=40,
)


def _run(sim: Sim, steps: list[tuple[Any, ...]]) -> None:
    sim.start()
    for step in steps:
        holder = sim.holder
        assert holder is not None
        match step:
            case ("input", v):
                sim.input(v)
            case ("advance", dt):
                sim.now += dt
            case ("pump", _):
                holder.pump()
            case ("accept", pick):
                sim.accept(pick)
            case ("answer", pick, outcome):
                sim.answer(pick, outcome)
            case ("dup", pick):
                sim.answer(pick, "ok")
                sim.answer(pick, "ok")
            case ("stray", _):
                sim.stray()
            case ("failover", _):
                sim.start()
    assert sim.holder is not None
    sim.holder.drain()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=actions, limit=st.integers(1, 4), snap=st.integers(1, 5))
def test_any_interleaving_one_answer_per_effect_and_replay_reproduces(
    steps: list[tuple[Any, ...]], limit: int, snap: int
) -> None:
    sim = Sim(spec=make_spec(limit=limit, snapshot_every=snap))
    _run(sim, steps)
    holder = sim.holder
    assert holder is not None
    live = holder.core

    # exactly one answer per effect id, and every request answered once
    seen = [eid for eid, _ in live.state["seen"]]
    assert len(seen) == len(set(seen))
    requested = {req.effect_id for _, req in sim.requests()}
    assert set(seen) == requested

    # no output slot written twice, across fail-overs
    slots = Counter(decode(r.value).header.slot for r in sim.log["out"])  # type: ignore[union-attr]
    assert not slots or max(slots.values()) == 1

    # every response on .resp is accounted for in the merge log: delivered once or passed over
    merged = [decode(r.value) for r in sim.log["merge"]]
    entries = [m for m in merged if isinstance(m, MergeEntry)]
    delivered = Counter(e.effect_id for e in entries if e.action == "deliver" and e.effect_id)
    assert all(n == 1 for n in delivered.values())
    assert [e.seq for e in entries if e.action == "deliver"] == list(range(live.seq))

    # replay (from the start and from snapshots) reproduces the state bytes and every output
    for use_snapshots in (False, True):
        result = replay(Asker(), sim.log, use_snapshots=use_snapshots)
        assert canonical_json(result.core.state) == canonical_json(live.state)
        assert result.core.seq == live.seq
        assert compare_outputs(result, sim.log) == []
    full = replay(Asker(), sim.log, use_snapshots=False)
    assert len(full.outputs) == len(slots)


@settings(max_examples=60, deadline=None)
@given(steps=actions, cut=st.integers(0, 30))
def test_replay_to_any_seq_matches_the_prefix(steps: list[tuple[Any, ...]], cut: int) -> None:
    sim = Sim(spec=make_spec(snapshot_every=2))
    _run(sim, steps)
    assert sim.holder is not None
    to = min(cut, max(sim.holder.core.seq - 1, 0))
    a = replay(Asker(), sim.log, to_seq=to, use_snapshots=True)
    b = replay(Asker(), sim.log, to_seq=to, use_snapshots=False)
    assert canonical_json(a.core.state) == canonical_json(b.core.state)
    assert a.core.seq == b.core.seq == min(to + 1, sim.holder.core.seq)


def test_outputs_are_plain_emits_and_requests() -> None:
    class Bad(Workload):
        def initial_state(self) -> Any:
            return {}

        def step(self, state: Any, event: Any) -> tuple[Any, list[Any]]:
            return state, [emit(1), "not an output"]

    core = Core.initial(Bad(), WID)
    with pytest.raises(WorkloadError, match="bad_output"):
        core.apply(_item("in", 0, 1, _input(1)), epoch=1, spec=make_spec())

    class NaNState(Workload):
        def initial_state(self) -> Any:
            return {}

        def step(self, state: Any, event: Any) -> tuple[Any, list[Any]]:
            return {"x": float("nan")}, []

    with pytest.raises(WorkloadError, match="bad_state"):
        Core.initial(NaNState(), WID).apply(_item("in", 0, 1, _input(1)), epoch=1,
                                            spec=make_spec())


# ------------------------------------------------------------------------------ pacing


def test_pacing_pauses_grow_with_a_streak_and_any_other_answer_ends_it() -> None:
    from workload_sdk._core import PACE_BASE_MS, PACE_CAP_MS, Pacing

    p = Pacing()
    assert p.allows(0) and p.resumes_at() is None
    p.note("backpressure", 1_000)
    assert not p.allows(1_000 + PACE_BASE_MS - 1) and p.allows(1_000 + PACE_BASE_MS)
    p.note("backpressure", 1_000)
    assert p.resumes_at() == 1_000 + 2 * PACE_BASE_MS
    for _ in range(30):
        p.note("backpressure", 2_000)
    assert p.resumes_at() == 2_000 + PACE_CAP_MS
    p.note("ok", 2_001)
    assert p.streak == 0 and p.resumes_at() == 2_000 + PACE_CAP_MS  # the pause in force stays
    p.note("backpressure", 9_000)
    assert p.resumes_at() == 9_000 + PACE_BASE_MS  # a new streak starts short


def test_backpressure_holds_inputs_back_in_broker_time_and_replay_follows_the_log() -> None:
    from workload_sdk._core import PACE_BASE_MS

    sim = Sim(make_spec(limit=4))
    sim.start()
    holder = sim.holder
    assert holder is not None
    for v in range(8):
        sim.input(2 * v + 1)  # odd: each asks the model once
    holder.pump()
    assert len(sim.requests()) == 4  # the outstanding limit
    for pick in range(4):  # every queue full: backpressure for the four
        sim.answer(pick, "backpressure")
    holder.pump()
    # the answers were merged (room for four more), but no input: the pause is in force
    assert len(sim.requests()) == 4 and holder.core.pacing.streak == 4
    resume = holder.core.pacing.resumes_at()
    assert resume == sim.now + PACE_BASE_MS * 8
    sim.now = resume - 1
    holder.pump()
    assert len(sim.requests()) == 4
    sim.now = resume + 1
    holder.pump()  # broker time passes the pause: a tick shows it, then the inputs are merged
    holder.pump()
    assert len(sim.requests()) == 8
    ticks = [r for r in (decode(x.value) for x in sim.log["resp"]) if isinstance(r, TickRecord)]
    assert ticks, "the holder wrote a tick to see the pause end"
    for pick in range(4, 8):
        sim.answer(pick, "ok")
    holder.drain()
    result = replay(Asker(), sim.log, use_snapshots=False)
    assert compare_outputs(result, sim.log) == []


# ------------------------------------------------------------------------------ the round


def test_a_batch_is_bounded_and_the_rest_stays_buffered_for_the_next() -> None:
    from collections import deque

    from workload_sdk._round import merge_batch

    spec = make_spec(limit=100, snapshot_every=2)
    core = Core.initial(Asker(), WID)
    bufs = {"in": deque(_item("in", i, 1000 + i, InputRecord(
        workload_id=WID, body=InlineBody.of_json(2 * i))) for i in range(10)), "resp": deque()}
    first = merge_batch(core, spec, bufs, epoch=1, now_resp_ms=None, max_batch=5)
    # one merge entry and one output per even input, and a snapshot every second step
    assert [s for s, _ in first.records] == ["merge", "out", "merge", "out", "merge"]
    assert first.steps == 2 and first.snapshots == 1 and len(bufs["in"]) == 8
    assert [type(o).__name__ for o in first.outputs] == ["OutputRecord", "OutputRecord"]
    rest = merge_batch(core, spec, bufs, epoch=1, now_resp_ms=None, max_batch=10**6)
    assert rest.steps == 8 and not bufs["in"] and core.seq == 10
    assert merge_batch(core, spec, bufs, epoch=1, now_resp_ms=None, max_batch=5).records == []


def test_outcomes_and_ticks_are_judged_on_merged_broker_time() -> None:
    from workload_sdk._round import outcomes_due, tick_due

    E1 = f"{WID}/0/1@1"
    core = Core.initial(Asker(), WID)
    core.pending[E1] = Pending(effect_id=E1, input_offset=0, index=1, epoch=1,
                                 effect_kind=INFERENCE_KIND, deadline_ms=50)
    times, offsets = {E1: 1000}, {E1: 3}
    kw: dict[str, Any] = {"holder_id": "h", "workload_id": WID}
    assert outcomes_due(core, times, offsets, already_written=set(), now_resp_ms=None,
                        **kw) == []  # no broker time seen yet
    assert outcomes_due(core, times, offsets, already_written=set(), now_resp_ms=1049,
                        **kw) == []
    (late,) = outcomes_due(core, times, offsets, already_written=set(), now_resp_ms=1051, **kw)
    assert late.outcome == "timeout" and late.request_offset == 3
    assert outcomes_due(core, times, offsets, already_written={E1}, now_resp_ms=1051,
                        **kw) == []
    tick = {"already_written": set(), "inputs_waiting": False, "now_resp_ms": 1000}
    assert not tick_due(core, times, broker_now_ms=1050, tick_in_flight=False, **tick)
    assert tick_due(core, times, broker_now_ms=1051, tick_in_flight=False, **tick)
    assert not tick_due(core, times, broker_now_ms=1051, tick_in_flight=True, **tick)


@settings(max_examples=80, deadline=None)
@given(values=st.lists(st.integers(0, 9), min_size=0, max_size=20),
       delays=st.lists(st.integers(1, 40), max_size=20),
       sizes=st.lists(st.integers(1, 7), min_size=1, max_size=10),
       limit=st.integers(1, 4), snap=st.integers(1, 4))
def test_the_holder_round_does_not_depend_on_how_it_is_cut_into_batches(
        values: list[int], delays: list[int], sizes: list[int], limit: int,
        snap: int) -> None:
    """The pure holder step (``merge_batch``): the same buffered records, merged in
    transactions of any sizes, give the same records in the same order as one transaction,
    and the same fold."""
    from collections import deque

    from workload_sdk._round import merge_batch

    spec = make_spec(limit=limit, snapshot_every=snap)
    ins = [_item("in", i, 1000 + 10 * i, _input(v)) for i, v in enumerate(values)]

    def run(cuts: list[int], resps: list[Item]) -> tuple[list[tuple[str, str]], Any, int]:
        core = Core.initial(Asker(), WID)
        bufs: dict[str, Any] = {"in": deque(ins), "resp": deque(resps)}
        written: list[tuple[str, str]] = []
        for k in range(500):
            batch = merge_batch(core, spec, bufs, epoch=1, now_resp_ms=None,
                                max_batch=cuts[k % len(cuts)])
            assert batch.failure is None
            written += [(s, encode(r).decode()) for s, r in batch.records]
            if not batch.records:
                break
        return written, canonical_json(core.state), core.seq

    # the answers: one per request a first run issues, each some time after its input
    first = run([10**6], [])
    reqs = [decode(r.encode()) for s, r in first[0] if s == "out"]
    resps = []
    for n, r in enumerate(x for x in reqs if isinstance(x, EffectRequest)):
        t = ins[min(n, len(ins) - 1)].time_ms + (delays[n % len(delays)] if delays else 5)
        resps.append(_item("resp", n, t, ResponseRecord(
            effect_id=r.effect_id, header=r.header, request_offset=0, outcome="ok",
            output=InlineBody.of_json(1), written_by="e")))
    resps.sort(key=lambda it: it.time_ms)
    resps = [_item("resp", n, it.time_ms, it.record) for n, it in enumerate(resps)]
    whole = run([10**6], resps)
    assert run(sizes, resps) == whole
    assert run([1], resps) == whole


def test_a_tick_is_the_holders_only_when_it_names_its_epochs_holder() -> None:
    """Issue 30: ticks from another writer than the epoch's holder are rejected (the shell
    writes them to sys.rejects and never takes them as its clock)."""
    holders = {1: "h1", 2: "h2"}
    assert tick_problem(TickRecord(workload_id=WID, epoch=2, holder_id="h2"), holders) is None
    assert "names holder 'mallory'" in (tick_problem(
        TickRecord(workload_id=WID, epoch=2, holder_id="mallory"), holders) or "")
    assert "no claim names" in (tick_problem(
        TickRecord(workload_id=WID, epoch=7, holder_id="h2"), holders) or "")


def test_a_shadow_fold_takes_recorded_answers_whichever_request_they_name() -> None:
    """A shadow fold's requests may differ from the recorded ones (a rebound model changes a
    later request): the recorded answers stand for them (``bind_answers`` off)."""
    spec = make_spec()
    core = Core.initial(Asker(), WID)
    core.bind_answers = False
    h = core.apply(_item("in", 0, 5, _input(3)), epoch=1, spec=spec).outputs[1].header
    other = _resp(h).model_copy(update={"request_hash": "sha256:" + "e" * 64})
    assert core.apply(_item("resp", 0, 6, other), epoch=1, spec=spec).decision.action == "deliver"
