"""Teacher-forced re-execution (``generation.teacher_force``, the verifier's default) gives
exactly what the step-by-step decode gives: the same tokens and the same logits digest for
truthful receipts (greedy and sampled) and for every kind of tampered output, and ``verify``
fails a tampered receipt with the same reasons either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fx_integer.artifact import Artifact
from fx_integer.engine import IntegerEngine, reexecute_receipt
from fx_integer.generation import GenRequest, generate_batch, teacher_force
from fx_integer.oracle import OracleOps
from fx_integer.receipt import ReceiptSigner, output_hash
from fx_integer.sampling import SamplingParams
from fx_integer.verifier import verify

GREEDY = SamplingParams()
SAMPLED = (SamplingParams(temperature_q16=52429, seed=3),  # 0.8
           SamplingParams(temperature_q16=85197, top_k=20, seed=11),  # 1.3, top_k
           SamplingParams(temperature_q16=65536, top_p_q16=58982, seed=5),  # top_p 0.9
           SamplingParams(temperature_q16=45875, top_k=40, top_p_q16=62259, seed=2**63 + 9))


def _variants(out: list[int], vocab: int) -> list[list[int]]:
    """Claimed outputs a forger or a broken producer could present, around the true one."""
    v = [list(out), [], out[:1], out[:-1], [*out, out[-1]], [*out, 1, 2, 3]]
    for i in range(len(out)):
        v.append([*out[:i], (out[i] + 1) % vocab, *out[i + 1:]])
    v.append([*out[:2], -1, *out[3:]])
    v.append([*out[:1], vocab + 5, *out[2:]])
    return v


@pytest.mark.parametrize("sp", [GREEDY, *SAMPLED], ids=lambda s: f"t{s.temperature_q16}")
def test_teacher_force_equals_step_by_step(synth_oracle: OracleOps, sp: SamplingParams) -> None:
    vocab = synth_oracle.config.vocab_size
    for prompt, max_tokens, stop in (((1, 9, 8, 7), 7, None), ((5,), 5, None),
                                     ((3, 40, 41, 42, 43, 44), 6, 17), ((2, 2), 1, None)):
        req = GenRequest(prompt_tokens=prompt, max_tokens=max_tokens, sampling=sp,
                         stop_token=stop)
        ref = generate_batch(synth_oracle, [req])[0]
        for claimed in _variants(ref.output_tokens, vocab):
            got = teacher_force(synth_oracle, req, claimed)
            assert got.output_tokens == ref.output_tokens, (prompt, claimed)
            assert got.logits_digest == ref.logits_digest, (prompt, claimed)


def test_teacher_force_stops_where_the_decode_stops(synth_oracle: OracleOps) -> None:
    """A claimed output that runs past the stop token: the decode stops at the stop token."""
    req0 = GenRequest(prompt_tokens=(1, 2, 3), max_tokens=8, sampling=SAMPLED[0],
                      stop_token=None)
    free = generate_batch(synth_oracle, [req0])[0].output_tokens
    stop = free[2]
    req = GenRequest(prompt_tokens=(1, 2, 3), max_tokens=8, sampling=SAMPLED[0],
                     stop_token=stop)
    ref = generate_batch(synth_oracle, [req])[0]
    assert ref.output_tokens[-1] == stop and len(ref.output_tokens) <= 3
    got = teacher_force(synth_oracle, req, free)
    assert (got.output_tokens, got.logits_digest) == (ref.output_tokens, ref.logits_digest)


# ------------------------------------------------------------------ through the verifier


@pytest.fixture(scope="module")
def tf_engine(synth_path: Path) -> IntegerEngine:
    return IntegerEngine(synth_path, signer=ReceiptSigner.generate(node_id="tf"))


def _resign(receipt: dict[str, Any], **changes: Any) -> dict[str, Any]:
    body = {k: v for k, v in receipt.items()
            if k not in ("signature", "node_id", "seq", "prev_receipt_hash", "public_key")}
    body.update(changes)
    if "output_tokens" in changes:
        body["output_hash"] = output_hash(body["output_tokens"])
    return ReceiptSigner.generate(node_id="forger").sign(body)


REQUESTS = ({"prompt": "the cat", "max_tokens": 6},
            {"prompt_tokens": [1, 50, 60, 70], "max_tokens": 5, "temperature": 0.8, "seed": 3,
             "top_k": 20, "top_p": 0.9},
            {"prompt_tokens": [4, 5, 6], "max_tokens": 6, "temperature": 1.5, "seed": 77})


@pytest.mark.parametrize("params", REQUESTS, ids=["greedy", "topk-topp", "temperature"])
def test_verify_same_reasons_teacher_forced_and_step_by_step(
        tf_engine: IntegerEngine, synth_path: Path, params: dict[str, Any]) -> None:
    r = tf_engine.run(params)["receipt"]
    assert reexecute_receipt(tf_engine, r) == reexecute_receipt(tf_engine, r, step_by_step=True)
    toks = r["output_tokens"]
    tampered = {
        "genuine": r,
        "token": _resign(r, output_tokens=[*toks[:2], (toks[2] + 1) % 300, *toks[3:]]),
        "last-token": _resign(r, output_tokens=[*toks[:-1], (toks[-1] + 1) % 300]),
        "shorter": _resign(r, output_tokens=toks[:-2]),
        "digest": _resign(r, logits_digest=("0" if r["logits_digest"][0] != "0" else "1")
                          + r["logits_digest"][1:]),
    }
    for name, rc in tampered.items():
        tf = verify(rc, artifact_path=synth_path, backend="oracle")
        sbs = verify(rc, artifact_path=synth_path, backend="oracle", step_by_step=True)
        assert tf.reasons == sbs.reasons, name
        assert tf.ok == sbs.ok == (name == "genuine"), (name, tf.reasons)
        assert "re-executed on oracle, teacher-forced" in tf.checks
        assert "re-executed on oracle, step by step" in sbs.checks
        if name in ("token", "last-token", "shorter"):
            assert any(x.startswith("output_tokens differ from re-execution at index")
                       for x in tf.reasons), tf.reasons
        if name == "digest":
            assert tf.reasons == ["logits_digest differs from the oracle's: the producer's "
                                  "logits were not byte-identical"]
        if name == "token":
            assert any(x.startswith("output_tokens differ from re-execution at index 2: ")
                       for x in tf.reasons), tf.reasons


def test_real_model_receipts_teacher_forced(real: Artifact) -> None:
    """On SmolLM2: a greedy and a sampled receipt re-execute to the same tokens and digest both
    ways, and a changed token is found at its index both ways."""
    eng = IntegerEngine.from_artifact(real)
    for params in ({"prompt": "The capital of France is", "max_tokens": 6},
                   {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.9,
                    "seed": 12, "top_k": 40, "top_p": 0.95}):
        r = eng.run(params)["receipt"]
        tf = reexecute_receipt(eng, r)
        assert tf == (r["output_tokens"], r["logits_digest"])
        assert reexecute_receipt(eng, r, step_by_step=True) == tf
        bad = dict(r, output_tokens=[*r["output_tokens"][:3], (r["output_tokens"][3] + 1)
                                     % real.config.vocab_size, *r["output_tokens"][4:]])
        assert reexecute_receipt(eng, bad) == reexecute_receipt(eng, bad, step_by_step=True)
