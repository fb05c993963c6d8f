"""What an input reference may name: the pure decision
(:func:`fx_node.admission.input_problem`), its place among the refusals of
:func:`fx_node.admission.decide`, the spec's ``input_topics`` grant, and whose chunks a request
may name (:func:`fx_node.admission.chunk_problem`, ``chunks_from``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from broker_schema import ERROR_RETRIABLE, decode, encode, record_hash
from broker_schema.records import (
    INFERENCE_KIND,
    ChunkRef,
    ErrorInfo,
    ExecutorInfo,
    InlineBody,
    SpecRecord,
    StreamRef,
)
from fx_node.admission import (
    Admit,
    ExecutorState,
    Refuse,
    chunk_owner,
    chunk_problem,
    decide,
    input_problem,
)
from fx_node.errors import OutcomeError
from tests.unit.executor.helpers import MODULE_HASH, claim, request, spec

WL = "cam-1"
M1 = "sha256:" + "a" * 64
INFO = ExecutorInfo(node_id="n1", engine="fx-executor", engine_version="0", device_class="cpu")
APPEND_MS = 1_700_000_000_000


def _req(topic: str, **kw: object) -> object:
    kw.setdefault("epoch", 2)
    return request(WL, M1, StreamRef(topic=topic, offset=3), **kw)  # type: ignore[arg-type]


def _spec(grants: tuple[str, ...] = (), chunks_from: tuple[str, ...] = ()) -> SpecRecord:
    return SpecRecord(workload_id=WL, module_hash=MODULE_HASH, effect_kinds=(INFERENCE_KIND,),
                      models={"m": M1}, input_topics=grants, chunks_from=chunks_from)


def test_own_inputs_inline_chunks_and_no_input_are_allowed() -> None:
    sp = _spec()
    assert input_problem(_req(f"wl.{WL}.in"), sp) is None  # type: ignore[arg-type]
    assert input_problem(request(WL, M1, b"inline"), sp) is None
    assert input_problem(request(WL, M1, ChunkRef(hash=M1, size=3)), sp) is None
    assert input_problem(request(WL, M1, InlineBody.of_json({"a": 1})), sp) is None
    no_input = request(WL, M1).model_copy(update={"input": None})
    assert input_problem(no_input, sp) is None
    assert input_problem(_req(f"wl.{WL}.in"), None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("topic,says", [
    ("sys.facts", "system topic"),
    ("sys.chunks", "system topic"),
    ("sys.rejects", "system topic"),
    ("wl.cam-2.in", "in stream of workload cam-2"),
    ("wl.cam-10.in", "in stream of workload cam-10"),
    (f"wl.{WL}.out", f"out stream of workload {WL}"),
    (f"wl.{WL}.resp", f"resp stream of workload {WL}"),
    (f"wl.{WL}.merge", f"merge stream of workload {WL}"),
    (f"wl.{WL}.spec", f"spec stream of workload {WL}"),
    (f"wl.{WL}.claims", f"claims stream of workload {WL}"),
    (f"wl.{WL}.in.x", "not a workload topic"),
    (f"wl.{WL}.IN", "not a workload topic"),
    (f"wl..{WL}.in", "not a workload topic"),
    (f" wl.{WL}.in", "not a workload topic"),
    (f"wl.{WL}.in\x00", "not a workload topic"),
    (f"wl.{WL}.in\n", "not a workload topic"),
    ("wl.cam\u20111.in", "not a workload topic"),  # a non-breaking hyphen
    ("__consumer_offsets", "not a workload topic"),
    ("x" * 249, "not a workload topic"),
])
def test_anything_else_is_forbidden(topic: str, says: str) -> None:
    problem = input_problem(_req(topic), _spec())  # type: ignore[arg-type]
    assert problem is not None and says in problem, problem
    assert f"wl.{WL}.in" in problem


def test_the_spec_grants_named_workload_topics_only() -> None:
    sp = _spec(("wl.cam-2.in", f"wl.{WL}.out"))
    assert input_problem(_req("wl.cam-2.in"), sp) is None  # type: ignore[arg-type]
    assert input_problem(_req(f"wl.{WL}.out"), sp) is None  # type: ignore[arg-type]
    assert input_problem(_req("wl.cam-3.in"), sp) is not None  # type: ignore[arg-type]
    assert input_problem(_req("sys.facts"), sp) is not None  # type: ignore[arg-type]
    for bad in ("sys.facts", "sys.chunks", "wl.cam-2", "wl.cam-2.in.x", "wl.-x.in", "x"):
        with pytest.raises(ValidationError):
            _spec((bad,))


def test_a_spec_granting_nothing_keeps_its_bytes_and_hash() -> None:
    sp = spec(WL, {"m": M1})
    data = encode(sp)
    assert b"input_topics" not in data
    assert record_hash(sp) == record_hash(decode(data))
    assert decode(data, strict=True) == sp
    granting = _spec(("wl.cam-2.in",))
    gdata = encode(granting)
    assert b'"input_topics":["wl.cam-2.in"]' in gdata
    assert decode(gdata, strict=True) == granting


def _state(sp: SpecRecord) -> ExecutorState:
    st = ExecutorState(node_id="n1", kinds={INFERENCE_KIND: 4}, engine_info=INFO)
    st.observe_spec(sp, offset=0)
    st.observe_claim(claim(WL, 2))
    return st


def _decide(st: ExecutorState, req: object, now_ms: int = APPEND_MS + 5) -> object:
    return decide(st, req, topic=f"wl.{WL}.out", partition=0, offset=7,  # type: ignore[arg-type]
                  append_ms=APPEND_MS, now_ms=now_ms, now_us=now_ms * 1000,
                  model_status="ready")


def test_decide_refuses_input_forbidden_without_accept() -> None:
    st = _state(_spec())
    d = _decide(st, _req("sys.facts"))
    assert isinstance(d, Refuse)
    assert d.response.error is not None and d.response.error.code == "input_forbidden"
    assert "sys.facts" in d.response.error.message and not st.in_flight
    assert isinstance(_decide(st, _req(f"wl.{WL}.in")), Admit)


def test_input_forbidden_comes_after_fencing_and_binding_before_deadline_and_store() -> None:
    st = _state(_spec())
    stale = _req("sys.facts", epoch=1)
    d = _decide(st, stale)
    assert isinstance(d, Refuse) and d.response.error and d.response.error.code == "stale_epoch"
    unbound = request(WL, "sha256:" + "f" * 64, StreamRef(topic="sys.facts", offset=0), epoch=2)
    d = _decide(st, unbound)
    assert isinstance(d, Refuse) and d.response.error
    assert d.response.error.code == "model_unbound"
    late = _req("sys.facts", deadline_ms=1)
    d = _decide(st, late, now_ms=APPEND_MS + 1000)
    assert isinstance(d, Refuse) and d.response.error
    assert d.response.error.code == "input_forbidden"


def test_the_code_is_in_the_closed_set_and_not_retriable() -> None:
    assert ERROR_RETRIABLE["input_forbidden"] is False
    assert ErrorInfo(code="input_forbidden").retriable is False
    assert OutcomeError("input_forbidden", "x").code == "input_forbidden"


def test_a_chunk_reference_names_a_chunk_of_its_own_workload_unless_granted() -> None:
    own = ChunkRef(hash=M1, size=3)
    named_own = ChunkRef(hash=M1, size=3, workload=WL)
    other = ChunkRef(hash=M1, size=3, workload="cam-2")
    assert chunk_owner(own, WL) == WL and chunk_owner(other, WL) == "cam-2"
    assert input_problem(request(WL, M1, own), _spec()) is None
    assert input_problem(request(WL, M1, named_own), _spec()) is None
    problem = input_problem(request(WL, M1, other), _spec())
    assert problem is not None and "cam-2" in problem and "chunks_from" in problem
    assert input_problem(request(WL, M1, other), None) is not None
    assert input_problem(request(WL, M1, other), _spec(chunks_from=("cam-2",))) is None
    assert input_problem(request(WL, M1, ChunkRef(hash=M1, size=3, workload="cam-3")),
                         _spec(chunks_from=("cam-2",))) is not None


def test_a_chunk_inside_a_granted_stream_record_is_that_workloads() -> None:
    # a record of wl.cam-2.in (granted by input_topics) carries cam-2's chunks with it; a chunk it
    # names as a third workload's needs that workload granted to the reader
    sp = _spec(("wl.cam-2.in",))
    assert chunk_problem(ChunkRef(hash=M1, size=1), reader=WL, spec=sp, context="cam-2") is None
    third = ChunkRef(hash=M1, size=1, workload="cam-3")
    assert chunk_problem(third, reader=WL, spec=sp, context="cam-2") is not None
    assert chunk_problem(third, reader=WL, spec=_spec(chunks_from=("cam-3",)),
                         context="cam-2") is None


def test_decide_refuses_another_workloads_chunk_before_accept() -> None:
    st = _state(_spec())
    d = _decide(st, request(WL, M1, ChunkRef(hash=M1, size=3, workload="cam-2"), epoch=2))
    assert isinstance(d, Refuse) and d.response.error is not None
    assert d.response.error.code == "input_forbidden" and not st.in_flight
    assert isinstance(_decide(st, request(WL, M1, ChunkRef(hash=M1, size=3), epoch=2)), Admit)


def test_chunk_fields_left_out_when_unused_keep_the_old_bytes() -> None:
    ref = ChunkRef(hash=M1, size=3)
    assert b'"workload":' not in encode(request(WL, M1, ref))
    assert b"chunks_from" not in encode(spec(WL, {"m": M1}))
    granting = _spec(chunks_from=("cam-2",))
    assert b'"chunks_from":["cam-2"]' in encode(granting)
    assert decode(encode(granting), strict=True) == granting
    with pytest.raises(ValidationError):
        _spec(chunks_from=("../x",))
    with pytest.raises(ValidationError):
        ChunkRef(hash=M1, size=3, workload="wl.x")
