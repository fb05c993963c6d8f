"""Replay's byte shortcuts in broker_schema (issue 29, second round): the trusted parse that takes
an input's long body string as it is gives ``orjson.loads``'s value, ``request_bytes`` gives
``encode``'s bytes, and ``construct_values`` builds what validation builds from such values."""

from __future__ import annotations

import base64
import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import broker_schema as bs
from broker_schema.construct import ConstructError, construct_values
from broker_schema.request_bytes import request_bytes
from broker_schema.trusted_parse import parse_trusted
from tests.unit import schema_strategies as ss

long_bodies = st.one_of(
    st.binary(min_size=380, max_size=3000).map(bs.InlineBody.of_bytes),
    st.text(min_size=500, max_size=1500).map(bs.InlineBody.of_text),
    st.text(alphabet="abc \"\\\n\u00e9\U0001f600", min_size=520, max_size=700).map(
        bs.InlineBody.of_text),
    st.binary(min_size=380, max_size=800).map(
        lambda b: bs.InlineBody.of_bytes(b, media_type="image/png")),
)


@settings(max_examples=150, deadline=None)
@given(body=long_bodies | ss.bodies, source=st.none() | st.text(max_size=20))
def test_the_trusted_parse_is_orjsons(body: Any, source: str | None) -> None:
    raw = bs.encode(bs.InputRecord(workload_id="w-1", body=body, source=source))
    assert parse_trusted(raw) == orjson.loads(raw)
    assert bs.decode_trusted(raw) == bs.decode(raw)


def test_the_trusted_parse_leaves_what_it_does_not_take_to_orjson() -> None:
    data = base64.b64encode(b"\x00" * 600).decode()
    good = b'{"body":{"data":"' + data.encode() + b'","encoding":"base64","media_type":null,' \
        b'"type":"inline"},"kind":"input","v":1,"workload_id":"w"}'
    assert parse_trusted(good) == orjson.loads(good)
    assert parse_trusted(good)["body"]["data"] == data
    for bad in (good[:-1], good.replace(b'"kind"', b"kind"), good[:700],
                good.replace(b"AAAA", b"\xff\xfe\xfd\xfc", 1)):
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(bad)
        with pytest.raises(orjson.JSONDecodeError):
            parse_trusted(bad)
        with pytest.raises(bs.DecodeError):
            bs.decode_trusted(bad)
    nested = good.replace(b'"body":{', b'"body":[{', 1).replace(b'"type":"inline"}',
                                                                  b'"type":"inline"}]', 1)
    assert parse_trusted(nested) == orjson.loads(nested)


@st.composite
def requests(draw: st.DrawFn) -> bs.EffectRequest:
    header = draw(ss.headers)
    params = draw(st.just({}) | st.dictionaries(st.text(max_size=5), ss.json_scalars,
                                                max_size=3))
    reissue = None
    if header.input_offset > 0 and draw(st.booleans()):
        reissue = bs.EffectHeader(workload_id=header.workload_id, input_offset=0, index=0,
                                  epoch=1, shadow=header.shadow).effect_id
    return bs.EffectRequest(
        header=header, effect_kind=draw(ss.kinds), model=draw(st.none() | ss.hashes),
        params=params, input=draw(st.none() | long_bodies | ss.bodies),
        deadline_ms=draw(st.integers(1, 2**53 - 1)), reissue_of=reissue)


@settings(max_examples=300, deadline=None)
@given(req=requests())
def test_request_bytes_are_encodes(req: bs.EffectRequest) -> None:
    assert request_bytes(req) == bs.encode(req)
    assert bs.request_hash(request_bytes(req)) == bs.request_hash(bs.encode(req))


def test_request_bytes_refuse_what_encode_refuses() -> None:
    header = bs.EffectHeader(workload_id="w", input_offset=1, index=0, epoch=1)
    body = bs.InlineBody.of_bytes(b"x" * 40_000)
    req = bs.EffectRequest(header=header, effect_kind=bs.INFERENCE_KIND, input=body,
                           deadline_ms=5)
    with pytest.raises(bs.RecordTooLarge):
        request_bytes(req, limit=1000)
    with pytest.raises(bs.RecordTooLarge):
        bs.encode(req, limit=1000)
    odd = req.model_copy(update={"input": bs.InlineBody.model_construct(
        encoding="utf8", data="\ud800 lone surrogate")})
    with pytest.raises(bs.EncodeError):
        bs.encode(odd)
    with pytest.raises(bs.EncodeError):
        request_bytes(odd)


def test_construct_values_builds_the_validated_record() -> None:
    header = bs.EffectHeader(workload_id="w", input_offset=1, index=0, epoch=1)
    body = bs.InlineBody.of_json({"a": 1})
    out = construct_values(bs.OutputRecord, {"header": header, "body": body})
    want = bs.OutputRecord(header=header, body=body)
    assert out == want and repr(out) == repr(want)
    assert out.model_fields_set == want.model_fields_set and bs.encode(out) == bs.encode(want)
    req = construct_values(bs.EffectRequest, {"header": header, "effect_kind": "k:a/b@1.0.0",
                                              "deadline_ms": 3})
    assert req == bs.EffectRequest(header=header, effect_kind="k:a/b@1.0.0", deadline_ms=3)
    assert isinstance(req, bs.EffectRequest) and req.params == {}
    other = construct_values(bs.EffectRequest, {"header": header, "effect_kind": "k:a/b@1.0.0",
                                                "deadline_ms": 3})
    assert isinstance(other, bs.EffectRequest) and other.params is not req.params  # a factory's
    with pytest.raises(ConstructError, match="no 'body'"):
        construct_values(bs.OutputRecord, {"header": header})
    with pytest.raises(ConstructError, match="no field 'extra'"):
        construct_values(bs.OutputRecord, {"header": header, "body": body, "extra": 1})


def test_a_trusted_build_plans_by_key_order_and_refuses_every_time() -> None:
    from broker_schema.construct import _PLANS_MAX, construct

    header = bs.EffectHeader(workload_id="w", input_offset=1, index=0, epoch=1)
    entry = bs.MergeEntry(workload_id="w", seq=1, epoch=1, source="resp", source_offset=2,
                          effect_id=header.effect_id, action="pass_over", reason="duplicate")
    obj = orjson.loads(bs.encode(entry))
    for _ in range(2):  # the plan made for this key order, then used
        assert construct(bs.MergeEntry, dict(obj)) == entry
    reordered = dict(reversed(list(obj.items())))
    assert construct(bs.MergeEntry, reordered) == entry
    assert construct(bs.MergeEntry, {k: v for k, v in obj.items() if k != "reason"}) \
        == entry.model_copy(update={"reason": None})  # a default filled in
    for _ in range(2):  # a refusal is never remembered as a plan
        with pytest.raises(ConstructError, match="has no 'seq'"):
            construct(bs.MergeEntry, {k: v for k, v in obj.items() if k != "seq"})
        with pytest.raises(ConstructError, match="has no field 'bogus'"):
            construct(bs.MergeEntry, {**obj, "bogus": 1})
    orders = itertools.islice(itertools.permutations(obj), 2 * _PLANS_MAX + 5)
    for order in orders:  # many key orders: the plans are bounded, each build is right
        assert construct(bs.MergeEntry, {k: obj[k] for k in order}) == entry
