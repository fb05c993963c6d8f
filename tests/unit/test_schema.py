"""The wire contract: round trips, canonical bytes, typed decode errors, limits, topics."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import broker_schema as bs
from broker_schema import streams, topics
from broker_schema.export import json_schemas
from tests.unit.schema_strategies import records

H = "sha256:" + "ab" * 32


def _header(**kw: Any) -> bs.EffectHeader:
    return bs.EffectHeader(**{"workload_id": "cam-1", "input_offset": 7, "index": 0,
                              "epoch": 3, **kw})


@given(records)
@settings(max_examples=300, deadline=None)
def test_decode_encode_round_trip(record: Any) -> None:
    data = bs.encode(record)
    back = bs.decode(data, strict=True)
    assert back == record
    assert type(back) is type(record)
    assert bs.encode(back) == data


@given(st.binary(max_size=300))
@settings(max_examples=500, deadline=None)
def test_random_bytes_raise_only_decode_error(data: bytes) -> None:
    try:
        bs.decode(data)
    except bs.DecodeError as exc:
        assert exc.code in bs.DECODE_CODES


@given(records, st.data())
@settings(max_examples=200, deadline=None)
def test_mutated_records_raise_only_decode_error(record: Any, data: st.DataObject) -> None:
    raw = bytearray(bs.encode(record))
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] = data.draw(st.integers(0, 255))
    try:
        bs.decode(bytes(raw))
    except bs.DecodeError as exc:
        assert exc.code in bs.DECODE_CODES


def test_canonical_bytes_are_stable_and_sorted() -> None:
    req = bs.EffectRequest(header=_header(), effect_kind=bs.INFERENCE_KIND, model=H,
                           params={"b": 1, "a": [1.5, "x"]}, deadline_ms=250)
    expected = (
        b'{"deadline_ms":250,"effect_kind":"ninelives:inference/run@0.1.0","header":'
        b'{"epoch":3,"index":0,"input_offset":7,"shadow":null,"workload_id":"cam-1"},'
        b'"input":null,"kind":"request","model":"' + H.encode() + b'",'
        b'"params":{"a":[1.5,"x"],"b":1},"v":1}'
    )
    assert bs.encode(req) == expected
    # field order of construction, and a round trip through a dict, change nothing
    again = bs.EffectRequest.model_validate(json.loads(expected))
    assert bs.encode(again) == expected
    assert bs.record_hash(req) == bs.sha256_hex(expected)


def test_effect_id_from_header() -> None:
    assert _header().effect_id == "cam-1/7/0@3"
    assert _header(shadow="eval-1").effect_id == "shadow:eval-1/cam-1/7/0@3"
    assert _header().slot == (7, 0)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\xff\xfe garbage", "not_json"),
        (b"", "not_json"),
        (b"NaN", "not_json"),
        (b'{"a": Infinity}', "not_json"),
        (b"[1,2]", "not_object"),
        (b'"text"', "not_object"),
        (b'{"v":1}', "unknown_kind"),
        (b'{"kind":"bogus","v":1}', "unknown_kind"),
        (b'{"kind":"claim"}', "unsupported_version"),
        (b'{"kind":"claim","v":2}', "unsupported_version"),
        (b'{"kind":"claim","v":"1"}', "unsupported_version"),
        (b'{"kind":"claim","v":true}', "unsupported_version"),
        (b'{"kind":"claim","v":1}', "invalid_record"),
        (b'{"kind":"claim","v":1,"workload_id":"w","epoch":"1","holder_id":"h",'
         b'"spec_hash":"' + H.encode() + b'","spec_offset":0}', "invalid_record"),
        (b'{"kind":"claim","v":1,"workload_id":"w","epoch":1,"holder_id":"h",'
         b'"spec_hash":"' + H.encode() + b'","spec_offset":0,"extra":1}', "invalid_record"),
        (b'{"kind":"claim","v":1,"workload_id":"w","epoch":0,"holder_id":"h",'
         b'"spec_hash":"' + H.encode() + b'","spec_offset":0}', "invalid_record"),
        (b'{"kind":"claim","v":1,"workload_id":"w","epoch":1,"holder_id":"h",'
         b'"spec_hash":"md5:00","spec_offset":0}', "invalid_record"),
        (b'{"kind":"claim","v":1,"workload_id":"w","epoch":99999999999999999999,'
         b'"holder_id":"h","spec_hash":"' + H.encode() + b'","spec_offset":0}', "invalid_record"),
        (b" " * (bs.MAX_RECORD_BYTES + 1), "oversize"),
    ],
)
def test_bad_bytes_have_stable_codes(data: bytes, code: str) -> None:
    with pytest.raises(bs.DecodeError) as info:
        bs.decode(data)
    assert info.value.code == code
    assert info.value.retriable is False


def test_non_canonical_bytes_are_refused_unless_read_leniently() -> None:
    claim = bs.ClaimRecord(workload_id="w", epoch=1, holder_id="h", spec_hash=H, spec_offset=0)
    loose = json.dumps(claim.model_dump(mode="json"), indent=1).encode()
    unsorted = json.dumps(dict(reversed(claim.model_dump(mode="json").items())),
                          separators=(",", ":")).encode()
    resp = bs.ResponseRecord(effect_id=_header().effect_id, header=_header(), request_offset=1,
                             outcome="timeout", written_by="h")
    omitted = {k: v for k, v in resp.model_dump(mode="json").items() if v is not None}
    sparse = bs.canonical_json(omitted)  # canonical JSON, but not every field present
    for raw, record in ((loose, claim), (unsorted, claim), (sparse, resp)):
        with pytest.raises(bs.DecodeError) as info:
            bs.decode(raw)
        assert info.value.code == "not_canonical"
        assert bs.decode(raw, strict=False) == record
    assert bs.decode(bs.encode(claim)) == claim


def test_inline_limit_and_oversize_record_refused_before_send() -> None:
    big = "x" * (bs.INLINE_MAX_BYTES + 1)
    with pytest.raises(ValueError, match="inline body"):
        bs.InlineBody.of_text(big)
    ok = bs.InlineBody.of_text("x" * (bs.INLINE_MAX_BYTES - 2))  # plus two quote bytes
    assert len(ok.raw()) == bs.INLINE_MAX_BYTES - 2
    # a record of many inline parameters can still exceed the frame cap: refused by encode()
    params = {f"p{i}": "y" * 60_000 for i in range(20)}
    req = bs.EffectRequest(header=_header(), effect_kind=bs.INFERENCE_KIND, params=params,
                           deadline_ms=1)
    with pytest.raises(bs.RecordTooLarge) as info:
        bs.encode(req)
    assert info.value.code == "oversize" and info.value.size > bs.MAX_RECORD_BYTES


def test_values_json_cannot_carry_exactly_are_refused() -> None:
    req = bs.EffectRequest(header=_header(), effect_kind=bs.INFERENCE_KIND,
                           params={"seed": 2**60}, deadline_ms=1)
    with pytest.raises(bs.EncodeError) as info:
        bs.encode(req)
    assert info.value.code == "not_canonicalizable"


def test_response_outcome_rules() -> None:
    h = _header()
    with pytest.raises(ValueError):
        bs.ResponseRecord(effect_id=h.effect_id, header=h, request_offset=0, outcome="error",
                          written_by="n")
    with pytest.raises(ValueError):
        bs.ResponseRecord(effect_id=h.effect_id, header=h, request_offset=0, outcome="timeout",
                          output=bs.InlineBody.of_text("x"), written_by="n")
    err = bs.ErrorInfo(code="model_hash_mismatch", message="tampered")
    assert err.retriable is True
    assert bs.ErrorInfo(code="stale_epoch").retriable is False


def test_signing_bytes_exclude_signature() -> None:
    h = _header()
    resp = bs.ResponseRecord(effect_id=h.effect_id, header=h, request_offset=4, outcome="ok",
                             output=bs.InlineBody.of_json({"label": "python"}), written_by="n")
    signed = resp.model_copy(update={"signature": bs.Signature(key_id=H, value="AAAA")})
    assert signed.signing_bytes() == resp.signing_bytes() == bs.encode(resp)


def test_spec_binding_switches() -> None:
    h2 = "sha256:" + "cd" * 32
    spec = bs.SpecRecord(workload_id="w", module_hash=H, effect_kinds=(bs.INFERENCE_KIND,),
                         models={"clf": H},
                         binding_switches=(bs.BindingSwitch(at_input_offset=10,
                                                            models={"clf": h2}),))
    assert spec.models_at(9) == {"clf": H}
    assert spec.models_at(10) == {"clf": h2}
    with pytest.raises(ValueError, match="increasing"):
        bs.SpecRecord(workload_id="w", module_hash=H, effect_kinds=(),
                      binding_switches=(bs.BindingSwitch(at_input_offset=5, models={}),
                                        bs.BindingSwitch(at_input_offset=5, models={})))


def test_records_are_frozen() -> None:
    claim = bs.ClaimRecord(workload_id="w", epoch=1, holder_id="h", spec_hash=H, spec_offset=0)
    with pytest.raises(ValueError):
        claim.epoch = 2  # type: ignore[misc]


def test_topics() -> None:
    assert topics.all_topics("cam-1") == [
        "wl.cam-1.in", "wl.cam-1.spec", "wl.cam-1.claims", "wl.cam-1.out", "wl.cam-1.resp",
        "wl.cam-1.merge"]
    assert topics.parse("wl.cam-1.resp") == ("cam-1", "resp")
    import re
    assert re.fullmatch(topics.OUT_PATTERN, "wl.cam-1.out")
    assert not re.fullmatch(topics.OUT_PATTERN, "wl.cam-1.resp")
    for bad in ["", "a.b", "-x", "x" * 201, "a b"]:
        with pytest.raises(ValueError):
            topics.inputs(bad)
    with pytest.raises(ValueError):
        topics.parse("wl.x.bogus")


def test_json_schema_export_covers_every_kind_and_is_committed() -> None:
    docs = json_schemas()
    assert set(docs) == {f"{k}.schema.json" for k in bs.RECORD_TYPES} | {"record.schema.json"}
    from pathlib import Path
    committed = Path(__file__).resolve().parents[2] / "docs" / "schema"
    for name, schema in docs.items():
        on_disk = json.loads((committed / name).read_text())
        assert on_disk == schema, f"docs/schema/{name} is stale: run `fx schema export`"


def test_docs_record_examples_are_canonical_records() -> None:
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "records.md").read_text()
    blocks = re.findall(r"```json\n(.*?)\n```", text, flags=re.S)
    kinds = set()
    for block in blocks:
        record = bs.decode(block.encode(), strict=True)
        kinds.add(record.kind)
    assert kinds == set(bs.RECORD_TYPES)


@given(records)
@settings(max_examples=150, deadline=None)
def test_every_decoded_record_re_encodes(record: Any) -> None:
    """A lenient decode still returns only records encode() accepts."""
    loose = json.dumps(record.model_dump(mode="json")).encode()
    assert bs.encode(bs.decode(loose, strict=False)) == bs.encode(record)


@pytest.mark.parametrize("number", [b"9007199254740992", b"-9007199254740993", b"1e300",
                                    b"9007199254740992.0"])
def test_numbers_outside_the_exact_domain_are_refused(number: bytes) -> None:
    data = (b'{"kind":"request","v":1,"header":{"workload_id":"w","input_offset":0,"index":0,'
            b'"epoch":1,"shadow":null},"effect_kind":"ninelives:inference/run@0.1.0",'
            b'"model":null,"params":{"x":' + number + b'},"input":null,"deadline_ms":5}')
    with pytest.raises(bs.DecodeError) as info:
        bs.decode(data)
    assert info.value.code == "invalid_record"


# ------------------------------------------------------------------- effect id, depth, streams


def _accepted(effect_id: str, **header: Any) -> bytes:
    rec = bs.AcceptedRecord.model_construct(
        effect_id=effect_id, header=_header(**header), request_offset=1, node_id="n",
        lease_ms=10, accepted_us=0, kind="accepted", v=1)
    return bs.canonical_json(rec.model_dump(mode="json"))


def _response(effect_id: str, **header: Any) -> bytes:
    rec = bs.ResponseRecord.model_construct(
        effect_id=effect_id, header=_header(**header), request_offset=1, outcome="timeout",
        error=None, output=None, model_hash=None, executor=None, timing=None,
        written_by="h", receipt=None, signature=None, kind="response", v=1)
    return bs.canonical_json(rec.model_dump(mode="json"))


@pytest.mark.parametrize("make", [_accepted, _response])
@pytest.mark.parametrize("effect_id", [
    "cam-1/7/0@4", "cam-1/8/0@3", "cam-1/7/1@3", "cam-2/7/0@3", "shadow:e/cam-1/7/0@3",
    "cam-1/07/0@3", "", "cam-1/7/0@3 ",
])
def test_an_effect_id_that_its_header_does_not_spell_is_refused(
        make: Any, effect_id: str) -> None:
    with pytest.raises(bs.DecodeError) as info:
        bs.decode(make(effect_id))
    assert info.value.code == "effect_id_mismatch"
    assert bs.decode(make("cam-1/7/0@3")).effect_id == "cam-1/7/0@3"  # type: ignore[union-attr]
    shadowed = make("shadow:e/cam-1/7/0@3", shadow="e")
    assert bs.decode(shadowed).effect_id == "shadow:e/cam-1/7/0@3"  # type: ignore[union-attr]
    # and constructing one in code fails the same way
    with pytest.raises(ValueError, match="effect_id"):
        bs.AcceptedRecord(effect_id=effect_id, header=_header(), request_offset=1, node_id="n",
                          lease_ms=10, accepted_us=0)


def test_a_merge_entry_effect_id_must_be_an_effect_id() -> None:
    def merge(effect_id: str | None) -> bytes:
        return bs.canonical_json({"kind": "merge", "v": 1, "workload_id": "cam-1", "seq": 1,
                                  "epoch": 1, "source": "resp", "source_offset": 0,
                                  "effect_id": effect_id, "action": "deliver", "reason": None})
    assert bs.decode(merge("cam-1/0/0@1")).effect_id == "cam-1/0/0@1"  # type: ignore[union-attr]
    assert bs.decode(merge("shadow:x/cam-1/0/0@1"))
    assert bs.decode(merge(None))
    assert bs.decode(merge("cam-2/0/0@1"))  # a pass-over of a response naming another workload
    for bad in ("cam-1/0/0", "cam-1/-1/0@1", "nonsense", "cam-1/0/0@1 "):
        with pytest.raises(bs.DecodeError) as info:
            bs.decode(merge(bad))
        assert info.value.code == "effect_id_mismatch", bad


def test_parse_effect_id_is_the_inverse_of_the_header_spelling() -> None:
    for header in (_header(), _header(shadow="eval-1"), _header(input_offset=2**53 - 1)):
        assert bs.parse_effect_id(header.effect_id) == header
    for bad in ("cam-1/7/0@0", "cam-1/+7/0@3", "cam 1/7/0@3", "cam-1/7/0@3/", "a/1/2147483648@1",
                "x" * 600):
        with pytest.raises(ValueError):
            bs.parse_effect_id(bad)


@pytest.mark.parametrize("depth", [bs.MAX_JSON_DEPTH + 1, 500, 5_000, 400_000])
def test_deeply_nested_json_has_its_own_code(depth: int) -> None:
    body = b"[" * depth + b"]" * depth
    data = (b'{"body":{"data":' + body + b',"encoding":"json","media_type":null,"type":"inline"},'
            b'"kind":"input","source":null,"v":1,"workload_id":"a"}')
    with pytest.raises(bs.DecodeError) as info:
        bs.decode(data[:bs.MAX_RECORD_BYTES] if len(data) > bs.MAX_RECORD_BYTES else data)
    assert info.value.code == "too_deep"
    with pytest.raises(bs.DecodeError) as info:  # a bare nested array: too deep before anything
        bs.decode(body)
    assert info.value.code == "too_deep"


def test_nesting_up_to_the_limit_round_trips_and_deeper_is_not_encoded() -> None:
    value: Any = 1
    for _ in range(bs.MAX_JSON_DEPTH - 2):  # the record and its body take two levels
        value = [value]
    rec = bs.InputRecord(workload_id="a", body=bs.InlineBody.of_json(value))
    assert bs.json_depth(rec.model_dump(mode="json")) == bs.MAX_JSON_DEPTH
    assert bs.decode(bs.encode(rec)) == rec
    deeper = bs.InputRecord(workload_id="a", body=bs.InlineBody.of_json([value]))
    with pytest.raises(bs.EncodeError) as info:
        bs.encode(deeper)
    assert info.value.code == "too_deep"


@pytest.mark.parametrize(("topic", "allowed"), [
    ("wl.cam-1.out", {"output", "request"}), ("wl.cam-1.resp", {"accepted", "response", "tick"}),
    ("wl.cam-1.in", {"input"}), ("wl.cam-1.claims", {"claim"}),
    ("wl.cam-1.spec", {"spec", "skip_order"}),
    ("wl.cam-1.merge", {"merge", "snapshot"}), (topics.FACTS, {"facts"}),
    (topics.REJECTS, {"rejected"}),
])
def test_a_kind_read_from_a_stream_it_does_not_belong_on_is_wrong_stream(
        topic: str, allowed: set[str]) -> None:
    assert streams.kinds_on(topic) == frozenset(allowed)
    claim = bs.encode(bs.ClaimRecord(workload_id="cam-1", epoch=1, holder_id="h", spec_hash=H,
                                     spec_offset=0))
    if "claim" in allowed:
        assert bs.decode(claim, topic=topic)
    else:
        with pytest.raises(bs.DecodeError) as info:
            bs.decode(claim, topic=topic)
        assert info.value.code == "wrong_stream"
        assert "claim" in info.value.detail
    assert bs.decode(claim, topic="some.other.topic")  # not ours: no opinion
    # sys.chunks holds raw parts and key entries, and the redaction records beside them
    assert streams.kinds_on("sys.chunks") == frozenset({"redaction"})


def test_topic_builders() -> None:
    assert topics.stream("cam-1", "merge") == topics.merge("cam-1")
    with pytest.raises(ValueError):
        topics.stream("cam-1", "bogus")
    assert topics.out_pattern() == topics.OUT_PATTERN
    import re
    assert re.fullmatch(topics.out_pattern("cam-1"), "wl.cam-1.out")
    assert not re.fullmatch(topics.out_pattern("cam-1"), "wl.cam-10.out")


@pytest.mark.parametrize("number", [2.0**53, -(2.0**53), 1e300, float("inf")])
def test_encode_refuses_a_float_decode_would_refuse(number: float) -> None:
    req = bs.EffectRequest(header=_header(), effect_kind=bs.INFERENCE_KIND,
                           params={"x": number}, deadline_ms=1)
    with pytest.raises(bs.EncodeError) as info:
        bs.encode(req)
    assert info.value.code == "not_canonicalizable"
    ok = req.model_copy(update={"params": {"x": 2.0**53 - 1}})
    assert bs.decode(bs.encode(ok)) == ok


def test_a_base64_body_is_checked_once_per_string_and_bad_ones_are_always_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that passes an input's body on builds a request holding the same body object,
    and pydantic runs the body's check again then: the strict base64 check runs once per string
    object (it is a pure function of the string); an invalid string is refused every time, with
    the same message, also when it reaches a body without validation (model_copy)."""
    from broker_schema import records as rec_mod

    calls: list[str] = []

    class Counting(dict[int, str]):  # a string is entered once each time it is checked afresh
        def __setitem__(self, key: int, value: str) -> None:
            calls.append(value)
            super().__setitem__(key, value)

    monkeypatch.setattr(rec_mod, "_BASE64_CHECKED", Counting())
    body = bs.InlineBody.of_bytes(b"x" * 3000)
    header = bs.EffectHeader(workload_id="wl-a", input_offset=0, index=0, epoch=1)
    req = bs.EffectRequest(header=header, effect_kind=bs.INFERENCE_KIND, model=None, params={},
                           input=body, deadline_ms=1000)
    assert req.input is body
    assert calls == [body.data]  # of_bytes checked it; the request's check found it checked
    decoded = bs.decode(bs.encode(req))
    assert decoded == req and len(calls) == 2  # a string read from bytes is another object
    for bad in ("AAA", "AA=A", "AAA!", "=AAA", " AAAA"):
        for _ in range(2):
            with pytest.raises(ValueError, match="base64 body data is not valid base64"):
                bs.InlineBody(encoding="base64", data=bad)
            with pytest.raises(ValueError, match="base64 body data is not valid base64"):
                bs.EffectRequest(header=header, effect_kind=bs.INFERENCE_KIND, model=None,
                                 params={}, input=body.model_copy(update={"data": bad}),
                                 deadline_ms=1000)
    for n in range(rec_mod._BASE64_CHECKED_MAX + 3):  # the table stays bounded
        bs.InlineBody.of_bytes(b"%d" % n)
    assert len(rec_mod._BASE64_CHECKED) <= rec_mod._BASE64_CHECKED_MAX


def test_the_base64_fast_accept_is_a_subset_of_the_strict_decoder() -> None:
    """``_check_base64`` accepts a string without decoding it only when the strict decoder
    accepts it (every string of up to 9 characters over ``A P / =`` and a few others); anything
    else it hands to the decoder, so refusals and their messages are the decoder's."""
    import base64
    import binascii
    import itertools

    from broker_schema import records as rec_mod

    def strict(text: str) -> str | None:
        try:
            base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            return str(exc)
        return None

    def ours(text: str) -> str | None:
        rec_mod._BASE64_CHECKED.clear()
        try:
            rec_mod._check_base64(text)
        except (binascii.Error, ValueError) as exc:
            return str(exc)
        return None

    texts = ["".join(t) for n in range(10) for t in itertools.product("AP/=", repeat=n)]
    texts += ["AAAA\n", "AA==\n", "é" * 4, "AA-_", "AAAA====", "AAA=A===", "AAAA" * 1000 + "A=="]
    for text in texts:
        assert ours(text) == strict(text), text
