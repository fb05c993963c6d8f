"""Decode tokens/s: integer oracle vs float32 numpy reference (same forward driver, same KV cache).

    .venv/bin/python bench/integer_decode.py [--tokens 32] [--batch 4] [--cpu-kernel] [--json]
        [--quick] [--repeat 3] [--threads N] [--no-native]

Engines, side by side in one process: the float32 numpy reference, the integer oracle (numpy,
the canonical reference), its compiled twin ``oracle-native`` (``fx_integer/int_kernel``, exact
integers, byte-identical) and, with ``--cpu-kernel``, the ``.cu`` kernels built for the CPU.
``OPENBLAS_NUM_THREADS`` is set to 1 when unset (before numpy loads, so the float side and the
numpy oracle run their BLAS on one thread) and ``--threads`` (default: the same number) is the
compiled kernel's thread count: both sides get the same cores. Each figure is the median of
``--repeat`` runs, taken round robin (every engine once per repeat). ``--quick`` is the bounded
mode for ``make bench`` (8 decode steps, 1 run). Prints a small table (and JSON with --json,
ratios to the float reference included). Progress goes to stderr.
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
from fx_integer.float_ref import FloatOps
from fx_integer.generation import to_host
from fx_integer.oracle import KVCache, Ops, OracleOps, forward
from fx_integer.tokenizer import tokenizer_for

PROMPT = "Once upon a time, there was a little girl who lived in a small village near the forest."
FLOAT = "float32 numpy (reference)"


def decode_rate(ops: Ops, prompts: list[list[int]], n: int) -> dict[str, Any]:
    caches = [KVCache(ops) for _ in prompts]
    t0 = time.perf_counter()
    rows = forward(ops, list(zip(caches, prompts, strict=True)))
    t1 = time.perf_counter()
    nxt = [[int(np.argmax(to_host(r)[0]))] for r in rows]
    for _ in range(n):
        rows = forward(ops, list(zip(caches, nxt, strict=True)))
        nxt = [[int(np.argmax(to_host(r)[0]))] for r in rows]
    t2 = time.perf_counter()
    toks = n * len(prompts)
    return {"prefill_s": round(t1 - t0, 3), "decode_s": round(t2 - t1, 3),
            "decode_tok_s": round(toks / (t2 - t1), 2), "batch": len(prompts)}


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    runs = sorted(runs, key=lambda r: float(r["decode_tok_s"]))
    mid = dict(runs[len(runs) // 2])
    mid["runs_tok_s"] = [r["decode_tok_s"] for r in runs]
    mid["median_tok_s"] = statistics.median(float(r["decode_tok_s"]) for r in runs)
    return mid


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--cpu-kernel", action="store_true", help="also the g++ build of the .cu")
    ap.add_argument("--no-native", action="store_true",
                    help="leave out oracle-native (the compiled exact-integer path)")
    ap.add_argument("--threads", type=int, default=None,
                    help="oracle-native threads (default: $OPENBLAS_NUM_THREADS)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per figure (median)")
    ap.add_argument("--quick", action="store_true",
                    help="bounded mode: 8 decode steps, 1 run (for make bench)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.tokens, a.repeat = min(a.tokens, 8), 1
    if a.tokens < 2 or a.repeat < 1:
        ap.error("--tokens must be >= 2 and --repeat >= 1")
    blas = os.environ["OPENBLAS_NUM_THREADS"]
    threads = a.threads if a.threads is not None else (int(blas) if blas.isdigit() else 1)
    art = artifact.load(model_paths.ensure_artifact())
    tok = tokenizer_for(art.tokenizer)
    p = tok.encode(PROMPT)
    batch = [p, *[tok.encode(f"Story number {i}: {PROMPT}") for i in range(1, a.batch)]]
    engines: list[tuple[str, Any]] = [(FLOAT, lambda: FloatOps(art)),
                                      ("integer oracle (numpy)", lambda: OracleOps(art))]
    if not a.no_native:
        from fx_integer import int_kernel

        if int_kernel.available():
            engines.append((f"integer oracle-native (C, exact, {threads} thread(s))",
                            lambda: int_kernel.NativeOps(art, threads=threads)))
        else:
            print("bench: oracle-native does not build here (no g++): left out",
                  file=sys.stderr)
    if a.cpu_kernel:
        from fx_integer.cpu_kernel import CpuKernelOps

        engines.append(("integer .cu on CPU (g++, 1 thread)",
                        lambda: CpuKernelOps(art, threads=1)))
    # Round robin: each repeat runs every engine once, so a change of the machine's load during
    # the run weighs on every engine alike.
    built: list[tuple[str, Any]] = []
    for name, make in engines:
        print(f"bench: preparing {name}", file=sys.stderr, flush=True)
        built.append((name, make()))
    singles: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in built}
    batched: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in built}
    for rep in range(a.repeat):
        for name, ops in built:
            print(f"bench: run {rep + 1}/{a.repeat}: {name}", file=sys.stderr, flush=True)
            singles[name].append(decode_rate(ops, [p], a.tokens))
            if a.batch > 1:
                batched[name].append(decode_rate(ops, batch, a.tokens // 2))
    res: list[dict[str, Any]] = [
        {"engine": name, "single": median_of(singles[name]),
         "batched": median_of(batched[name]) if batched[name] else None}
        for name, _ in built]
    ref = res[0]
    for r in res:
        r["ratio_single"] = round(r["single"]["median_tok_s"] / ref["single"]["median_tok_s"], 3)
        if r["batched"] and ref["batched"]:
            r["ratio_batched"] = round(r["batched"]["median_tok_s"]
                                       / ref["batched"]["median_tok_s"], 3)
    if a.json:
        print(json.dumps({"model_hash": art.model_hash, "prompt_tokens": len(p),
                          "decode_tokens": a.tokens, "repeat": a.repeat,
                          "openblas_num_threads": blas, "native_threads": threads,
                          "load_avg": list(os.getloadavg()), "results": res}))
        return 0
    print(f"modelHash {art.model_hash}; prompt {len(p)} tokens; {a.tokens} decode steps; "
          f"OPENBLAS_NUM_THREADS={blas}, oracle-native threads {threads}; median of {a.repeat}; "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'engine':46s} {'prefill s':>9s} {'decode tok/s':>12s} {'x float':>7s} "
          f"{'batch':>5s} {'batched tok/s':>13s} {'x float':>7s}")
    for r in res:
        b = r["batched"]
        print(f"{r['engine']:46s} {r['single']['prefill_s']:9.2f} "
              f"{r['single']['median_tok_s']:12.2f} {r['ratio_single']:7.2f} "
              f"{b['batch'] if b else 1:5d} "
              f"{b['median_tok_s'] if b else float('nan'):13.2f} "
              f"{r.get('ratio_batched', float('nan')):7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
