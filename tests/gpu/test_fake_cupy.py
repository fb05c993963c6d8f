"""The CuPy backend and bench/gpu_check.py, run end to end WITHOUT a GPU (tests/gpu/fake_cupy.py).

CuPy has never run this code, and the device run is one shot: these tests execute every line of
``cupy_backend.py`` and ``gpu_check.py`` here, with each kernel launch checked argument by
argument against the parameter list in the CUDA source (a Python int where the kernel takes
``int`` would shift every later argument on a GPU), then run on the g++ build of the kernels,
byte-compared with the oracle.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from fx_integer import artifact, cpu_kernel
from fx_integer.generation import GenRequest, generate_batch, to_host
from fx_integer.kernel_ops import SIGNATURES, kernel_source
from fx_integer.oracle import FixedPointOverflow, KVCache, OracleOps, forward
from fx_integer.sampling import SamplingParams
from fx_integer.synthetic_archs import synthetic_v2
from tests.gpu import fake_cupy

ROOT = Path(__file__).resolve().parents[2]

if cpu_kernel.compiler() is None:  # the fake runs the kernels' g++ build
    pytest.skip("no C++ compiler for the CPU build of the kernels", allow_module_level=True)


def _kinds(params: list[tuple[str, bool]]) -> str:
    return "".join("p" if ptr else {"int": "i", "i64": "l", "long long": "l"}[t]
                   for t, ptr in params)


def test_signatures_are_the_sources() -> None:
    parsed = fake_cupy.parse_kernels(kernel_source())
    assert {k: _kinds(v) for k, v in parsed.items()} == SIGNATURES


@pytest.fixture(scope="module")
def synth() -> artifact.Artifact:
    return artifact.parse(artifact.synthetic(seed=7))


@pytest.fixture(scope="module")
def synth_oracle(synth: artifact.Artifact) -> OracleOps:
    return OracleOps(synth)


@pytest.fixture
def fake() -> Any:
    with fake_cupy.installed() as cp:
        yield cp


def _prefill(ops: Any, toks: list[int]) -> bytes:
    return to_host(forward(ops, [(KVCache(ops), toks)], all_logits=True)[0]).tobytes()


def test_cupy_ops_on_the_fake_device(fake: Any, synth: artifact.Artifact,
                                     synth_oracle: OracleOps) -> None:
    from fx_integer.cupy_backend import CupyOps, available

    assert available()
    for threads in (0, 1, 3):
        gpu = CupyOps(synth, threads=threads)
        for toks in ([1, 5, 77, 200, 3], [1, 2], list(range(3, 40))):
            assert _prefill(gpu, toks) == _prefill(synth_oracle, toks)
    # every kernel of format 1's llama (Q4_1 nibbles, the Q8_0 head and embedding) launched
    assert {name for name, *_ in gpu.module.log} == set(SIGNATURES) - FORMAT2_ONLY
    reqs = [GenRequest(prompt_tokens=(1, 5, 77), max_tokens=4, sampling=s, stop_token=None)
            for s in (SamplingParams(), SamplingParams(temperature_q16=45875, seed=3))]
    assert generate_batch(gpu, reqs) == generate_batch(synth_oracle, reqs)
    with pytest.raises(ValueError):
        CupyOps(synth, threads=257)


FORMAT2_ONLY = {"nl_geglu", "nl_scale", "nl_qmatmul_s64", "nl_embed_s64"}


def test_cupy_ops_format2_on_the_fake_device(fake: Any) -> None:
    """Each synthetic format 2 architecture through CupyOps on the fake device: its scenarios
    (every row of a prompt past the window, batches both ways, split prefill, batched decode)
    equal the oracle's; the router's host round trip and the experts' combination in ``xp``
    run on 'device' arrays; int64 scales reach their kernels. Every kernel but format 1's
    nibble-packed matmul is launched."""
    from fx_integer.artifact import QWeight
    from fx_integer.cupy_backend import CupyOps
    from fx_integer.oracle import embed_rows, qmatmul, qmatrix
    from tests.unit.integer import arch_scenarios

    launched: set[str] = set()
    for arch, art in arch_scenarios.arts().items():
        gpu = CupyOps(art)
        names = None if arch == "cohere2-moe" else ("long", "short+long")
        got = arch_scenarios.scenarios(gpu, names)
        want = arch_scenarios.scenarios(OracleOps(art), names)
        assert got == want, arch
        launched |= {name for name, *_ in gpu.module.log}
    rng = np.random.Generator(np.random.PCG64(1))
    codes = rng.integers(-32, 32, size=(40, 64), dtype=np.int8)
    scale = rng.integers(-(1 << 32), 1 << 32, size=(40, 4), dtype=np.int64)  # past int32
    w = QWeight(codes, scale, None, 16, 32, "test")
    gpu.mats["wide"] = gpu.emb = gpu.device_matrix(w)
    x = rng.integers(-(1 << 16), 1 << 16, size=(3, 64), dtype=np.int64)
    assert to_host(gpu.matmul(fake.asarray(x), "wide")).tobytes() == \
        qmatmul(x, qmatrix(w)).tobytes()
    toks = np.asarray([0, 39, 7], dtype=np.int64)
    assert to_host(gpu.embed(toks)).tobytes() == embed_rows(w, toks).tobytes()
    gpu.finish()
    launched |= {name for name, *_ in gpu.module.log}
    assert launched == set(SIGNATURES) - {"nl_q4_matmul"}  # format 1's nibbles only


def test_gpu_check_arch_section_on_the_fake_device(fake: Any, tmp_path: Path) -> None:
    """bench/gpu_check.py's section 4 (format 2 artifacts) on each synthetic architecture."""
    from fx_integer.cupy_backend import CupyOps
    from tests.unit.integer import arch_scenarios

    gpu_check = _gpu_check()
    for arch, seed in arch_scenarios.SEEDS.items():
        p = tmp_path / f"{arch}.nlfxint"
        artifact.write(p, synthetic_v2(seed, arch=arch))
        rep = gpu_check.arch_checks(str(p), CupyOps, fake)
        assert (rep["prefill_equal"], rep["split_prefill_equal"], rep["batched_equal"]) == \
            (True, True, True), (arch, rep)
        assert rep["prompt_tokens"] > 2 * artifact.load(p).config.window
        assert rep["decode_tok_s_batch1"] > 0 and rep["decode_tok_s_batch8"] > 0


