"""The metric names the rules and the dashboard rely on are the project's: the AST scan finds
what the registries really expose, and the pending list (names other branches add) is honest."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from actuator.metrics import GatewayMetrics
from executor.metrics import ExecutorMetrics
from tests.unit.deploy.helpers import PENDING, declared_metrics, known_series, metric_names


def _exposed(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Sample name -> label names, from a live registry (each labelled metric given a child)."""
    out: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def _touch_children(metrics: object) -> None:
    for value in vars(metrics).values():
        names = getattr(value, "_labelnames", None)
        if names:
            value.labels(*["x"] * len(names))


def test_scan_matches_the_live_registries() -> None:
    """Every sample the executor's and the gateway's registries expose is predicted by the scan,
    with its labels (so the scan can be trusted for the holder's and the gate's metrics)."""
    series = known_series()
    for metrics in (ExecutorMetrics(), GatewayMetrics()):
        _touch_children(metrics)
        exposed = _exposed(metrics.registry)
        assert exposed, f"{type(metrics).__name__} exposes nothing"
        for name, labels in exposed.items():
            assert name in series, f"{type(metrics).__name__} exposes {name}, not found by the scan"
            assert labels <= series[name][1], (name, labels, series[name][1])


def test_known_executor_names() -> None:
    series = known_series()
    for name in ("fx_executor_request_total", "fx_executor_queue_depth",
                 "fx_executor_workload_queue_depth", "fx_executor_queue_duration_seconds_bucket",
                 "fx_executor_compute_duration_seconds_bucket",
                 "fx_executor_read_lag_seconds_bucket", "fx_executor_model_load_failures_total"):
        assert name in series
    assert "fx_executor_request" not in series  # a counter is selected as ..._total


def test_pending_metrics_agree_with_the_code() -> None:
    """A pending name that the code defines has the agreed type and labels (the rules and the
    dashboard were written against those)."""
    declared = declared_metrics()
    clashes = []
    for name, want in PENDING.items():
        got = declared.get(name) or declared.get(name + "_total")
        if got is not None and (got.type, got.labels) != (want.type, want.labels):
            clashes.append(f"{name}: defined at {got.where} as {got.type}{sorted(got.labels)}, "
                           f"agreed {want.type}{sorted(want.labels)}")
    assert not clashes, "\n".join(clashes)


def test_metric_name_extraction() -> None:
    expr = ('sum by (workload) (rate(fx_holder_outcomes_total{outcome="fx_not_a_metric"}[5m]))'
            ' / on (workload) up{job="fx-holder"} == 0')
    assert metric_names(expr) == {"fx_holder_outcomes_total", "up"}
    assert metric_names("fx_executor_inflight_requests > 3") == {"fx_executor_inflight_requests"}
