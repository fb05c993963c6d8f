"""The actuator gateway: actuation kinds executed on real devices (Modbus TCP through
``pymodbus``), with guarantee kinds (``idempotent``, ``fenced``, ``at-most-once``), a memory of
effect ids and epochs that survives restarts (``sys.actuator.<node>``), and ``fx alarms``.

Same shape as the executor: a pure core (:mod:`actuator.core`), a runner
(:mod:`actuator.runner`: memory, Modbus writes, telemetry) served by the node's shell that the
executor runs too (:mod:`fx_node.shell`: consuming, commits, leases, facts on ``sys.facts``, HTTP
health and metrics; :mod:`actuator.service` composes the two). It imports ``fx_node`` (the
admission rules, offsets, identity, facts, HTTP), never the executor nor the workload SDK:
workloads and gateways meet only on the log. ``import actuator`` is light.
"""

from actuator.config import CRASH_POINTS, DeviceConfig, GatewayConfig, KindConfig
from actuator.config import load_gateway_config as load_config

__all__ = ["CRASH_POINTS", "DeviceConfig", "GatewayConfig", "KindConfig", "load_config"]
