"""The compiled exact-integer path (backend ``oracle-native``, ``fx_integer.int_kernel``) against
the numpy oracle, the canonical reference: logits and digests compared as bytes on the real
SmolLM2 artifact (several prompts, batch sizes, prefill and decode) and on the synthetic one,
single ops (matmuls, RMSNorm, SwiGLU, attention) over wide input ranges, and the same
FixedPointOverflow where the oracle raises."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import pytest

from fx_integer import int_kernel
from fx_integer.artifact import Artifact
from fx_integer.engine import BACKENDS, IntegerEngine
from fx_integer.generation import GenRequest, generate_batch
from fx_integer.oracle import FixedPointOverflow, KVCache, OracleOps, forward
from fx_integer.sampling import SamplingParams
from fx_integer.tokenizer import Tokenizer

if not int_kernel.available():  # pragma: no cover - g++ is a system dependency of the project
    pytest.skip("the integer kernel does not build here (no g++)", allow_module_level=True)


@pytest.fixture(scope="module")
def real_native(real: Artifact) -> Iterator[int_kernel.NativeOps]:
    yield int_kernel.NativeOps(real, threads=2)


@pytest.fixture(scope="module")
def synth_native(synth: Artifact) -> int_kernel.NativeOps:
    return int_kernel.NativeOps(synth, threads=3)


PROMPTS = ("The capital of France is",
           "Once upon a time, there was a little girl who lived in a small village.",
           "def fibonacci(n):\n    return",
           "1, 2, 3, 5, 8, 13,")


def _run(ops: OracleOps, prompts: list[list[int]], steps: int) -> bytes:
    """Prefill (every row's logits) then ``steps`` greedy decode steps, all rows' bytes."""
    caches = [KVCache(ops) for _ in prompts]
    rows = forward(ops, list(zip(caches, prompts, strict=True)), all_logits=True)
    out = [np.ascontiguousarray(r).astype("<i8").tobytes() for r in rows]
    nxt = [[int(np.argmax(r[-1]))] for r in rows]
    for _ in range(steps):
        rows = forward(ops, list(zip(caches, nxt, strict=True)))
        out += [np.ascontiguousarray(r).astype("<i8").tobytes() for r in rows]
        nxt = [[int(np.argmax(r[0]))] for r in rows]
    return b"".join(out)


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_real_model_logits_are_byte_identical(real: Artifact, real_oracle: OracleOps,
                                              real_native: int_kernel.NativeOps,
                                              batch: int) -> None:
    tok = Tokenizer(real.tokenizer)
    prompts = [tok.encode(PROMPTS[(i + batch) % len(PROMPTS)]) for i in range(batch)]
    a = _run(real_oracle, prompts, 3)
    b = _run(real_native, prompts, 3)
    assert len(a) == len(b) and hashlib.sha256(a).digest() == hashlib.sha256(b).digest()
    assert a == b


def test_real_model_digests_and_tokens_are_identical(real: Artifact, real_oracle: OracleOps,
                                                     real_native: int_kernel.NativeOps) -> None:
    tok = Tokenizer(real.tokenizer)
    reqs = [GenRequest(prompt_tokens=tuple(tok.encode(p)), max_tokens=5, stop_token=None,
                       sampling=sp)
            for p, sp in zip(PROMPTS, (SamplingParams(),
                                       SamplingParams(temperature_q16=58982, seed=4),
                                       SamplingParams(temperature_q16=65536, top_k=30, seed=8),
                                       SamplingParams(temperature_q16=45875, top_p_q16=60000,
                                                      seed=1)), strict=True)]
    ref = generate_batch(real_oracle, reqs)
    got = generate_batch(real_native, reqs)
    assert [(r.output_tokens, r.logits_digest) for r in ref] == \
        [(r.output_tokens, r.logits_digest) for r in got]


def test_synthetic_forward_is_byte_identical(synth_oracle: OracleOps,
                                             synth_native: int_kernel.NativeOps) -> None:
    rng = np.random.default_rng(3)
    v = synth_oracle.config.vocab_size
    for batch in (1, 3, 9):  # 9 rows > the C kernel's 8-row tile
        prompts = [[int(t) for t in rng.integers(0, v, size=int(rng.integers(1, 12)))]
                   for _ in range(batch)]
        assert _run(synth_oracle, prompts, 2) == _run(synth_native, prompts, 2)


@pytest.mark.parametrize("scale_bits", [0, 8, 16, 24, 29, 31])
def test_ops_identical_over_input_ranges(real_oracle: OracleOps,
                                         real_native: int_kernel.NativeOps,
                                         scale_bits: int) -> None:
    """Each compiled op on random Q.16 inputs of growing magnitude: the same bytes, or the same
    FixedPointOverflow message where the oracle refuses the input."""
    rng = np.random.default_rng(scale_bits)
    for mat in ("blk.0.qkv", "blk.3.gate_up", "blk.7.ffn_down", "blk.29.attn_output", "output"):
        k = real_native.native[mat].in_features
        for rows in (1, 5):
            x = rng.integers(-(1 << scale_bits), (1 << scale_bits) + 1, size=(rows, k),
                             dtype=np.int64)
            try:
                want: np.ndarray | str = real_oracle.matmul(x, mat)
            except FixedPointOverflow as exc:
                want = str(exc)
            try:
                got: np.ndarray | str = real_native.matmul(x, mat)
            except FixedPointOverflow as exc:
                got = str(exc)
            if isinstance(want, str):
                assert got == want
            else:
                assert isinstance(got, np.ndarray) and got.tobytes() == want.tobytes()
    d = real_oracle.config.d_model
    x = rng.integers(-(1 << scale_bits), (1 << scale_bits) + 1, size=(6, d), dtype=np.int64)
    x[1] = 0  # an all-zero row (eps alone)
    x[2, :] = 0
    x[2, 7] = 1 << min(scale_bits + 8, 40)  # one spike
    for gain in ("blk.0.attn_norm", "blk.12.ffn_norm", "output_norm"):
        assert real_native.rmsnorm(x, gain).tobytes() == real_oracle.rmsnorm(x, gain).tobytes()
    f = real_oracle.config.d_ff
    gu = rng.integers(-(1 << scale_bits), (1 << scale_bits) + 1, size=(3, 2 * f), dtype=np.int64)
    gu[0, :9] = [0, 1, -1, 1 << 26, -(1 << 26), (1 << 26) + 1, 1 << 31, -(1 << 31), 12345]
    want_s = real_oracle.swiglu(gu[:, :f], gu[:, f:])
    assert real_native.swiglu(gu[:, :f], gu[:, f:]).tobytes() == want_s.tobytes()
    assert real_native.swiglu(np.ascontiguousarray(gu[:, :f]),
                              np.ascontiguousarray(gu[:, f:])).tobytes() == want_s.tobytes()
    gu[2, 3] = (1 << 31) + 1
    with pytest.raises(FixedPointOverflow) as want_e:
        real_oracle.swiglu(gu[:, :f], gu[:, f:])
    with pytest.raises(FixedPointOverflow) as got_e:
        real_native.swiglu(gu[:, :f], gu[:, f:])
    assert str(got_e.value) == str(want_e.value)


@pytest.mark.parametrize("bits", [4, 16, 24, 27, 28])
def test_attention_identical(real_oracle: OracleOps, real_native: int_kernel.NativeOps,
                             bits: int) -> None:
    """Random q, k, v of growing magnitude (up to the QK bound 2**28 - 1 and past it), rows at
    their positions in the cache (a prefill chunk, a decode row, an offset chunk)."""
    cfg = real_oracle.config
    h, kvh, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    rng = np.random.default_rng(bits)
    lim = min((1 << bits), (1 << 28) - 1)
    for n, m, start in ((7, 7, 0), (1, 13, 12), (4, 20, 9), (3, 3, 0)):
        q = rng.integers(-lim, lim + 1, size=(n, h, hd), dtype=np.int64)
        k = rng.integers(-lim, lim + 1, size=(m, kvh, hd), dtype=np.int64)
        v = rng.integers(-(1 << 31), (1 << 31) + 1, size=(m, kvh, hd), dtype=np.int64)
        pos = np.arange(start, start + n, dtype=np.int64)
        want = real_oracle.attention(q, k, v, pos)
        assert real_native.attention(q, k, v, pos).tobytes() == want.tobytes()
    q[0, 0, 0] = 1 << 28  # past the bound: the oracle's error
    with pytest.raises(FixedPointOverflow) as want_e:
        real_oracle.attention(q, k, v, pos)
    with pytest.raises(FixedPointOverflow) as got_e:
        real_native.attention(q, k, v, pos)
    assert str(got_e.value) == str(want_e.value)


def test_overflow_is_the_oracles(real_oracle: OracleOps,
                                 real_native: int_kernel.NativeOps) -> None:
    """Inputs past the proven-exact range raise the numpy oracle's own error, word for word."""
    k = real_native.native["blk.0.qkv"].in_features
    for value in (1 << 33, 1 << 42, -(1 << 45)):
        x = np.zeros((2, k), dtype=np.int64)
        x[1, 5] = value
        with pytest.raises(FixedPointOverflow) as want:
            real_oracle.matmul(x, "blk.0.qkv")
        with pytest.raises(FixedPointOverflow) as got:
            real_native.matmul(x, "blk.0.qkv")
        assert str(got.value) == str(want.value)


def test_backend_naming_and_the_numpy_switch(synth: Artifact,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Receipts name what computed them: ``oracle-native`` is its own backend name; the verifier
    re-executes on the numpy oracle by default and on oracle-native only when asked
    (FX_INTEGER_ORACLE=native), gated then by the parity canaries (test_cli)."""
    assert "oracle-native" in BACKENDS
    eng = IntegerEngine.from_artifact(synth, backend="oracle-native")
    ref = IntegerEngine.from_artifact(synth)
    a = eng.run({"prompt": "the cat", "max_tokens": 4})["receipt"]
    b = ref.run({"prompt": "the cat", "max_tokens": 4})["receipt"]
    assert a["engine"]["backend"] == "oracle-native" and b["engine"]["backend"] == "oracle"
    assert (a["output_tokens"], a["logits_digest"]) == (b["output_tokens"], b["logits_digest"])
    monkeypatch.delenv("FX_INTEGER_ORACLE", raising=False)
    assert int_kernel.verifier_backend() == "oracle"
    monkeypatch.setenv("FX_INTEGER_ORACLE", "native")
    assert int_kernel.verifier_backend() == "oracle-native"


def test_teacher_forced_logits_identical(real: Artifact, real_oracle: OracleOps,
                                         real_native: int_kernel.NativeOps) -> None:
    """The verifier's one-forward path: every row, from an offset, the same bytes."""
    tok = Tokenizer(real.tokenizer)
    ids = tok.encode(PROMPTS[1]) + tok.encode(" She loved to read books.")
    n = len(tok.encode(PROMPTS[1]))
    a = forward(real_oracle, [(KVCache(real_oracle), ids)], all_logits=True, logits_from=n - 1)
    b = forward(real_native, [(KVCache(real_native), ids)], all_logits=True, logits_from=n - 1)
    assert a[0].shape == (len(ids) - n + 1, real.config.vocab_size)
    assert a[0].tobytes() == b[0].tobytes()
