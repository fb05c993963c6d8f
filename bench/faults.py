"""A fault harness: a sustained stream of effects through real brokers, executors and holders
while faults are injected; then ``fx audit`` and a count of what was lost or duplicated.

    .venv/bin/python bench/faults.py --executor-kills 3 --broker-restarts 1 \\
        --holder-failovers 2 --cluster-kills 1 --duplicates 3 --late-answers 3 \\
        --duration-cap-s 600 --seed 1 --json faults.json

Everything is real and on loopback: the project's own Apache Kafka (:class:`fx_kafka.local.
LocalKafka`, a fresh data dir under a temporary directory), ``fx executor run`` processes with
magika (imported from its PyPI wheel into a model store), ``fx workload run`` election candidates
for :class:`workload_sdk.examples.filetype_gate.FiletypeGate`, and inputs appended at a steady
rate. Two phases, each on its own broker and workload:

``single``
    a one-node broker; executor SIGKILLs, graceful broker restarts (stop, down 1-3 s, start on
    the same data dir and ports) and holder SIGKILLs (a stand-by is elected; the killed candidate
    is started again so there are always stand-bys), in a seeded random order, one at a time
    (with ``--tracks 2`` executor kills run on a track of their own beside the others).
``cluster``
    a 3-node cluster; one node SIGKILLed at a time (down 3-8 s, started again, and every
    workload and internal topic back to a full ISR before the next).

In the first phase that runs, a rogue writer also appends byte copies of real executor
responses (an executor that answers twice: must be passed over, as ``duplicate``, or as
``after_outcome`` when the holder had written that request's ``timeout``) and unsigned
``ok`` answers to gate requests 0-500 ms after their deadline (an executor that answers late:
passed over as ``after_outcome`` when the holder's ``timeout`` was merged first, else it is the
answer, which is the design's rule: the first answer merged wins).

Each fault waits for its recovery (bounded by ``--fault-timeout-s``) before the next, so each
recovery time is its own. A phase ends by draining (inputs stop; every input decided, every
request answered in the merge log, bounded), stopping the services, running ``fx audit ID
--module ... --json`` as a subprocess and counting from the log. Definitions (recovery times,
kill classes, lost, duplicated) are in ``docs/reliability.md``; the module's own summary:

- executor kill classes, judged from the log against the kill time (same clock: loopback):
  ``after_accept`` the killed node had accepted an effect and not answered it; ``before_accept``
  it was the node serving (the last executor to write on ``.resp``) and an inference request
  was on ``.out`` that no executor had accepted or answered yet; ``after_response`` it was the
  node serving with nothing in flight or waiting; ``standby`` another node was serving.
- recovery: from the fault to the broker append time of the first ``deliver`` entry on
  ``.merge`` after it that merges a record itself appended after the fault (a new input or a
  new answer): an executor's answer (executor kill); any, appended after the broker was ready
  again (broker restart: from the stop, and from ready); any (cluster kill). Holder fail-over:
  the new claim on ``.claims`` (take-over), and the first step of the new epoch.
- ``--tracks 2`` runs executor kills on their own track beside the other faults (broker faults
  still run alone); a fault whose window overlapped another's is flagged ``overlapped``.

Exit 0 when nothing was lost or duplicated, ``fx audit`` exits 0, every fault recovered and every
rogue duplicate was passed over; 1 otherwise; 2 when the duration cap stopped the run before
every fault asked for was injected (unless ``--allow-capped``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import hashlib
import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "bench") not in sys.path:  # its helpers, also when loaded by file (tests)
    sys.path.append(str(ROOT / "bench"))

from aiokafka import TopicPartition  # noqa: E402
from aiokafka.errors import KafkaError  # noqa: E402
from executor_setup import write_executor_config  # noqa: E402

from broker_schema import (  # noqa: E402
    INFERENCE_KIND,
    AcceptedRecord,
    ClaimRecord,
    DecodeError,
    EffectRequest,
    ExecutorInfo,
    InputRecord,
    MergeEntry,
    OutputRecord,
    Record,
    ResponseRecord,
    decode,
    encode,
    topics,
)
from fx_kafka.client import make_admin, make_consumer, make_producer  # noqa: E402
from fx_kafka.local import LocalKafka  # noqa: E402
from fx_kafka.security import child_env  # noqa: E402
from workload_sdk import WorkloadLog, body_of, read_workload_log  # noqa: E402
from workload_sdk.examples.filetype_gate import GATE_KIND  # noqa: E402
from workload_sdk.testing import WorkloadHarness, fx_command  # noqa: E402

__all__ = [
    "EXECUTOR_KILL_CLASSES",
    "FAULT_TYPES",
    "Fault",
    "FaultConfig",
    "FaultReport",
    "PhaseReport",
    "analyse_log",
    "classify_executor_kill",
    "main",
    "percentile",
    "render_report",
    "run_faults",
]

MODULE = "workload_sdk.examples.filetype_gate:FiletypeGate"
FAULT_TYPES = ("executor_kill", "broker_restart", "holder_failover", "cluster_kill",
               "rogue_duplicate", "rogue_late")
EXECUTOR_KILL_CLASSES = ("before_accept", "after_accept", "after_response", "standby")
#: Which point a targeted executor kill waits for (``random``: a random running executor, now).
KILL_TARGETS = ("before_accept", "after_accept", "after_response", "random")
SESSION_TIMEOUT_MS = 6000
ROGUE_DUP = "rogue-dup"  # the duplicate is a byte copy: it names the real executor; this is ours
ROGUE_LATE = "rogue-late"
FILES = (
    b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" * 20,
    b"import os\n\ndef main() -> None:\n    print(os.getcwd())\n\n" * 20,
    b'{"a": [1, 2, 3], "b": {"c": "d"}}\n' * 30,
    b"Dear reader,\nthis is plain text about nothing in particular.\n" * 15,
)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _log(msg: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile (the value at rank ceil(p/100 * n) of the sorted
    values; with fewer than 100 values p99 is the maximum); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


# ---------------------------------------------------------------------------------- config


@dataclass
class FaultConfig:
    """What to inject, how fast, and the bounds. Counts are exact targets; the duration cap may
    stop a run before they are reached (reported as ``capped``)."""

    executor_kills: int = 3
    broker_restarts: int = 1
    holder_failovers: int = 2
    cluster_kills: int = 1
    duplicates: int = 3
    late_answers: int = 3
    duration_cap_s: float = 600.0
    seed: int = 1
    rate_hz: float = 2.0
    executors: int = 2
    candidates: int = 3
    fault_timeout_s: float = 90.0
    drain_timeout_s: float = 180.0
    audit_timeout_s: float = 900.0
    gap_s: tuple[float, float] = (0.5, 2.0)
    #: 1: every fault in one sequence; 2: executor kills on their own track, beside the rest
    tracks: int = 1
    #: the executors' consumer-group session timeout: an executor kill recovers in about this
    #: (the holders' election keeps SESSION_TIMEOUT_MS)
    executor_session_timeout_ms: int = SESSION_TIMEOUT_MS
    #: the share of serving-executor kills whose restart waits until the kill has recovered, so
    #: that the stand-by, not the restarted process, takes the partition over
    delay_restart_p: float = 0.0
    workdir: Path | None = None
    keep: bool = False
    #: a model store that holds magika already (else it is imported into the work dir)
    model_store: Path | None = None

    def __post_init__(self) -> None:
        for name in ("executor_kills", "broker_restarts", "holder_failovers", "cluster_kills",
                     "duplicates", "late_answers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.executors < 2:
            raise ValueError("at least 2 executors (one stays up while the other is killed)")
        if self.candidates < 2 and self.holder_failovers:
            raise ValueError("holder fail-overs need at least 2 candidates")
        if self.tracks not in (1, 2):
            raise ValueError("tracks is 1 or 2")
        if not 1000 <= self.executor_session_timeout_ms <= 60_000:
            raise ValueError("executor_session_timeout_ms must be in [1000, 60000]")
        if not 0.0 <= self.delay_restart_p <= 1.0:
            raise ValueError("delay_restart_p must be in [0, 1]")
        if not 0 < self.rate_hz <= 50:
            raise ValueError("rate_hz must be in (0, 50]")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["workdir"] = None if self.workdir is None else str(self.workdir)
        d["model_store"] = None if self.model_store is None else str(self.model_store)
        d["gap_s"] = list(self.gap_s)
        return d


@dataclass
class Fault:
    """One injected fault. Times are wall-clock ms (the broker's append-time clock on
    loopback). ``recovery_ms``: see the module docstring; None when it did not recover in
    time (``recovered`` False)."""

    type: str
    t_ms: int
    target: str
    wanted: str = ""
    klass: str = ""
    recovered: bool = False
    recovery_ms: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class PhaseReport:
    """One phase: its broker, workload, faults, counts from the log and the audit's verdict."""

    name: str
    workload_id: str
    nodes: int
    started_ms: int
    ended_ms: int = 0
    faults: list[Fault] = field(default_factory=list)
    asked: dict[str, int] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    audit: dict[str, Any] = field(default_factory=dict)
    audit_exit: int | None = None
    problems: list[str] = field(default_factory=list)
    capped: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems and self.audit_exit == 0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "workload_id": self.workload_id, "nodes": self.nodes,
                "started_ms": self.started_ms, "ended_ms": self.ended_ms,
                "duration_s": round((self.ended_ms - self.started_ms) / 1000, 1),
                "ok": self.ok, "capped": self.capped, "asked": dict(self.asked),
                "faults_by_type": dict(Counter(f.type for f in self.faults)),
                "recovery": _recovery_summary(self.faults),
                "counts": self.counts, "audit_exit": self.audit_exit,
                "audit": self.audit, "problems": list(self.problems),
                "faults": [asdict(f) for f in self.faults]}


