"""The pure core: fencing, spec binding, deadlines, backpressure, responses, offsets."""

from __future__ import annotations

import pytest

from broker_schema import decode, encode, request_hash, topics
from broker_schema.binding import (
    MAX_EPOCH,
    MAX_EPOCH_STEP,
    accepted_claims,
    epoch_after,
    next_epoch,
)
from broker_schema.records import (
    INFERENCE_KIND,
    BindingSwitch,
    ExecutorInfo,
    InlineBody,
)
from broker_schema.signatures import SigningKey, holder_signature
from fx_node.admission import (
    Admit,
    ExecutorState,
    Ignore,
    OffsetTracker,
    Refuse,
    decide,
    error_response,
    holder_problem,
    ok_response,
    redact,
    renewal_due,
    renewed,
)
from tests.unit.executor.helpers import claim, request, spec

WL = "wl1"
M1 = "sha256:" + "a" * 64
M2 = "sha256:" + "b" * 64
INFO = ExecutorInfo(node_id="n1", engine="fx-executor", engine_version="0", device_class="cpu")
APPEND_MS = 1_700_000_000_000


def state(limit: int = 4) -> ExecutorState:
    st = ExecutorState(node_id="n1", kinds={INFERENCE_KIND: limit}, engine_info=INFO)
    st.observe_spec(spec(WL, {"m": M1}), offset=0)
    st.observe_claim(claim(WL, 2))
    return st


def run(st: ExecutorState, req: object, *, offset: int = 10, now_ms: int = APPEND_MS + 5,
        status: str = "ready") -> object:
    return decide(st, req, topic=topics.out(WL), partition=0, offset=offset,  # type: ignore[arg-type]
                  append_ms=APPEND_MS, now_ms=now_ms, now_us=now_ms * 1000,
                  model_status=status)  # type: ignore[arg-type]


def refusal_code(decision: object) -> str | None:
    assert isinstance(decision, Refuse), decision
    resp = decision.response
    assert resp.written_by == "n1" and resp.executor == INFO and resp.output is None
    return resp.error.code if resp.error else None


def test_admit_writes_accepted_and_enters_in_flight() -> None:
    st = state()
    req = request(WL, M1, epoch=2)
    d = run(st, req, offset=42)
    assert isinstance(d, Admit)
    assert d.accepted.effect_id == req.effect_id == f"{WL}/0/0@2"
    assert d.accepted.request_offset == 42 and d.accepted.node_id == "n1"
    assert d.accepted.lease_ms == 30_000
    assert d.job.deadline_at_ms == APPEND_MS + 60_000
    assert st.in_flight[req.effect_id] is d.job
    assert st.queue_depth(INFERENCE_KIND) == 1 and st.depth_by_workload() == {WL: 1}


def test_every_record_for_a_request_names_the_hash_of_its_bytes() -> None:
    """Issue 30: accepted, the answer and a refusal carry the request's hash, so the holder can
    tell the answer to its own request from the answer to a stray with the same effect id."""
    st = state()
    req = request(WL, M1, epoch=2)
    bound = request_hash(encode(req))
    d = decide(st, req, topic=topics.out(WL), partition=0, offset=7, append_ms=APPEND_MS,
               now_ms=APPEND_MS + 5, now_us=1, model_status="ready", request_hash=bound)
    assert isinstance(d, Admit) and d.accepted.request_hash == bound
    ok = ok_response(st, d.job, output=InlineBody.of_json({"label": "pdf"}), model_hash=M1,
                     executor=INFO, started_us=2, finished_us=3)
    err = error_response(st, d.job, code="engine_error", message="x", model_hash=M1,
                         executor=INFO, started_us=2, finished_us=3)
    assert ok.request_hash == err.request_hash == bound
    stale = request(WL, M1, epoch=1)
    r = decide(st, stale, topic=topics.out(WL), partition=0, offset=8, append_ms=APPEND_MS,
               now_ms=APPEND_MS + 5, now_us=1, model_status="ready",
               request_hash=request_hash(encode(stale)))
    assert isinstance(r, Refuse) and r.response.request_hash == request_hash(encode(stale))
    assert decode(encode(ok)) == ok  # on the wire, and covered by the signature


def test_same_effect_id_in_flight_is_ignored() -> None:
    st = state()
    assert isinstance(run(st, request(WL, M1, epoch=2)), Admit)
    assert isinstance(run(st, request(WL, M1, epoch=2), offset=11), Ignore)


