"""The actuator gateway service: the node's shell (:mod:`fx_node.shell`: consuming ``wl.*.out``
per actuation kind, commits, leases, facts, HTTP, the resilient producer) serving with the
gateway's runner (:mod:`actuator.runner`: decisions, memory, Modbus writes, telemetry).
"""

from __future__ import annotations

import logging

from actuator.config import GatewayConfig
from actuator.core import GatewayState
from actuator.metrics import GatewayMetrics
from actuator.runner import DeviceRunner
from fx_node.identity import NodeIdentity
from fx_node.runner import NodeSettings, node_settings
from fx_node.service import NodeService
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


class GatewayService(NodeService):
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