@dataclass
class FaultReport:
    """A whole run: its configuration, phases, and the machine load around it."""

    config: FaultConfig
    phases: list[PhaseReport] = field(default_factory=list)
    started_ms: int = 0
    ended_ms: int = 0
    load_before: str = ""
    load_after: str = ""
    problems: list[str] = field(default_factory=list)
    #: where the brokers' data and the services' logs are (kept on failure or with keep)
    workdir: str = ""
    #: the 1-minute load average, sampled every 30 s during the run
    load_samples: list[float] = field(default_factory=list)

    @property
    def capped(self) -> bool:
        return any(p.capped for p in self.phases)

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.phases) and all(p.ok for p in self.phases)

    def totals(self) -> dict[str, Any]:
        faults = [f for p in self.phases for f in p.faults]
        keys = ("inputs", "effects_issued", "lost", "duplicated", "unknown", "timeouts",
                "timeouts_inference", "backpressure", "reasks", "errors", "decisions")
        out: dict[str, Any] = {k: sum(int(p.counts.get(k, 0)) for p in self.phases)
                               for k in keys}
        out["faults_by_type"] = dict(Counter(f.type for f in faults))
        out["executor_kills_by_class"] = dict(Counter(f.klass for f in faults
                                                      if f.type == "executor_kill"))
        # who answered first after a kill of the serving node: itself restarted, or the other
        took: Counter[str] = Counter()
        for f in faults:
            if f.type == "executor_kill" and f.klass != "standby":
                by = f.detail.get("first_answer_by")
                how = "delayed" if f.detail.get("restart_delayed") else "immediate"
                took[f"{how}_restart/" + ("none" if by is None else
                                          "restarted" if by == f.target else "other")] += 1
        out["executor_kill_first_answer"] = dict(sorted(took.items()))
        out["recovery"] = _recovery_summary(faults)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "capped": self.capped, "config": self.config.as_dict(),
                "started_ms": self.started_ms, "ended_ms": self.ended_ms,
                "duration_s": round((self.ended_ms - self.started_ms) / 1000, 1),
                "load_before": self.load_before, "load_after": self.load_after,
                "load_1m_during": _load_summary(self.load_samples),
                "totals": self.totals(), "problems": list(self.problems),
                "workdir": self.workdir,
                "phases": [p.as_dict() for p in self.phases]}


def _load_summary(samples: Sequence[float]) -> dict[str, float | int | None]:
    if not samples:
        return {"n": 0, "min": None, "mean": None, "max": None}
    return {"n": len(samples), "min": round(min(samples), 2),
            "mean": round(sum(samples) / len(samples), 2), "max": round(max(samples), 2)}


def _recovery_summary(faults: Iterable[Fault]) -> dict[str, dict[str, Any]]:
    """p50/p99/max recovery (seconds) per fault type, per executor-kill class, and for the
    second figure of broker restarts (after ready) and holder fail-overs (first step); with how
    many overlapped another fault, and the percentiles of those that did not."""
    groups: dict[str, list[tuple[float, bool]]] = {}
    for f in faults:
        if f.type.startswith("rogue"):
            continue
        ovl = bool(f.detail.get("overlapped"))
        if f.recovery_ms is not None:
            groups.setdefault(f.type, []).append((f.recovery_ms / 1000, ovl))
            if f.type == "executor_kill":
                groups.setdefault(f"executor_kill/{f.klass}", []).append(
                    (f.recovery_ms / 1000, ovl))
                if f.detail.get("restart_delayed"):
                    groups.setdefault("executor_kill/restart_delayed", []).append(
                        (f.recovery_ms / 1000, ovl))
        for extra in ("after_ready_ms", "first_step_ms"):
            if f.detail.get(extra) is not None:
                name = f"{f.type}/{extra.removesuffix('_ms')}"
                groups.setdefault(name, []).append((f.detail[extra] / 1000, ovl))
    out = {}

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 2)

    for name, pairs in sorted(groups.items()):
        vals = [v for v, _ in pairs]
        alone = [v for v, o in pairs if not o]
        out[name] = {"n": len(vals), "overlapped": len(vals) - len(alone),
                     "p50_s": r(percentile(vals, 50)), "p99_s": r(percentile(vals, 99)),
                     "max_s": r(max(vals)),
                     "isolated_p50_s": r(percentile(alone, 50)),
                     "isolated_p99_s": r(percentile(alone, 99))}
    return out


# ------------------------------------------------------------------------- analysis (pure)


@dataclass(frozen=True)
class _RespRow:
    offset: int
    time_ms: int
    kind: str  # accepted / response / tick
    effect_id: str | None
    node: str | None  # the executor node (accepted.node_id / response written_by)
    outcome: str | None = None


def _resp_rows(log: WorkloadLog) -> list[_RespRow]:
    rows = []
    for rec in log["resp"]:
        try:
            r = decode(rec.value)
        except DecodeError:
            continue
        if isinstance(r, AcceptedRecord):
            rows.append(_RespRow(rec.offset, rec.time_ms, "accepted", r.effect_id, r.node_id))
        elif isinstance(r, ResponseRecord):
            rows.append(_RespRow(rec.offset, rec.time_ms, "response", r.effect_id, r.written_by,
                                 r.outcome))
    return rows


def classify_executor_kill(node: str, t_ms: int, rows: Sequence[_RespRow],
                           requests: Sequence[tuple[int, str]], executor_nodes: set[str], *,
                           window_ms: int = 120_000,
                           row_times: Sequence[int] | None = None) -> str:
    """The class of a kill of executor ``node`` at ``t_ms`` (see the module docstring), from the
    ``.resp`` rows (sorted by append time) and the inference requests ``(append time, effect
    id)`` on ``.out`` (sorted), looking ``window_ms`` back (longer than any deadline or lease
    here, so nothing older is still in flight)."""
    import bisect

    times = row_times if row_times is not None else [r.time_ms for r in rows]
    lo = bisect.bisect_left(times, t_ms - window_ms)
    before = [r for r in rows[lo:] if r.time_ms <= t_ms and r.node in executor_nodes]
    accepted = {r.effect_id for r in before if r.kind == "accepted" and r.node == node}
    answered = {r.effect_id for r in before if r.kind == "response" and r.node == node}
    if accepted - answered:
        return "after_accept"
    owner = before[-1].node if before else None
    if owner != node:
        return "standby"
    touched = {r.effect_id for r in before}
    first = bisect.bisect_left(requests, (t_ms - window_ms, ""))
    waiting = [eid for t, eid in requests[first:] if t <= t_ms and eid not in touched]
    return "before_accept" if waiting else "after_response"


@dataclass(frozen=True)
class _Delivery:
    time_ms: int  # the merge entry's append time
    src_ms: int  # the append time of the record it merges (an input or an answer)
    executor: bool  # it merges an answer an executor wrote
    node: str | None = None  # that executor


