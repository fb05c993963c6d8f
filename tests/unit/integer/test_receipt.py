from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fx_integer.engine import IntegerEngine, ParamError
from fx_integer.receipt import GENESIS, ReceiptSigner, receipt_hash
from fx_integer.verifier import verify, verify_chain


@pytest.fixture(scope="module")
def signer() -> ReceiptSigner:
    return ReceiptSigner.generate(node_id="node-a")


@pytest.fixture(scope="module")
def synth_engine(synth_path: Path, signer: ReceiptSigner) -> IntegerEngine:
    return IntegerEngine(synth_path, signer=signer)


@pytest.fixture(scope="module")
def chain(synth_engine: IntegerEngine) -> list[dict[str, Any]]:
    r1 = synth_engine.run({"prompt": "the cat", "max_tokens": 5})
    r2 = synth_engine.run({"prompt_tokens": [1, 50, 60, 70], "max_tokens": 4,
                           "temperature": 0.8, "seed": 3, "top_k": 20, "top_p": 0.9})
    return [r1["receipt"], r2["receipt"]]


def test_run_result_shape(synth_engine: IntegerEngine) -> None:
    out = synth_engine.run({"prompt": "hi", "max_tokens": 3})
    json.dumps(out)
    assert len(out["output_tokens"]) == 3
    assert out["receipt"]["model_hash"] == synth_engine.model_hash
    assert synth_engine.name and synth_engine.version and synth_engine.device_class == "cpu"


def test_engine_refuses_wrong_hash(synth_path: Path) -> None:
    from fx_integer.artifact import ArtifactError

    with pytest.raises(ArtifactError):
        IntegerEngine(synth_path, expected_model_hash="ab" * 32)


def test_params_validation(synth_engine: IntegerEngine) -> None:
    for bad in ({}, {"prompt": "x", "prompt_tokens": [1]}, {"prompt": "x", "max_tokens": 0},
                {"prompt": "x", "bogus": 1}, {"prompt_tokens": [10**6]},
                {"prompt": "x", "top_p": 0}, {"prompt": "x", "temperature": -1},
                # never read loosely: a bool or a float is not an integer parameter
                {"prompt": "x", "top_k": True}, {"prompt": "x", "top_k": 3.9},
                {"prompt": "x", "seed": -1}, {"prompt": "x", "seed": 2**64},
                {"prompt": "x", "seed": "7"}):
        with pytest.raises(ParamError):
            synth_engine.run(bad)


def test_sampling_is_reproducible_and_batch_invariant(synth_engine: IntegerEngine) -> None:
    p = {"prompt_tokens": [1, 9, 8, 7], "max_tokens": 6, "temperature": 1.3, "seed": 99}
    a = synth_engine.run(p)
    b = synth_engine.run_batch([{"prompt": "other", "max_tokens": 2}, p])[1]
    assert a["output_tokens"] == b["output_tokens"]
    assert a["receipt"]["logits_digest"] == b["receipt"]["logits_digest"]
    c = synth_engine.run({**p, "seed": 100})
    assert c["receipt"]["params"]["seed"] == 100


def test_chain_verifies(chain: list[dict[str, Any]], synth_path: Path) -> None:
    assert chain[0]["prev_receipt_hash"] == GENESIS or chain[0]["seq"] > 0
    assert chain[1]["prev_receipt_hash"] == receipt_hash(chain[0])
    res = verify_chain(chain, artifact_path=synth_path)
    assert [r.ok for r in res] == [True, True], [r.reasons for r in res]


@pytest.mark.parametrize("field,value,reason", [
    ("output_tokens", "bump", "output_tokens differ"),
    ("logits_digest", "0" * 64, "logits_digest"),
    ("model_hash", "1" * 64, "cannot load the committed artifact"),
    ("prompt_tokens", [1, 2], "input_hash"),
    ("params", "seed", "output_tokens differ"),  # max_tokens changed
])
def test_any_changed_byte_fails(chain: list[dict[str, Any]], synth_path: Path, field: str,
                                value: Any, reason: str) -> None:
    r = json.loads(json.dumps(chain[1]))
    if value == "bump":
        r["output_tokens"][-1] = (r["output_tokens"][-1] + 1) % 300
    elif value == "seed":
        r["params"]["max_tokens"] -= 1
    else:
        r[field] = value
    res = verify(r, artifact_path=synth_path, prev=chain[0])
    assert not res.ok
    assert any("signature" in x for x in res.reasons)
    assert any(reason in x for x in res.reasons), res.reasons


def test_resigned_forgery_fails_reexecution(chain: list[dict[str, Any]],
                                            synth_path: Path) -> None:
    forger = ReceiptSigner.generate(node_id="evil")
    body = {k: v for k, v in chain[0].items()
            if k not in ("signature", "node_id", "seq", "prev_receipt_hash", "public_key")}
    body["output_tokens"] = [*body["output_tokens"][:-1], (body["output_tokens"][-1] + 1) % 300]
    from fx_integer.receipt import output_hash

    body["output_hash"] = output_hash(body["output_tokens"])
    forged = forger.sign(body)
    res = verify(forged, artifact_path=synth_path)
    assert not res.ok and any("output_tokens differ" in x for x in res.reasons)
    res = verify(forged, artifact_path=synth_path, trusted_keys=[chain[0]["public_key"]])
    assert any("not trusted" in x for x in res.reasons)


