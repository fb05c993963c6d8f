"""ONE prepared H200 check of the CuPy producer (run by the lead on the GPU machine).

Needs only numpy + cupy + this repository (no registry access, no gguf): the committed artifact
must be present (copy it, or set FX_ARTIFACT to its path). Run from the repository root:

    python bench/gpu_check.py            # figures to stdout, and to $OUT/gpu_check.json if set
    GPU_CHECK_PROMPTS=20 python bench/gpu_check.py   # parity on the first 20 prompts only

1. parity: CuPy vs the numpy oracle on every fidelity prompt (all-position logits, byte-equal)
   and on greedy + sampled generations, single and batched;
2. decode tokens/s, single stream and batched (1, 8, 32, 64);
3. fraction of the memory-bandwidth bound 4.8e12 / weight bytes for single-stream decode.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from executor.integer import _paths, artifact, fidelity
from executor.integer.cupy_backend import CupyOps, available
from executor.integer.generate import GenRequest, generate_batch, to_host
from executor.integer.oracle import KVCache, OracleOps, forward
from executor.integer.sampling import SamplingParams
from executor.integer.tokenizer import Tokenizer

HBM_BYTES_PER_S = 4.8e12


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> int:
    out: dict[str, object] = {}
    if not available():
        print("no CUDA device visible to CuPy", file=sys.stderr)
        return 2
    import cupy as cp

    path = Path(os.environ.get("FX_ARTIFACT", str(_paths.default_artifact_path())))
    art = artifact.load(path)
    out["model_hash"] = art.model_hash
    out["device"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    tok = Tokenizer(art.tokenizer)
    t = time.perf_counter()
    gpu = CupyOps(art)
    cp.cuda.Device().synchronize()
    out["gpu_load_s"] = round(time.perf_counter() - t, 2)
    ora = OracleOps(art)

    # 1. parity on every fidelity prompt (teacher-forced logits at all positions)
    mism = []
    n_pos = 0
    prompts = fidelity.load_prompts()[: int(os.environ.get("GPU_CHECK_PROMPTS", "1000"))]
    for p in prompts:
        text = tok.chat_prompt(p["text"]) if p["chat"] else p["text"]
        ids = tok.encode(text)
        a = forward(ora, [(KVCache(ora), ids)], all_logits=True)[0]
        b = to_host(forward(gpu, [(KVCache(gpu), ids)], all_logits=True)[0])
        n_pos += len(ids)
        if a.tobytes() != b.tobytes():
            mism.append(p["id"])
        log(f"parity {p['id']}: {'ok' if a.tobytes() == b.tobytes() else 'MISMATCH'}")
    reqs = [GenRequest(prompt_tokens=tuple(tok.encode(tok.chat_prompt(q))), max_tokens=16,
                       sampling=s, stop_token=None)
            for q in ("What is the capital of France?", "Write a haiku about rain.")
            for s in (SamplingParams(), SamplingParams(temperature_q16=45875, top_k=40,
                                                       top_p_q16=58982, seed=7))]
    gen_ok = generate_batch(gpu, reqs) == generate_batch(ora, reqs)
    gen_single_ok = [generate_batch(gpu, [r])[0] for r in reqs] == generate_batch(ora, reqs)
    out["parity"] = {"prompts": len(prompts), "positions": n_pos,
                     "mismatched_prompts": mism, "generation_batched_equal": gen_ok,
                     "generation_single_equal": gen_single_ok}
    log(f"parity: {out['parity']}")

    # 2. decode tokens/s
    weight_bytes = sum(int(v.nbytes) for k, v in art.tensors.items() if not k.startswith("rope"))
    prompt = tok.encode("Once upon a time, there was a little girl who lived in a village.")
    rates = {}
    for bsz in (1, 8, 32, 64):
        caches = [KVCache(gpu) for _ in range(bsz)]
        forward(gpu, [(c, prompt) for c in caches])
        feed = [[42]] * bsz
        steps = 64 if bsz == 1 else 32
        for _ in range(3):  # warm-up
            forward(gpu, list(zip(caches, feed, strict=True)))
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            rows = forward(gpu, list(zip(caches, feed, strict=True)))
            feed = [[int(np.argmax(to_host(r)[0]))] for r in rows]
        cp.cuda.Device().synchronize()
        dt = time.perf_counter() - t
        rates[bsz] = round(bsz * steps / dt, 2)
        log(f"decode batch {bsz}: {rates[bsz]} tok/s")
    bound = HBM_BYTES_PER_S / weight_bytes
    out["decode_tok_s"] = rates
    out["weight_bytes"] = weight_bytes
    out["bandwidth_bound_tok_s"] = round(bound, 1)
    out["fraction_of_bound_single_stream"] = round(rates[1] / bound, 4)
    digest = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()
    out["report_sha256"] = digest
    text = json.dumps(out, indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "gpu_check.json").write_text(text)
    return 0 if not mism and gen_ok and gen_single_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