def test_kind_not_served_is_ignored_not_answered() -> None:
    st = state()
    d = run(st, request(WL, M1, epoch=2, kind="acme:valve/set@1.0.0"))
    assert isinstance(d, Ignore) and "not served" in d.reason
    assert not st.in_flight


def test_lower_epoch_than_highest_claim_is_stale() -> None:
    st = state()
    assert refusal_code(run(st, request(WL, M1, epoch=1))) == "stale_epoch"
    # an epoch equal to or above the highest claim passes the fence
    assert isinstance(run(st, request(WL, M1, epoch=3, index=1)), Admit)


def test_claims_only_raise_the_epoch() -> None:
    st = state()
    assert st.observe_claim(claim(WL, 5))
    assert not st.observe_claim(claim(WL, 3))
    assert st.workload(WL).highest_epoch == 5
    assert refusal_code(run(st, request(WL, M1, epoch=4))) == "stale_epoch"


def test_a_claim_too_far_ahead_is_refused_by_every_reader_alike() -> None:
    """Issue 30, attack 4: one claim of epoch 2^53 - 1 made every request stale_epoch and a
    restarted holder crash (it claimed 2^53). A claim more than MAX_EPOCH_STEP above the highest
    accepted before it is refused (the executor writes it to sys.rejects); the next epoch is
    counted from the accepted ones; with none left, there is no next epoch (never 2^53)."""
    st = state()  # highest claim 2
    giant = claim(WL, MAX_EPOCH)
    assert st.claim_refused(giant) is not None
    assert st.claim_refused(claim(WL, 2 + MAX_EPOCH_STEP)) is None
    assert st.workload(WL).highest_epoch == 2
    assert isinstance(run(st, request(WL, M1, epoch=2)), Admit)
    log = [claim(WL, 1), giant, claim(WL, 2), claim(WL, 5000), claim(WL, 3)]
    assert [c.epoch for c in accepted_claims(log)] == [1, 2, 3]
    assert next_epoch(log) == 4 and next_epoch([]) == 1
    # a giant first claim is refused too (the bound counts from 0)
    assert accepted_claims([claim(WL, MAX_EPOCH - 1), claim(WL, MAX_EPOCH)]) == []
    # reached a bound at a time, the last epoch leaves none to claim: None, never 2^53
    assert epoch_after(MAX_EPOCH - 1) == MAX_EPOCH and epoch_after(MAX_EPOCH) is None


def test_no_spec() -> None:
    st = ExecutorState(node_id="n1", kinds={INFERENCE_KIND: 4}, engine_info=INFO)
    assert refusal_code(run(st, request(WL, M1))) == "no_spec"


def _adopt(st: ExecutorState, spec_offset: int, from_seq: int, epoch: int = 2) -> None:
    st.observe_claim(claim(WL, epoch).model_copy(update={"spec_offset": spec_offset,
                                                         "from_seq": from_seq}))


def test_kind_unbound() -> None:
    st = state()
    st.observe_spec(spec(WL, {"m": M1}, kinds=("acme:other/thing@1.0.0",)), offset=1)
    _adopt(st, 1, from_seq=0)
    assert refusal_code(run(st, request(WL, M1, epoch=2))) == "kind_unbound"


def test_the_spec_the_holder_put_in_force_binds_not_the_latest() -> None:
    # one rule with the holder (broker_schema.binding): a spec appended but not adopted by the
    # holder of the request's epoch binds nothing yet; adopted from step 5, it binds 5 and on
    st = state()
    st.observe_spec(spec(WL, {"m": M2}), offset=5)
    assert not st.observe_spec(spec(WL, {"m": M1}), offset=3)  # older offset read late
    assert isinstance(run(st, request(WL, M1, epoch=2)), Admit)  # the claim's spec (offset 0)
    _adopt(st, 5, from_seq=5)
    assert isinstance(run(st, request(WL, M1, epoch=2, input_offset=4, index=1)), Admit)
    d = run(st, request(WL, M1, epoch=2, input_offset=5))
    assert refusal_code(d) == "model_unbound"
    assert isinstance(run(st, request(WL, M2, epoch=2, input_offset=6)), Admit)


