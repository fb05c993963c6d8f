"""Records built without validation (broker_schema.construct, decode_trusted): the same records
as a strict decode for every valid record, and typed refusals for what it still checks."""

from __future__ import annotations

import base64

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

import broker_schema as bs
from broker_schema import DecodeError, decode, decode_trusted, encode
from broker_schema.construct import ConstructError, construct
from broker_schema.records import RECORD_TYPES
from fx_kafka.workload_log import LogGap, LogRecord
from tests.unit.schema_strategies import records

WID = "cam-1"
HEADER = bs.EffectHeader(workload_id=WID, input_offset=3, index=0, epoch=2)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records)
def test_a_trusted_decode_equals_the_strict_one_on_every_record_kind(record: bs.Record) -> None:
    raw = encode(record)
    got = decode_trusted(raw)
    strict = decode(raw)
    assert type(got) is type(record)
    assert got == record == strict
    assert got.model_fields_set == strict.model_fields_set
    assert encode(got) == raw  # the same canonical bytes back: hashes and signatures hold
    assert got.model_dump(mode="json") == strict.model_dump(mode="json")


def test_every_record_kind_has_a_builder() -> None:
    # builders are derived from the annotations: a field type construct cannot build is found
    # here (TypeError), not at the first trusted read of a log holding that kind
    for cls in RECORD_TYPES.values():
        with pytest.raises(ConstructError):
            construct(cls, {})


def test_nested_models_bodies_and_tuples_are_built_as_validation_would() -> None:
    req = bs.EffectRequest(header=HEADER, effect_kind=bs.INFERENCE_KIND,
                           model="sha256:" + "ab" * 32, params={"k": [1, {"a": None}]},
                           input=bs.ChunkRef(hash="sha256:" + "cd" * 32, size=5),
                           deadline_ms=1000)
    got = decode_trusted(encode(req))
    assert isinstance(got, bs.EffectRequest)
    assert isinstance(got.header, bs.EffectHeader) and got.header.effect_id == req.effect_id
    assert isinstance(got.input, bs.ChunkRef) and got.input.workload is None
    spec = bs.SpecRecord(workload_id=WID, module_hash="sha256:" + "00" * 32,
                         effect_kinds=(bs.INFERENCE_KIND,), models={},
                         binding_switches=(bs.BindingSwitch(at_input_offset=4, models={}),))
    got_spec = decode_trusted(encode(spec))
    assert isinstance(got_spec, bs.SpecRecord)
    assert isinstance(got_spec.effect_kinds, tuple)
    assert isinstance(got_spec.binding_switches[0], bs.BindingSwitch)
    with pytest.raises((TypeError, ValueError)):  # still frozen
        got_spec.workload_id = "x"  # type: ignore[misc]


def _value(record: bs.Record, **changes: object) -> bytes:
    obj = orjson.loads(encode(record))
    obj.update(changes)
    return orjson.dumps(obj)


def test_what_a_trusted_decode_still_refuses_has_the_strict_codes() -> None:
    inp = bs.InputRecord(workload_id=WID, body=bs.InlineBody.of_json({"x": 1}))
    cases = {
        b"not json": "not_json",
        b"[1]": "not_object",
        _value(inp, kind="nope"): "unknown_kind",
        _value(inp, v=9): "unsupported_version",
        _value(inp, body={"type": "pigeon"}): "invalid_record",
        _value(inp, body=[1]): "invalid_record",
        orjson.dumps({"kind": "input", "v": 1}): "invalid_record",  # required fields missing
        _value(inp, surprise=1): "invalid_record",  # a field the kind does not have
    }
    for raw, code in cases.items():
        with pytest.raises(DecodeError) as err:
            decode_trusted(raw)
        assert err.value.code == code, raw
    with pytest.raises(DecodeError) as err:
        decode_trusted(None)
    assert err.value.code == "not_json"
    with pytest.raises(DecodeError) as err:
        decode_trusted(encode(inp), topic=f"wl.{WID}.resp")
    assert err.value.code == "wrong_stream"


def test_what_a_trusted_decode_does_not_check_is_left_to_the_strict_one() -> None:
    # not canonical (spaces), a bad base64 body, a header that is not the effect id: accepted
    # by the trusted read (the holder refused them when it merged), refused by the strict one
    inp = bs.InputRecord(workload_id=WID, body=bs.InlineBody.of_bytes(b"abc"))
    spaced = encode(inp).replace(b",", b", ")
    bad_b64 = _value(inp, body={"type": "inline", "encoding": "base64", "data": "%%%",
                                "media_type": None})
    acc = bs.AcceptedRecord(effect_id=HEADER.effect_id, header=HEADER, request_offset=1,
                            node_id="e", lease_ms=10, accepted_us=5)
    forged = _value(acc, effect_id=f"{WID}/9/9@9")
    for raw, code in ((spaced, "not_canonical"), (bad_b64, "invalid_record"),
                      (forged, "effect_id_mismatch")):
        decode_trusted(raw)
        with pytest.raises(DecodeError) as err:
            decode(raw)
        assert err.value.code == code


def test_a_log_record_decoded_trusted_is_decoded_again_by_a_strict_read() -> None:
    inp = bs.InputRecord(workload_id=WID, body=bs.InlineBody.of_bytes(b"abc"))
    spaced = LogRecord(0, 1, encode(inp).replace(b",", b", "))
    assert spaced.decode("t", trusted=True) == inp
    with pytest.raises(LogGap) as err:
        spaced.decode("t")  # the trusted parse is not reused by a strict read
    assert err.value.why == "undecodable" and "not_canonical" in str(err.value)
    good = LogRecord(1, 1, encode(inp))
    strict = good.decode("t")
    assert good.decode("t", trusted=True) is strict  # a strict parse serves both


def test_a_trusted_body_reads_its_bytes() -> None:
    data = bytes(range(256)) * 3
    inp = bs.InputRecord(workload_id=WID, body=bs.InlineBody.of_bytes(data))
    got = decode_trusted(encode(inp))
    assert isinstance(got, bs.InputRecord) and isinstance(got.body, bs.InlineBody)
    assert got.body.raw() == data and got.body.data == base64.b64encode(data).decode()


def test_a_model_with_no_trusted_construction_says_so_every_time() -> None:
    from pydantic import BaseModel

    class Odd(BaseModel):
        value: set[int]

    for _ in range(2):  # the second call raises the same error, not a recursion
        with pytest.raises(TypeError, match="no trusted construction"):
            construct(Odd, {"value": [1]})
