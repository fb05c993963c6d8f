"""The committed trust vectors (tests/data/receipt_vectors/trust.json, made by make_trust.py):
issue 31's three weaknesses as data a verifier written from the docs can run, and the project's
own verdicts on them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from broker_schema import ResponseRecord, decode, signatures
from broker_schema.canonical import canonical_json
from broker_schema.key_history import (
    KeyHistory,
    TrustedKey,
    build_history,
    file_receipt_key_problem,
    ledger_key_judge,
    receipt_key_problem,
    response_signer,
)
from broker_schema.records import KeyCertRecord, KeyRevokeRecord
from fx_integer import ledger as L

VECTORS = Path(__file__).resolve().parents[2] / "data" / "receipt_vectors"
TRUST = json.loads((VECTORS / "trust.json").read_text(encoding="utf-8"))
CASES = {c["name"]: c for c in TRUST["cases"]}


def test_the_vectors_are_what_make_trust_writes() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_trust", VECTORS / "make_trust.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert json.loads(json.dumps(module.build())) == TRUST
    assert {c["weakness"] for c in TRUST["cases"]} == {1, 2, 3}


def _history(case: dict[str, Any]) -> KeyHistory | None:
    if case["sys_keys"] is None:
        return None
    fleet = signatures.public_key_from_text(TRUST["fleet_key"]["public_key_b64"])
    records = []
    for i, rec in enumerate(case["sys_keys"]):
        decoded = decode(canonical_json(rec))
        assert isinstance(decoded, KeyCertRecord | KeyRevokeRecord)
        records.append((i, decoded))
    history = build_history(records, [fleet])
    assert history.ignored == []
    return history


def _audit(case: dict[str, Any], history: KeyHistory | None) -> L.Audit:
    node = case["node"]
    values = [(e["offset"], e["value"].encode("utf-8"), e["append_us"]) for e in case["ledger"]]
    if history is None:
        return L.audit(values, node, [bytes.fromhex(k) for k in case["keys"]])
    return L.audit(values, node, history.public_keys(node),
                   key_problem=ledger_key_judge(history, node))


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["weakness"] in (1, 2)])
def test_ledger_cases(name: str) -> None:
    case = CASES[name]
    expect = case["expect"]
    found = _audit(case, _history(case))
    assert found.foreign == expect["foreign_leaves"]
    if "problem_kinds" in expect:
        assert sorted({k for k, _ in found.problems}) == expect["problem_kinds"]
    if "trusted_checkpoint_offsets" in expect:
        assert found.checkpoint_offsets == expect["trusted_checkpoint_offsets"]
        refused = [int(m.split(":")[0].removeprefix("offset "))
                   for k, m in found.problems if k == "signature"]
        assert refused == expect["refused_checkpoint_offsets"]
    for item in expect.get("included", []):
        index = found.find(item["receipt"])
        assert index is not None
        latest = found.latest
        assert latest is not None
        included = index not in found.foreign and index < latest.size and L.verify_inclusion(
            L.leaf_hash(L.leaf_data(item["receipt"])), index, latest.size,
            found.tree.inclusion_proof(index, latest.size), latest.root)
        assert included is item["included"], item["receipt"].get("seq")
    if "executor_extends" in expect:  # LedgerWriter refuses a ledger with a foreign leaf
        assert (not found.foreign) is expect["executor_extends"]


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["weakness"] == 3])
def test_response_cases(name: str) -> None:
    case = CASES[name]
    history = _history(case)
    assert history is not None
    response = ResponseRecord.model_validate(case["response"])
    assert response.receipt is not None
    receipt = response.receipt["integer"]
    assert isinstance(receipt, dict)
    key = bytes.fromhex(str(receipt["public_key"]))
    if case["appended_us"] is None:  # a file: undated, the ledger may vouch for it
        found = _audit(case, history) if case["ledger"] else None

        def logged_before(cut: int) -> str | None:
            return None if found is None else L.logged_before_note(found, receipt, cut)

        problem, note = file_receipt_key_problem(history, case["node"], key, logged_before)
        assert (problem is None) is case["expect"]["trusted"], problem
        assert (note is not None) is case["expect"]["trusted"]
        # dated by its own finished_us (what a back-dating thief chooses) it would have passed
        if not case["expect"]["trusted"]:
            assert response.timing is not None
            assert history.key_problem(case["node"], key, response.timing.finished_us) is None
    else:
        signer = response_signer(response, [], history, appended_us=case["appended_us"])
        receipt_problem = receipt_key_problem(response, key, [], history,
                                              appended_us=case["appended_us"])
        trusted = isinstance(signer, TrustedKey) and receipt_problem is None
        assert trusted is case["expect"]["trusted"], (signer, receipt_problem)