def test_without_a_claim_of_the_epoch_the_latest_spec_binds() -> None:
    st = ExecutorState(node_id="n1", kinds={INFERENCE_KIND: 4}, engine_info=INFO)
    st.observe_spec(spec(WL, {"m": M1}), offset=0)
    st.observe_spec(spec(WL, {"m": M2}), offset=1)
    assert refusal_code(run(st, request(WL, M1, epoch=1))) == "model_unbound"
    assert isinstance(run(st, request(WL, M2, epoch=1)), Admit)
    assert isinstance(run(st, request(WL, M2, epoch=2)), Admit)


def test_model_unbound_follows_binding_switches() -> None:
    st = state()
    switched = spec(WL, {"m": M1}).model_copy(
        update={"binding_switches": (BindingSwitch(at_input_offset=100, models={"m": M2}),)}
    )
    st.observe_spec(switched, offset=1)
    _adopt(st, 1, from_seq=0)
    assert isinstance(run(st, request(WL, M1, epoch=2, input_offset=99)), Admit)
    assert refusal_code(run(st, request(WL, M1, epoch=2, input_offset=100))) == "model_unbound"
    assert isinstance(run(st, request(WL, M2, epoch=2, input_offset=100)), Admit)


def test_deadline_is_append_time_plus_deadline_ms() -> None:
    st = state()
    req = request(WL, M1, epoch=2, deadline_ms=1000)
    assert isinstance(run(st, req, now_ms=APPEND_MS + 1000), Admit)  # exactly at the deadline
    st.finish(req.effect_id)
    assert refusal_code(run(st, req, now_ms=APPEND_MS + 1001)) == "deadline_passed"


@pytest.mark.parametrize(("status", "code"), [("absent", "model_unknown"),
                                              ("corrupt", "model_hash_mismatch")])
def test_model_store_answers(status: str, code: str) -> None:
    assert refusal_code(run(state(), request(WL, M1, epoch=2), status=status)) == code


def test_fencing_is_checked_before_the_deadline() -> None:
    # a zombie's request is stale even when it is also late: the more fundamental reason wins
    st = state()
    assert refusal_code(run(st, request(WL, M1, epoch=1), now_ms=APPEND_MS + 10**9)) == \
        "stale_epoch"


def test_queue_full_is_backpressure_and_frees_on_finish() -> None:
    st = state(limit=2)
    admitted = [run(st, request(WL, M1, epoch=2, index=i)) for i in range(2)]
    assert all(isinstance(d, Admit) for d in admitted)
    over = run(st, request(WL, M1, epoch=2, index=2))
    assert isinstance(over, Refuse)
    assert over.response.outcome == "backpressure" and over.response.error is None
    assert refusal_code(over) is None
    assert len(st.in_flight) == 2
    first = admitted[0]
    assert isinstance(first, Admit)
    assert st.finish(first.job.effect_id) is first.job
    assert isinstance(run(st, request(WL, M1, epoch=2, index=2)), Admit)


def test_ok_and_error_responses() -> None:
    st = state()
    d = run(st, request(WL, M1, epoch=2))
    assert isinstance(d, Admit)
    engine = ExecutorInfo(node_id="n1", engine="onnxruntime", engine_version="1.2",
                          device_class="cpu")
    ok = ok_response(st, d.job, output=InlineBody.of_json({"label": "python"}), model_hash=M1,
                     executor=engine, started_us=5, finished_us=9, receipt={"batch_size": 1})
    assert ok.outcome == "ok" and ok.model_hash == M1 and ok.request_offset == 10
    assert ok.timing is not None and ok.timing.received_us == d.job.received_us
    assert ok.effect_id == d.job.effect_id and ok.signature is None
    err = error_response(st, d.job, code="input_invalid", message="bad", model_hash=M1,
                         executor=engine, started_us=5, finished_us=6)
    assert err.outcome == "error" and err.error is not None and not err.error.retriable


def test_abandon_empties_the_table() -> None:
    st = state()
    run(st, request(WL, M1, epoch=2, index=0))
    run(st, request(WL, M1, epoch=2, index=1))
    jobs = st.abandon()
    assert len(jobs) == 2 and not st.in_flight


def test_offset_tracker_commits_only_settled_prefix() -> None:
    t = OffsetTracker()
    tp = ("wl.a.out", 0)
    for off in (5, 6, 7):
        t.track(tp, off)
    assert t.committable() == {tp: 5}
    t.done(tp, 6)
    assert t.committable() == {tp: 5}
    t.done(tp, 5)
    assert t.committable() == {tp: 7}
    t.mark_committed({tp: 7})
    assert t.committable() == {}
    t.done(tp, 7)
    assert t.committable() == {tp: 8}
    assert t.pending_in([tp]) == 0
    t.forget([tp])
    assert t.committable() == {}


