"""The fold's second-round shortcuts (issue 29, replay at log speed) change no byte and no
decision: a request or output built without validation is the validated record, field for field
and byte for byte; the request hash written out directly is the hash of ``encode``; a trusted
input whose long body string is taken as it is holds the body strict decoding gives; and
replay, strict and trusted, reaches the live holder's state hash and outputs, through requests
that pass the input's body on (inline base64, text, JSON, chunk references), parameters the
shortcut takes and ones it leaves to validation, and a quarantined step."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from broker_schema import (
    EffectHeader,
    EffectRequest,
    InlineBody,
    InputRecord,
    OutputRecord,
    content_hash,
    decode,
    decode_trusted,
    encode,
)
from broker_schema.construct import construct_values
from broker_schema.request_bytes import request_bytes
from tests.unit.workload_sdk.sim import Sim, make_spec
from workload_sdk import (
    EffectResult,
    InputEvent,
    Output,
    State,
    Workload,
    _core,
    compare_outputs,
    emit,
    infer,
    replay,
)
from workload_sdk._api import Request
from workload_sdk._core import Core, Item, _output, _request


class PassOn(Workload):
    """Passes each input's body on to the model (params by the input's position: none, scalar,
    nested), emits a JSON body it changes after making it, raises on the 4th input."""

    def initial_state(self) -> State:
        return {"n": 0, "labels": {}}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        n = state["n"] + 1
        if isinstance(event, InputEvent):
            if event.offset == 3:
                raise RuntimeError("the fourth input")
            params = ({} if n % 3 == 0 else {"k": n, "s": "x", "b": True, "z": None}
                      if n % 3 == 1 else {"nested": [n]})
            out = emit({"n": n})
            out.body.data["later"] = n  # type: ignore[index]  # changed after it was made
            return ({"n": n, "labels": state["labels"]},
                    [out, infer(model="m", input=event.body, params=params,
                                deadline_ms=None if n % 2 else 5_000)])
        labels = dict(state["labels"])
        labels[event.outcome] = labels.get(event.outcome, 0) + 1
        return {"n": n, "labels": labels}, [emit({"effect": event.effect_id})]


def _bodies(sim: Sim) -> list[object]:
    return [
        InlineBody.of_bytes(bytes(range(256)) * 6),  # 2 KB of base64: taken as it is
        InlineBody.of_text("é\"quoted\" and long " * 60),  # not ASCII, escapes: orjson's
        InlineBody.of_json({"v": [1, 2.5, "x"]}),
        InlineBody.of_bytes(b"short"),
        sim.put_chunk(b"chunked bytes " * 100),
        InlineBody.of_text("plain ascii text " * 60, media_type="text/plain"),
        InlineBody.of_bytes(b"\xff" * 3000, media_type="application/octet-stream"),
    ]


def _run() -> Sim:
    spec = make_spec(limit=50, snapshot_every=4)
    spec = spec.model_copy(update={"input_policy": spec.input_policy.model_copy(
        update={"on_step_error": "quarantine"})})
    sim = Sim(spec=spec, workload=PassOn())
    sim.start()
    holder = sim.holder
    assert holder is not None
    for body in _bodies(sim):
        sim.input_body(body)  # type: ignore[arg-type]
        holder.pump()
    for pick in range(6):
        sim.answer(pick, "ok")
        holder.pump()
    holder.drain()
    return sim


def test_records_built_without_validation_are_the_validated_ones_byte_for_byte(
        monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    def counted(cls: type, values: dict[str, object]) -> object:
        built.append(cls.__name__)
        return construct_values(cls, values)  # type: ignore[arg-type]

    monkeypatch.setattr(_core, "construct_values", counted)
    sim = _run()
    # both ways taken: shortcuts (scalar or no params) and validation (nested params)
    assert built.count("EffectRequest") == 4 and built.count("OutputRecord") >= 9
    outs = [decode(r.value) for r in sim.log["out"]]
    requests = [o for o in outs if isinstance(o, EffectRequest)]
    assert len(requests) >= 5 and any(r.params == {} for r in requests)
    for out in outs:
        assert isinstance(out, EffectRequest | OutputRecord)
        rebuilt = type(out).model_validate(out.model_dump())
        assert encode(rebuilt) == encode(out)
    holder_core = sim.holder.core  # type: ignore[union-attr]
    assert holder_core is not None
    quarantined = [decode(r.value) for r in sim.log["merge"]]
    assert any(getattr(e, "reason", None) == "quarantined" for e in quarantined)
    for trusted in (False, True):
        result = replay(sim.workload, sim.log, use_snapshots=False, trust_log=trusted)
        assert result.core.state_hash == holder_core.state_hash
        assert result.core.state_hash == content_hash(result.core.state)
        assert compare_outputs(result, sim.log) == []
        for out in result.outputs.values():
            validated = type(out)(**{name: getattr(out, name)
                                     for name in out.model_fields_set})
            assert out == validated and out.model_fields_set == validated.model_fields_set
            assert repr(out) == repr(validated)
            if isinstance(out, EffectRequest):
                assert request_bytes(out) == encode(out)


def test_the_step_request_shortcut_equals_validation_and_leaves_errors_to_it() -> None:
    header = EffectHeader(workload_id="w", input_offset=3, index=1, epoch=2)
    body = InlineBody.of_bytes(b"x" * 900)
    for params, deadline in (({}, 50), ({"a": 1, "b": "s", "c": None, "d": False}, 2**53 - 1),
                             ({"f": 1.5}, 7), ({"l": [1]}, 7)):
        out = Request(effect_kind="k:x/y@1.0.0", model="sha256:" + "ab" * 32,
                      params=params, input=body, deadline_ms=deadline)
        for known in (body, None):
            got = _request(header, out, out.model, deadline, known)
            want = EffectRequest(header=header, effect_kind=out.effect_kind, model=out.model,
                                 params=dict(params), input=body, deadline_ms=deadline,
                                 reissue_of=None)
            assert got == want and repr(got) == repr(want)
            assert got.model_fields_set == want.model_fields_set
            assert encode(got) == encode(want) == request_bytes(got)
    bad = Request(effect_kind="k:x/y@1.0.0", input=body, deadline_ms=0)
    with pytest.raises(ValidationError):
        _request(header, bad, None, 0, body)  # out of range: validation says so
    big = InlineBody.of_json({"a": 1})
    big.data["a"] = "x" * 70_000  # type: ignore[index]  # grew past the inline limit after it was made
    with pytest.raises(ValidationError, match="inline body is"):
        _request(header, Request(effect_kind="k:x/y@1.0.0", input=big, deadline_ms=5),
                 None, 5, None)
    with pytest.raises(ValidationError, match="inline body is"):
        _output(header, big, None)
    good = InlineBody.of_json({"a": 1})
    assert _output(header, good, None) == OutputRecord(header=header, body=good)


def test_a_trusted_input_with_a_long_body_holds_what_strict_decoding_gives() -> None:
    sim = _run()
    for rec in sim.log["in"]:
        strict = decode(rec.value)
        trusted = decode_trusted(rec.value)
        assert isinstance(strict, InputRecord) and trusted == strict
        assert encode(trusted) == rec.value


def test_classify_asked_once_gives_what_apply_asks_itself() -> None:
    sim = _run()
    spec = sim.spec
    cores = [Core.initial(sim.workload, sim.log.workload_id) for _ in range(2)]
    merges = [decode(r.value) for r in sim.log["merge"]]
    for entry in merges:
        if getattr(entry, "kind", None) != "merge":
            continue
        raw = sim.log[entry.source].raw(entry.source_offset)  # type: ignore[union-attr]
        item = Item(entry.source, entry.source_offset, raw.time_ms,  # type: ignore[union-attr]
                    decode(raw.value), sim.log.resolved.get((entry.source,  # type: ignore[union-attr]
                                                             entry.source_offset)))
        given = cores[0].apply(item, epoch=entry.epoch, spec=spec,  # type: ignore[union-attr]
                               decision=cores[0].classify(item, spec))
        asked = cores[1].apply(item, epoch=entry.epoch, spec=spec)  # type: ignore[union-attr]
        assert given.decision == asked.decision and given.entry == asked.entry
        assert given.outputs == asked.outputs
    assert cores[0].state_hash == cores[1].state_hash