def _first_fresh_delivery(deliveries: Sequence[_Delivery], times: Sequence[int], t_ms: int, *,
                          executor: bool = False) -> _Delivery | None:
    """The first delivery after ``t_ms`` that merges a record appended after ``t_ms`` (an
    executor's answer, with ``executor``); ``times``: the deliveries' ascending ``time_ms``."""
    import bisect

    for d in deliveries[bisect.bisect_right(times, t_ms):]:
        if d.src_ms > t_ms and (d.executor or not executor):
            return d
    return None


def _first_fresh(deliveries: Sequence[_Delivery], times: Sequence[int], t_ms: int, *,
                 executor: bool = False) -> int | None:
    """The append time of :func:`_first_fresh_delivery`, or None."""
    d = _first_fresh_delivery(deliveries, times, t_ms, executor=executor)
    return None if d is None else d.time_ms


def analyse_log(log: WorkloadLog, faults: Sequence[Fault], *, executor_nodes: set[str],
                rogue_offsets: dict[int, str]) -> tuple[dict[str, Any], list[str]]:
    """Count from the recorded log (independently of ``fx audit``) and fill in each fault's
    class and recovery time. ``rogue_offsets``: ``.resp`` offset -> ``dup``/``late`` of every
    record the rogue writer appended. Returns the counts and the problems found."""
    problems: list[str] = []
    inputs = sorted(r.offset for r in log["in"])
    decisions: Counter[int] = Counter()
    requests: dict[str, tuple[int, int, EffectRequest]] = {}
    slots: Counter[tuple[int, int]] = Counter()
    kinds: Counter[str] = Counter()
    for rec in log["out"]:
        r = decode(rec.value)
        if not isinstance(r, OutputRecord | EffectRequest):
            continue
        slots[r.header.slot] += 1
        if slots[r.header.slot] > 1:
            continue
        if isinstance(r, EffectRequest):
            requests[r.effect_id] = (rec.offset, rec.time_ms, r)
            kinds[r.effect_kind] += 1
        else:
            data = getattr(r.body, "data", None)
            if isinstance(data, dict) and "decision" in data and "file_offset" in data:
                decisions[int(data["file_offset"])] += 1
    all_rows = _resp_rows(log)
    resp_by_offset = {row.offset: row for row in all_rows}
    # for the kill classes: by append time, without the rogue's copies
    rows = sorted((row for row in all_rows if row.offset not in rogue_offsets),
                  key=lambda row: row.time_ms)
    row_times = [row.time_ms for row in rows]
    delivered: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    pass_over: Counter[str] = Counter()
    deliveries: list[_Delivery] = []
    epoch_first_step: dict[int, int] = {}
    rogue_fate: dict[str, Counter[str]] = {"dup": Counter(), "late": Counter()}
    infer_timeouts = 0
    resp_records: dict[int, ResponseRecord] = {}
    for rec in log["resp"]:
        with contextlib.suppress(DecodeError):
            r = decode(rec.value)
            if isinstance(r, ResponseRecord):
                resp_records[rec.offset] = r
    for rec in log["merge"]:
        e = decode(rec.value)
        if not isinstance(e, MergeEntry):
            continue
        if e.source == "resp" and e.source_offset in rogue_offsets:
            fate = "delivered" if e.action == "deliver" else str(e.reason)
            rogue_fate[rogue_offsets[e.source_offset]][fate] += 1
        if e.action == "pass_over":
            pass_over[str(e.reason)] += 1
            continue
        epoch_first_step.setdefault(e.epoch, rec.time_ms)
        if e.source == "in":
            src = log["in"].records.get(e.source_offset)
            deliveries.append(_Delivery(rec.time_ms, src.time_ms if src else 0, False))
        if e.source != "resp" or e.effect_id is None:
            continue
        delivered[e.effect_id] += 1
        resp = resp_records.get(e.source_offset)
        if resp is None:
            problems.append(f"merge@{rec.offset} delivers resp@{e.source_offset}, not read")
            continue
        outcomes[resp.outcome] += 1
        if resp.outcome == "error" and resp.error is not None:
            errors[resp.error.code] += 1
        req = requests.get(e.effect_id)
        if resp.outcome == "timeout" and req is not None and req[2].effect_kind != GATE_KIND:
            infer_timeouts += 1
        row = resp_by_offset.get(e.source_offset)
        deliveries.append(_Delivery(rec.time_ms, 0 if row is None else row.time_ms,
                                    row is not None and row.node in executor_nodes,
                                    None if row is None else row.node))
    # lost and duplicated
    lost_inputs = [o for o in inputs if decisions[o] == 0]
    lost_requests = [eid for eid in requests if delivered[eid] == 0]
    dup_slots = [s for s, n in slots.items() if n > 1]
    dup_decisions = [o for o, n in decisions.items() if n > 1]
    dup_delivered = [eid for eid, n in delivered.items() if n > 1]
    if lost_inputs:
        problems.append(f"{len(lost_inputs)} input(s) without a decision: {lost_inputs[:10]}")
    if lost_requests:
        problems.append(f"{len(lost_requests)} request(s) without a merged answer: "
                        f"{lost_requests[:10]}")
    if dup_slots:
        problems.append(f".out slot(s) written twice: {dup_slots[:10]}")
    if dup_decisions:
        problems.append(f"input(s) decided twice: {dup_decisions[:10]}")
    if dup_delivered:
        problems.append(f"effect(s) delivered twice: {dup_delivered[:10]}")
    if rogue_fate["dup"].get("delivered"):
        problems.append(f"{rogue_fate['dup']['delivered']} rogue duplicate(s) were delivered")
    # faults: classes and recovery times
    infer_requests = sorted((t, eid) for eid, (_, t, r) in requests.items()
                            if r.effect_kind == INFERENCE_KIND)
    claims = [(rec.time_ms, c) for rec in log["claims"]
              if isinstance(c := decode(rec.value), ClaimRecord)]
    deliveries.sort(key=lambda d: d.time_ms)
    times = [d.time_ms for d in deliveries]
    for f in faults:
        if f.type == "executor_kill":
            f.klass = classify_executor_kill(f.target, f.t_ms, rows, infer_requests,
                                             executor_nodes, row_times=row_times)
            first = _first_fresh_delivery(deliveries, times, f.t_ms, executor=True)
            at = None if first is None else first.time_ms
            # which node answered first after the kill: the restarted one or another
            f.detail["first_answer_by"] = None if first is None else first.node
        elif f.type == "broker_restart":
            ready = int(f.detail["ready_ms"])
            at = _first_fresh(deliveries, times, ready)
            f.detail["after_ready_ms"] = None if at is None else at - ready
        elif f.type == "cluster_kill":
            at = _first_fresh(deliveries, times, f.t_ms)
        elif f.type == "holder_failover":
            old = int(f.detail["old_epoch"])
            new = next(((t, c) for t, c in claims if c.epoch > old), None)
            at = None if new is None else new[0]
            if new is not None:
                f.detail["new_epoch"] = new[1].epoch
                f.detail["new_holder"] = new[1].holder_id
                step = epoch_first_step.get(new[1].epoch)
                f.detail["first_step_ms"] = None if step is None else step - f.t_ms
        else:
            continue
        f.recovery_ms = None if at is None else at - f.t_ms
        if f.recovery_ms is None and f.recovered:
            problems.append(f"{f.type} at {f.t_ms}: recovered live, but no later step on the "
                            "log")
    counts: dict[str, Any] = {
        "inputs": len(inputs),
        "decisions": sum(decisions.values()),
        "effects_issued": len(requests),
        "effects_by_kind": dict(kinds),
        "lost": len(lost_inputs) + len(lost_requests),
        "lost_inputs": len(lost_inputs),
        "lost_requests": len(lost_requests),
        "duplicated": len(dup_slots) + len(dup_delivered) + len(dup_decisions),
        "out_slots_twice": len(dup_slots),
        "delivered_twice": len(dup_delivered),
        "decided_twice": len(dup_decisions),
        "outcomes": dict(outcomes),
        "unknown": outcomes.get("unknown", 0),
        "timeouts": outcomes.get("timeout", 0),
        "timeouts_inference": infer_timeouts,
        "backpressure": outcomes.get("backpressure", 0),
        "errors": sum(errors.values()),
        "errors_by_code": dict(errors),
        "reasks": max(0, kinds.get(INFERENCE_KIND, 0) - len(inputs)),
        "pass_over": dict(pass_over),
        "rogue": {k: dict(v) for k, v in rogue_fate.items()},
        "claims": len(claims),
    }
    return counts, problems