def test_a_lease_is_renewed_each_third_of_it_and_the_renewal_only_moves_its_start() -> None:
    from broker_schema.records import AcceptedRecord

    req = request(WL, "sha256:" + "a" * 64)
    acc = AcceptedRecord(effect_id=req.effect_id, header=req.header, request_offset=3,
                         node_id="n1", lease_ms=3000, accepted_us=1_000_000)
    assert not renewal_due(acc, 1_000_000 + 999_999)
    assert renewal_due(acc, 2_000_000)
    again = renewed(acc, 2_000_000)
    assert again.accepted_us == 2_000_000
    assert again.model_copy(update={"accepted_us": acc.accepted_us}) == acc
    assert not renewal_due(again, 2_500_000) and renewal_due(again, 3_000_000)


# ---------------------------------------------------------------------------------- shadows


def _shadow_def(models: dict[str, str], eval_id: str = "ev1") -> object:
    from broker_schema import ShadowEvalRecord

    return ShadowEvalRecord(eval_id=eval_id, workload_id=WL, models=models, mode="history",
                            from_seq=0, to_seq=9, deadline_ms=60_000, created_ms=1,
                            created_by="t")


def _shadow(req: object, eval_id: str = "ev1") -> object:
    header = req.header.model_copy(update={"shadow": eval_id})  # type: ignore[attr-defined]
    return req.model_copy(update={"header": header})  # type: ignore[attr-defined]


def test_a_shadow_request_needs_its_evaluations_definition() -> None:
    st = state()
    d = run(st, _shadow(request(WL, M2, epoch=2)))
    assert refusal_code(d) == "shadow_unknown"


def test_a_shadow_request_is_bound_by_the_spec_with_the_evaluations_rebinding() -> None:
    st = state()
    st.observe_shadow(_shadow_def({"m": M2}))  # type: ignore[arg-type]
    # the rebound model is admitted, under the shadow id; the live one is not bound any more
    d = run(st, _shadow(request(WL, M2, epoch=2)))
    assert isinstance(d, Admit) and d.accepted.effect_id.startswith("shadow:ev1/")
    assert d.accepted.header.shadow == "ev1"
    assert refusal_code(run(st, _shadow(request(WL, M1, epoch=2, index=1)))) == "model_unbound"
    # the live request names the live binding only
    assert refusal_code(run(st, request(WL, M2, epoch=2))) == "model_unbound"


def test_a_shadow_request_of_an_older_epoch_is_not_stale() -> None:
    st = state()
    st.observe_claim(claim(WL, 5))
    st.observe_shadow(_shadow_def({"m": M2}))  # type: ignore[arg-type]
    assert refusal_code(run(st, request(WL, M1, epoch=2))) == "stale_epoch"
    assert isinstance(run(st, _shadow(request(WL, M2, epoch=2))), Admit)


def test_the_first_definition_of_an_evaluation_wins() -> None:
    st = state()
    assert st.observe_shadow(_shadow_def({"m": M2}))  # type: ignore[arg-type]
    assert not st.observe_shadow(_shadow_def({"m": M1}))  # type: ignore[arg-type]
    assert st.shadows[(WL, "ev1")].models == {"m": M2}


def test_queue_depth_is_counted_as_the_table_changes() -> None:
    """The in-flight table keeps its depth per kind and per workload (O(1) to ask): equal to
    a scan after admissions, a replaced entry, finishes, a missing finish and a clear."""
    st = state(limit=100)

    def scan() -> tuple[dict[str, int], dict[str, int]]:
        kinds: dict[str, int] = {}
        wids: dict[str, int] = {}
        for job in st.in_flight.values():
            kinds[job.request.effect_kind] = kinds.get(job.request.effect_kind, 0) + 1
            wid = job.request.header.workload_id
            wids[wid] = wids.get(wid, 0) + 1
        return kinds, wids

    admitted = [run(st, request(WL, M1, index=i, epoch=2), offset=i) for i in range(5)]
    assert all(isinstance(d, Admit) for d in admitted)
    assert st.queue_depth(INFERENCE_KIND) == 5 and st.depth_by_workload() == {WL: 5}
    assert isinstance(admitted[0], Admit)
    first = admitted[0].job
    st.in_flight[first.effect_id] = first  # entered again: still one
    assert (st.in_flight.by_kind, st.depth_by_workload()) == scan()
    assert st.finish(first.effect_id) is first and st.finish(first.effect_id) is None
    del st.in_flight[admitted[1].job.effect_id]  # type: ignore[attr-defined]
    assert st.queue_depth(INFERENCE_KIND) == 3
    assert (st.in_flight.by_kind, st.depth_by_workload()) == scan()
    assert len(st.abandon()) == 3
    assert st.queue_depth(INFERENCE_KIND) == 0 and st.depth_by_workload() == {}


