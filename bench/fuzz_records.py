"""Hostile records at scale: at least 10^5 generated records through every decoder and both pure
cores, with counts per outcome and code, records/s, and crashes (which must be 0).

    .venv/bin/python bench/fuzz_records.py [--records 100000] [--seed 9] [--json]
    .venv/bin/python bench/fuzz_records.py --atheris --runs 20000   # libFuzzer-driven (atheris)

The generator is the CI fuzz tests' (tests/unit/fuzz/hostile.py): valid records of every kind and
valid-but-hostile ones (huge sizes and offsets, unicode tricks in ids and topics, references to
missing chunks and other workloads' streams, mismatched effect ids), mutated as JSON (NaN,
Infinity, 5000-digit numbers, nesting to 100 000, wrong types, dropped and added fields) and as
bytes (truncated, flipped, overlong UTF-8, a BOM, over 1 MiB).

Hypothesis draws are slow (tens of records/s), so the run has two phases. A corpus of
``--corpus`` record templates is drawn by hypothesis from seeded random buffers (through
``fuzz_one_input``, so a seed gives the same corpus on every run); then every record is a template
mutated again by a seeded ``random.Random`` with the same hostile values, JSON and byte
mutations. Every record is decoded (alternately strict), and what decodes is fed to the
executor's core (``decide`` and the answers) and to the lease holder's core (``classify``,
``apply``, ``due_outcomes``), as the services do. A crash is any exception that is not a typed
refusal; each one's bytes are written under ``--crash-dir`` to be replayed.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import broker_schema as bs
from tests.unit.fuzz.hostile import (
    HOSTILE_FLOATS,
    HOSTILE_INTS,
    HOSTILE_RAW,
    HOSTILE_TEXT,
    HOSTILE_TOPICS,
    WID,
    ExecutorHarness,
    HolderHarness,
    Raw,
    _effect_id,
    _paths,
    _set,
    _to_dict,
    decode_outcome,
    deep,
    dumps,
    hostile_valid_dicts,
    mutated_dicts,
    record_bytes,
)
from tests.unit.schema_strategies import records as valid_records

TALLY: Counter[str] = Counter()
STATE: dict[str, Any] = {"records": 0, "examples": 0}


def _run_one(raws: list[bytes], strict_bits: int, statuses: list[str]) -> None:
    executor = ExecutorHarness()
    holder = HolderHarness()
    for i, raw in enumerate(raws):
        outcome, record = decode_outcome(raw, strict=bool(strict_bits >> (i % 16) & 1))
        STATE["records"] += 1
        TALLY["decode " + outcome] += 1
        if record is None:
            continue
        TALLY["executor " + executor.feed(record, model_status=statuses[i % 3], finish=i)] += 1
        source = "in" if isinstance(record, bs.InputRecord) else "resp"
        TALLY["holder " + holder.feed(record, source=source)] += 1


@settings(database=None, deadline=None, max_examples=1,
          suppress_health_check=list(HealthCheck))
@given(st.lists(record_bytes(), min_size=1, max_size=16), st.integers(0, 2**16 - 1),
       st.permutations(["ready", "absent", "corrupt"]))
def one_example(raws: list[bytes], strict_bits: int, statuses: list[str]) -> None:
    _run_one(raws, strict_bits, statuses)


CORPUS: list[Any] = []


@settings(database=None, deadline=None, max_examples=1,
          suppress_health_check=list(HealthCheck))
@given(mutated_dicts(st.one_of(valid_records.map(_to_dict), hostile_valid_dicts())))
def corpus_example(value: Any) -> None:
    CORPUS.append(value)


def _hostile(rng: random.Random) -> Any:
    pool = rng.randrange(8)
    if pool == 0:
        return rng.choice(HOSTILE_TEXT)
    if pool == 1:
        return rng.choice(HOSTILE_INTS)
    if pool == 2:
        return rng.choice(HOSTILE_FLOATS)
    if pool == 3:
        return Raw(rng.choice(HOSTILE_RAW))
    if pool == 4:
        return deep(rng.choice([10, 180, 300, 990, 3000, 100_000]), obj=rng.random() < 0.5)
    if pool == 5:
        return rng.choice(HOSTILE_TOPICS)
    if pool == 6:
        return rng.choice([None, True, 0, -1, "", [], {}, [1, "x"], {"a": None}])
    return rng.randrange(-(2**60), 2**60)


def mutate(template: Any, rng: random.Random) -> bytes:
    """One record from a corpus template: 0-3 JSON mutations, then maybe one byte mutation."""
    value = copy.deepcopy(template)  # Raw leaves (deep nesting, NaN) stay text
    if isinstance(value, dict) and rng.random() < 0.5:  # aim at the harnesses' workload
        header = value.get("header")
        if isinstance(header, dict):
            header.update(workload_id=WID, epoch=rng.choice([1, 2, 3]))
            if "effect_id" in value and rng.random() < 0.8:
                value["effect_id"] = _effect_id(header) if _spellable(header) else "x"
        elif "workload_id" in value:
            value["workload_id"] = WID
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        paths = _paths(value)
        path = rng.choice(paths)
        op = rng.randrange(6)
        if op <= 2:
            value = _set(value, path, _hostile(rng))
        elif op == 3 and path and isinstance(value, dict):
            parent: Any = value
            for p in path[:-1]:
                parent = parent[p]
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
        elif op == 4 and isinstance(value, dict):
            value["kind"] = rng.choice(sorted(bs.RECORD_TYPES))
        elif isinstance(value, dict):
            value[rng.choice(["extra", "\u202ekind", "v"])] = _hostile(rng)
    raw = dumps(value).encode("utf-8", "surrogatepass")
    op = rng.randrange(40)
    if op < 4 and raw:
        raw = raw[: rng.randrange(len(raw))]
    elif op < 8 and raw:
        pos = rng.randrange(len(raw))
        raw = raw[:pos] + bytes([rng.randrange(256)]) + raw[pos + 1:]
    elif op < 10:
        pos = rng.randrange(len(raw) + 1)
        raw = raw[:pos] + rng.choice([b"\xc0\xaf", b"\xed\xa0\x80", b"\x00", b"\xef\xbb\xbf",
                                      b"\xe2\x80\xae", b"\xf4\x90\x80\x80"]) + raw[pos:]
    elif op == 10 and rng.random() < 0.2:
        raw = raw + b" " * (bs.MAX_RECORD_BYTES + 1 - len(raw))
    elif op == 11:
        raw = b" " + raw  # valid, not canonical
    return raw


def _spellable(header: dict[str, Any]) -> bool:
    return all(k in header for k in ("workload_id", "input_offset", "index", "epoch", "shadow"))


def run_corpus(records: int, seed: int, corpus_size: int, crash_dir: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    before = machine()
    start = time.perf_counter()
    draw = corpus_example.hypothesis.fuzz_one_input  # type: ignore[attr-defined]
    while len(CORPUS) < corpus_size:
        draw(rng.randbytes(rng.choice([256, 1024, 4096])))
    corpus_s = time.perf_counter() - start
    crashes: list[str] = []
    executor, holder = ExecutorHarness(), HolderHarness()
    start = time.perf_counter()
    statuses = ("ready", "absent", "corrupt")
    for i in range(records):
        if i % 64 == 0:
            executor, holder = ExecutorHarness(), HolderHarness()
        raw = mutate(CORPUS[rng.randrange(len(CORPUS))], rng)
        try:
            outcome, record = decode_outcome(raw, strict=bool(i & 1))
            TALLY["decode " + outcome] += 1
            if record is not None:
                TALLY["executor " + executor.feed(record, model_status=statuses[i % 3],
                                                  finish=i)] += 1
                source = "in" if isinstance(record, bs.InputRecord) else "resp"
                TALLY["holder " + holder.feed(record, source=source)] += 1
        except Exception as exc:  # a crash: not a typed refusal
            crash_dir.mkdir(parents=True, exist_ok=True)
            path = crash_dir / f"crash-{seed}-{i}.json"
            path.write_bytes(raw)
            crashes.append(f"{type(exc).__name__}: {str(exc)[:200]} ({path})")
            TALLY[f"CRASH {type(exc).__name__}"] += 1
            executor, holder = ExecutorHarness(), HolderHarness()
    elapsed = time.perf_counter() - start
    return {"records": records, "corpus": len(CORPUS), "corpus_seconds": round(corpus_s, 1),
            "seed": seed, "seconds": round(elapsed, 1),
            "records_per_s": round(records / elapsed), "crashes": len(crashes),
            "crash_list": crashes[:20],
            "known_crashes": sum(v for k, v in TALLY.items() if "CRASH_KNOWN" in k),
            "machine_before": before, "machine_after": machine(),
            "tally": dict(sorted(TALLY.items()))}


def machine() -> dict[str, Any]:
    load = os.getloadavg()
    return {"cpus": os.cpu_count(), "load_1m": round(load[0], 2), "load_5m": round(load[1], 2),
            "python": sys.version.split()[0]}


def run_seeded(records: int, seed: int, crash_dir: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    crashes: list[str] = []
    before = machine()
    start = time.perf_counter()
    fuzz = one_example.hypothesis.fuzz_one_input  # type: ignore[attr-defined]
    while STATE["records"] < records:
        buffer = rng.randbytes(rng.choice([256, 1024, 4096, 16384]))
        STATE["examples"] += 1
        try:
            fuzz(buffer)
        except Exception as exc:  # a crash: not a typed refusal
            crash_dir.mkdir(parents=True, exist_ok=True)
            path = crash_dir / f"crash-{seed}-{STATE['examples']}.bin"
            path.write_bytes(buffer)
            crashes.append(f"{type(exc).__name__}: {str(exc)[:200]} ({path})")
            TALLY[f"CRASH {type(exc).__name__}"] += 1
    elapsed = time.perf_counter() - start
    return {"records": STATE["records"], "examples": STATE["examples"], "seed": seed,
            "seconds": round(elapsed, 1), "records_per_s": round(STATE["records"] / elapsed),
            "crashes": len(crashes), "crash_list": crashes[:20],
            "known_crashes": sum(v for k, v in TALLY.items() if "CRASH_KNOWN" in k),
            "machine_before": before, "machine_after": machine(),
            "tally": dict(sorted(TALLY.items()))}


def run_atheris(runs: int, seed: int) -> None:
    import atheris

    fuzz = one_example.hypothesis.fuzz_one_input  # type: ignore[attr-defined]

    def target(data: bytes) -> None:
        fuzz(data)  # an untyped exception propagates: libFuzzer records the input and stops

    # no atheris.instrument_all(): instrumenting the ~10,700 loaded functions took over 3 minutes
    # on 2 busy cores, so libFuzzer runs here without coverage feedback (random buffers)
    atheris.Setup([sys.argv[0], f"-runs={runs}", f"-seed={seed}", "-max_len=16384",
                   "-len_control=0", "-rss_limit_mb=4096"], target)
    atheris.Fuzz()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    ap.add_argument("--corpus", type=int, default=1000,
                    help="templates drawn by hypothesis before the seeded mutation phase")
    ap.add_argument("--hypothesis-only", action="store_true",
                    help="every record drawn by hypothesis (slow: tens of records/s)")
    ap.add_argument("--crash-dir", type=Path, default=Path(".fx/fuzz-crashes"))
    ap.add_argument("--atheris", action="store_true", help="drive the generator with libFuzzer")
    ap.add_argument("--runs", type=int, default=20_000, help="libFuzzer runs (--atheris)")
    args = ap.parse_args(argv)
    if args.atheris:
        # exits when the runs are done (libFuzzer's own exit code: 0 = no crash)
        run_atheris(args.runs, args.seed)
        return 0
    if args.hypothesis_only:
        result = run_seeded(args.records, args.seed, args.crash_dir)
    else:
        result = run_corpus(args.records, args.seed, args.corpus, args.crash_dir)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for key, count in result["tally"].items():
            print(f"{count:>9}  {key}")
        print(f"records={result['records']} examples={result.get('examples', '-')} "
              f"corpus={result.get('corpus', '-')} seed={args.seed} "
              f"seconds={result['seconds']} records/s={result['records_per_s']} "
              f"crashes={result['crashes']} known_crashes={result['known_crashes']}")
        print(f"machine before: {result['machine_before']}  after: {result['machine_after']}")
        for line in result["crash_list"]:
            print("  crash:", line)
    return 1 if result["crashes"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