# -------------------------------------------------------------------------------- processes


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _Proc:
    """One service process (an executor or holder instance) and its log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        env = child_env(dict(os.environ))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as out:
            # spawned from the event loop's thread, so PDEATHSIG follows the harness itself
            self.popen = subprocess.Popen(argv, env=env, cwd=str(ROOT), stdout=out,
                                          stderr=subprocess.STDOUT,
                                          preexec_fn=_die_with_parent)
        self.started = time.monotonic()
        self.killed = False

    def alive(self) -> bool:
        return self.popen.poll() is None

    def logged(self, text: str) -> bool:
        try:
            return text in self.log_path.read_text(errors="replace")
        except OSError:
            return False

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def kill(self) -> None:
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGKILL)

    async def wait_exit(self, timeout: float = 20.0) -> int | None:
        deadline = time.monotonic() + timeout
        while self.popen.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.popen.poll()

    async def stop(self, timeout: float = 20.0) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            code = await self.wait_exit(timeout)
            if code is None:
                self.kill()
                return await self.wait_exit(10)
            return code
        return self.popen.returncode


# -------------------------------------------------------------------------------- live tail


Listener = Callable[[str, int, int, Record, bytes], None]


class _Tail:
    """Reads ``.in``, ``.out``, ``.resp``, ``.merge`` and ``.claims`` as they grow
    (read_committed), keeps what the faults need, and wakes waiters after each batch."""

    def __init__(self, bootstrap: str, wid: str, executor_nodes: set[str]) -> None:
        self.bootstrap = bootstrap
        self.wid = wid
        self.executor_nodes = executor_nodes
        self.stream_of = {topics.stream(wid, s): s for s in ("in", "out", "resp", "merge",
                                                              "claims")}
        self.cond = asyncio.Condition()
        self.in_end = 0
        self.requests: dict[str, int] = {}  # effect id -> append time
        self.decided: set[int] = set()
        self.delivered: set[str] = set()
        self.deliveries: list[tuple[int, int, str, int]] = []  # time, epoch, source, offset
        self.in_time: dict[int, int] = {}  # .in offset -> append time
        self.resp_info: dict[int, tuple[int, str]] = {}  # .resp offset -> (time, written_by)
        self.last_exec: tuple[str, str, int] | None = None  # node, kind, time
        self.claims: list[tuple[int, str, int]] = []  # epoch, holder, time
        self.listeners: list[Listener] = []
        self.errors = 0
        self._seen: set[bytes] = set()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, KafkaError, TimeoutError):
                await asyncio.wait_for(self._task, 30)

    async def _run(self) -> None:
        positions = {name: 0 for name in self.stream_of}
        while not self._stop.is_set():
            consumer = make_consumer(self.bootstrap)
            try:
                await consumer.start()
                tps = [TopicPartition(name, 0) for name in self.stream_of]
                consumer.assign(tps)
                for tp in tps:
                    consumer.seek(tp, positions[tp.topic])
                while not self._stop.is_set():
                    batch = await consumer.getmany(timeout_ms=200)
                    for tp, msgs in batch.items():
                        for msg in msgs:
                            positions[tp.topic] = msg.offset + 1
                            self._on(self.stream_of[tp.topic], msg.offset, msg.timestamp,
                                     msg.value)
                    if batch:
                        async with self.cond:
                            self.cond.notify_all()
            except (KafkaError, OSError, TimeoutError) as exc:
                self.errors += 1
                if self.errors % 20 == 1:
                    _log(f"tail: {exc!r}; reconnecting")
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(KafkaError, TimeoutError, OSError):
                    await asyncio.wait_for(consumer.stop(), 10)

    def _on(self, stream: str, offset: int, time_ms: int, value: bytes) -> None:
        if stream == "in":
            self.in_end = max(self.in_end, offset + 1)
            self.in_time[offset] = time_ms
            return
        try:
            r = decode(value)
        except DecodeError:
            return
        if stream == "out":
            if isinstance(r, EffectRequest):
                self.requests.setdefault(r.effect_id, time_ms)
            elif isinstance(r, OutputRecord):
                data = getattr(r.body, "data", None)
                if isinstance(data, dict) and "decision" in data and "file_offset" in data:
                    self.decided.add(int(data["file_offset"]))
        elif stream == "resp":
            if isinstance(r, AcceptedRecord) and r.node_id in self.executor_nodes:
                self.last_exec = (r.node_id, "accepted", time_ms)
            elif isinstance(r, ResponseRecord):
                self.resp_info[offset] = (time_ms, r.written_by)
                digest = hashlib.sha256(value).digest()
                if r.written_by in self.executor_nodes and digest not in self._seen:
                    self._seen.add(digest)  # a byte copy (the rogue's) is nobody's activity
                    self.last_exec = (r.written_by, "response", time_ms)
        elif stream == "merge":
            if isinstance(r, MergeEntry) and r.action == "deliver":
                self.deliveries.append((time_ms, r.epoch, r.source, r.source_offset))
                if r.effect_id is not None:
                    self.delivered.add(r.effect_id)
        elif stream == "claims" and isinstance(r, ClaimRecord):
            self.claims.append((r.epoch, r.holder_id, time_ms))
        for listener in list(self.listeners):
            listener(stream, offset, time_ms, r, value)

    # -- questions --------------------------------------------------------------------------
    def owner(self) -> str | None:
        """The executor node that wrote last on ``.resp`` (the one serving, as far as seen)."""
        return None if self.last_exec is None else self.last_exec[0]

    def holder(self) -> tuple[int, str] | None:
        """``(epoch, holder id)`` of the latest claim."""
        return None if not self.claims else (self.claims[-1][0], self.claims[-1][1])

    def delivered_after(self, t_ms: int, *, executor: bool = False, fresh: bool = True,
                        epoch: int | None = None) -> int | None:
        """Append time of the first delivery on ``.merge`` after ``t_ms`` that merges a record
        itself appended after ``t_ms`` (``fresh``; an input or an answer), of an executor's
        answer (``executor``), of an epoch at or above ``epoch``. None: none seen yet."""
        found = None
        for time_ms, ep, source, offset in reversed(self.deliveries):
            if time_ms <= t_ms:
                break
            if epoch is not None and ep < epoch:
                continue
            if source == "resp":
                src_time, writer = self.resp_info.get(offset, (None, None))
            else:
                src_time, writer = self.in_time.get(offset), None
            if fresh and (src_time is None or src_time <= t_ms):
                continue
            if executor and (source != "resp" or writer not in self.executor_nodes):
                continue
            found = time_ms
        return found

    def drained(self) -> bool:
        return (self.in_end > 0 and all(o in self.decided for o in range(self.in_end))
                and all(eid in self.delivered for eid in self.requests))

    async def wait(self, predicate: Callable[[], Any], timeout: float) -> bool:
        """Wait until ``predicate()`` is truthy (checked after each batch); False on timeout."""
        try:
            async with self.cond:
                await asyncio.wait_for(self.cond.wait_for(predicate), timeout)
            return True
        except TimeoutError:
            return bool(predicate())


# ---------------------------------------------------------------------------------- writers


class _Writer:
    """A producer that rides broker outages out as a client must: one whose batch was lost (or
    that fails any other way) is replaced by a new one before the next send."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.producer: Any = None
        self.replaced = 0

    async def _ensure(self) -> Any:
        while self.producer is None:
            producer = make_producer(self.bootstrap)
            try:
                await asyncio.wait_for(producer.start(), 30)
                self.producer = producer
            except (KafkaError, OSError, TimeoutError):
                with contextlib.suppress(KafkaError, TimeoutError, OSError):
                    await asyncio.wait_for(producer.stop(), 10)
                await asyncio.sleep(0.5)
        return self.producer

    async def send(self, topic: str, value: bytes, timeout: float = 60.0) -> int | None:
        """Append ``value`` to partition 0 of ``topic``; its offset, or None when it failed
        (the producer is then replaced; the record may or may not be on the log)."""
        producer = await self._ensure()
        try:
            meta = await asyncio.wait_for(
                producer.send_and_wait(topic, value=value, partition=0), timeout)
            return int(meta.offset)
        except (KafkaError, OSError, TimeoutError):
            self.replaced += 1
            self.producer = None
            with contextlib.suppress(KafkaError, TimeoutError, OSError):
                await asyncio.wait_for(producer.stop(), 10)
            return None

    async def close(self) -> None:
        if self.producer is not None:
            with contextlib.suppress(KafkaError, TimeoutError, OSError):
                await asyncio.wait_for(self.producer.stop(), 10)
            self.producer = None