def test_ok_response_built_without_revalidation_has_the_same_bytes() -> None:
    """``ok_response`` skips validating again what is validated already: its record, signed or
    not, encodes to exactly the bytes of the same record built with validation."""
    from broker_schema import encode
    from broker_schema.records import InlineBody, ResponseRecord
    from fx_node.admission import ok_response
    from fx_node.identity import NodeIdentity

    st = state()
    d = run(st, request(WL, M1, b"\x00\xffbytes", epoch=2))
    assert isinstance(d, Admit)
    identity = NodeIdentity.generate()
    for receipt in (None, {"batch_size": 8, "manifest_hash": M2, "preprocessing_version": "x/1",
                           "flag": True, "none": None},
                    {"batch_size": 1, "nested": {"scores": [0.5, 1.0, -0.0]}}):
        for started, finished in ((1, 2), (None, None)):
            built = ok_response(st, d.job, output=InlineBody.of_json({"label": "txt", "p": 0.25}),
                                model_hash=M1, executor=INFO, started_us=started or 0,
                                finished_us=finished or 0, receipt=receipt)  # type: ignore[arg-type]
            validated = ResponseRecord.model_validate(built.model_dump())
            assert encode(built) == encode(validated)
            assert built == validated
            assert encode(identity.sign_response(built)) == encode(
                identity.sign_response(validated))


def test_error_messages_name_no_server_path() -> None:
    """Issue 30: an answer says nothing of the executor's file system."""
    st = ExecutorState(node_id="n1", kinds={INFERENCE_KIND: 4}, engine_info=INFO,
                       private_paths=("/srv/fx/chunks", "/srv/fx/models/", ".", "relative"))
    assert st.private_paths == ("/srv/fx/chunks", "/srv/fx/models")
    st.observe_spec(spec(WL, {"m": M1}), offset=0)
    d = run(st, request(WL, M1, epoch=1))
    assert isinstance(d, Admit)
    err = error_response(st, d.job, code="input_missing", message="cannot read the input: "
                         "FileNotFoundError: [Errno 2] No such file: '/srv/fx/chunks/wl/x/1'",
                         model_hash=None, executor=None, started_us=None, finished_us=None)
    assert err.error is not None and "/srv" not in err.error.message
    assert err.error.message.endswith("No such file: '<server path>'")
    assert redact("no model in /srv/fx/models and . here", st.private_paths) == (
        "no model in <server path> and . here")


def test_only_requests_signed_by_their_epochs_holder_are_answered() -> None:
    """Issue 30, attack 2 (executor side): a claim names its holder's key; a request of that
    epoch must carry the key's signature over its bytes (header fx-holder-sig)."""
    holder, mallory = SigningKey.generate(), SigningKey.generate()
    st = ExecutorState(node_id="n1", kinds={INFERENCE_KIND: 4}, engine_info=INFO)
    st.observe_spec(spec(WL, {"m": M1}), offset=0)
    st.observe_claim(claim(WL, 3).model_copy(update={"holder_key": holder.public_key_b64}))
    req = request(WL, M1, epoch=3)
    value = encode(req)
    assert holder_problem(st, req, value, holder_signature(holder, value)) is None
    assert "no holder signature" in (holder_problem(st, req, value, None) or "")
    assert "not the epoch's holder key" in (
        holder_problem(st, req, value, holder_signature(mallory, value)) or "")
    other = encode(request(WL, M1, b"other", epoch=3))
    assert "does not verify" in (
        holder_problem(st, req, value, holder_signature(holder, other)) or "")
    ahead = request(WL, M1, epoch=4)
    assert "no claim of epoch 4" in (holder_problem(st, ahead, encode(ahead), None) or "")
    # a workload whose holders do not sign (claims without a key): nothing is checked
    plain = ExecutorState(node_id="n1", kinds={INFERENCE_KIND: 4}, engine_info=INFO)
    plain.observe_claim(claim(WL, 3))
    assert holder_problem(plain, req, value, None) is None
