"""The actuator gateway: actuation kinds executed on real devices (Modbus TCP through
``pymodbus``), with guarantee kinds (``idempotent``, ``fenced``, ``at-most-once``), a memory of
effect ids and epochs that survives restarts (``sys.actuator.<node>``), and ``fx alarms``.

Same shape as the executor: a pure core (:mod:`actuator.core`), a thin aiokafka shell
(:mod:`actuator.service`), facts on ``sys.facts``, HTTP health and metrics. It imports the
executor's reusable pieces (its decide rules, offsets, identity, facts, HTTP) and never the
workload SDK: workloads and gateways meet only on the log. ``import actuator`` is light.
"""

from actuator.config import CRASH_POINTS, DeviceConfig, GatewayConfig, KindConfig
from actuator.config import load_gateway_config as load_config

__all__ = ["CRASH_POINTS", "DeviceConfig", "GatewayConfig", "KindConfig", "load_config"]