# ------------------------------------------------------------------------------------ phase


class _Phase:
    """One broker, one workload, its executors and holders, and the faults injected into it."""

    def __init__(self, cfg: FaultConfig, rng: random.Random, name: str, kafka: LocalKafka,
                 store: Path, model_hash: str, workdir: Path, asked: dict[str, int],
                 inject_until: float, hard_until: float) -> None:
        self.cfg = cfg
        self.rng = rng
        self.kafka = kafka
        self.bootstrap = kafka.bootstrap
        self.store = store
        self.model_hash = model_hash
        self.workdir = workdir
        self.inject_until = inject_until
        self.hard_until = hard_until
        self.wid = f"faults-{name}-{int(time.time() * 1000) % 10**9}"
        self.report = PhaseReport(name=name, workload_id=self.wid, nodes=kafka.nodes,
                                  started_ms=_now_ms(), asked=dict(asked))
        self.slots = [chr(ord("a") + i) for i in range(cfg.executors)]
        self.executor_nodes = {f"exec-{s}" for s in self.slots}
        self.executors: dict[str, _Proc] = {}
        self.holders: dict[str, _Proc] = {}
        self.instances: Counter[str] = Counter()
        self.dead: list[str] = []  # processes that exited without being killed by us
        self.tail = _Tail(self.bootstrap, self.wid, self.executor_nodes)
        self.rogue_offsets: dict[int, str] = {}
        self.rogue_asked = {"dup": asked.get("rogue_duplicate", 0),
                            "late": asked.get("rogue_late", 0)}
        self.rogue_tasks: set[asyncio.Task[None]] = set()
        self.rogue_p = {"dup": 0.0, "late": 0.0}
        self.rogue_on = False
        self.sent = 0
        self.resent = 0
        self._stop_feed = asyncio.Event()
        self._gate = _Gate()
        self._total = self._done = 0
        self._halt = False

    # -- processes --------------------------------------------------------------------------
    def _executor_config(self, slot: str) -> Path:
        session_ms = self.cfg.executor_session_timeout_ms
        return write_executor_config(
            self.workdir / f"executor-{slot}.json", self.bootstrap, self.wid, self.store,
            node_id=f"exec-{slot}", group_prefix=f"fx-faults-{self.wid}",
            key_file=str(self.workdir / f"node-{slot}.key"),
            chunk_dir=str(self.workdir / f"chunks-{slot}"), preload="all",
            session_timeout_ms=session_ms, heartbeat_interval_ms=min(500, session_ms // 4),
            device="cpu")

    def _start_executor(self, slot: str) -> _Proc:
        self.instances[f"exec-{slot}"] += 1
        name = f"exec-{slot}.{self.instances[f'exec-{slot}']}"
        proc = _Proc(name, [*fx_command(), "executor", "run", "--config",
                            str(self.workdir / f"executor-{slot}.json")],
                     self.workdir / "logs" / f"{name}.log")
        self.executors[slot] = proc
        return proc

    def _start_holder(self, hid: str) -> _Proc:
        self.instances[hid] += 1
        name = f"holder-{hid}.{self.instances[hid]}"
        proc = _Proc(name, [sys.executable, "-m", "workload_sdk", "workload", "run", MODULE,
                            "--id", self.wid, "--holder-id", hid, "--bootstrap", self.bootstrap,
                            "--session-timeout-ms", str(SESSION_TIMEOUT_MS),
                            # the gate kind is served by nobody here (its requests time out)
                            "--force"],
                     self.workdir / "logs" / f"{name}.log")
        self.holders[hid] = proc
        return proc

    async def _wait_ready(self, procs: Iterable[_Proc], text: str, timeout: float) -> None:
        pending = list(procs)
        deadline = time.monotonic() + timeout
        while pending:
            pending = [p for p in pending if not p.logged(text)]
            for p in pending:
                if not p.alive():
                    raise RuntimeError(f"{p.name} exited {p.popen.returncode} before it was "
                                       f"ready:\n{p.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{', '.join(p.name for p in pending)} not ready after "
                                   f"{timeout:.0f} s:\n" + "\n".join(p.tail() for p in pending))
            if pending:
                await asyncio.sleep(0.2)

    async def _executors_ready(self, timeout: float = 120.0) -> None:
        await self._wait_ready(self.executors.values(), "serving", timeout)

    async def _candidates_ready(self, timeout: float = 120.0) -> None:
        await self._wait_ready(self.holders.values(), "candidate for the lease", timeout)

    def _check_processes(self) -> None:
        """Note (and replace) any service that exited without being killed by the harness."""
        for slot, proc in list(self.executors.items()):
            if not proc.alive() and not proc.killed:
                self.dead.append(f"{proc.name} exited {proc.popen.returncode}: "
                                 f"{proc.tail(1500)}")
                self._start_executor(slot)
        for hid, proc in list(self.holders.items()):
            if not proc.alive() and not proc.killed:
                self.dead.append(f"{proc.name} exited {proc.popen.returncode}: "
                                 f"{proc.tail(1500)}")
                self._start_holder(hid)

    # -- inputs and the rogue writer --------------------------------------------------------
    async def _feed(self) -> None:
        writer = _Writer(self.bootstrap)
        period = 1.0 / self.cfg.rate_hz
        nxt = time.monotonic()
        try:
            while not self._stop_feed.is_set():
                data = FILES[self.sent % len(FILES)] + b"\n# input %d\n" % self.sent
                record = InputRecord(workload_id=self.wid, body=body_of(data), source="faults")
                while await writer.send(topics.inputs(self.wid), encode(record)) is None:
                    self.resent += 1  # resent: it may be on .in twice (two inputs, two decisions)
                    if self._stop_feed.is_set():
                        break
                    await asyncio.sleep(0.2)
                self.sent += 1
                nxt += period
                await asyncio.sleep(max(0.0, nxt - time.monotonic()))
                nxt = max(nxt, time.monotonic() - period)
        finally:
            await writer.close()

    def _on_record(self, stream: str, offset: int, time_ms: int, r: Record, raw: bytes) -> None:
        if not self.rogue_on:
            return
        if (stream == "resp" and isinstance(r, ResponseRecord)
                and r.written_by in self.executor_nodes and r.header.index == 0
                and self._rogue_room("dup")):
            self._rogue_spawn(self._rogue_dup(raw, r.effect_id))
        elif (stream == "out" and isinstance(r, EffectRequest) and r.effect_kind == GATE_KIND
              and self._rogue_room("late")):
            self._rogue_spawn(self._rogue_late(offset, time_ms, r))

    def _rogue_room(self, what: str) -> bool:
        done = sum(1 for w in self.rogue_offsets.values() if w == what)
        in_flight = sum(1 for t in self.rogue_tasks if t.get_name() == what)
        return (done + in_flight < self.rogue_asked[what]
                and self.rng.random() < self.rogue_p[what])

    def _rogue_spawn(self, coro: Any) -> None:
        name = "dup" if coro.__name__ == "_rogue_dup" else "late"
        task = asyncio.create_task(coro, name=name)
        self.rogue_tasks.add(task)
        task.add_done_callback(self.rogue_tasks.discard)

    async def _rogue_dup(self, raw: bytes, effect_id: str) -> None:
        """An executor that answers twice: the same signed response, appended again."""
        await asyncio.sleep(self.rng.uniform(0.05, 0.5))
        offset = await self._rogue_writer.send(topics.resp(self.wid), raw, timeout=20)
        if offset is not None:
            self.rogue_offsets[offset] = "dup"
            self.report.faults.append(Fault("rogue_duplicate", _now_ms(), effect_id,
                                            detail={"resp_offset": offset}))

    async def _rogue_late(self, offset: int, time_ms: int, req: EffectRequest) -> None:
        """An executor that answers after the deadline: an unsigned ``ok`` 0-500 ms late."""
        due = (time_ms + req.deadline_ms + self.rng.randint(0, 500)) / 1000
        await asyncio.sleep(max(0.0, due - time.time()))
        resp = ResponseRecord(
            effect_id=req.effect_id, header=req.header, request_offset=offset, outcome="ok",
            output=body_of({"set_point": req.params.get("set_point"), "late": True}),
            executor=ExecutorInfo(node_id=ROGUE_LATE, engine="rogue", engine_version="0",
                                  device_class="none"),
            written_by=ROGUE_LATE)
        at = await self._rogue_writer.send(topics.resp(self.wid), encode(resp), timeout=20)
        if at is not None:
            self.rogue_offsets[at] = "late"
            self.report.faults.append(Fault("rogue_late", _now_ms(), req.effect_id,
                                            detail={"resp_offset": at,
                                                    "late_by_ms": _now_ms() - time_ms
                                                    - req.deadline_ms}))

    # -- faults -----------------------------------------------------------------------------
    async def _executor_kill(self) -> Fault:
        await self._executors_ready()
        wanted = self.rng.choice(KILL_TARGETS)
        running = [s for s, p in self.executors.items() if p.alive()]
        owner = self.tail.owner()
        slot = (owner.removeprefix("exec-") if wanted != "random" and owner is not None
                and owner.removeprefix("exec-") in running else self.rng.choice(running))
        proc = self.executors[slot]
        node = f"exec-{slot}"
        loop = asyncio.get_running_loop()
        fired: asyncio.Future[int] = loop.create_future()

        def trigger(stream: str, offset: int, time_ms: int, r: Record, raw: bytes) -> None:
            hit = ((wanted == "before_accept" and stream == "out"
                    and isinstance(r, EffectRequest) and r.effect_kind == INFERENCE_KIND)
                   or (wanted == "after_accept" and stream == "resp"
                       and isinstance(r, AcceptedRecord) and r.node_id == node)
                   or (wanted == "after_response" and stream == "resp"
                       and isinstance(r, ResponseRecord) and r.written_by == node))
            if hit and not fired.done():
                t = _now_ms()
                proc.kill()
                fired.set_result(t)

        missed = False
        if wanted != "random":
            self.tail.listeners.append(trigger)
            try:
                t_ms = await asyncio.wait_for(asyncio.shield(fired), 10)
            except TimeoutError:
                missed = True
            finally:
                self.tail.listeners.remove(trigger)
        if wanted == "random" or missed:
            t_ms = _now_ms()
            proc.kill()
        code = await proc.wait_exit(20)
        if code is None:
            raise RuntimeError(f"{proc.name} still runs after SIGKILL")
        # a delayed restart (only of the serving node): the stand-by must take the partition
        delayed = owner == node and self.rng.random() < self.cfg.delay_restart_p
        if not delayed:
            self._start_executor(slot)
        fault = Fault("executor_kill", t_ms, node, wanted=wanted,
                      detail={"instance": proc.name, "trigger_missed": missed,
                              "restart_delayed": delayed})
        fault.recovered = await self.tail.wait(
            lambda: self.tail.delivered_after(t_ms, executor=True) is not None,
            self.cfg.fault_timeout_s)
        if delayed:
            self._start_executor(slot)
        return fault

    async def _holder_failover(self) -> Fault:
        await self._candidates_ready()
        held = self.tail.holder()
        if held is None:
            raise RuntimeError("no claim on the log: no holder to kill")
        epoch, hid = held
        proc = self.holders[hid]
        t_ms = _now_ms()
        proc.kill()
        if await proc.wait_exit(20) is None:
            raise RuntimeError(f"{proc.name} still runs after SIGKILL")
        fault = Fault("holder_failover", t_ms, hid, detail={"old_epoch": epoch,
                                                             "instance": proc.name})
        claimed = await self.tail.wait(lambda: (h := self.tail.holder()) is not None
                                       and h[0] > epoch, self.cfg.fault_timeout_s)
        self._start_holder(hid)  # the killed candidate comes back as a stand-by
        fault.recovered = claimed and await self.tail.wait(
            lambda: self.tail.delivered_after(t_ms, epoch=epoch + 1, fresh=False) is not None,
            self.cfg.fault_timeout_s)
        return fault

    async def _broker_restart(self) -> Fault:
        before = self.kafka.bootstrap
        t_ms = _now_ms()
        await self.kafka.astop()
        down_ms = _now_ms()
        await asyncio.sleep(self.rng.uniform(1.0, 3.0))
        after = await self.kafka.astart(timeout=120)
        ready = _now_ms()
        if after != before:
            raise RuntimeError(f"the broker came back on {after}, not {before}")
        fault = Fault("broker_restart", t_ms, "node-1",
                      detail={"stopped_ms": down_ms, "ready_ms": ready,
                              "down_s": round((ready - t_ms) / 1000, 2)})
        fault.recovered = await self.tail.wait(
            lambda: self.tail.delivered_after(ready) is not None, self.cfg.fault_timeout_s)
        return fault

    async def _cluster_kill(self) -> Fault:
        await self._wait_isr()
        leaders = await _leaders(self.bootstrap, topics.all_topics(self.wid))
        victim = self.rng.randint(1, self.kafka.nodes)
        led = sorted(t.rsplit(".", 1)[-1] for t, lead in leaders.items() if lead == victim)
        t_ms = _now_ms()
        await asyncio.to_thread(self.kafka.kill_node, victim)
        fault = Fault("cluster_kill", t_ms, f"node-{victim}", detail={"led": led})
        recovered = self.tail.wait(lambda: self.tail.delivered_after(t_ms) is not None,
                                   self.cfg.fault_timeout_s)
        down_s = self.rng.uniform(3.0, 8.0)
        ok, _ = await asyncio.gather(recovered, asyncio.sleep(down_s))
        await asyncio.to_thread(self.kafka.start_node, victim, 120.0)
        fault.detail["ready_ms"] = _now_ms()
        fault.detail["down_s"] = round((fault.detail["ready_ms"] - t_ms) / 1000, 2)
        fault.recovered = bool(ok)
        t0 = time.monotonic()
        await self._wait_isr()
        fault.detail["isr_back_s"] = round(time.monotonic() - t0, 1)
        return fault

    async def _wait_isr(self, timeout: float = 180.0) -> None:
        names = [*topics.all_topics(self.wid), "__consumer_offsets", "__transaction_state"]
        deadline = time.monotonic() + timeout
        while True:
            seen: object
            try:
                seen = isr = await _isr(self.bootstrap, names)
                if all(len(v) == self.kafka.nodes for v in isr.values()):
                    return
            except (KafkaError, OSError, TimeoutError) as exc:
                seen = repr(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"ISR not full after {timeout:.0f} s: {seen}")
            await asyncio.sleep(1.0)

    # -- the phase --------------------------------------------------------------------------
    async def run(self) -> PhaseReport:
        rep = self.report
        cfg = self.cfg
        self._rogue_writer = _Writer(self.bootstrap)
        async with WorkloadHarness(self.bootstrap, self.wid, MODULE,
                                   effect_kinds=(INFERENCE_KIND, GATE_KIND),
                                   models={"filetype": self.model_hash}, snapshot_every=20):
            pass  # topics and the spec
        for slot in self.slots:
            self._executor_config(slot)
            self._start_executor(slot)
        for i in range(cfg.candidates):
            self._start_holder(f"cand-{chr(ord('a') + i)}")
        self.tail.listeners.append(self._on_record)
        self.tail.start()
        feeder = asyncio.create_task(self._feed())
        try:
            await self._executors_ready()
            await self._candidates_ready()
            if not await self.tail.wait(lambda: len(self.tail.decided) >= 1, 180):
                raise RuntimeError("no decision within 180 s of the start")
            await self._inject()
        except Exception as exc:
            rep.problems.append(f"{type(exc).__name__}: {exc}")
            _log(f"{rep.name}: {type(exc).__name__}: {exc}")
        finally:
            self.rogue_on = False
            self._stop_feed.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(feeder, 120)
            for task in list(self.rogue_tasks):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 30)
            await self._rogue_writer.close()
        if not rep.problems:
            await self._drain()
        self.tail.listeners.clear()
        await self.tail.close()
        codes = {}
        for proc in [*self.holders.values(), *self.executors.values()]:
            codes[proc.name] = await proc.stop()
        self._check_dead()
        await self._audit()
        await self._count()
        rep.counts["fed"] = self.sent
        rep.counts["feeder_resends"] = self.resent
        rep.counts["stop_exit_codes"] = codes
        rep.counts["tail_reconnects"] = self.tail.errors
        rep.ended_ms = _now_ms()
        return rep

    def _check_dead(self) -> None:
        for line in self.dead:
            self.report.problems.append(f"a service exited without being killed: {line}")

    async def _inject(self) -> None:
        rep, cfg = self.report, self.cfg
        plan = [t for t in ("executor_kill", "broker_restart", "holder_failover",
                            "cluster_kill") for _ in range(rep.asked.get(t, 0))]
        self.rng.shuffle(plan)
        window = max(60.0, self.inject_until - time.monotonic())
        responses = cfg.rate_hz * window
        for what in ("dup", "late"):
            self.rogue_p[what] = min(1.0, max(0.05, 3 * self.rogue_asked[what]
                                              / max(1.0, responses)))
        self.rogue_on = True
        if cfg.tracks == 1:
            tracks = [plan]
        else:  # executor kills on one track, the other faults on the other
            tracks = [[t for t in plan if t == "executor_kill"],
                      [t for t in plan if t != "executor_kill"]]
        self._total = len(plan)
        self._done = 0
        self._halt = False
        await asyncio.gather(*(self._track(t) for t in tracks if t))
        if self._done < len(plan):
            rep.capped = rep.capped or not self._halt
        _mark_overlaps(rep.faults)
        # the rogue writer's quota: keep the stream going until it is written (bounded)
        def rogue_done() -> bool:
            return all(sum(1 for w in self.rogue_offsets.values() if w == what)
                       >= self.rogue_asked[what] for what in ("dup", "late"))
        self.rogue_p = {"dup": 1.0, "late": 1.0}
        deadline = min(self.inject_until, time.monotonic() + 120)
        while not rogue_done() and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        if not rogue_done():
            rep.capped = True

    async def _track(self, plan: list[str]) -> None:
        """Inject ``plan`` one fault at a time, each after its predecessor recovered. Broker
        faults take the gate alone (no other fault runs during them); the others share it."""
        rep, cfg = self.report, self.cfg
        inject = {"executor_kill": self._executor_kill, "broker_restart": self._broker_restart,
                  "holder_failover": self._holder_failover, "cluster_kill": self._cluster_kill}
        for what in plan:
            if self._halt:
                return
            if time.monotonic() > self.inject_until:
                rep.capped = True
                _log(f"{rep.name}: duration cap: {self._done} of {self._total} faults injected")
                return
            await asyncio.sleep(self.rng.uniform(*cfg.gap_s))
            exclusive = what in ("broker_restart", "cluster_kill")
            async with self._gate.hold(exclusive=exclusive):
                if self._halt:
                    return
                self._check_processes()
                fault = await inject[what]()
                fault.detail["recovered_at_ms"] = _now_ms()
            rep.faults.append(fault)
            self._done += 1
            if not fault.recovered:
                rep.problems.append(f"{fault.type} of {fault.target} at {fault.t_ms}: no "
                                    f"recovery within {cfg.fault_timeout_s:.0f} s")
                self._halt = True
                return
            if self._done % 10 == 0 or self._total < 30:
                _log(f"{rep.name}: {self._done}/{self._total} faults ({what} of "
                     f"{fault.target}); {self.sent} inputs, {len(self.tail.decided)} decided")

    async def _drain(self) -> None:
        self._check_processes()
        timeout = min(self.cfg.drain_timeout_s, max(30.0, self.hard_until - time.monotonic()))
        if not await self.tail.wait(self.tail.drained, timeout):
            undecided = [o for o in range(self.tail.in_end) if o not in self.tail.decided]
            unanswered = [e for e in self.tail.requests if e not in self.tail.delivered]
            self.report.problems.append(
                f"not drained after {timeout:.0f} s: {len(undecided)} input(s) undecided "
                f"{undecided[:10]}, {len(unanswered)} request(s) unanswered {unanswered[:5]}")

    async def _audit(self) -> None:
        argv = [sys.executable, "-m", "fx_cli.main", "audit", self.wid, "--module", MODULE,
                "--bootstrap", self.bootstrap, "--json"]
        t0 = time.monotonic()
        try:
            proc = await asyncio.to_thread(subprocess.run, argv, capture_output=True, cwd=ROOT,
                                           env=child_env(dict(os.environ)),
                                           timeout=self.cfg.audit_timeout_s, check=False)
        except subprocess.TimeoutExpired:
            self.report.problems.append(f"fx audit ran past {self.cfg.audit_timeout_s:.0f} s")
            return
        rep = self.report
        rep.audit_exit = proc.returncode
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            doc = {"stdout": proc.stdout.decode(errors="replace")[-2000:]}
        rep.audit = {"seconds": round(time.monotonic() - t0, 1),
                     "result": doc.get("result"), "violated": doc.get("violated"),
                     "invariants": {i["name"]: {"status": i["status"], "counts": i["counts"],
                                                "violations": i["violations"][:5],
                                                "notes": i["notes"][:3]}
                                    for i in doc.get("invariants", [])},
                     "notes": doc.get("notes", []),
                     "stderr": proc.stderr.decode(errors="replace")[-1500:]}
        if proc.returncode != 0:
            rep.problems.append(f"fx audit exited {proc.returncode}: {doc.get('violated')}")

    async def _count(self) -> None:
        log = await read_workload_log(self.bootstrap, self.wid, with_facts=False)
        faults = [f for f in self.report.faults]
        counts, problems = analyse_log(log, faults, executor_nodes=self.executor_nodes,
                                       rogue_offsets=self.rogue_offsets)
        self.report.counts.update(counts)
        self.report.problems.extend(problems)


