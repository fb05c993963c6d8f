"""The settings every node service loads the same way: one loader (a defaults, file, environment,
overrides chain) for the executor's and the actuator gateway's configs, the data directory they
default under, and the broker security table they both take.

Sources, later ones winning: the field defaults, a TOML or JSON file (a ``[table]`` in TOML), then
environment variables ``<PREFIX><FIELD>`` (upper case; dict and list fields as JSON), then the
caller's overrides (:func:`load_settings`).
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from broker_schema import topics
from fx_kafka.security import ClientSecurity, SecurityConfigError

__all__ = ["SECURITY_KEYS", "ConfigError", "NodeConfig", "check_security_keys",
           "default_data_dir", "load_settings", "misplaced_settings", "security_of"]

#: The keys ``kafka_security`` takes (``FX_KAFKA_<KEY>`` in the environment).
SECURITY_KEYS = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password_file",
                 "ca_file", "ssl_check_hostname")


_Settings = TypeVar("_Settings", bound=BaseModel)


class ConfigError(ValueError):
    """The configuration file or an environment variable is not valid."""


def default_data_dir() -> Path:
    """``$FX_DATA_DIR`` or ``~/.local/share/ninelives-fx``: model store, chunks, node key."""
    env = os.environ.get("FX_DATA_DIR")
    return Path(env) if env else Path.home() / ".local" / "share" / "ninelives-fx"


def check_security_keys(value: dict[str, str]) -> dict[str, str]:
    """``value`` if its keys are :data:`SECURITY_KEYS` (a ``kafka_security`` table), else
    ``ValueError``."""
    unknown = sorted(set(value) - set(SECURITY_KEYS))
    if unknown:
        raise ValueError(f"unknown keys {unknown}; allowed: {', '.join(SECURITY_KEYS)} "
                         "(a password is given by sasl_password_file)")
    return value


def security_of(kafka_security: Mapping[str, str]) -> ClientSecurity | None:
    """The broker security a ``kafka_security`` table names (None when it is empty: the
    ``FX_KAFKA_*`` environment applies). Raises :class:`ConfigError`."""
    if not kafka_security:
        return None
    env = {f"FX_KAFKA_{key.upper()}": value for key, value in kafka_security.items()}
    try:
        return ClientSecurity.from_env(env)
    except (SecurityConfigError, ValueError) as exc:
        raise ConfigError(f"kafka_security: {exc}") from exc


def _env_overrides(environ: Mapping[str, str], fields: Mapping[str, Any], prefix: str,
                   what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix) :].lower()
        if name not in fields:
            raise ConfigError(f"{key}: no such {what} setting (known: {', '.join(fields)})")
        value: Any = raw
        stripped = raw.strip()
        if stripped[:1] in ("{", "[") or (name == "http_port" and stripped == "null"):
            try:
                value = json.loads(stripped)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{key}: not valid JSON: {exc}") from exc
        out[name] = value
    return out


def misplaced_settings(loaded: Mapping[str, Any], table: str,
                       fields: Mapping[str, Any]) -> str | None:
    """Why a config file's top level is wrong, or None. When the file has a ``[table]``, every
    setting belongs in it: anything else at the top level would be silently dropped (issue 30:
    a top-level ``[kafka_security]`` beside ``[executor]`` left the service on plaintext), so it
    is refused, naming where a known setting belongs. Pure."""
    if table not in loaded:
        return None
    if not isinstance(loaded[table], dict):
        return f"[{table}] must be a table"
    stray = sorted(k for k in loaded if k != table)
    if not stray:
        return None
    parts = []
    for key in stray:
        if key in fields:
            kind = "table" if isinstance(loaded[key], dict) else "setting"
            where = f"[{table}.{key}]" if kind == "table" else f"{key} = ... under [{table}]"
            parts.append(f"the {kind} {key!r} is at the top level, where it is ignored: it "
                         f"belongs in [{table}] (write it as {where})")
        else:
            parts.append(f"{key!r} at the top level is not a setting of [{table}] (known: "
                         f"{', '.join(sorted(fields))})")
    return "; ".join(parts)


def load_settings(
    cls: type[_Settings],
    path: str | Path | None,
    *,
    table: str,
    prefix: str,
    environ: Mapping[str, str] | None,
    overrides: Mapping[str, Any],
) -> _Settings:
    """A service config of type ``cls``: its defaults, then ``path`` (``.toml``, whose settings
    may sit under a ``[table]``, or ``.json``), then ``<prefix><FIELD>`` variables of ``environ``
    (default ``os.environ``; dict and list fields as JSON), then ``overrides``. Raises
    :class:`ConfigError`. One loader for the executor and the actuator gateway."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config {p}: {exc}") from exc
        try:
            loaded = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{p}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a table/object")
        problem = misplaced_settings(loaded, table, cls.model_fields)
        if problem is not None:
            raise ConfigError(f"{p}: {problem}")
        data.update(loaded.get(table, loaded))
    data.update(_env_overrides(os.environ if environ is None else environ, cls.model_fields,
                               prefix, table))
    data.update(overrides)
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(str(exc)) from exc


