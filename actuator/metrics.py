"""Prometheus metrics of one actuator gateway (``fx_actuator_*``; docs/actuation.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["GatewayMetrics"]

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class GatewayMetrics:
    """The gateway's metrics, in a registry of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "fx_actuator_request", "Actuation requests answered, by kind, outcome and error code",
            ["kind", "outcome", "code"], registry=r)
        self.ignored = Counter(
            "fx_actuator_ignored", "Records on .out read and left alone, by reason",
            ["reason"], registry=r)
        self.in_doubt = Counter(
            "fx_actuator_in_doubt",
            "Commands left unanswered because the device may have acted (their lease decides: "
            "unknown, and an alarm for at-most-once kinds)", ["kind"], registry=r)
        self.device_writes = Counter(
            "fx_actuator_device_writes", "Modbus writes, by device and result "
            "(ok, refused, unreachable, in_doubt)", ["device", "result"], registry=r)
        self.device_up = Gauge(
            "fx_actuator_device_up", "1 while the device answers (its latest read or connect "
            "reached it), else 0", ["device"], registry=r)
        self.alarms = Counter(
            "fx_actuator_alarms", "Alarms raised on sys.alarms (a device did not confirm a "
            "write in time), by kind", ["kind"], registry=r)
        self.read_backs = Counter(
            "fx_actuator_read_backs", "Registers read back after a write the device did not "
            "confirm, by device and result (ok, unreadable)", ["device", "result"], registry=r)
        self.memory_writes = Counter(
            "fx_actuator_memory_writes", "Records written to this gateway's memory, by entry",
            ["entry"], registry=r)
        self.remembered = Gauge(
            "fx_actuator_remembered_effects", "Effect ids this gateway remembers", registry=r)
        self.queue_depth = Gauge(
            "fx_actuator_queue_depth", "Commands admitted and not yet answered, per kind",
            ["kind"], registry=r)
        self.command_seconds = Histogram(
            "fx_actuator_command_seconds",
            "From reading a request to its response acknowledged, per kind", ["kind"],
            buckets=_BUCKETS, registry=r)
        self.telemetry = Counter(
            "fx_actuator_telemetry", "Telemetry inputs appended, by device and result",
            ["device", "result"], registry=r)
        self.lease_renewals = Counter(
            "fx_actuator_lease_renewals", "accepted records written again to keep a lease",
            registry=r)
        self.broker_retries = Counter(
            "fx_actuator_broker_retries", "Broker operations retried while it was unavailable",
            ["op"], registry=r)
        self.sync_failures = Counter(
            "fx_actuator_sync_failures", "Failed catch-ups on a workload's claims and spec",
            registry=r)

    def render(self) -> bytes:
        """Prometheus text format."""
        return generate_latest(self.registry)