def test_deferred_overflow_flags(fake: Any, synth: artifact.Artifact,
                                 synth_oracle: OracleOps) -> None:
    from fx_integer.cupy_backend import CupyOps

    gpu = CupyOps(synth)
    big = np.full((2, 8), 1 << 40, dtype=np.int64)
    with pytest.raises(FixedPointOverflow) as want:
        synth_oracle.add(big, big)
    gpu.add(fake.asarray(big), fake.asarray(big))  # deferred: nothing raised yet
    with pytest.raises(FixedPointOverflow) as got:
        gpu.finish()
    assert str(got.value) == str(want.value)
    gpu.finish()  # cleared
    # a forward that failed before its finish() leaves its flags: the next forward drops them
    gpu.add(fake.asarray(big), fake.asarray(big))
    forward(gpu, [(KVCache(gpu), [1, 2])])


def test_the_fake_catches_a_python_int_for_an_int_parameter(
        fake: Any, synth: artifact.Artifact, monkeypatch: pytest.MonkeyPatch) -> None:
    from fx_integer.cupy_backend import CupyOps

    gpu = CupyOps(synth)

    def careless(name: str, grid: tuple[int, ...], args: tuple[Any, ...]) -> None:
        gpu.kernels[name](tuple(grid), (32,), tuple(args))  # Python ints as they come

    monkeypatch.setattr(gpu, "launch", careless)
    with pytest.raises(AssertionError, match="int, need int32"):
        forward(gpu, [(KVCache(gpu), [1, 2])])