class NodeConfig(BaseModel):
    """The settings of the node shell (:mod:`fx_node.shell`) that every node service has: the
    executor's and the gateway's configs extend it with their node id, group prefix, key file,
    HTTP port (each with its own default) and the runner's own settings. ``print(config)``
    shows it (``str`` is TOML-like)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str = Field(
        default_factory=lambda: os.environ.get("FX_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    #: Which ``.out`` topics to read (a regex over topic names). Narrow it to share a broker.
    topic_pattern: str = topics.OUT_PATTERN
    #: Consumer group per kind: ``<group_prefix>.<kind>`` (each service has its own default).
    group_prefix: str = "fx-node"
    key_type: Literal["ed25519", "secp256k1"] = "ed25519"
    #: HTTP (health, metrics, facts); the port is the service's (0 picks a free port; None
    #: disables HTTP).
    http_host: str = "127.0.0.1"
    #: How often pattern subscription looks for new ``wl.*.out`` topics.
    metadata_max_age_ms: Annotated[int, Field(ge=100)] = 3000
    session_timeout_ms: Annotated[int, Field(ge=1000)] = 10_000
    heartbeat_interval_ms: Annotated[int, Field(ge=100)] = 1000
    #: On SIGTERM: how long work in flight may take before the node stops anyway (the
    #: executor's abandoned accepted requests become ``unknown`` at the lease holder, by design;
    #: a command being written to a device is never abandoned half-way by the gateway itself).
    shutdown_grace_s: Annotated[float, Field(ge=0)] = 10.0
    #: How often facts are republished even without a change (0: only at start and on change).
    facts_interval_s: Annotated[float, Field(ge=0)] = 60.0
    #: Broker security, as the ``FX_KAFKA_*`` variables of :mod:`fx_kafka.security` without
    #: the ``FX_KAFKA_`` prefix, in lower case: ``security_protocol``, ``sasl_mechanism``,
    #: ``sasl_username``, ``sasl_password_file``, ``ca_file``, ``ssl_check_hostname``. A
    #: password is named by file only (the config is printed). Empty: the environment decides.
    kafka_security: dict[str, str] = Field(default_factory=dict)

    @field_validator("topic_pattern")
    @classmethod
    def _regex(cls, value: str) -> str:
        import re

        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"topic_pattern is not a regex: {exc}") from exc
        return value

    @field_validator("kafka_security")
    @classmethod
    def _check_security_keys(cls, value: dict[str, str]) -> dict[str, str]:
        return check_security_keys(value)

    def group_id(self, kind: str) -> str:
        """The consumer group serving ``kind``: ``<group_prefix>.<kind>``."""
        return f"{self.group_prefix}.{kind}"

    def client_security(self) -> ClientSecurity | None:
        """The broker security of ``kafka_security`` (None when it is empty: the ``FX_KAFKA_*``
        environment applies). Raises :class:`ConfigError` for settings that do not fit."""
        return security_of(self.kafka_security)

    def __str__(self) -> str:
        return "\n".join(f"{name} = {json.dumps(value)}"
                         for name, value in self.model_dump(mode="json").items())

