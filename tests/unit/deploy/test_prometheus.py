"""deploy/prometheus: the scrape config and the alert rules are valid for Prometheus (promtool),
each alert fires on the series it is meant for and not on a near miss (promtool test rules), and
every metric and label an alert names is one the project exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.unit.deploy.helpers import DEPLOY, ROOT, check_expr, known_series, need_tool

PROM = DEPLOY / "prometheus"
PROMTOOL_HOW = "Debian package prometheus: make system-deps"


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROM / "rules.yml").read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    promtool = need_tool("promtool", PROMTOOL_HOW)
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def test_promtool_check_config_and_rules() -> None:
    done = _promtool("check", "config", "prometheus.yml", cwd=PROM)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr
    done = _promtool("check", "rules", "rules.yml", cwd=PROM)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(_rules())} rules found" in done.stdout


def test_alerts_fire_as_meant(tmp_path: Path) -> None:
    """promtool test rules over rules.test.yml, with the annotations left out of a copy of the
    rules (promtool compares them verbatim; `check rules` has parsed their templates)."""
    doc = yaml.safe_load((PROM / "rules.yml").read_text(encoding="utf-8"))
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    shutil.copy(PROM / "rules.test.yml", tmp_path / "rules.test.yml")
    done = _promtool("test", "rules", "rules.test.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_tested() -> None:
    tests = yaml.safe_load((PROM / "rules.test.yml").read_text(encoding="utf-8"))
    fired = {case["alertname"] for t in tests["tests"] for case in t["alert_rule_test"]
             if case.get("exp_alerts")}
    alerts = {r["alert"] for r in _rules()}
    assert alerts - fired == set(), f"alerts no test case fires: {sorted(alerts - fired)}"


def test_rules_name_only_exported_metrics() -> None:
    series = known_series()
    problems = [f"{rule['alert']}: {p}" for rule in _rules()
                for p in check_expr(rule["expr"], series)]
    assert not problems, "\n".join(problems)


def test_the_alerts_the_issue_asks_for() -> None:
    by_name = {r["alert"]: r for r in _rules()}
    needed = {
        "FxUnreadRequestsGrowing": "fx_workload_unread_requests",
        "FxHolderMergeLagGrowing": "fx_holder_merge_lag_records",
        "FxUnknownOutcomes": 'outcome="unknown"',
        "FxBackpressure": 'outcome="backpressure"',
        "FxParityGateRefused": "fx_executor_parity_gate_refused",
        "FxLedgerForeignLeaf": "fx_executor_ledger_foreign_leaves",
        "FxSignatureInvalid": 'fx_holder_signature_failures_total{reason=~"invalid|unsigned"}',
        "FxExecutorDown": 'up{job="fx-executor"} == 0',
        "FxWorkloadWithoutLeader": "fx_holder_leader",
    }
    for alert, fragment in needed.items():
        assert alert in by_name, alert
        assert fragment in by_name[alert]["expr"], (alert, by_name[alert]["expr"])
    for rule in by_name.values():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["annotations"]["runbook"] == "docs/operations.md#alerts", rule["alert"]


def test_scrape_jobs_match_the_rules_and_compose() -> None:
    """The jobs the rules select (up{job=...}) are the scrape config's; each DNS name scraped is
    a compose service (every long-running compose service is scraped)."""
    config = yaml.safe_load((PROM / "prometheus.yml").read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    for rule in _rules():
        for job in re.findall(r'job="([^"]+)"', rule["expr"]):
            assert job in jobs, (rule["alert"], job)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    long_running = {name for name, svc in compose["services"].items()
                    if svc.get("restart", "no") != "no"} | {"redpanda"}
    scraped = {name for job in jobs.values() for sd in job.get("dns_sd_configs", [])
               for name in sd["names"]} | {"prometheus"}
    assert scraped - set(compose["services"]) == set()
    assert long_running - scraped == set(), f"not scraped: {sorted(long_running - scraped)}"


def test_operations_doc_lists_every_alert() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    missing = [r["alert"] for r in _rules() if f"| `{r['alert']}` |" not in doc]
    assert not missing, f"docs/operations.md alerts table lacks {missing}"
