"""The lease holder's metrics, no broker: what the pure code returns for them (``MergedBatch``'s
answers and pass-over reasons, :mod:`workload_sdk._observe`), how
:class:`~workload_sdk._holder_metrics.HolderMetrics` turns that into samples, and that the fold,
replay and the simulator do not need Prometheus."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from broker_schema import (
    INFERENCE_KIND,
    AcceptedRecord,
    EffectRequest,
    InlineBody,
    InputRecord,
    ResponseRecord,
)
from tests.unit.workload_sdk.sim import WID, Asker, make_spec
from workload_sdk import Core, Item
from workload_sdk._holder_metrics import HolderMetrics
from workload_sdk._observe import (
    PendingRequest,
    executor_groups,
    merge_lag,
    outstanding_by_kind,
    unread_requests,
)
from workload_sdk._round import Answer, merge_batch

ROOT = Path(__file__).resolve().parents[3]


def _samples(metrics: HolderMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _resp(req: EffectRequest, outcome: str = "ok", request_offset: int = 1) -> ResponseRecord:
    return ResponseRecord(effect_id=req.effect_id, header=req.header,
                          request_offset=request_offset, outcome=outcome,  # type: ignore[arg-type]
                          written_by="e", output=InlineBody.of_json(1) if outcome == "ok" else None)


def test_a_batch_says_which_answers_a_step_saw_and_why_the_rest_were_passed_over() -> None:
    spec = make_spec(limit=10)
    core = Core.initial(Asker(), WID)
    bufs: dict[str, deque[Item]] = {"in": deque(), "resp": deque()}
    bufs["in"].extend(Item("in", i, 10 + i, InputRecord(workload_id=WID,
                                                       body=InlineBody.of_json(v)))
                      for i, v in enumerate([1, 3]))
    first = merge_batch(core, spec, bufs, epoch=1, now_resp_ms=None, max_batch=100)
    reqs = [o for o in first.outputs if isinstance(o, EffectRequest)]
    assert len(reqs) == 2 and first.answers == [] and first.passed_over_by == {}
    a, b = reqs
    accepted = AcceptedRecord(effect_id=a.effect_id, header=a.header, request_offset=1,
                              node_id="e", lease_ms=100, accepted_us=1)
    stray = _resp(a).model_copy(update={"effect_id": "other/0/1@1"})
    bufs["resp"].extend([
        Item("resp", 0, 20, accepted),
        Item("resp", 1, 21, _resp(a)),
        Item("resp", 2, 22, _resp(a)),  # the same effect answered twice
        Item("resp", 3, 23, _resp(b, "timeout")),
        Item("resp", 4, 24, stray),
    ])
    second = merge_batch(core, spec, bufs, epoch=1, now_resp_ms=None, max_batch=100)
    assert second.answers == [Answer(a.effect_id, INFERENCE_KIND, "ok"),
                              Answer(b.effect_id, INFERENCE_KIND, "timeout")]
    assert second.delivered == [a.effect_id, b.effect_id]
    assert second.passed_over_by == {"not_an_answer": 1, "duplicate": 1, "unknown_effect": 1}
    assert second.passed_over == 3


def test_outstanding_counts_every_spec_kind_even_when_it_drained() -> None:
    assert outstanding_by_kind(["a", "b"], ["a", "a", "c"]) == {"a": 2, "b": 0, "c": 1}
    assert outstanding_by_kind(["a"], []) == {"a": 0}


def test_executor_groups_are_those_on_the_broker_else_the_first_prefix() -> None:
    prefixes = ("fx-executor", "fx-actuator")
    assert executor_groups(prefixes, ["llm", "valve"], {"fx-actuator.valve", "other"}) == {
        "fx-executor.llm": "llm", "fx-actuator.valve": "valve"}
    assert executor_groups(prefixes, ["k"], {"fx-executor.k", "fx-actuator.k"}) == {
        "fx-executor.k": "k", "fx-actuator.k": "k"}
    assert executor_groups((), ["k"], set()) == {}


def test_unread_requests_are_pending_requests_of_the_group_s_kind_past_its_commit() -> None:
    pending = [PendingRequest("llm", 3), PendingRequest("llm", 7), PendingRequest("gate", 5)]
    groups = {"g.llm": "llm", "g.gate": "gate", "g.none": "none"}
    # nothing committed: every pending request of the kind is unread
    assert unread_requests(groups, {}, pending) == {"g.llm": 2, "g.gate": 1, "g.none": 0}
    # committed past offset 3 (the next to read is 4): the request at 7 is still unread
    assert unread_requests(groups, {"g.llm": 4, "g.gate": 6, "g.none": None}, pending) == {
        "g.llm": 1, "g.gate": 0, "g.none": 0}
    # a committed offset of -1 (Kafka's "none") counts as nothing committed
    assert unread_requests({"g.llm": "llm"}, {"g.llm": -1}, pending) == {"g.llm": 2}
    assert unread_requests({"g.llm": "llm"}, {"g.llm": 8}, pending) == {"g.llm": 0}


def test_merge_lag() -> None:
    assert merge_lag(10, 4) == 6
    assert merge_lag(4, 10) == 0
    assert merge_lag(None, 3) is None and merge_lag(3, None) is None


def test_holder_metrics_samples_follow_the_updates() -> None:
    m = HolderMetrics()
    m.lease("w", held=True, epoch=3)
    m.set_outstanding("w", {"llm": 2, "gate": 0})
    m.merged("w", [Answer("e1", "llm", "ok"), Answer("e2", "llm", "timeout"),
                   Answer("e3", "llm", "ok")],
             {"not_an_answer": 4, "duplicate": 2, "after_outcome": 1},
             [("llm", 0.2), ("llm", 1.5)])
    m.skipped("w", "undecodable")
    m.set_merge_lag("w", 5)
    m.set_unread("w", {"fx-executor.llm": 2, "fx-executor.gate": 1})
    m.snapshot("w", 1_000.0)
    s = _samples(m)
    w = (("workload", "w"),)
    assert s[("fx_holder_leader", w)] == 1 and s[("fx_holder_epoch", w)] == 3
    assert s[("fx_holder_outstanding_requests", (("kind", "gate"), ("workload", "w")))] == 0
    assert s[("fx_holder_outstanding_requests", (("kind", "llm"), ("workload", "w")))] == 2
    ok = (("kind", "llm"), ("outcome", "ok"), ("workload", "w"))
    assert s[("fx_holder_outcomes_total", ok)] == 2
    assert s[("fx_holder_outcomes_total", (("kind", "llm"), ("outcome", "timeout"),
                                           ("workload", "w")))] == 1
    rejected = {dict(labels)["reason"]: v for (name, labels), v in s.items()
                if name == "fx_holder_rejected_responses_total"}
    assert rejected == {"duplicate": 2, "after_outcome": 1, "undecodable": 1}  # no accepted
    kw = (("kind", "llm"), ("workload", "w"))
    assert s[("fx_holder_round_trip_seconds_count", kw)] == 2
    assert s[("fx_holder_round_trip_seconds_sum", kw)] == 1.7
    assert s[("fx_holder_round_trip_seconds_bucket", (("kind", "llm"), ("le", "0.25"),
                                                      ("workload", "w")))] == 1
    assert s[("fx_holder_merge_lag_records", w)] == 5
    assert s[("fx_workload_unread_requests", (("group", "fx-executor.llm"),
                                              ("workload", "w")))] == 2
    assert s[("fx_holder_snapshot_age_seconds", w)] > 1_000_000  # written at t=1000 s
    # a group that went away is dropped; a newer snapshot resets the age; lease lost
    m.set_unread("w", {"fx-executor.llm": 0})
    m.snapshot("w", 2e10)  # in the future: a negative age says the clocks disagree
    m.lease("w", held=False, epoch=3)
    s = _samples(m)
    assert ("fx_workload_unread_requests", (("group", "fx-executor.gate"),
                                            ("workload", "w"))) not in s
    assert s[("fx_workload_unread_requests", (("group", "fx-executor.llm"),
                                              ("workload", "w")))] == 0
    assert s[("fx_holder_snapshot_age_seconds", w)] < 0
    assert s[("fx_holder_leader", w)] == 0 and s[("fx_holder_epoch", w)] == 0


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_fold_replay_and_the_simulator_do_not_need_prometheus() -> None:
    """Prometheus and the HTTP stack impossible to import: the holder's decisions, replay, the
    observation helpers and the simulator still load and run."""
    out = _run("""
        import importlib.abc, sys
        class Blocker(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("prometheus_client", "fastapi", "uvicorn"):
                    raise ImportError("blocked: " + name)
                return None
        sys.meta_path.insert(0, Blocker())
        import workload_sdk, workload_sdk._round, workload_sdk._replay, workload_sdk._observe
        import workload_sdk._holder, workload_sdk._election
        from collections import deque
        from broker_schema import InlineBody, InputRecord
        from tests.unit.workload_sdk.sim import WID, Asker, Sim, make_spec
        from workload_sdk import Core, Item
        core = Core.initial(Asker(), WID)
        bufs = {"in": deque([Item("in", 0, 1, InputRecord(workload_id=WID,
                                                          body=InlineBody.of_json(1)))]),
                "resp": deque()}
        batch = workload_sdk._round.merge_batch(core, make_spec(), bufs, epoch=1,
                                                now_resp_ms=None, max_batch=10)
        assert batch.steps == 1 and core.pending
        assert not [m for m in sys.modules if m.split(".")[0] == "prometheus_client"]
        print("ok")
    """)
    assert out.strip() == "ok"


# ------------------------------------------------------------------ the process's HTTP surface
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _holder(*args: str) -> list[str]:
    return [sys.executable, "-m", "workload_sdk", "workload", "run",
            "workload_sdk.examples.filetype_gate:FiletypeGate", "--id", "w1",
            "--bootstrap", f"127.0.0.1:{_free_port()}", *args]  # nobody listens there


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_a_port_in_use_ends_the_holder_at_start_with_exit_4() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(_holder("--http-port", str(port)), cwd=ROOT, capture_output=True,
                              text=True, timeout=120, check=False)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert f"cannot run: cannot serve HTTP on 127.0.0.1:{port}" in proc.stderr


def test_a_candidate_waiting_for_the_broker_is_live_not_ready() -> None:
    """No broker: the candidate waits for it (with backoff), its HTTP answers meanwhile."""
    proc = subprocess.Popen(_holder("--http-port", "0"), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        line = b""
        deadline = time.monotonic() + 120
        while b"serving /metrics" not in line:
            assert time.monotonic() < deadline and proc.poll() is None
            line = proc.stderr.readline()
        port = int(re.findall(rb"http://127\.0\.0\.1:(\d+)", line)[0])
        base = f"http://127.0.0.1:{port}"
        assert _get(f"{base}/healthz") == (200, b'{"live":true}')
        status, body = _get(f"{base}/readyz")
        ready = json.loads(body)
        assert status == 503 and ready["ready"] is False and ready["role"] == "starting"
        assert ready["workload"] == "w1" and ready["elected"] is False
        status, text = _get(f"{base}/metrics")
        assert status == 200 and b"# TYPE fx_holder_leader gauge" in text
        assert b"# TYPE fx_workload_unread_requests gauge" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


#: The names and labels agreed for issue 15 (alert rules and the dashboard are written against
#: them): name in the exposition -> labels.
AGREED = {
    "fx_holder_leader": {"workload"},
    "fx_holder_epoch": {"workload"},
    "fx_holder_outstanding_requests": {"workload", "kind"},
    "fx_holder_merge_lag_records": {"workload"},
    "fx_holder_outcomes_total": {"workload", "kind", "outcome"},
    "fx_holder_round_trip_seconds": {"workload", "kind"},
    "fx_holder_snapshot_age_seconds": {"workload"},
    "fx_holder_rejected_responses_total": {"workload", "reason"},
    "fx_workload_unread_requests": {"workload", "group"},
    "fx_holder_signatures_checked_total": {"workload"},
    "fx_holder_signature_failures_total": {"workload", "reason"},
}


def test_the_metrics_have_the_agreed_names_and_labels_and_are_documented() -> None:
    """Every metric, with every label, once each is set; each a row of docs/operations.md,
    "The lease holder's metrics", naming the same labels."""
    m = HolderMetrics()
    m.lease("w", held=True, epoch=1)
    m.set_outstanding("w", {"k": 1})
    m.merged("w", [Answer("e", "k", "ok")], {"duplicate": 1}, [("k", 0.1)])
    m.set_merge_lag("w", 0)
    m.snapshot("w", time.time())
    m.set_unread("w", {"g": 0})
    m.signatures_on("w")
    found: dict[str, set[str]] = {}
    for name, sample_labels in _samples(m):
        base = name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
        if not name.endswith("_created"):
            found.setdefault(base, set()).update(k for k, _ in sample_labels if k != "le")
    assert found == AGREED
    doc = (ROOT / "docs" / "operations.md").read_text()
    section = doc[doc.index("### The lease holder's metrics"):]
    section = section[:section.index("\n## ")]
    for metric, labels in AGREED.items():
        rows = [line for line in section.splitlines() if line.startswith(f"| `{metric}` |")]
        assert len(rows) == 1, metric
        assert {x.strip() for x in rows[0].split("|")[3].split(",")} == labels, rows[0]
