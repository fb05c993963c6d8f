"""Receipt format 2: the receipt binds its context (workload, effect id, request hash, epoch,
manifest hash) and the prompt and output texts; ``check_record`` holds a response record to
them. Each binding is tampered with alone (re-signed by the node's own key, so only that binding
can catch it) and refused with its specific reason."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest

from broker_schema import record_hash, signatures
from broker_schema.records import EffectHeader, EffectRequest, InlineBody, ResponseRecord, Signature
from executor.verify_workload import ReceiptCheck, _check_context
from fx_integer.engine import IntegerEngine
from fx_integer.receipt import (
    RECEIPT_VERSION,
    ReceiptSigner,
    receipt_context,
    text_hash,
)
from fx_integer.verifier import check_record, verify

PROMPT = "the cat"
MANIFEST = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def signer() -> ReceiptSigner:
    return ReceiptSigner.generate(node_id="node-c")


@pytest.fixture(scope="module")
def request_record(synth_path: Path) -> EffectRequest:
    model = "sha256:" + IntegerEngine.cached(synth_path).model_hash
    return EffectRequest(header=EffectHeader(workload_id="wl-a", input_offset=4, index=0, epoch=2),
                         effect_kind="ninelives:inference/run@0.1.0", model=model,
                         params={"prompt": PROMPT, "max_tokens": 3}, deadline_ms=60_000)


@pytest.fixture(scope="module")
def bound(synth_path: Path, signer: ReceiptSigner, request_record: EffectRequest
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(receipt, the signed response record carrying it)."""
    eng = IntegerEngine(synth_path, signer=signer)
    ctx = receipt_context(workload_id="wl-a", effect_id=request_record.effect_id, epoch=2,
                          request_hash=record_hash(request_record), manifest_hash=MANIFEST)
    out = eng.run({"prompt": PROMPT, "max_tokens": 3}, ctx)
    resp = ResponseRecord(
        effect_id=request_record.effect_id, header=request_record.header, request_offset=7,
        outcome="ok", model_hash="sha256:" + eng.model_hash, written_by="node-c",
        output=InlineBody.of_json({"text": out["text"], "finish_reason": out["finish_reason"],
                                   "output_tokens": out["output_tokens"],
                                   "prompt_token_count": len(out["prompt_tokens"])}),
        receipt={"manifest_hash": MANIFEST, "integer": out["receipt"]})
    return out["receipt"], _sign(resp.model_dump(mode="json"), signer)


def _sign(record: dict[str, Any], signer: ReceiptSigner) -> dict[str, Any]:
    """Re-sign a response record with the node key (as a node reusing a receipt would)."""
    resp = ResponseRecord.model_validate({**record, "signature": None})
    raw = bytes.fromhex(signer.public_key_hex)
    sig = Signature(key_id=signatures.key_id(raw),
                    value=base64.b64encode(signer.key.sign(resp.signing_bytes())).decode())
    return resp.model_copy(update={"signature": sig}).model_dump(mode="json")


def _resign(receipt: dict[str, Any], signer: ReceiptSigner, **change: Any) -> dict[str, Any]:
    body = {k: v for k, v in copy.deepcopy(receipt).items()
            if k not in ("signature", "node_id", "seq", "prev_receipt_hash", "public_key")}
    body.update(change)
    return ReceiptSigner(signer.key, node_id=signer.node_id).sign(body)


def test_a_bound_receipt_and_its_record_verify(bound: tuple[dict[str, Any], dict[str, Any]],
                                               synth_path: Path,
                                               request_record: EffectRequest) -> None:
    receipt, record = bound
    assert receipt["receipt_version"] == RECEIPT_VERSION == 2
    assert receipt["context"] == {"workload_id": "wl-a", "effect_id": "wl-a/4/0@2", "epoch": 2,
                                  "request_hash": record_hash(request_record),
                                  "manifest_hash": MANIFEST}
    assert receipt["prompt_text_hash"] == text_hash(PROMPT)
    assert receipt["output_text_hash"] == text_hash(record["output"]["data"]["text"])
    res = verify(receipt, artifact_path=synth_path)
    assert res.ok, res.reasons
    assert "output_text_hash == decoding of output_tokens" in res.checks and not res.notes
    reasons, passed, _ = check_record(record, receipt)
    assert not reasons, reasons
    assert "response signature (by the receipt's key)" in passed
    check = ReceiptCheck(offset=0, effect_id=record["effect_id"], node_id="node-c", seq=0,
                         text="")
    _check_context(check, receipt, request_record)
    assert check.ok and check.checks, check.reasons


def _moved(record: dict[str, Any], **header: Any) -> dict[str, Any]:
    h = EffectHeader.model_validate({**record["header"], **header})
    return {**record, "header": h.model_dump(mode="json"), "effect_id": h.effect_id}


