"""Speculative reads on and off, alternately, in one session: the effect round trip with the
real executor (:func:`bench.effect_hops.effect_hops`, trivial ONNX model, one effect in flight),
each run right after a bare aiokafka ping-pong of its own.

    .venv/bin/python bench/speculation_ab.py [--bootstrap HOST:PORT] [--pairs 4] [--n 60]
        [--model trivial|magika]

Each pair runs the executor once with ``speculative_reads`` off and once with it on (the order
swapped every pair, so neither always runs first on a warmer broker); the load average is taken
before and after each run. Prints (and with ``--json`` writes) every run's figures and the
medians of each side: round trip p50/p99, its ratio to the ping-pong measured just before it,
the request's append to its ``accepted`` and the speculation counters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from effect_hops import effect_hops  # noqa: E402
from effect_roundtrip import ping_pong, summary  # noqa: E402

from fx_kafka.workload import ensure_system_topics  # noqa: E402


async def one(bootstrap: str, n: int, speculative: bool, model: str) -> dict[str, Any]:
    """A ping-pong, then the effect round trip with speculation ``speculative``."""
    load = os.getloadavg()[0]
    pp = summary(await ping_pong(bootstrap, n, warmup=10))
    with tempfile.TemporaryDirectory(prefix="fx-spec-ab-") as d:
        hops = await effect_hops(bootstrap, n, Path(d), speculative_reads=speculative,
                                 model_name=model)
    rt = hops["roundtrip"]
    return {"speculative_reads": speculative, "load_before": round(load, 2),
            "load_after": round(os.getloadavg()[0], 2), "ping_pong_p50_ms": pp["p50_ms"],
            "ping_pong_p99_ms": pp["p99_ms"], "roundtrip_p50_ms": rt["p50_ms"],
            "roundtrip_p99_ms": rt["p99_ms"],
            "ratio_p50": round(rt["p50_ms"] / pp["p50_ms"], 2),
            "ratio_p99": round(rt["p99_ms"] / pp["p99_ms"], 2),
            "request_to_executor_read_p50_ms": hops["request_to_executor_read"]["p50_ms"],
            "request_to_accepted_p50_ms": hops["request_to_accepted"]["p50_ms"],
            "request_to_accepted_mean_ms": hops["request_to_accepted"]["mean_ms"],
            "response_to_holder_read_p50_ms": hops["response_to_holder_read"]["p50_ms"],
            "response_to_step_p50_ms": hops["response_to_step"]["p50_ms"],
            "counters": hops["speculative_reads"]}


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("roundtrip_p50_ms", "roundtrip_p99_ms", "ping_pong_p50_ms", "ratio_p50", "ratio_p99",
            "request_to_executor_read_p50_ms", "request_to_accepted_p50_ms",
            "request_to_accepted_mean_ms", "response_to_holder_read_p50_ms",
            "response_to_step_p50_ms")
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}


async def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("FX_KAFKA_BOOTSTRAP"))
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--model", choices=("trivial", "magika"), default="trivial")
    parser.add_argument("--switch-interval", type=float,
                        help="sys.setswitchinterval for the run (s; Python's default 0.005)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if not args.bootstrap:
        parser.error("--bootstrap or FX_KAFKA_BOOTSTRAP is required")
    await ensure_system_topics(args.bootstrap)
    runs: list[dict[str, Any]] = []
    for pair in range(args.pairs):
        for speculative in ((False, True) if pair % 2 == 0 else (True, False)):
            run = await one(args.bootstrap, args.n, speculative, args.model)
            runs.append(run)
            print(json.dumps(run), flush=True)
    on = [r for r in runs if r["speculative_reads"]]
    off = [r for r in runs if not r["speculative_reads"]]
    pairs = [(a, b) for a, b in zip(off, on, strict=True)]
    report = {"model": args.model, "switch_interval_s": sys.getswitchinterval(), "n": args.n,
              "pairs": args.pairs, "off": medians(off), "on": medians(on),
              "on_over_off_p50_each_pair": [round(b["roundtrip_p50_ms"] / a["roundtrip_p50_ms"],
                                                  2) for a, b in pairs],
              "runs": runs}
    text = json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    asyncio.run(main())
