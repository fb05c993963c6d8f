"""Shadow evaluation, the pure part, over logs the simulator generates: which requests are
re-issued, the fold over shadow answers, the diff of decisions and of answers, and that the
report is a function of the records (the same records, the same bytes)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker_schema import (
    INFERENCE_KIND,
    EffectRequest,
    InlineBody,
    ResponseRecord,
    ShadowEvalRecord,
    encode,
    request_hash,
)
from broker_schema.binding import shadow_models, shadow_spec
from fx_kafka.workload_log import LogRecord, TopicView
from tests.unit.workload_sdk.sim import MODEL, MODEL2, WID, Asker, Sim, make_spec
from workload_sdk._shadow import (
    answers,
    cut_view,
    decision_diff,
    evaluate,
    fold,
    output_diff,
    plan,
)

NEW = "sha256:" + "ef" * 32


def _drive(values: list[int], *, timeouts: frozenset[int] = frozenset()) -> Sim:
    """Inputs ``values``; every request answered ``ok`` (echo) except those whose position in
    ``.out`` order is in ``timeouts`` (left to the holder's timeout)."""
    sim = Sim(make_spec(limit=8, snapshot_every=3))
    sim.start()
    assert sim.holder is not None
    for v in values:
        sim.input(v)
    answered: set[str] = set()
    for _ in range(400):
        sim.holder.pump()
        for i, (offset, req) in enumerate(sim.requests()):
            if req.effect_id in answered or i in timeouts:
                continue
            answered.add(req.effect_id)
            sim.append("resp", ResponseRecord(
                effect_id=req.effect_id, header=req.header, request_offset=offset,
                outcome="ok", output=InlineBody.of_json({"echo": req.params}),
                model_hash=req.model, written_by="exec-1",
                request_hash=request_hash(encode(req))))  # as a real executor names it
        sim.now += 20
        core = sim.holder.core
        if (not core.pending and core.positions["in"] >= sim.log["in"].end
                and not sim.holder.bufs["in"] and not sim.holder.bufs["resp"]):
            sim.holder.pump()
            if not sim.holder.core.pending:
                break
    return sim


def _eval(to_seq: int, from_seq: int = 0, models: dict[str, str] | None = None
          ) -> ShadowEvalRecord:
    return ShadowEvalRecord(eval_id="ev1", workload_id=WID, models=models or {"m": NEW},
                            mode="history", from_seq=from_seq, to_seq=to_seq,
                            deadline_ms=60_000, created_ms=1, created_by="test")


def _last(sim: Sim) -> int:
    assert sim.holder is not None
    return sim.holder.core.seq - 1


def _shadow_answer(req: EffectRequest, output: Any, outcome: str = "ok") -> ResponseRecord:
    return ResponseRecord(effect_id=req.effect_id, header=req.header, request_offset=0,
                          outcome=outcome,  # type: ignore[arg-type]
                          output=None if outcome != "ok" else InlineBody.of_json(output),
                          model_hash=req.model, written_by="exec-2",
                          request_hash=request_hash(encode(req)))


def test_the_binding_rule_for_shadows_rebinds_only_names_the_step_binds() -> None:
    assert shadow_models({"m": MODEL, "m2": MODEL2}, {"m": NEW, "x": NEW}) == {"m": NEW,
                                                                               "m2": MODEL2}
    spec = make_spec()
    rebound = shadow_spec(spec, {"m": NEW})
    for seq in (0, 5, 1000):
        assert rebound.models_at(seq) == shadow_models(spec.models_at(seq), {"m": NEW})


def test_plan_reissues_only_requests_of_rebound_models_in_the_range() -> None:
    sim = _drive([1, 2, 3, 5, 4, 7])
    last = _last(sim)
    pairs = plan(sim.log, _eval(last))
    live = [r for _, r in sim.requests()]
    assert len(pairs) == len(live) == 4  # the odd inputs ask "m"
    for p in pairs:
        assert p.live.model == MODEL and p.shadow.model == NEW
        assert p.shadow.effect_id == f"shadow:ev1/{p.live.effect_id}"
        assert p.shadow.params == p.live.params and p.shadow.input == p.live.input
        assert p.shadow.deadline_ms == 60_000
    # a rebinding of another name re-issues nothing; a range re-issues its own steps only
    assert plan(sim.log, _eval(last, models={"m2": NEW})) == []
    some = plan(sim.log, _eval(2))
    assert {p.seq for p in some} == {p.seq for p in pairs if p.seq <= 2}


@given(values=st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=14),
       changed=st.sets(st.integers(min_value=0, max_value=20)))
@settings(max_examples=40, deadline=None)
def test_decisions_differ_exactly_where_the_shadow_answers_differ(
        values: list[int], changed: set[int]) -> None:
    sim = _drive(values)
    last = _last(sim)
    ev = _eval(last)
    pairs = plan(sim.log, ev)
    shadow = {}
    for i, p in enumerate(pairs):
        out = {"echo": p.live.params} if i not in changed else {"other": i}
        shadow[p.live.effect_id] = _shadow_answer(p.shadow, out)
    result = fold(Asker(), sim.log, ev, shadow, to_seq=last)
    assert result.diverged_at is None, result.divergence
    assert result.steps == last + 1
    expected = {p.live.effect_id for i, p in enumerate(pairs) if i in changed}
    assert {d.recorded["answer"] for d in result.differing} == expected
    assert all(d.fields == ("out",) and not d.renamed_only for d in result.differing)


