"""The actuator gateway service: the node's shell (:mod:`fx_node.shell`: consuming ``wl.*.out``
per actuation kind, commits, leases, facts, HTTP, the resilient producer) serving with the
gateway's runner (:mod:`actuator.runner`: decisions, memory, Modbus writes, telemetry).
"""

from __future__ import annotations

import logging
from typing import Any

from actuator.config import GatewayConfig
from actuator.core import GatewayState
from actuator.metrics import GatewayMetrics
from actuator.runner import DeviceRunner
from fx_node.identity import NodeIdentity
from fx_node.runner import NodeSettings, node_settings
from fx_node.shell import NodeShell

__all__ = ["GatewayService", "gateway_settings"]

log = logging.getLogger(__name__)


def gateway_settings(config: GatewayConfig) -> NodeSettings:
    """What the node's shell reads of the gateway's config (a revoked partition's commands get
    the shutdown grace)."""
    return node_settings(config, name="actuator gateway", task_label="gateway",
                         max_records=100, revoke_grace_s=config.shutdown_grace_s,
                         http_title="ninelives-fx actuator gateway", producer_batch_bytes=None,
                         producer_close_s=10.0)


class GatewayService:
    """One actuator gateway node: a :class:`~fx_node.shell.NodeShell` (``node``) with a
    :class:`~actuator.runner.DeviceRunner` (``runner``). ``await run()`` until
    :meth:`request_stop`."""

    def __init__(self, config: GatewayConfig, *, identity: NodeIdentity | None = None) -> None:
        self.config = config
        self.identity = identity or NodeIdentity.load_or_create(config.key_file,
                                                                config.key_type)
        self.metrics = GatewayMetrics()
        self.node = NodeShell(gateway_settings(config), identity=self.identity,
                              metrics=self.metrics, log=log)
        self.runner = DeviceRunner(config, self.node, metrics=self.metrics)
        self.node.attach(self.runner)

    @property
    def state(self) -> GatewayState:
        """The gateway's state (memory, admission state)."""
        return self.runner.gateway

    @property
    def http_port(self) -> int | None:
        """The bound HTTP port (after start), or None without HTTP."""
        return self.node.http_port

    async def start(self) -> None:
        """Connect, read the memory back, publish facts, start consuming."""
        await self.node.start()

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop (safe from a signal handler)."""
        self.node.request_stop()

    async def run(self) -> None:
        """Start, serve until :meth:`request_stop` or a fatal error, then stop."""
        await self.node.run()

    async def stop(self) -> None:
        """Stop reading, let commands in flight finish (``shutdown_grace_s``), close. Idempotent."""
        await self.node.stop()

    def is_live(self) -> bool:
        """The loops run and nothing fatal happened."""
        return self.node.is_live()

    async def readiness(self) -> dict[str, Any]:
        """Ready: started and the broker answers; each device's connection is reported."""
        return await self.node.readiness()

    def current_facts(self) -> dict[str, Any] | None:
        """The last published facts as JSON."""
        return self.node.current_facts()

    def metrics_text(self) -> bytes:
        """Prometheus text (queue gauges refreshed first)."""
        return self.node.metrics_text()