@pytest.mark.parametrize("tamper,reason", [
    (lambda r: _moved(r, workload_id="wl-b"), "workload: the response is on 'wl-b'"),
    (lambda r: _moved(r, index=1), "effect id: the response is 'wl-a/4/1@2'"),
    (lambda r: _moved(r, epoch=3), "epoch: the response is at epoch 3"),
    (lambda r: {**r, "receipt": {**r["receipt"], "manifest_hash": "sha256:" + "cd" * 32}},
     "manifest: the response names manifest"),
    (lambda r: {**r, "model_hash": "sha256:" + "ef" * 32}, "model: the response names"),
    (lambda r: {**r, "output": {**r["output"], "data": {**r["output"]["data"], "text": "x"}}},
     "output text: the sha256 of the response's text is not the receipt's output_text_hash"),
    (lambda r: {**r, "written_by": "node-z"}, "node: the response was written by 'node-z'"),
])
def test_each_record_binding_is_checked(bound: tuple[dict[str, Any], dict[str, Any]],
                                        signer: ReceiptSigner, tamper: Any, reason: str) -> None:
    receipt, record = bound
    changed = _sign(tamper(copy.deepcopy(record)), signer)  # the node itself re-signs it
    reasons, _, _ = check_record(changed, receipt)
    assert any(r.startswith(reason) for r in reasons), reasons
    # unsigned by the node, the change also breaks the record's signature
    reasons, _, _ = check_record({**tamper(copy.deepcopy(record)), "signature":
                                  record["signature"]}, receipt)
    assert any("not signed by the receipt's key" in r for r in reasons), reasons


def test_a_changed_context_breaks_the_signature(
        bound: tuple[dict[str, Any], dict[str, Any]]) -> None:
    receipt, _ = bound
    for field, value in (("workload_id", "wl-b"), ("effect_id", "wl-a/4/1@2"), ("epoch", 3),
                         ("request_hash", "sha256:" + "0" * 64),
                         ("manifest_hash", "sha256:" + "1" * 64)):
        bad = copy.deepcopy(receipt)
        bad["context"][field] = value
        res = verify(bad, reexecute=False)
        assert not res.ok and any("signature does not verify" in r for r in res.reasons), field
    for field in ("prompt_text_hash", "output_text_hash"):
        res = verify({**receipt, field: "2" * 64}, reexecute=False)
        assert any("signature does not verify" in r for r in res.reasons), field


def test_request_and_prompt_bindings(bound: tuple[dict[str, Any], dict[str, Any]],
                                     signer: ReceiptSigner,
                                     request_record: EffectRequest) -> None:
    receipt, record = bound

    def check(rcpt: dict[str, Any], req: EffectRequest) -> list[str]:
        c = ReceiptCheck(offset=0, effect_id=record["effect_id"], node_id="node-c", seq=0,
                         text="")
        _check_context(c, rcpt, req)
        return c.reasons

    other = request_record.model_copy(update={"deadline_ms": 59_999})
    assert any(r.startswith("request: the receipt was signed for request")
               for r in check(receipt, other))
    wrong_prompt = _resign(receipt, signer, prompt_text_hash=text_hash("the dog"))
    assert any(r.startswith("prompt text:") for r in check(wrong_prompt, request_record))


def test_receipt_internal_checks(bound: tuple[dict[str, Any], dict[str, Any]],
                                 signer: ReceiptSigner, synth_path: Path) -> None:
    receipt, _ = bound
    elsewhere = _resign(receipt, signer, context={**receipt["context"], "workload_id": "wl-b"})
    res = verify(elsewhere, reexecute=False)
    assert any("does not name workload 'wl-b'" in r for r in res.reasons), res.reasons
    wrong_text = _resign(receipt, signer, output_text_hash=text_hash("not it"))
    res = verify(wrong_text, artifact_path=synth_path)
    assert res.reasons == ["output_text_hash is not the hash of the decoding of output_tokens"]
    for bad_ctx in ({"workload_id": "wl-a"}, "wl-a", {**receipt["context"], "epoch": 0},
                    {**receipt["context"], "request_hash": "ab" * 32}):
        res = verify({**receipt, "context": bad_ctx}, reexecute=False)
        assert res.reasons and all(r.startswith("malformed receipt: ") for r in res.reasons)


@pytest.mark.parametrize("version", [1, 4, "2", None])
def test_unknown_versions_are_refused(bound: tuple[dict[str, Any], dict[str, Any]],
                                      version: Any, synth_path: Path) -> None:
    receipt, _ = bound
    res = verify({**receipt, "receipt_version": version}, artifact_path=synth_path)
    assert res.reasons == [f"unknown receipt_version {version!r}: this verifier reads versions "
                           "2, 3 only (version 1 receipts bound no request context and are not "
                           "accepted)"]


def test_an_unbound_receipt_says_so(synth_path: Path, signer: ReceiptSigner,
                                    bound: tuple[dict[str, Any], dict[str, Any]]) -> None:
    eng = IntegerEngine(synth_path, signer=ReceiptSigner(signer.key, node_id="node-c"))
    unbound = eng.run({"prompt_tokens": [1, 2, 3], "max_tokens": 2})["receipt"]
    assert unbound["context"] is None and unbound["prompt_text_hash"] is None
    res = verify(unbound, artifact_path=synth_path)
    assert res.ok and any("binds no context" in n for n in res.notes)
    _, record = bound
    reasons, _, _ = check_record({**record, "receipt": {**record["receipt"],
                                                        "integer": unbound}}, unbound)
    assert any("binds no context" in r for r in reasons)
