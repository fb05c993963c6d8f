"""broker_schema.canonical is byte-identical to the RFC 8785 reference (the ``rfc8785`` package).

The fast encoder hands structure and strings to orjson and formats numbers and UTF-16 key order
itself; these properties compare its bytes with the reference over every record kind, arbitrary
JSON values with hostile floats (integral, -0.0, [1e-6, 1e-5), subnormals, huge and tiny
exponents) and keys above U+FFFF, and check that it refuses exactly what the reference refuses.
"""

from __future__ import annotations

import enum
import math
import struct
from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import broker_schema as bs
from broker_schema.canonical import canonical_json, es_number
from tests.unit.schema_strategies import records

HOSTILE_FLOATS = [1.0, -1.0, 0.0, -0.0, 1e21, 1e-7, 1e-6, 1e-5, 9.999999999999999e-6,
                  1.5e-6, 123456789012345680000.0, 1e20, 1e16, 9007199254740993.0, 2.0**53,
                  5e-324, 2.2250738585072014e-308, 2.225073858507201e-308, 1.7976931348623157e308,
                  0.1, 0.30000000000000004, 1e-4, 1e15, 100.0, 1e300, -1e-300, 4.35, 0.000001]

floats = (
    st.floats(allow_nan=False, allow_infinity=False, width=64)
    | st.sampled_from(HOSTILE_FLOATS)
    | st.floats(min_value=1e-6, max_value=1e-5, exclude_max=True)
    | st.floats(min_value=1e15, max_value=1e22)
    | st.floats(min_value=-1e-300, max_value=1e-300)  # subnormals and tiny exponents
    | st.integers(min_value=0, max_value=2**64 - 1).map(
        lambda bits: struct.unpack("<d", struct.pack("<Q", bits))[0]).filter(math.isfinite)
    | st.integers(min_value=-(2**60), max_value=2**60).map(float)
)
astral_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=6) | st.sampled_from(
    ["\U0001f600", "\uffff", "\ue000", "\U00010000", "a\U0001f600", "a\uff61", "", "\x7f",
     "\u2028", "\x00", '"', "\\"])
scalars = (st.none() | st.booleans() | floats | st.text(max_size=12) | astral_text
           | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1))
json_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(astral_text | st.text(max_size=8), children, max_size=6),
    max_leaves=30,
)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
@example({"\U0001f600": 1, "\uffff": 2, "\ue000": [1.0, -0.0]})
@example([1e-6, 1e-5, 9.5e-6, 1e21, 1e20, 5e-324])
def test_bytes_identical_to_rfc8785_on_arbitrary_json(value: Any) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


@settings(max_examples=20000, deadline=None)
@given(floats)
def test_numbers_are_printed_as_ecmascript_does(number: float) -> None:
    assert es_number(number) == rfc8785.dumps(number)
    assert canonical_json([number, {"n": number}]) == rfc8785.dumps([number, {"n": number}])


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records)
def test_bytes_identical_to_rfc8785_on_every_record_kind(record: Any) -> None:
    value = record.model_dump(mode="json")
    assert canonical_json(value) == rfc8785.dumps(value)
    assert bs.encode(record) == rfc8785.dumps(value)


def test_deep_nesting_beyond_orjson_limit_is_the_reference_bytes() -> None:
    value: Any = [1.5, {"\U0001f600": 0.0}]
    for depth in range(600):
        value = [value] if depth % 2 else {"k": value, "\ue000": -0.0}
    assert canonical_json(value) == rfc8785.dumps(value)


class _Colour(str, enum.Enum):  # noqa: UP042  (the mixin, not StrEnum: its __str__ differs)
    RED = "red"


class _Level(enum.IntEnum):
    HIGH = 3


def test_subclasses_of_json_types_read_as_the_reference_reads_them() -> None:
    value: Any = {_Colour.RED: [_Level.HIGH, _Colour.RED, (1, 2.0)], "t": True}
    assert canonical_json(value) == rfc8785.dumps(value)


@pytest.mark.parametrize("value", [
    math.nan, math.inf, -math.inf, [1, {"a": math.nan}], 2**53, -(2**53), 2**64, -(2**70),
    {"a": [2**53]}, {1: 2}, {(1,): 2}, {True: 1}, object(), b"bytes", {"a": {1, 2}}, "\ud800",
    {"\udfff": 1}, [1.5, float("-inf")], {"\U0001f600": math.nan},
])
def test_refuses_what_the_reference_refuses_with_one_typed_error(value: Any) -> None:
    with pytest.raises((rfc8785.CanonicalizationError, TypeError, ValueError)):
        rfc8785.dumps(value)
    with pytest.raises(bs.EncodeError) as info:
        canonical_json(value)
    assert info.value.code == "not_canonicalizable"


def test_integers_at_the_edge_of_the_exact_domain() -> None:
    for number in (2**53 - 1, -(2**53) + 1, 0, -1):
        assert canonical_json({"n": number}) == rfc8785.dumps({"n": number})


def test_decode_checks_canonical_form_of_astral_keys_and_floats() -> None:
    """decode's fast canonical check (orjson alone when the bytes hold no float and no 4-byte
    UTF-8) must still refuse the code-point key order and a non-ECMAScript float."""
    header = bs.EffectHeader(workload_id="w", input_offset=0, index=0, epoch=1)
    record = bs.EffectRequest(header=header, effect_kind=bs.INFERENCE_KIND, deadline_ms=5,
                              params={"\U0001f600": 1, "\uffff": 2, "f": 1e-6})
    data = bs.encode(record)
    assert data == rfc8785.dumps(record.model_dump(mode="json"))
    assert bs.decode(data) == record
    swapped = data.replace("\"\U0001f600\":1,\"\uffff\":2".encode(),
                           "\"\uffff\":2,\"\U0001f600\":1".encode())
    assert swapped != data
    with pytest.raises(bs.DecodeError) as info:
        bs.decode(swapped)
    assert info.value.code == "not_canonical"
    for spelling in (b'"f":1e-6', b'"f":1.0e-6', b'"f":0.0000010'):
        with pytest.raises(bs.DecodeError) as info:
            bs.decode(data.replace(b'"f":0.000001', spelling))
        assert info.value.code == "not_canonical"
    plain = bs.encode(record.model_copy(update={"params": {"a": 1, "b": [True, None, "x"]}}))
    with pytest.raises(bs.DecodeError) as info:
        bs.decode(plain.replace(b'"a":1,"b"', b'"b"').replace(b'"x"]', b'"x"],"a":1'))
    assert info.value.code == "not_canonical"