def _gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check_under_test",
                                                  ROOT / "bench" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_gpu_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, art_path: Path,
                   **env: str) -> tuple[int, dict[str, Any]]:
    knobs = {"FX_ARTIFACT": str(art_path), "OUT": str(tmp_path / "out"),
             "GPU_CHECK_THREADS": "0,2", "GPU_CHECK_BATCHES": "1,2", "GPU_CHECK_STEPS": "2",
             "GPU_CHECK_GEN_TOKENS": "2", "GPU_CHECK_PROMPTS": "2", **env}
    for k, v in knobs.items():
        monkeypatch.setenv(k, v)
    rc = _gpu_check().main()
    return rc, json.loads((tmp_path / "out" / "gpu_check.json").read_text())


def _check_report(rc: int, rep: dict[str, Any]) -> None:
    assert rep.get("errors") is None, rep.get("errors")
    assert rc == 0 and rep["all_parity_ok"] is True
    assert all(v is True for v in rep["synthetic"].values()) and rep["synthetic"]
    assert rep["parity"]["prompts"] == 2 and rep["parity"]["mismatched_prompts"] == []
    assert 0 < rep["decode"]["fraction_of_bound_single_stream"] < 1


def test_gpu_check_without_the_artifact_falls_back(fake: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    rc, rep = _run_gpu_check(monkeypatch, tmp_path, tmp_path / "missing.nlfxint",
                             GPU_CHECK_THREADS="0", GPU_CHECK_BATCHES="1")
    assert rep["model"]["model"] == "synthetic-real-shapes"
    assert "FileNotFoundError" in rep["model"]["artifact_error"]
    assert "skipped" in rep["parity_gate"]
    _check_report(rc, rep)
    # the stand-in streams exactly the real model's bytes per token
    assert rep["decode"]["weight_bytes"] == 111_617_280  # = the real artifact's


def test_gpu_check_on_the_real_model_truncated(fake: Any, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.integer.real_model import real_artifact

    real = artifact.load(real_artifact())
    cfg = real.config
    short = artifact.Config(**{**cfg.to_json(), "n_layers": 1})
    tensors = {k: v for k, v in real.tensors.items()
               if not k.startswith("blk.") or k.startswith("blk.0.")}
    p = tmp_path / "one-layer.nlfxint"
    artifact.write(p, artifact.serialize(config=short, tokenizer=real.tokenizer,
                                         source=real.source, tensors=tensors))
    rc, rep = _run_gpu_check(monkeypatch, tmp_path, p)
    assert rep["model"]["model"] == "artifact" and rep["model"]["n_layers"] == 1
    assert rep["model"]["model_hash_ok"] is False  # not the full model: reported, not fatal
    _check_report(rc, rep)
    assert set(rep["decode"]["tok_s"]) == {"1", "2"}
    assert all(len(t) == 2 for t in rep["parity"]["generated_tokens"])
    # the executor's parity gate, run for the cupy backend as a GPU node runs it before serving
    gate = rep["parity_gate"]
    assert (gate["backend"], gate["result"], gate["mismatch"]) == ("cupy", "passed", None)
    assert gate["canaries"] >= 3 and len(gate["canary_set_sha256"]) == 64


def test_real_shapes_are_the_real_models(tmp_path: Path) -> None:
    from tests.unit.integer.real_model import real_artifact

    gpu_check = _gpu_check()
    real = artifact.load(real_artifact())
    syn = artifact.parse(artifact.synthetic(seed=1, **gpu_check.REAL_SHAPES))
    assert {k: (v.dtype, v.shape) for k, v in syn.tensors.items()} == \
        {k: (v.dtype, v.shape) for k, v in real.tensors.items()}
    for f in ("n_layers", "d_model", "d_ff", "n_heads", "n_kv_heads", "vocab_size", "ctx_len"):
        assert getattr(syn.config, f) == getattr(real.config, f), f




def test_gpu_check_records_a_compile_failure_and_still_reports(
        fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**kw: Any) -> None:
        raise RuntimeError("NVRTC_ERROR_COMPILATION: engine.cu(1): error: planted")

    monkeypatch.setattr(fake, "RawModule", broken)
    rc, rep = _run_gpu_check(monkeypatch, tmp_path, tmp_path / "missing.nlfxint")
    assert rc == 1 and rep["all_parity_ok"] is False
    assert set(rep["errors"]) == {"compile", "synthetic", "load"}
    assert "planted" in rep["errors"]["compile"]