def test_a_shadow_timeout_where_the_recorded_answer_was_ok_diverges_the_requests() -> None:
    sim = _drive([1, 3, 5])
    last = _last(sim)
    ev = _eval(last)
    pairs = plan(sim.log, ev)
    shadow = {p.live.effect_id: _shadow_answer(p.shadow, {"echo": p.live.params})
              for p in pairs}
    shadow[pairs[1].live.effect_id] = _shadow_answer(pairs[1].shadow, None, "timeout")
    result = fold(Asker(), sim.log, ev, shadow, to_seq=last)
    # Asker asks again after a timeout: a request the recorded log never had
    assert result.diverged_at is not None and "has a request" in result.divergence
    assert result.steps >= 1


def test_a_range_that_starts_later_folds_from_the_replayed_state() -> None:
    sim = _drive([1, 2, 3, 4, 5, 6, 7, 8, 9])
    last = _last(sim)
    ev = _eval(last, from_seq=5)
    pairs = plan(sim.log, ev)
    assert pairs and all(p.seq >= 5 for p in pairs)
    shadow = {p.live.effect_id: _shadow_answer(p.shadow, {"n": 1}) for p in pairs}
    result = fold(Asker(), sim.log, ev, shadow, to_seq=last)
    assert result.diverged_at is None, result.divergence
    assert result.steps == last + 1 - 5
    answered_in_range = [p for p in pairs if p.live.effect_id in
                         {d.recorded["answer"] for d in result.differing}]
    assert answered_in_range


def test_output_diff_for_classifiers_and_tokens() -> None:
    req = EffectRequest.model_validate({
        "header": {"workload_id": WID, "input_offset": 0, "index": 0, "epoch": 1},
        "effect_kind": INFERENCE_KIND, "model": MODEL, "deadline_ms": 10})
    a = _shadow_answer(req, {"label": "txt", "score": 0.5})
    b = _shadow_answer(req, {"label": "sql", "score": 0.75})
    d = output_diff(a, b)
    assert d["label"] == ["txt", "sql"] and d["score_delta"] == 0.25 and not d["same"]
    assert output_diff(a, a)["same"]
    t1 = _shadow_answer(req, {"output_tokens": [1, 2, 3, 4], "text": "abcd"})
    t2 = _shadow_answer(req, {"output_tokens": [1, 2, 9], "text": "abx"})
    d = output_diff(t1, t2)
    assert d["tokens"] == {"first_diff": 2, "differ": 2, "len": [4, 3]}
    e = output_diff(a, _shadow_answer(req, None, "timeout"))
    assert e["outcome"] == ["ok", "timeout"] and not e["same"]


def test_a_decision_that_names_the_new_model_only_is_renamed_only() -> None:
    d = decision_diff(3, 0, 9, {"label": "pdf", "model": MODEL}, {"label": "pdf", "model": NEW},
                      {NEW: MODEL})
    assert d is not None and d.renamed_only and d.fields == ("model",)
    d = decision_diff(3, 0, 9, {"label": "pdf", "model": MODEL}, {"label": "txt", "model": NEW},
                      {NEW: MODEL})
    assert d is not None and not d.renamed_only and d.fields == ("label", "model")
    assert decision_diff(1, 0, 1, {"a": 1}, {"a": 1}, {}) is None


def _view(topic: str, records: list[Any], *, backpressure_first: bool = False) -> TopicView:
    view = TopicView(topic=topic)
    offset = 0
    for r in records:
        if backpressure_first and isinstance(r, ResponseRecord):
            bp = r.model_copy(update={"outcome": "backpressure", "output": None})
            view.add(LogRecord(offset, 1, encode(bp)))
            offset += 1
        view.add(LogRecord(offset, 1, encode(r)))
        offset += 1
    return view


def test_the_report_is_a_function_of_the_records() -> None:
    sim = _drive([1, 3, 4, 5, 7])
    last = _last(sim)
    ev = _eval(last)
    pairs = plan(sim.log, ev)
    outs = _view("o", [p.shadow for p in pairs])
    resps = _view("r", [_shadow_answer(p.shadow, {"x": i}) for i, p in enumerate(pairs)],
                  backpressure_first=True)
    # backpressure is "not taken": the answer is the next record
    assert all(r.outcome == "ok" for _, r in answers(resps).values())
    topics_of = {"eval": "e", "out": "o", "resp": "r"}
    one = evaluate(Asker(), sim.log, ev, out_view=outs, resp_view=resps, to_seq=last,
                   topics_of=topics_of)
    two = evaluate(Asker(), sim.log, ev, out_view=outs, resp_view=resps, to_seq=last,
                   topics_of=topics_of)
    assert one == two and one["report_hash"].startswith("sha256:")
    assert one["requests"] == one["answered"] == one["requests_written"] == len(pairs)
    assert one["decisions_differ"] == len(pairs) and one["first_differing"] is not None
    assert one["ends"]["shadow.resp"] == resps.end
    # a late record after the report does not change it once the view is cut where it was
    late = TopicView(topic="r", records=dict(resps.records), end=resps.end)
    late.add(LogRecord(late.end, 2, encode(_shadow_answer(pairs[0].shadow, {"late": 1}))))
    again = evaluate(Asker(), sim.log, ev, out_view=outs,
                     resp_view=cut_view(late, one["ends"]["shadow.resp"]), to_seq=last,
                     topics_of=topics_of)
    assert again["report_hash"] == one["report_hash"]
    # an answer missing: no fold, said
    short = cut_view(resps, resps.end - 1)
    partial = evaluate(Asker(), sim.log, ev, out_view=outs, resp_view=short, to_seq=last,
                       topics_of=topics_of)
    assert partial["answered"] == len(pairs) - 1 and partial["missing"]
    assert partial["requests_diverged_at"] == 0 and "missing" in partial["divergence"]
