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
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from fx_kafka.security import ClientSecurity, SecurityConfigError

__all__ = ["SECURITY_KEYS", "ConfigError", "check_security_keys", "default_data_dir",
           "load_settings", "misplaced_settings", "security_of"]

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
