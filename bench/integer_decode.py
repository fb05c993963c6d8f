"""Decode tokens/s: integer oracle vs float32 numpy reference (same forward driver, same KV cache).

    .venv/bin/python bench/integer_decode.py [--tokens 32] [--batch 4] [--cpu-kernel]

Prints a small table (and JSON with --json). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from fx_integer import _paths, artifact
from fx_integer.float_ref import FloatOps
from fx_integer.generation import to_host
from fx_integer.oracle import KVCache, Ops, OracleOps, forward
from fx_integer.tokenizer import Tokenizer

PROMPT = "Once upon a time, there was a little girl who lived in a small village near the forest."


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--cpu-kernel", action="store_true", help="also the g++ build of the .cu")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    art = artifact.load(_paths.ensure_artifact())
    tok = Tokenizer(art.tokenizer)
    p = tok.encode(PROMPT)
    batch = [p, *[tok.encode(f"Story number {i}: {PROMPT}") for i in range(1, a.batch)]]
    engines: list[tuple[str, Ops]] = [("float32 numpy (reference)", FloatOps(art)),
                                      ("integer oracle (numpy)", OracleOps(art))]
    if a.cpu_kernel:
        from fx_integer.cpu_kernel import CpuKernelOps

        engines.append(("integer .cu on CPU (g++, 1 thread)", CpuKernelOps(art, threads=1)))
    res: list[dict[str, Any]] = []
    for name, ops in engines:
        print(f"bench: {name}", file=sys.stderr, flush=True)
        r1 = decode_rate(ops, [p], a.tokens)
        rb = decode_rate(ops, batch, a.tokens // 2) if a.batch > 1 else None
        res.append({"engine": name, "single": r1, "batched": rb})
    if a.json:
        print(json.dumps({"model_hash": art.model_hash, "prompt_tokens": len(p),
                          "decode_tokens": a.tokens, "results": res}))
        return 0
    print(f"modelHash {art.model_hash}; prompt {len(p)} tokens; {a.tokens} decode steps")
    print(f"{'engine':38s} {'prefill s':>9s} {'decode tok/s':>12s} "
          f"{'batch':>5s} {'batched tok/s':>13s}")
    for r in res:
        b = r["batched"]
        print(f"{r['engine']:38s} {r['single']['prefill_s']:9.2f} "
              f"{r['single']['decode_tok_s']:12.2f} {b['batch'] if b else 1:5d} "
              f"{b['decode_tok_s'] if b else float('nan'):13.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