def test_chain_break_detected(chain: list[dict[str, Any]], synth_path: Path) -> None:
    res = verify(chain[1], artifact_path=synth_path, prev=chain[1], reexecute=False)
    assert not res.ok and any("chain broken" in x for x in res.reasons)


def test_signer_key_persistence(tmp_path: Path) -> None:
    a = ReceiptSigner.load_or_create(tmp_path / "k.pem", node_id="n")
    b = ReceiptSigner.load_or_create(tmp_path / "k.pem", node_id="n")
    assert a.public_key_hex == b.public_key_hex


def test_full_model_greedy_generation_and_receipt(real_path: Path) -> None:
    """The 30-layer model: a short greedy answer, signed, and verified by re-execution."""
    eng = IntegerEngine.cached(real_path)
    eng.signer = ReceiptSigner.generate(node_id="full")
    out = eng.run({"prompt": "What is the capital of France?", "chat": True, "max_tokens": 10})
    eng.signer = None
    assert out["text"] == "The capital of France is Paris."
    assert out["finish_reason"] == "stop"
    res = verify(out["receipt"], artifact_path=real_path)
    assert res.ok, res.reasons


@pytest.mark.parametrize("change", [
    {"prompt_tokens": 5},
    {"output_tokens": ["1", "2"]},
    {"params": {"max_tokens": 4}},
    {"params": None},
    {"signature": 12345},
    {"public_key": "zz" * 32},
    {"seq": "3"},
    {"model_hash": "../../../etc/passwd"},
])
def test_malformed_receipt_fails_with_a_reason_never_an_exception(
        chain: list[dict[str, Any]], synth_path: Path, change: dict[str, Any]) -> None:
    bad = {**chain[0], **change}
    for reexecute in (False, True):
        res = verify(bad, artifact_path=synth_path, reexecute=reexecute)
        assert not res.ok and res.reasons
        assert all(r.startswith("malformed receipt: ") for r in res.reasons), res.reasons
    # and as the second link of a chain, with a malformed first link
    res = verify(chain[1], artifact_path=synth_path, prev={**chain[0], "seq": "0"},
                 reexecute=False)
    assert not res.ok and any("chain broken" in r for r in res.reasons)
    assert not verify([1, 2], reexecute=False).ok  # type: ignore[arg-type]


def test_reexecution_holds_receipt_params_to_request_ranges(
        synth_engine: IntegerEngine) -> None:
    from fx_integer.engine import reexecute_receipt
    from fx_integer.sampling import SamplingParams

    receipt = synth_engine.run({"prompt": "the cat", "max_tokens": 2})["receipt"]
    for params in ({"temperature_q16": -65536}, {"top_p_q16": 0}, {"top_k": -1},
                   {"seed": -1}, {"max_tokens": 0}, {"max_tokens": 10**6},
                   {"temperature_q16": 2**62}):
        bad = {**receipt, "params": {**receipt["params"], **params}}
        with pytest.raises(ParamError):
            reexecute_receipt(synth_engine, bad)
    with pytest.raises(ValueError):
        SamplingParams(temperature_q16=-1)
    # a temperature past the int64-safe range is a parameter error, not an engine failure
    with pytest.raises(ParamError):
        synth_engine.run({"prompt": "x", "max_tokens": 1, "temperature": 1e20})


def test_receipt_file_of_non_objects_is_a_value_error(tmp_path: Path) -> None:
    from fx_integer.receipt import load_receipts

    for text in ("[1, 2]", "5", "[[1]]", '{"a": 1}\n7\n'):
        f = tmp_path / "r.json"
        f.write_text(text)
        with pytest.raises(ValueError, match="JSON object"):
            load_receipts(f)


def test_secp256k1_receipts_chain_and_verify(synth_path: Path) -> None:
    signer = ReceiptSigner.generate(node_id="node-k", key_type="secp256k1")
    eng = IntegerEngine(synth_path, signer=signer)
    chain = [eng.run({"prompt": "the cat", "max_tokens": 3})["receipt"],
             eng.run({"prompt_tokens": [1, 50, 60], "max_tokens": 3, "temperature": 0.7,
                      "seed": 5})["receipt"]]
    assert len(chain[0]["public_key"]) == 66 and chain[0]["public_key"][:2] in ("02", "03")
    assert len(chain[0]["signature"]) == 128
    res = verify_chain(chain, artifact_path=synth_path)
    assert [r.ok for r in res] == [True, True], [r.reasons for r in res]
    tampered = json.loads(json.dumps(chain[1]))
    tampered["params"]["seed"] = 6
    bad = verify(tampered, artifact_path=synth_path, prev=chain[0], reexecute=False)
    assert not bad.ok and any("signature" in x for x in bad.reasons)
    # an Ed25519 key's receipt is not a secp256k1 one's: another key, another chain
    other = ReceiptSigner.generate(node_id="node-k").sign(
        {k: v for k, v in chain[1].items()
         if k not in ("signature", "node_id", "seq", "prev_receipt_hash", "public_key")})
    broken = verify(other, artifact_path=synth_path, prev=chain[0], reexecute=False)
    assert any("chain broken" in x for x in broken.reasons)
