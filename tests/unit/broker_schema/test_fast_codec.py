"""The msgspec fast path (broker_schema.fast_codec) against the codec: the same bytes for every
hot-path record, the same record or the same typed error for any bytes (valid records, mutated
records in canonical form, hostile bytes), and structs derived from the models, not copied."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, field_validator

import broker_schema as bs
from broker_schema import codec, fast_codec
from broker_schema.canonical import EncodeError, canonical_json, es_number
from broker_schema.limits import MAX_JSON_DEPTH
from tests.unit.fuzz.hostile import hostile_values, mutated_dicts, record_bytes
from tests.unit.schema_strategies import headers, json_values, records, responses

SLOW = settings(max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.data_too_large])
HOT = tuple(fast_codec.HOT_RECORDS)
hot_records = records.filter(lambda r: type(r) in HOT)
TOPICS = [None, "wl.cam-1.out", "wl.cam-1.resp", "wl.cam-1.in", "sys.facts"]


def outcome(decoder: Any, raw: bytes, topic: str | None = None) -> tuple[Any, ...]:
    """What a decoder made of ``raw``: the record (its type, value and fields set) or the code."""
    try:
        record = decoder(raw, topic=topic)
    except bs.DecodeError as exc:
        return ("error", exc.code)
    return ("ok", type(record), record, record.model_fields_set,
            record.model_dump(mode="json"))


def sign(message: bytes) -> bs.Signature:
    """A stand-in signer: deterministic, a valid signature shape."""
    digest = hashlib.sha512(message).digest()
    return bs.Signature(key_id=bs.sha256_hex(message),
                        value=base64.b64encode(digest).decode())


def sorted_text(value: Any) -> bytes:
    """JSON of a (mutated) record in the canonical layout where it can be (keys sorted, no
    white space): the fast path is then the one deciding, not the byte comparison."""
    try:
        return canonical_json(value)
    except EncodeError:
        pass
    if isinstance(value, dict):
        return b"{" + b",".join(_text(str(k)) + b":" + sorted_text(v)
                                for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))) + b"}"
    if isinstance(value, list | tuple):
        return b"[" + b",".join(sorted_text(v) for v in value) + b"]"
    if hasattr(value, "text"):  # hostile.Raw
        return str(value.text).encode("utf-8", "surrogatepass")
    return _text(value)


def _text(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


# ------------------------------------------------------------------------------ valid records


@SLOW
@given(hot_records)
def test_every_hot_record_has_the_codecs_bytes_and_decodes_to_the_same_record(
        record: bs.Record) -> None:
    raw = codec.encode(record)
    assert fast_codec.encode(record) == raw
    fast = outcome(fast_codec.decode, raw)
    assert fast == outcome(codec.decode, raw)
    assert fast[0] == "ok" and fast[2] == record
    assert codec.request_hash(fast_codec.encode(record)) == codec.request_hash(raw)


@SLOW
@given(responses())
def test_a_signed_response_has_the_codecs_signature_bytes_and_signing_bytes(
        response: bs.ResponseRecord) -> None:
    unsigned = response.model_copy(update={"signature": None})
    fast = fast_codec.encode_signed(unsigned, sign)
    assert fast == codec.encode_signed(unsigned, sign)
    signature, data, signing = fast
    assert signing == unsigned.signing_bytes()
    assert data == codec.encode(unsigned.model_copy(update={"signature": signature}))


@settings(max_examples=300, deadline=None)
@given(headers, st.dictionaries(st.text(max_size=6), json_values, max_size=4))
def test_the_fast_path_takes_canonical_records_itself(header: bs.EffectHeader,
                                                      params: dict[str, Any]) -> None:
    request = bs.EffectRequest(header=header, effect_kind=bs.INFERENCE_KIND, params=params,
                               input=bs.InlineBody.of_bytes(b"\x00" * 40), deadline_ms=5)
    raw = codec.encode(request)
    taken = fast_codec._fast_decode(raw, "wl.x.out")
    special = any(isinstance(v, float) or (isinstance(k, str) and any(c > "\uffff" for c in k))
                  for k, v in _leaves(params))
    if not special:  # floats msgspec prints otherwise, keys above U+FFFF: the codec's
        assert taken == request
    assert fast_codec.decode(raw) == request


def _leaves(value: Any, key: Any = None) -> list[tuple[Any, Any]]:
    out = [(key, value)]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _leaves(v, k)
    elif isinstance(value, list):
        for v in value:
            out += _leaves(v)
    return out


# ------------------------------------------------------------------------------ mutations


@SLOW
@given(st.one_of(hot_records.map(lambda r: json.loads(codec.encode(r)))).flatmap(
    lambda d: mutated_dicts(st.just(d))), st.sampled_from(TOPICS))
def test_mutated_hot_records_in_canonical_layout_get_the_codecs_verdict(
        value: Any, topic: str | None) -> None:
    raw = sorted_text(value)
    assert outcome(fast_codec.decode, raw, topic) == outcome(codec.decode, raw, topic)


@SLOW
@given(record_bytes(), st.sampled_from(TOPICS))
def test_hostile_bytes_get_the_codecs_verdict(raw: bytes, topic: str | None) -> None:
    assert outcome(fast_codec.decode, raw, topic) == outcome(codec.decode, raw, topic)


HEADER = {"workload_id": "cam-1", "input_offset": 4, "index": 0, "epoch": 2, "shadow": None}
REQUEST = {"kind": "request", "v": 1, "header": HEADER, "effect_kind": bs.INFERENCE_KIND,
           "model": None, "params": {}, "input": None, "deadline_ms": 50}


@pytest.mark.parametrize("change", [
    {"header": {**HEADER, "workload_id": "cam-1\n"}},  # Python's $ would match before \n
    {"effect_kind": bs.INFERENCE_KIND + "\n"},
    {"model": "sha256:" + "ab" * 32 + "\n"},
    {"deadline_ms": 2**53}, {"deadline_ms": 2**63}, {"deadline_ms": 0}, {"deadline_ms": 5.0},
    {"deadline_ms": True}, {"header": {**HEADER, "index": 2**31}},
    {"header": {**HEADER, "index": -1}}, {"header": {**HEADER, "workload_id": "a" * 201}},
    {"header": {**HEADER, "workload_id": "a" * 200}}, {"header": {**HEADER, "shadow": ""}},
    {"params": {"a": 2**53}}, {"params": {"a": -(2**53)}}, {"params": {"a": 1.5}},
    {"params": {"a": 1e21}}, {"params": {"a": 2.5e-5}}, {"params": {"\U0001f600": 1, "\uffff": 2}},
    {"reissue_of": None}, {"reissue_of": "cam-1/3/0@2"}, {"reissue_of": "cam-1/4/0@2"},
    {"reissue_of": ""}, {"input": {"type": "inline", "encoding": "base64", "data": "QUJD\n",
                                   "media_type": None}},
    {"input": {"type": "inline", "encoding": "base64", "data": "QUJD", "media_type": None}},
    {"input": {"type": "inline", "encoding": "utf8", "data": 5, "media_type": None}},
    {"input": {"type": "inline", "encoding": "json", "data": "x" * 70_000, "media_type": None}},
    {"input": {"type": "chunk", "hash": "sha256:" + "ab" * 32, "size": 3, "media_type": None,
               "workload": None}},
    {"input": {"type": "chunk", "hash": "sha256:" + "ab" * 32, "size": 3, "media_type": None}},
    {"input": {"type": "stream", "topic": "wl.cam-1.in", "offset": 3, "hash": None}},
    {"input": {"type": "stream", "topic": "wl.cam-1.in", "partition": 2**31, "offset": 3,
               "hash": None}},
    {"extra": 1}, {"v": 2}, {"kind": "output"},
])
def test_requests_at_the_edges_get_the_codecs_verdict(change: dict[str, Any]) -> None:
    raw = sorted_text({**REQUEST, **change})
    for topic in (None, "wl.cam-1.out", "wl.cam-1.resp"):
        assert outcome(fast_codec.decode, raw, topic) == outcome(codec.decode, raw, topic)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH - 4, MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH - 2,
                                   MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH])
def test_json_values_nesting_near_the_limit_get_the_codecs_verdict(depth: int) -> None:
    nested: Any = 1
    for _ in range(depth):
        nested = [nested]
    raw = sorted_text({**REQUEST, "params": {"a": nested}})
    assert outcome(fast_codec.decode, raw) == outcome(codec.decode, raw)
    response = {"kind": "response", "v": 1, "effect_id": "cam-1/4/0@2", "header": HEADER,
                "request_offset": 1, "outcome": "ok", "error": None,
                "output": {"type": "inline", "encoding": "json", "data": nested,
                           "media_type": None},
                "model_hash": None, "executor": None, "timing": None, "written_by": "n",
                "receipt": {"r": nested}, "signature": None}
    raw = sorted_text(response)
    assert outcome(fast_codec.decode, raw) == outcome(codec.decode, raw)


@pytest.mark.parametrize("data", [1.0, 1e15 + 0.5, 1e-7, 2.5e-5, -0.0, 0.1, [1.5, {"b": 2.0}],
                                  2**53 - 1, {"\U0001f600": 1, "\uffff": 2}])
def test_responses_holding_awkward_numbers_encode_to_the_codecs_bytes(data: Any) -> None:
    header = bs.EffectHeader(**HEADER)
    response = bs.ResponseRecord(
        effect_id=header.effect_id, header=header, request_offset=1, outcome="ok",
        output=bs.InlineBody.of_json(data), written_by="n", receipt={"x": data})
    assert fast_codec.encode(response) == codec.encode(response)
    assert fast_codec.encode_signed(response, sign) == codec.encode_signed(response, sign)
    raw = codec.encode(response)
    assert outcome(fast_codec.decode, raw) == outcome(codec.decode, raw)


@example(2**53)
@given(st.integers())
def test_out_of_domain_integers_are_the_codecs_errors(number: int) -> None:
    header = bs.EffectHeader(**HEADER)
    record = bs.EffectRequest(header=header, effect_kind=bs.INFERENCE_KIND,
                              params={"n": number}, deadline_ms=5)
    try:
        want: Any = codec.encode(record)
    except bs.EncodeError as exc:
        with pytest.raises(bs.EncodeError) as got:
            fast_codec.encode(record)
        assert got.value.code == exc.code
    else:
        assert fast_codec.encode(record) == want


def test_the_size_limit_is_the_codecs() -> None:
    header = bs.EffectHeader(**HEADER)
    record = bs.AcceptedRecord(effect_id=header.effect_id, header=header, request_offset=1,
                               node_id="n", lease_ms=5, accepted_us=1)
    size = len(codec.encode(record))
    assert fast_codec.encode(record, limit=size) == codec.encode(record)
    with pytest.raises(bs.RecordTooLarge):
        fast_codec.encode(record, limit=size - 1)
    other = bs.TickRecord(workload_id="cam-1", epoch=1, holder_id="h")  # not hot: the codec's
    assert fast_codec.encode(other) == codec.encode(other)


# ------------------------------------------------------------------------------ the structs


def test_the_structs_are_derived_from_the_models() -> None:
    for cls in (*HOT, bs.EffectHeader, bs.InlineBody, bs.ChunkRef, bs.StreamRef, bs.ErrorInfo,
                bs.ExecutorInfo, bs.Timing, bs.Signature):
        struct = fast_codec.struct_for(cls)
        info = msgspec.structs.StructConfig
        assert isinstance(struct.__struct_config__, info)
        tag = struct.__struct_config__.tag_field
        assert {*struct.__struct_fields__, *([tag] if tag else [])} == set(cls.model_fields)
        assert struct.__struct_config__.forbid_unknown_fields


def test_a_model_the_structs_cannot_carry_is_refused_at_once() -> None:
    class Checked(BaseModel):
        model_config = bs.EffectHeader.model_config
        name: str

        @field_validator("name")
        @classmethod
        def _upper(cls, v: str) -> str:
            return v.upper()

    class Falsy(BaseModel):
        model_config = bs.EffectHeader.model_config
        name: str | None = Field(default=None, exclude_if=lambda v: not v)

    for cls in (Checked, Falsy):
        with pytest.raises(TypeError):
            fast_codec.struct_for(cls)


@given(hostile_values)
def test_hostile_json_values_in_params_get_the_codecs_verdict(value: Any) -> None:
    raw = sorted_text({**REQUEST, "params": {"a": value}})
    assert outcome(fast_codec.decode, raw) == outcome(codec.decode, raw)


@settings(max_examples=5000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False)
       | st.floats(min_value=1e-7, max_value=1e-5) | st.floats(min_value=1e15, max_value=1e22))
@example(1e-6)
@example(1e21)
@example(2.5e-5)
@example(5e-324)
def test_msgspec_prints_a_float_as_ecmascript_wherever_the_fast_path_trusts_it(f: float) -> None:
    try:
        special = fast_codec._scan(f, 1)
    except fast_codec._Unsure:
        assert not -(2.0**53) < f < 2.0**53
        return
    if not special:
        assert fast_codec._ENCODER.encode(f) == es_number(f)


RESPONSE = {"kind": "response", "v": 1, "effect_id": "cam-1/4/0@2", "header": HEADER,
            "request_offset": 1, "outcome": "ok", "error": None, "output": None,
            "model_hash": None, "executor": None, "timing": None, "written_by": "n",
            "receipt": None, "signature": None}
ACCEPTED = {"kind": "accepted", "v": 1, "effect_id": "cam-1/4/0@2", "header": HEADER,
            "request_offset": 1, "node_id": "n", "lease_ms": 5, "accepted_us": 0}


@pytest.mark.parametrize("base", [RESPONSE, ACCEPTED])
@pytest.mark.parametrize("change", [
    {}, {"request_hash": None}, {"request_hash": "sha256:" + "ab" * 32},
    {"effect_id": "cam-1/4/0@3"}, {"effect_id": "shadow:e/cam-1/4/0@2"},
    {"outcome": "error"}, {"outcome": "timeout", "output": {"type": "chunk", "size": 1,
                                                            "hash": "sha256:" + "ab" * 32,
                                                            "media_type": None}},
    {"error": {"code": "internal", "message": ""}},
    {"executor": {"node_id": "n", "engine": "e", "engine_version": "1", "device_class": "cpu"}},
    {"executor": {"node_id": "n", "engine": "e", "engine_version": "1", "device_class": "cpu",
                  "provider": None}},
    {"executor": {"node_id": "n", "engine": "e", "engine_version": "1", "device_class": "cpu",
                  "provider": ""}},
    {"signature": {"alg": "ed25519", "key_id": "sha256:" + "ab" * 32, "value": "AA=="}},
    {"signature": {"alg": "ed25519", "key_id": "sha256:" + "ab" * 32, "value": "AA==\n"}},
    {"written_by": ""}, {"written_by": "\U0001f600" * 200}, {"written_by": "\U0001f600" * 201},
    {"lease_ms": 2**53 - 1}, {"node_id": "x" * 201},
])
def test_responses_and_accepts_at_the_edges_get_the_codecs_verdict(
        base: dict[str, Any], change: dict[str, Any]) -> None:
    raw = sorted_text({**base, **change})
    for topic in (None, "wl.cam-1.resp", "wl.cam-1.out"):
        assert outcome(fast_codec.decode, raw, topic) == outcome(codec.decode, raw, topic)


def test_the_fast_path_takes_the_records_an_executor_writes_itself() -> None:
    header = bs.EffectHeader(**HEADER)
    response = bs.ResponseRecord(
        effect_id=header.effect_id, header=header, request_offset=7, outcome="ok",
        output=bs.InlineBody.of_json({"label": "python", "score": 0.9987654328346252,
                                      "top": [["python", 0.9987654328346252],
                                              ["txt", 0.00012345678987654321]]}),
        model_hash="sha256:" + "ab" * 32,
        executor=bs.ExecutorInfo(node_id="n", engine="onnxruntime", engine_version="1",
                                 device_class="cpu", provider="CPUExecutionProvider"),
        timing=bs.Timing(received_us=1, started_us=2, finished_us=3), written_by="n",
        request_hash="sha256:" + "cd" * 32)
    _, raw, _ = fast_codec.encode_signed(response, sign)
    taken = fast_codec._fast_decode(raw, "wl.cam-1.resp")
    assert taken is not None and taken == codec.decode(raw)
    assert taken.model_fields_set == codec.decode(raw).model_fields_set
    accepted = bs.AcceptedRecord(effect_id=header.effect_id, header=header, request_offset=7,
                                 node_id="n", lease_ms=5, accepted_us=1,
                                 request_hash="sha256:" + "cd" * 32)
    assert fast_codec._fast_decode(fast_codec.encode(accepted), "wl.cam-1.resp") == accepted


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic's, on the unvalidated values
@pytest.mark.parametrize("change", [{"deadline_ms": 5.0}, {"deadline_ms": 2**60},
                                    {"deadline_ms": "5"}, {"reissue_of": None},
                                    {"model": None}, {"params": {"a": 1.0}}])
def test_a_record_made_without_validation_encodes_as_the_codec_encodes_it(
        change: dict[str, Any]) -> None:
    header = bs.EffectHeader(**HEADER)
    made = bs.EffectRequest.model_construct(
        **{"header": header, "effect_kind": bs.INFERENCE_KIND, "deadline_ms": 5, **change})
    try:
        want: Any = codec.encode(made)
    except bs.EncodeError as exc:
        with pytest.raises(bs.EncodeError) as got:
            fast_codec.encode(made)
        assert got.value.code == exc.code
    else:
        assert fast_codec.encode(made) == want
