"""Fuzzing every decoder: record bytes, canonical JSON, JSONL logs, integer-engine receipts.

Property of each: it returns, or raises its typed error (with a code from its closed set where it
has one), and nothing else, for any input. See tests/unit/fuzz/hostile.py for what is generated.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import broker_schema as bs
from fx_integer.receipt import ReceiptSigner, load_receipts
from fx_integer.verifier import check_static, verify
from fx_kafka.workload_log import LogFileError, LogGap, WorkloadLog
from tests.unit.fuzz.hostile import (
    FUZZ,
    HOSTILE_FLOATS,
    HOSTILE_INTS,
    HOSTILE_TEXT,
    decode_outcome,
    deep,
    dumps,
    hostile_values,
    record_bytes,
)

TALLY: Counter[str] = Counter()
GOLDEN = Path(__file__).resolve().parents[1] / "workload_sdk" / "golden" / "asker_failover.jsonl"


@FUZZ
@given(record_bytes(), st.booleans())
def test_decode_any_bytes_is_a_record_or_a_typed_error(raw: bytes, strict: bool) -> None:
    outcome, _ = decode_outcome(raw, strict=strict)
    TALLY[outcome] += 1


def test_decode_tally_covers_the_codes() -> None:
    """The CI run above exercised refusals of most codes and accepted most kinds (so the
    generator has not silently collapsed into one kind of garbage)."""
    if not TALLY:
        pytest.skip("run with the test above")
    codes = {k.split(":", 1)[1] for k in TALLY if k.startswith("DecodeError:")}
    kinds = {k.split(":", 1)[1] for k in TALLY if k.startswith("ok:")}
    assert {"not_json", "invalid_record", "unknown_kind", "unsupported_version"} <= codes, TALLY
    assert len(kinds) >= 6, TALLY


@pytest.mark.parametrize("depth", [10, 100, 180, 250, 990, 3000, 100_000])
@pytest.mark.parametrize("obj", [False, True])
@pytest.mark.parametrize("strict", [False, True])
def test_deeply_nested_json_is_a_typed_error(depth: int, obj: bool, strict: bool) -> None:
    for where in ("data", "params"):
        if where == "data":
            text = ('{"kind":"input","v":1,"workload_id":"w","source":null,"body":{"type":'
                    '"inline","encoding":"json","media_type":null,"data":'
                    + deep(depth, obj=obj).text + "}}")
        else:
            text = ('{"kind":"request","v":1,"deadline_ms":5,"effect_kind":"a:b@1.0.0",'
                    '"header":{"epoch":1,"index":0,"input_offset":0,"shadow":null,'
                    '"workload_id":"w"},"input":null,"model":null,"params":{"p":'
                    + deep(depth, obj=obj).text + "}}")
        outcome, _ = decode_outcome(text.encode(), strict=strict)
        assert outcome.startswith(("ok:", "DecodeError:"))


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999", "9" * 5000, "-0",
                                   "1e-400", "2e53", "9007199254740993"])
def test_non_finite_and_out_of_domain_numbers_are_typed(token: str) -> None:
    text = ('{"kind":"input","v":1,"workload_id":"w","source":null,"body":{"type":"inline",'
            '"encoding":"json","media_type":null,"data":' + token + "}}")
    for strict in (False, True):
        outcome, record = decode_outcome(text.encode(), strict=strict)
        if token in ("NaN", "Infinity", "-Infinity", "1e999", "9" * 5000, "9007199254740993"):
            assert outcome.startswith("DecodeError:"), (token, outcome)
        if record is not None:
            assert math.isfinite(float(record.body.data))


# --------------------------------------------------------------------------- canonical JSON

python_values: st.SearchStrategy[Any] = st.recursive(
    st.sampled_from([*HOSTILE_TEXT, *HOSTILE_INTS, *HOSTILE_FLOATS, None, True, b"x",
                     2**1000]) | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.tuples(c) | st.dictionaries(
        st.sampled_from(["a", "\ud800", "\x00", "\u202e"]) | st.integers(0, 2) | st.none(), c,
        max_size=3) | st.frozensets(st.integers(0, 3), max_size=2),
    max_leaves=10,
)


@FUZZ
@given(python_values)
def test_canonical_json_returns_bytes_or_encode_error(value: Any) -> None:
    try:
        data = bs.canonical_json(value)
    except bs.EncodeError as exc:
        assert exc.code == "not_canonicalizable"
        return
    back = json.loads(data)  # what it writes is JSON
    try:
        again = bs.canonical_json(back)
    except bs.EncodeError:
        # an integral float of magnitude >= 2^53 is printed as an integer beyond the exact
        # domain (documented in broker_schema/canonical.py): see test_encoded_records_decode
        assert any(isinstance(v, float) and abs(v) >= 2**53 for v in _leaves(value))
        return
    assert again == data  # and canonical: a fixed point


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list | tuple | frozenset):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


# found by fuzzing (issue 9): encode() refuses a float decode() would refuse (|x| >= 2^53)
@pytest.mark.parametrize("x", [2.0**53, -(2.0**60), 1e300])
def test_encoded_records_decode(x: float) -> None:
    req = bs.EffectRequest(header=bs.EffectHeader(workload_id="w", input_offset=0, index=0,
                                                  epoch=1),
                           effect_kind=bs.INFERENCE_KIND, params={"x": x}, deadline_ms=5)
    try:
        data = bs.encode(req)
    except bs.EncodeError:
        return  # refused at encode: fine
    bs.decode(data)  # what encode wrote must decode


@pytest.mark.parametrize("depth", [100, 1000, 5000])
def test_canonical_json_of_deep_values_is_typed(depth: int) -> None:
    value: Any = []
    for _ in range(depth):
        value = [value]
    try:
        bs.canonical_json(value)
    except bs.EncodeError as exc:
        assert exc.code == "not_canonicalizable"
    except RecursionError:
        pytest.fail("canonical_json leaks RecursionError on a value nested "
                    f"{depth} deep (want EncodeError)")


# --------------------------------------------------------------------------- JSONL logs

def _golden_lines() -> list[str]:
    return [line for line in GOLDEN.read_text().splitlines() if line.strip()]


@st.composite
def jsonl_files(draw: st.DrawFn) -> str:
    rows: list[Any] = [json.loads(line) for line in
                       draw(st.lists(st.sampled_from(_golden_lines()), min_size=1, max_size=8))]
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(rows) - 1))
        op = draw(st.sampled_from(["field", "field", "value", "raw", "truncate", "junk"]))
        row = rows[i]
        if op == "field" and isinstance(row, dict):
            row[draw(st.sampled_from(["topic", "offset", "ts", "start", "end", "value"]))] = (
                draw(hostile_values))
        elif op == "value" and isinstance(row, dict) and isinstance(row.get("value"), dict):
            if row["value"]:
                key = draw(st.sampled_from(sorted(row["value"])))
                row["value"][key] = draw(hostile_values)
        elif op == "raw":
            rows[i] = deep(3000) if draw(st.booleans()) else draw(st.sampled_from(
                ["[]", "1", "null", '"x"', "{", '{"topic": "in"}', '{"topic": "facts"}',
                 '{"topic": "facts", "value": 1}', '{"topic": "\u202ein", "value": {}}']))
        elif op == "truncate":
            text = dumps(row) if not isinstance(row, str) else row
            rows[i] = text[: draw(st.integers(0, len(text)))]
        elif op == "junk":
            rows.insert(i, draw(st.text(max_size=20)))
    return "\n".join(r if isinstance(r, str) else dumps(r) for r in rows) + "\n"


@FUZZ
@given(jsonl_files(), st.sampled_from([None, "sim-1", "\u202e", ""]))
def test_from_jsonl_is_a_log_or_a_log_file_error(text: str, wid: str | None) -> None:
    path = Path(f"/tmp/fx-fuzz-{id(text)}.jsonl")
    try:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            log = WorkloadLog.from_jsonl(path, wid or None)
        except LogFileError as exc:
            assert exc.line >= 0
            return
        for view in log.views.values():
            for rec in view:
                try:
                    view.get(rec.offset)
                except LogGap as gap:
                    assert gap.why == "undecodable"
    finally:
        path.unlink(missing_ok=True)


def test_from_jsonl_reads_the_golden_log() -> None:
    log = WorkloadLog.from_jsonl(GOLDEN)
    assert sum(len(v) for v in log.views.values()) > 10


# --------------------------------------------------------------------------- receipts

_SIGNER = ReceiptSigner.generate(node_id="fz-node")


def _receipt() -> dict[str, Any]:
    from fx_integer.receipt import RECEIPT_VERSION, input_hash, output_hash

    signer = ReceiptSigner(_SIGNER.key, node_id="fz-node")
    return signer.sign({
        "receipt_version": RECEIPT_VERSION, "kind": bs.INFERENCE_KIND, "model_hash": "a" * 64,
        "engine": {"name": "integer", "version": "0", "backend": "oracle", "device_class": "cpu"},
        "context": {"workload_id": "fz", "effect_id": "fz/0/0@1", "epoch": 1,
                    "request_hash": "sha256:" + "c" * 64, "manifest_hash": "sha256:" + "d" * 64},
        "prompt_tokens": [1, 2, 3], "input_hash": input_hash([1, 2, 3]),
        "prompt_text_hash": "e" * 64, "output_text_hash": "f" * 64,
        "params": {"max_tokens": 2, "seed": 0, "stop_token": None, "temperature_q16": 0,
                   "top_k": 0, "top_p_q16": 65536},
        "output_tokens": [4, 5], "output_hash": output_hash([4, 5]), "logits_digest": "b" * 64,
    })


RECEIPT = _receipt()
receipt_values = hostile_values | st.sampled_from([[10**9], [-1], [], [True], list(range(5000)),
                                                   {"max_tokens": 10**9}, "A" * 64, "a" * 63])


@st.composite
def hostile_receipts(draw: st.DrawFn) -> Any:
    receipt: Any = json.loads(json.dumps(RECEIPT))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["set", "set", "set", "drop", "add", "param", "whole"]))
        if op == "set":
            receipt[draw(st.sampled_from(sorted(RECEIPT)))] = draw(receipt_values)
        elif op == "drop":
            receipt.pop(draw(st.sampled_from(sorted(RECEIPT))), None)
        elif op == "add":
            receipt[draw(st.sampled_from(["extra", "\u202e", "signature\x00"]))] = 1
        elif op == "param" and isinstance(receipt.get("params"), dict):
            receipt["params"][draw(st.sampled_from(sorted(RECEIPT["params"])))] = (
                draw(receipt_values))
        elif op == "whole":
            return draw(hostile_values)
    # values as they come out of a JSON decoder (Raw leaves become what JSON makes of them)
    try:
        return json.loads(dumps(receipt))
    except (ValueError, RecursionError):
        return receipt if not isinstance(receipt, dict) else {**receipt}


@FUZZ
@given(hostile_receipts(), st.none() | hostile_receipts() | st.just(RECEIPT))
def test_receipt_checks_give_reasons_never_exceptions(receipt: Any, prev: Any) -> None:
    result = verify(receipt, prev=prev, reexecute=False)
    assert result.ok is (not result.reasons)
    reasons, _ = check_static(receipt, prev=prev)
    assert reasons == result.reasons
    if receipt is not RECEIPT and receipt != RECEIPT:
        assert not result.ok or prev is None


@pytest.mark.parametrize("depth", [100, 1500])
def test_receipt_with_deeply_nested_engine_fails_with_a_reason(depth: int) -> None:
    nested: Any = 1
    for _ in range(depth):
        nested = {"a": nested}
    for bad in ({**RECEIPT, "engine": {"x": nested}}, {**RECEIPT, "kind": "x"}):
        result = verify(bad, prev=bad, reexecute=False)
        assert not result.ok and result.reasons


@settings(FUZZ, max_examples=60)
@given(hostile_receipts())
def test_receipt_reexecution_on_hostile_receipts(synth_path: Path, receipt: Any) -> None:
    result = verify(receipt, artifact_path=synth_path, reexecute=True)
    assert not result.ok or receipt == RECEIPT


@FUZZ
@given(st.lists(st.sampled_from([json.dumps(RECEIPT), "[", "[1]", "{}", deep(3000).text,
                                 "NaN", '{"a":' + "9" * 5000 + "}", "\x00", ""]), max_size=4))
def test_load_receipts_is_a_list_or_a_value_error(lines: list[str]) -> None:
    path = Path(f"/tmp/fx-fuzz-receipt-{id(lines)}.jsonl")
    try:
        path.write_text("\n".join(lines))
        try:
            receipts = load_receipts(path)
        except ValueError:
            return
        assert all(isinstance(r, dict) for r in receipts)
    finally:
        path.unlink(missing_ok=True)


@FUZZ
@given(record_bytes())
def test_trusted_decode_of_any_bytes_is_a_record_or_a_typed_error(raw: bytes) -> None:
    """``decode_trusted`` (replay with ``trust_log``) checks less than ``decode``, but on any
    bytes it still returns a record or raises ``DecodeError`` with a code from the closed set;
    and on bytes the strict decoder accepts, it returns the same record."""
    try:
        trusted = bs.decode_trusted(raw)
    except bs.DecodeError as exc:
        assert exc.code in bs.DECODE_CODES, exc.code
        trusted = None
    try:
        strict = bs.decode(raw)
    except bs.DecodeError:
        return
    assert trusted == strict
