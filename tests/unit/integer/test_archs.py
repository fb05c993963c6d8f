"""The seed's architectures from GGUF, on the SYNTHETIC models of fx_integer.synthetic_gguf.

* The converter reads each architecture the way llama.cpp does (checked field by field here, and
  against llama.cpp itself on the same file when llama-cpp-python is installed).
* oracle-native is byte-identical to the numpy oracle on every one, across batch mixes, split
  prefill, thread counts and prompts longer than the sliding window.
* A GGUF the engine cannot run is refused with an error naming what is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fx_integer import artifact, gguf_import, synthetic_gguf
from fx_integer.float_ref import FloatOps
from fx_integer.forward import KVCache, forward
from fx_integer.int_kernel import NativeOps
from fx_integer.oracle import OracleOps
from fx_integer.tokenizer import Tokenizer

TEXT = ("Integer arithmetic makes every backend agree: the same weights and the same rounding "
        "give the same bytes on a laptop, a server and a GPU.")


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("synthetic-gguf")
    return {m: synthetic_gguf.write(m, d / f"{m}.gguf") for m in synthetic_gguf.MODELS}


@pytest.fixture(scope="module")
def arts(ggufs: dict[str, Path]) -> dict[str, artifact.Artifact]:
    return {m: artifact.parse(gguf_import.convert(p)) for m, p in ggufs.items()}


def test_synthetic_files_are_deterministic(tmp_path: Path, ggufs: dict[str, Path]) -> None:
    for m, p in ggufs.items():
        again = synthetic_gguf.write(m, tmp_path / "again.gguf")
        assert again.read_bytes() == p.read_bytes(), m


def test_qwen3_q1_0_config(arts: dict[str, artifact.Artifact]) -> None:
    a = arts["qwen3-q1_0-synthetic"]
    c = a.config
    assert a.format_version == 2 and c.arch == "qwen3"
    assert c.qk_norm == 1 and c.rope_layout == "neox" and c.act == "silu" and not c.layer_kinds
    assert {q["format"] for n, q in a.quant.items() if n.startswith("blk.")} == {"Q1_0"}
    assert a.weight("blk.0.attn_q").group == 128 and a.weight("blk.0.attn_q").qmax == 1
    assert "synthetic" in a.source["general.name"]


def test_cohere2moe_config(arts: dict[str, artifact.Artifact]) -> None:
    a = arts["cohere2moe-synthetic"]
    c = a.config
    assert c.arch == "cohere2moe" and c.parallel_block == 1 and c.norm == "rms"
    # layer 0 full and dense (RoPE kept: a leading dense layer), 4 full without RoPE (NoPE)
    assert c.layer_kinds == "fsssns" and c.window == 16 and c.rope_layout == "interleaved"
    assert (c.n_experts, c.n_experts_used, c.d_ff_expert, c.moe_gating, c.moe_norm_topk,
            c.n_dense_lead) == (4, 2, 256, "softmax", 1, 1)
    assert c.logit_scale_q24 == 1 << 22  # 0.25
    formats = {q["format"] for q in a.quant.values()}
    assert {"Q4_K", "Q6_K", "Q8_0"} <= formats  # the F32 router is requantized to Q8_0
    assert a.quant["blk.1.ffn_gate_inp"]["format"] == "Q8_0"
    assert a.has_weight("blk.1.ffn_down_exps.3") and not a.has_weight("blk.0.ffn_gate_inp")


def _last_rows(ops: object, seqs: list[list[int]], split: int = 0) -> list[bytes]:
    caches = [KVCache(ops) for _ in seqs]  # type: ignore[arg-type]
    if split:
        forward(ops, [(c, s[:split]) for c, s in zip(caches, seqs, strict=True)])  # type: ignore[arg-type]
        seqs = [s[split:] for s in seqs]
    rows = forward(ops, list(zip(caches, seqs, strict=True)), all_logits=True)  # type: ignore[arg-type]
    return [np.ascontiguousarray(r).tobytes() for r in rows]


@pytest.mark.parametrize("model", synthetic_gguf.MODELS)
def test_native_equals_oracle(arts: dict[str, artifact.Artifact], model: str) -> None:
    a = arts[model]
    tok = Tokenizer(a.tokenizer)
    long = tok.encode(TEXT + " " + TEXT)  # 56 tokens: past cohere2moe's window of 16
    short = tok.encode("The capital of France is")
    oracle = OracleOps(a)
    ref_long, ref_short = _last_rows(oracle, [long])[0], _last_rows(oracle, [short])[0]
    for threads in (1, 2):
        native = NativeOps(a, threads=threads)
        assert _last_rows(native, [long])[0] == ref_long, (model, threads)
        assert _last_rows(native, [long, short]) == [ref_long, ref_short], (model, threads)
        assert _last_rows(native, [short, long]) == [ref_short, ref_long], (model, threads)
    # split prefill: the rows after the split are the same rows of the one-pass run
    v = a.config.vocab_size * 8
    assert _last_rows(oracle, [long], split=20)[0] == ref_long[20 * v:]
    assert _last_rows(NativeOps(a, threads=2), [long], split=20)[0] == ref_long[20 * v:]


@pytest.mark.parametrize("model", synthetic_gguf.MODELS)
def test_float_reference_agrees(arts: dict[str, artifact.Artifact], model: str) -> None:
    """The numpy float forward of the same config and weights picks the integer engine's
    next token at (nearly) every position: the integer forward computes the architecture."""
    a = arts[model]
    toks = Tokenizer(a.tokenizer).encode(TEXT)
    li = np.asarray(forward(OracleOps(a), [(KVCache(OracleOps(a)), toks)], all_logits=True)[0])
    fo = FloatOps(a)
    lf = np.asarray(forward(fo, [(KVCache(fo), toks)], all_logits=True)[0])
    assert (li.argmax(1) == lf.argmax(1)).mean() >= 0.95
    assert np.corrcoef(li[-1] / 65536.0, lf[-1])[0, 1] > 0.999


@pytest.mark.parametrize("model", synthetic_gguf.MODELS)
def test_llama_cpp_reads_the_same_architecture(ggufs: dict[str, Path],
                                                arts: dict[str, artifact.Artifact],
                                                model: str) -> None:
    """The same GGUF through llama.cpp: the logits correlate and every integer choice is in
    llama.cpp's top 3 (agreement check of the architecture; figures in docs). The few rows of
    the mixture of experts that correlate less (0.987 at worst) are as far from the numpy float
    forward too: llama.cpp rounds the router's input to 8 bits (Q8_K), which flips a near-tie
    expert choice there."""
    from fx_integer.llamacpp_ref import LlamaCppReference, available

    if not available():
        pytest.skip("llama-cpp-python is not installed (optional extra: pip install '.[llamacpp]')")
    a = arts[model]
    toks = Tokenizer(a.tokenizer).encode(TEXT)
    with LlamaCppReference(ggufs[model], n_ctx=256, n_threads=1) as ref:
        lf = ref.logits(toks)
    o = OracleOps(a)
    li = np.asarray(forward(o, [(KVCache(o), toks)], all_logits=True)[0])
    top3 = np.argsort(-lf, axis=1)[:, :3]
    assert (top3 == li.argmax(1)[:, None]).any(axis=1).all()
    corr = [np.corrcoef(li[j] / 65536.0, lf[j])[0, 1] for j in range(len(toks))]
    assert float(np.median(corr)) > 0.999 and min(corr) > 0.95


def _rewrite(src: Path, dst: Path, *, arch: str | None = None, drop: str | None = None) -> Path:
    """A copy of a GGUF with another architecture name or without one tensor."""
    from gguf import GGUFReader, GGUFWriter

    r = GGUFReader(str(src))
    old = str(r.fields["general.architecture"].contents())
    new = arch or old
    w = GGUFWriter(str(dst), new)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        key = k.replace(f"{old}.", f"{new}.", 1)
        vt = f.types[0]
        if vt.name == "ARRAY":
            w.add_array(key, f.contents())
        else:
            w.add_key_value(key, f.contents(), vt)
    for t in r.tensors:
        if t.name == drop:
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_unsupported_ggufs_are_refused_by_name(ggufs: dict[str, Path], tmp_path: Path) -> None:
    src = ggufs["qwen3-q1_0-synthetic"]
    with pytest.raises(gguf_import.UnsupportedGGUF, match="architecture 'mamba' is not supported"):
        gguf_import.convert(_rewrite(src, tmp_path / "a.gguf", arch="mamba"))
    with pytest.raises(gguf_import.UnsupportedGGUF, match=r"missing tensors \['blk.1.attn_k_norm'"):
        gguf_import.convert(_rewrite(src, tmp_path / "b.gguf", drop="blk.1.attn_k_norm.weight"))


def test_import_int_accepts_the_synthetic_files(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """python -m fx_integer.synthetic_gguf writes one; fx models import-int --gguf converts it
    (the same artifact as the converter's own call) and refuses a missing file clearly."""
    from fx_cli.main import build_parser

    g = tmp_path / "q.gguf"
    assert synthetic_gguf.main(["qwen3-q1_0-synthetic", str(g)]) == 0
    ap = build_parser()
    args = ap.parse_args(["models", "import-int", "qwen3-q1_0-synthetic", "--gguf", str(g),
                          "--out", str(tmp_path / "q.nlfxint"), "--no-store"])
    assert args.func(args) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["model_hash"] == artifact.parse(gguf_import.convert(g)).model_hash
    args = ap.parse_args(["models", "import-int", "x", "--gguf", str(tmp_path / "none.gguf")])
    assert args.func(args) == 2
    assert "no GGUF file at" in capsys.readouterr().err


def test_fidelity_greedy_reads_float_logits_as_floats(arts: dict[str, artifact.Artifact]) -> None:
    """Free-running greedy on the float reference starts from the same choice as its
    teacher-forced last row (float logits were once cast to integers there, flattening them
    into ties); the integer side gives its own greedy tokens, and the report counts them."""
    from fx_integer import fidelity

    a = arts["qwen3-q1_0-synthetic"]
    toks = Tokenizer(a.tokenizer).encode(TEXT)
    fo = FloatOps(a)
    last = np.asarray(forward(fo, [(KVCache(fo), toks)], all_logits=True)[0])[-1]
    assert fidelity._greedy(fo, toks, 3)[0] == int(np.argmax(last))
    rep = fidelity.evaluate(a, prompts=[{"id": "t", "text": TEXT}], int_ops=NativeOps(a),
                            float_ops=fo, greedy_tokens=3)
    assert rep.greedy[0].tokens == 3 and 0 <= rep.greedy[0].agreed <= 3
    assert rep.to_json()["greedy"][0]["id"] == "t"
