"""deploy/grafana: the provisioned datasource and dashboard load as Grafana reads them, every query
is valid PromQL over metrics the project exports, and the panels the issue asks for are there."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.unit.deploy.helpers import DEPLOY, ROOT, check_expr, known_series, need_tool

GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "ninelives-fx.json"


def _dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return doc


def _panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def _exprs() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _panels() for t in p["targets"]]


def _as_promql(expr: str) -> str:
    """Grafana's variables replaced as Grafana would at query time."""
    return expr.replace("$__rate_interval", "1m").replace("$workload", ".*")


def test_dashboard_structure() -> None:
    dash = _dashboard()
    assert dash["uid"] == "ninelives-fx"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in dash["panels"]:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, p["title"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "workload"} <= variables
    for p in _panels():
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]


def test_provisioning_points_at_the_dashboard_and_prometheus() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert _dashboard()["templating"]["list"][0]["current"]["value"] == source["uid"]
    prov = yaml.safe_load((GRAFANA / "provisioning/dashboards/ninelives-fx.yml").read_text())
    (provider,) = prov["providers"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"


def test_queries_name_only_exported_metrics() -> None:
    series = known_series()
    problems = [f"{title}: {p}" for title, expr in _exprs()
                for p in check_expr(_as_promql(expr), series)]
    problems += [p for v in _dashboard()["templating"]["list"] if v["type"] == "query"
                 for p in check_expr(v["definition"], series)]
    assert not problems, "\n".join(problems)


def test_queries_are_valid_promql(tmp_path: Path) -> None:
    """Every panel query as a recording rule: `promtool check rules` parses each one."""
    rules = [{"record": f"fx_dashboard:q{i}", "expr": _as_promql(expr)}
             for i, (_title, expr) in enumerate(_exprs())]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool = need_tool("promtool", "Debian package prometheus: make system-deps")
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(rules)} rules found" in done.stdout


def test_the_panels_the_issue_asks_for() -> None:
    exprs = "\n".join(e for _t, e in _exprs())
    titles = {p["title"] for p in _panels()}
    # queue depth per workload and per executor (admitted, and unread on .out)
    assert "Queue depth per workload" in titles
    assert "Queue depth per executor and kind" in titles
    for metric in ("fx_executor_workload_queue_depth", "fx_workload_unread_requests",
                   "fx_executor_queue_depth", "fx_holder_outstanding_requests"):
        assert metric in exprs, metric
    # outcomes
    assert "fx_holder_outcomes_total" in exprs and "fx_executor_request_total" in exprs
    # the latency split: queue, compute, read lag, round trip
    split = next(p for p in _panels() if p["title"] == "Latency split, p95")
    legends = " ".join(t["legendFormat"] for t in split["targets"])
    for part in ("queue", "compute", "read lag", "round trip"):
        assert part in legends, part
    # lag
    lag = next(p for p in _panels() if p["title"] == "Lag")
    assert {"fx_holder_merge_lag_records", "fx_workload_unread_requests"} <= {
        m for t in lag["targets"] for m in
        ("fx_holder_merge_lag_records", "fx_workload_unread_requests") if m in t["expr"]}
