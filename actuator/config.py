"""The actuator gateway's configuration: one typed, printable object.

Sources, later ones winning (the executor's loader, :func:`fx_node.settings.load_settings`): the
field defaults, a TOML or JSON file (``fx actuator run --config FILE``; a TOML file may put
everything under an ``[actuator]`` table), then ``FX_ACTUATOR_<FIELD>`` environment variables
(dict and list fields as JSON). ``bootstrap`` falls back to ``FX_KAFKA_BOOTSTRAP``.

```toml
[actuator]
node_id = "gw-site-1"
bootstrap = "kafka-1:9092"

[actuator.devices.gate-a]              # a Modbus TCP device and the holding register it is set by
host = "10.0.0.17"
port = 502
unit = 1
address = 0                            # the holding register of the set-point
values = { closed = 0, open = 1 }      # named set-points (absolute); numbers in [minimum, maximum]

[actuator.kinds."acme:gate/set@1.0.0"]
guarantee = "at-most-once"             # idempotent | fenced | at-most-once
devices = ["gate-a"]                   # the first is the default when a request names none
queue_limit = 16
```
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from broker_schema import topics
from broker_schema.records import EffectKind, Guarantee
from fx_node.settings import NodeConfig, default_data_dir, load_settings

__all__ = ["CRASH_POINTS", "ENV_PREFIX", "DeviceConfig", "GatewayConfig", "KindConfig",
           "TelemetryConfig", "load_gateway_config"]

ENV_PREFIX = "FX_ACTUATOR_"

#: Where ``crash_at`` kills the gateway (SIGKILL to itself), in the order a command passes them:
#: after deciding to admit and before writing ``accepted``; after ``accepted`` is acknowledged;
#: after an at-most-once ``attempt`` is remembered, before the device write; after the device
#: acknowledged the write (and was read back); after what is remembered after the write
#: (at-most-once ``done``, idempotent ``recent``) is acknowledged, before the response; after the
#: response is acknowledged, before its offset is committed.
CRASH_POINTS = ("before_accept", "after_accept", "after_attempt", "after_write",
                "after_remember", "after_response")
CrashPoint = Literal["before_accept", "after_accept", "after_attempt", "after_write",
                     "after_remember", "after_response"]

_Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)]
_Register = Annotated[int, Field(ge=0, le=65535)]


def _default_node_id() -> str:
    return f"gw-{socket.gethostname()}"


class DeviceConfig(BaseModel):
    """A Modbus TCP device: where it is, and the holding register its set-point is written to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 502
    #: the Modbus unit (device) id
    unit: Annotated[int, Field(ge=0, le=255)] = 1
    #: the address of the holding register the set-point is written to and read back from
    address: _Register = 0
    #: named set-points -> register value (``{"closed": 0, "open": 1}``); a request's
    #: ``set_point`` is one of these names or a number in ``[minimum, maximum]``
    values: dict[str, _Register] = Field(default_factory=dict)
    minimum: _Register = 0
    maximum: _Register = 65535
    #: the longest one Modbus request (connect, write or read) may take
    timeout_s: Annotated[float, Field(gt=0, le=60)] = 2.0

    @model_validator(mode="after")
    def _check_range(self) -> DeviceConfig:
        if self.minimum > self.maximum:
            raise ValueError("minimum > maximum")
        return self


class KindConfig(BaseModel):
    """An actuation kind this gateway serves: its guarantee, the devices it may set, its queue."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    guarantee: Guarantee
    devices: Annotated[list[_Name], Field(min_length=1)]
    queue_limit: Annotated[int, Field(ge=1, le=1_000_000)] = 16


class TelemetryConfig(BaseModel):
    """Read a device's set-point register every ``interval_s`` and append it as an input to a
    workload's ``wl.<id>.in`` (the read-back pattern's telemetry; docs/actuation.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: _Name
    workload_id: Annotated[str, Field(pattern=topics.WORKLOAD_ID_RE.pattern)]
    interval_s: Annotated[float, Field(gt=0, le=3600)] = 1.0


class GatewayConfig(NodeConfig):
    """Everything ``fx actuator run`` needs: the node shell's settings
    (:class:`fx_node.settings.NodeConfig`) and the device runner's. ``print(config)`` shows
    it."""

    #: This node's id: ``written_by`` of its responses, key of its facts on ``sys.facts``, and
    #: the name of its memory topic ``sys.actuator.<node_id>``.
    node_id: Annotated[str, Field(min_length=1, max_length=200)] = Field(
        default_factory=_default_node_id)
    kinds: dict[EffectKind, KindConfig] = Field(default_factory=dict)
    devices: dict[_Name, DeviceConfig] = Field(default_factory=dict)
    telemetry: list[TelemetryConfig] = Field(default_factory=list)
    #: Consumer group per kind: ``<group_prefix>.<kind>``.
    group_prefix: str = "fx-actuator"
    key_file: Path = Field(default_factory=lambda: default_data_dir() / "gateway.key")
    http_port: Annotated[int, Field(ge=0, le=65535)] | None = 8089
    #: How many recent effect ids of ``idempotent`` commands the gateway remembers per device
    #: (``recent`` entries on its memory topic): a repeat of one of them is not written to the
    #: device again (docs/actuation.md, "Memory"); the oldest is forgotten (``cleared``) when a
    #: newer one would make more.
    idempotent_window: Annotated[int, Field(ge=1, le=1_000_000)] = 4096
    #: Fault injection for tests: SIGKILL this process at that point of the first command that
    #: reaches it (:data:`CRASH_POINTS`). Never set in production.
    crash_at: CrashPoint | None = None

    @field_validator("node_id")
    @classmethod
    def _check_node_id(cls, value: str) -> str:
        topics.actuator_memory(value)  # its memory topic is named after it
        return value

    @model_validator(mode="after")
    def _check_devices(self) -> GatewayConfig:
        for kind, served in self.kinds.items():
            missing = sorted(set(served.devices) - set(self.devices))
            if missing:
                raise ValueError(f"kind {kind} names devices that are not configured: {missing}")
        for entry in self.telemetry:
            if entry.device not in self.devices:
                raise ValueError(f"telemetry names device {entry.device!r}, not configured")
        return self

    @property
    def memory_topic(self) -> str:
        """``sys.actuator.<node_id>``: what this gateway remembers."""
        return topics.actuator_memory(self.node_id)

    @property
    def queue_limits(self) -> dict[str, int]:
        """Kind -> queue limit."""
        return {kind: served.queue_limit for kind, served in self.kinds.items()}

    @property
    def guarantees(self) -> dict[str, Guarantee]:
        """Kind -> the guarantee it is served with."""
        return {kind: served.guarantee for kind, served in self.kinds.items()}



def load_gateway_config(path: str | Path | None = None, *,
                        environ: Mapping[str, str] | None = None,
                        **overrides: Any) -> GatewayConfig:
    """Build the config from ``path``, then ``FX_ACTUATOR_*`` variables, then ``overrides``.
    Raises :class:`fx_node.settings.ConfigError`."""
    return load_settings(GatewayConfig, path, table="actuator", prefix=ENV_PREFIX,
                         environ=environ, overrides=overrides)
