"""Prometheus metrics of one executor, named like Triton's ``nv_inference_*`` as ``fx_executor_*``.

Each service owns its own :class:`~prometheus_client.CollectorRegistry`, so two executors in one
process (tests) never share counters. The list, with meanings, is in
``docs/operations.md`` (section "The executor").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from broker_schema.records import ParityGateFact

__all__ = ["ExecutorMetrics"]

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class ExecutorMetrics:
    """The executor's metrics (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "fx_executor_request",
            "Effect requests answered, by kind, outcome and error code ('' unless outcome=error)",
            ["kind", "outcome", "code"],
            registry=r,
        )
        self.ignored = Counter(
            "fx_executor_ignored",
            "Records on .out read and ignored (plain outputs, kinds not served, in flight here)",
            ["reason"],
            registry=r,
        )
        self.rejected = Counter(
            "fx_executor_rejected_records",
            "Undecodable records on .out (garbage, wrong schema version, oversize), by code",
            ["code"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "fx_executor_queue_depth",
            "Requests admitted and not yet answered (waiting plus running), per kind",
            ["kind"],
            registry=r,
        )
        self.workload_queue_depth = Gauge(
            "fx_executor_workload_queue_depth",
            "Requests admitted and not yet answered, per workload",
            ["workload"],
            registry=r,
        )
        self.speculative = Counter(
            "fx_executor_speculative_reads",
            "Speculative reads (speculative_reads on): requests prepared on their uncommitted "
            "read (prepared; ran: the model run too), requests read committed that found "
            "theirs (hit) or none (miss), prepared ones that left unused (expired: aborted, or "
            "not read committed within the cache's time or size)",
            ["result"],
            registry=r,
        )
        self.queue_limit = Gauge(
            "fx_executor_queue_limit", "Queue limit per kind", ["kind"], registry=r
        )
        self.unrouted_workloads = Gauge(
            "fx_executor_unrouted_workloads",
            "Workload topics no member of the kind's group holds every bound model of "
            "(set by the group leader at each assignment; docs/operations.md, Placement)",
            ["kind"],
            registry=r,
        )
        self.inflight = Gauge(
            "fx_executor_inflight_requests",
            "Requests inside the engine right now",
            registry=r,
        )
        self.queue_seconds = Histogram(
            "fx_executor_queue_duration_seconds",
            "Time from accept to the engine call starting",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.compute_seconds = Histogram(
            "fx_executor_compute_duration_seconds",
            "Engine call time (input resolution excluded), per model",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.request_seconds = Histogram(
            "fx_executor_request_duration_seconds",
            "Time from reading the request to its response being acknowledged",
            ["kind", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.read_lag_seconds = Histogram(
            "fx_executor_read_lag_seconds",
            "Broker append time of a request to the executor reading it (executor clock)",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "fx_executor_batch_size",
            "Requests per engine call, per model",
            ["model"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.exec_count = Counter(
            "fx_executor_exec",
            "Engine calls (a batch counts once), per model",
            ["model"],
            registry=r,
        )
        self.models_loaded = Gauge(
            "fx_executor_models_loaded", "Models held warm by an engine", registry=r
        )
        self.parity_gate_checks = Counter(
            "fx_executor_parity_gate_checks",
            "Integer-engine parity gate runs (a backend against the numpy oracle on the canary "
            "set), by model, backend and result (passed, refused)",
            ["model", "backend", "result"],
            registry=r,
        )
        self.ledger_foreign_leaves = Gauge(
            "fx_executor_ledger_foreign_leaves",
            "Leaves of this node's receipt ledger it did not append (> 0: it refuses to extend "
            "the ledger and serves no receipt; alert FxLedgerForeignLeaf)",
            registry=r,
        )
        self.parity_gate_refused = Gauge(
            "fx_executor_parity_gate_refused",
            "1 while the backend is refused for the model by its parity gate, else 0",
            ["model", "backend"],
            registry=r,
        )
        self.model_load_failures = Counter(
            "fx_executor_model_load_failures",
            "Model loads refused, by code (model_hash_mismatch, engine_error...)",
            ["code"],
            registry=r,
        )
        self.sync_failures = Counter(
            "fx_executor_sync_failures",
            "Failed catch-ups on a workload's .claims/.spec (retried; no request is decided "
            "on stale fencing state meanwhile)",
            registry=r,
        )

        self.queue_full_waits = Counter(
            "fx_executor_queue_full_waits",
            "Requests that found their kind's queue full and waited for room (up to "
            "backpressure_wait_s) before being decided",
            ["kind"],
            registry=r,
        )
        self.lease_renewals = Counter(
            "fx_executor_lease_renewals",
            "accepted records written again for requests still in flight (lease renewals)",
            registry=r,
        )
        self.broker_retries = Counter(
            "fx_executor_broker_retries",
            "Broker calls retried because the broker was down or restarting, by operation "
            "(response, accepted, facts, reject, commit, stream)",
            ["op"],
            registry=r,
        )

    def observe_parity_gate(self, fact: ParityGateFact) -> None:
        """A parity gate run (:mod:`executor.parity`): ``fx_executor_parity_gate_checks_total``
        counts it, ``fx_executor_parity_gate_refused`` holds 1 while it stands refused."""
        self.parity_gate_checks.labels(fact.model, fact.backend, fact.result).inc()
        self.parity_gate_refused.labels(fact.model, fact.backend).set(
            0 if fact.result == "passed" else 1)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