class _Gate:
    """Faults that may run together (shared) and faults that run alone (exclusive: broker
    restarts and kills). A waiting exclusive fault keeps new shared ones out."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextlib.asynccontextmanager
    async def hold(self, *, exclusive: bool) -> Any:
        async with self._cond:
            if exclusive:
                self._waiting += 1
                await self._cond.wait_for(lambda: not self._exclusive and not self._shared)
                self._waiting -= 1
                self._exclusive = True
            else:
                await self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
                self._shared += 1
        try:
            yield
        finally:
            async with self._cond:
                if exclusive:
                    self._exclusive = False
                else:
                    self._shared -= 1
                self._cond.notify_all()


def _mark_overlaps(faults: list[Fault]) -> None:
    """Set ``detail["overlapped"]`` on each outage fault whose window (injection to the live
    recovery, both in ms) intersects another one's: its recovery time may include the other
    fault. Windows that only touch (one ends in the millisecond the next starts) do not."""
    spans = [(f, f.t_ms, int(f.detail.get("recovered_at_ms", f.t_ms))) for f in faults
             if not f.type.startswith("rogue")]
    for f, start, end in spans:
        f.detail["overlapped"] = any(o is not f and start < o_end and o_start < end
                                     for o, o_start, o_end in spans)


async def _leaders(bootstrap: str, names: list[str]) -> dict[str, int]:
    described = await _describe(bootstrap, names)
    return {t: lead for t, (lead, _) in described.items()}


async def _isr(bootstrap: str, names: list[str]) -> dict[str, list[int]]:
    described = await _describe(bootstrap, names)
    return {t: isr for t, (_, isr) in described.items()}


async def _describe(bootstrap: str, names: list[str]) -> dict[str, tuple[int, list[int]]]:
    """``{topic: (leader, isr)}`` of partition 0 of each topic (``(-1, [])`` when not known)."""
    admin = make_admin(bootstrap)
    await asyncio.wait_for(admin.start(), 30)
    try:
        described = await asyncio.wait_for(admin.describe_topics(names), 30)
    finally:
        with contextlib.suppress(KafkaError, TimeoutError, OSError):
            await asyncio.wait_for(admin.close(), 10)
    out: dict[str, tuple[int, list[int]]] = {}
    for topic in described:
        parts = [p for p in topic["partitions"] if p["partition"] == 0]
        out[topic["topic"]] = ((parts[0]["leader"], list(parts[0]["isr"])) if parts
                               else (-1, []))
    return out


# -------------------------------------------------------------------------------------- run


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10,
                              check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _magika(store: Path, *, import_it: bool) -> str:
    """magika's model hash in ``store`` (imported from its PyPI wheel first with
    ``import_it``)."""
    from executor.models import ModelStore

    models = ModelStore(store)
    if import_it:
        models.import_package("magika")
    return next(m.hash for m in models.list() if m.interface == "magika")


async def run_faults(cfg: FaultConfig) -> FaultReport:
    """Run the phases the configuration asks for and return the report (never raises for a
    fault or violation: they are in ``report.problems`` and the phases' ``problems``)."""
    report = FaultReport(config=cfg, started_ms=_now_ms(), load_before=_uptime())
    # a broker outage makes aiokafka log every failed connect; the counts say what matters
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    rng = random.Random(cfg.seed)

    async def sample_load() -> None:
        while True:
            report.load_samples.append(os.getloadavg()[0])
            await asyncio.sleep(30)

    sampler = asyncio.create_task(sample_load())
    t0 = time.monotonic()
    hard_until = t0 + cfg.duration_cap_s
    own_dir = cfg.workdir is None
    base = Path(tempfile.mkdtemp(prefix="fx-faults-")) if cfg.workdir is None else cfg.workdir
    base.mkdir(parents=True, exist_ok=True)
    try:
        store = cfg.model_store or base / "models"
        model_hash = await asyncio.to_thread(_magika, store, import_it=cfg.model_store is None)
        single = {"executor_kill": cfg.executor_kills, "broker_restart": cfg.broker_restarts,
                  "holder_failover": cfg.holder_failovers}
        cluster = {"cluster_kill": cfg.cluster_kills}
        rogue = {"rogue_duplicate": cfg.duplicates, "rogue_late": cfg.late_answers}
        phases: list[tuple[str, int, dict[str, int]]] = []
        if any(single.values()) or not cfg.cluster_kills:
            phases.append(("single", 1, {**single, **rogue}))
            if cfg.cluster_kills:
                phases.append(("cluster", 3, cluster))
        else:
            phases.append(("cluster", 3, {**cluster, **rogue}))
        # time left for a cluster phase after the single one, and for each drain and audit
        cluster_reserve = 150.0 + 45.0 * cfg.cluster_kills if len(phases) == 2 else 0.0
        tail_reserve = 150.0
        for name, nodes, asked in phases:
            end = hard_until - (cluster_reserve if name == "single" else 0.0)
            inject_until = end - tail_reserve
            kafka = LocalKafka(data_dir=base / f"kafka-{name}", nodes=nodes,
                               heap="384m" if nodes > 1 else "512m",
                               die_with_parent=nodes == 1)
            _log(f"{name}: starting a {nodes}-node broker")
            try:
                await kafka.astart(timeout=180)
            except Exception as exc:
                report.problems.append(f"{name}: the broker did not start: {exc}")
                with contextlib.suppress(Exception):
                    await kafka.astop()
                continue
            try:
                workdir = base / name
                workdir.mkdir(exist_ok=True)
                phase = _Phase(cfg, rng, name, kafka, store, model_hash, workdir, asked,
                               inject_until, end)
                _log(f"{name}: workload {phase.wid}, asked {asked}")
                report.phases.append(await phase.run())
                _log(f"{name}: done, problems: {phase.report.problems or 'none'}")
            finally:
                await kafka.astop()
    finally:
        sampler.cancel()
        quiet.setLevel(level)
        report.ended_ms = _now_ms()
        report.load_after = _uptime()
        if own_dir and report.ok and not cfg.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            report.workdir = str(base)
            _log(f"files kept in {base}")
    return report


# ------------------------------------------------------------------------------------ table


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def render_report(report: FaultReport) -> str:
    """The figures as a plain table."""
    tot = report.totals()
    lines = [f"fault run: {'OK' if report.ok else 'FAILED'}"
             + (" (CAPPED: not every fault asked for was injected)" if report.capped else ""),
             f"duration {round((report.ended_ms - report.started_ms) / 1000)} s, seed "
             f"{report.config.seed}, rate {report.config.rate_hz}/s",
             f"load before: {report.load_before}", f"load after:  {report.load_after}",
             f"1-minute load during the run (every 30 s): {_load_summary(report.load_samples)}",
             f"cores: {os.cpu_count()}", ""]
    asked = Counter[str]()
    for p in report.phases:
        asked.update(p.asked)
    lines.append(f"  {'fault':28} {'asked':>6} {'done':>6} {'n':>5} {'ovl':>4} {'p50 s':>7} "
                 f"{'p99 s':>7} {'max s':>7}")
    rec = tot["recovery"]
    by_type = tot["faults_by_type"]

    def row(label: str, a: str, d: str, r: dict[str, Any]) -> str:
        return (f"  {label:28} {a:>6} {d:>6} {r.get('n', 0):>5} {r.get('overlapped', 0):>4} "
                f"{_fmt(r.get('p50_s')):>7} {_fmt(r.get('p99_s')):>7} "
                f"{_fmt(r.get('max_s')):>7}")

    for t in FAULT_TYPES:
        lines.append(row(t, str(asked.get(t, 0)), str(by_type.get(t, 0)), rec.get(t, {})))
        for sub, r2 in rec.items():
            if sub.startswith(f"{t}/"):
                lines.append(row("  " + sub.split("/", 1)[1], "", "", r2))
    lines.append(f"  first answer after a kill of the serving executor: "
                 f"{tot['executor_kill_first_answer']}")
    lines.append("")
    for k in ("inputs", "decisions", "effects_issued", "lost", "duplicated", "unknown",
              "timeouts", "timeouts_inference", "backpressure", "errors", "reasks"):
        lines.append(f"  {k:20} {tot[k]}")
    for p in report.phases:
        lines.append("")
        lines.append(f"phase {p.name} ({p.nodes} node(s), workload {p.workload_id}): "
                     f"{'ok' if p.ok else 'FAILED'}, fx audit exit {p.audit_exit} "
                     f"({p.audit.get('result')}, {p.audit.get('seconds')} s)")
        c = p.counts
        lines.append(f"  outcomes {c.get('outcomes')}; errors {c.get('errors_by_code')}")
        lines.append(f"  pass-overs {c.get('pass_over')}; rogue {c.get('rogue')}")
        for prob in p.problems:
            lines.append(f"  PROBLEM: {prob[:2000]}")
    for prob in report.problems:
        lines.append(f"PROBLEM: {prob}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executor-kills", type=int, default=3)
    parser.add_argument("--broker-restarts", type=int, default=1)
    parser.add_argument("--holder-failovers", type=int, default=2)
    parser.add_argument("--cluster-kills", type=int, default=1)
    parser.add_argument("--duplicates", type=int, default=3,
                        help="rogue duplicate answers (byte copies of executor responses)")
    parser.add_argument("--late-answers", type=int, default=3,
                        help="rogue answers after a gate request's deadline")
    parser.add_argument("--duration-cap-s", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=2.0, help="inputs per second")
    parser.add_argument("--tracks", type=int, choices=(1, 2), default=1,
                        help="2: executor kills on their own track beside the other faults")
    parser.add_argument("--gap-s", type=float, nargs=2, default=(0.5, 2.0),
                        metavar=("MIN", "MAX"), help="random pause before each fault")
    parser.add_argument("--executor-session-timeout-ms", type=int, default=SESSION_TIMEOUT_MS,
                        help="the executors' consumer-group session timeout (an executor kill "
                             "recovers in about this)")
    parser.add_argument("--delay-restart-p", type=float, default=0.0,
                        help="share of serving-executor kills restarted only after recovery, "
                             "so the stand-by takes over")
    parser.add_argument("--fault-timeout-s", type=float, default=90.0)
    parser.add_argument("--drain-timeout-s", type=float, default=180.0)
    parser.add_argument("--workdir", type=Path, help="keep brokers' data and logs here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary dir")
    parser.add_argument("--allow-capped", action="store_true",
                        help="exit 0 when the cap stopped the run early but nothing failed")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    cfg = FaultConfig(executor_kills=args.executor_kills, broker_restarts=args.broker_restarts,
                      holder_failovers=args.holder_failovers, cluster_kills=args.cluster_kills,
                      duplicates=args.duplicates, late_answers=args.late_answers,
                      duration_cap_s=args.duration_cap_s, seed=args.seed, rate_hz=args.rate,
                      fault_timeout_s=args.fault_timeout_s,
                      drain_timeout_s=args.drain_timeout_s, workdir=args.workdir,
                      tracks=args.tracks, gap_s=(args.gap_s[0], args.gap_s[1]),
                      executor_session_timeout_ms=args.executor_session_timeout_ms,
                      delay_restart_p=args.delay_restart_p, keep=args.keep)

    async def run() -> FaultReport:
        # SIGTERM cancels the run, so the brokers are stopped on the way out (the services die
        # with the harness: PR_SET_PDEATHSIG)
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await run_faults(cfg)

    try:
        report = asyncio.run(run())
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("fault run interrupted: brokers stopped, no figures", file=sys.stderr)
        return 130
    doc = report.as_dict()
    doc["command"] = " ".join(["python", "bench/faults.py", *(argv or sys.argv[1:])])
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(render_report(report))
    if not report.ok:
        return 1
    return 2 if report.capped and not args.allow_capped else 0


if __name__ == "__main__":
    sys.exit(main())
