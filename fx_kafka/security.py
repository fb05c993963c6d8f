"""Client security settings: the one home for how every client of the project authenticates.

Every producer, consumer and admin client the project makes (:mod:`fx_kafka.client`'s
factories) takes its SASL/TLS options from :func:`current`: the settings installed with
:func:`use_security` in the running context, else those read from the environment
(:meth:`ClientSecurity.from_env`). Services (the executor, the lease holder) and every ``fx``
command therefore need no security code of their own: export the variables and run them.

========================================  ======================================================
``FX_KAFKA_SECURITY_PROTOCOL``            ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``,
                                          ``SASL_SSL`` (default when a user name is set)
``FX_KAFKA_SASL_MECHANISM``               ``SCRAM-SHA-512`` (default), ``SCRAM-SHA-256``,
                                          ``PLAIN``
``FX_KAFKA_SASL_USERNAME``                the SASL user (the ACL principal is ``User:<name>``)
``FX_KAFKA_SASL_PASSWORD``                its password, or
``FX_KAFKA_SASL_PASSWORD_FILE``           a file holding it (first line; wins over the above)
``FX_KAFKA_CA_FILE``                      PEM CA bundle the broker's certificate is checked
                                          against (default: the system's trust store)
``FX_KAFKA_SSL_CHECK_HOSTNAME``           ``1`` (default) or ``0``
========================================  ======================================================

``fx broker start --secure`` writes one ``<user>.env`` file per user with these exports.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "ENV_CA_FILE",
    "ENV_CHECK_HOSTNAME",
    "ENV_MECHANISM",
    "ENV_PASSWORD",
    "ENV_PASSWORD_FILE",
    "ENV_PROTOCOL",
    "ENV_USERNAME",
    "PLAINTEXT",
    "ClientSecurity",
    "SecurityConfigError",
    "child_env",
    "current",
    "use_security",
]

ENV_PROTOCOL = "FX_KAFKA_SECURITY_PROTOCOL"
ENV_MECHANISM = "FX_KAFKA_SASL_MECHANISM"
ENV_USERNAME = "FX_KAFKA_SASL_USERNAME"
ENV_PASSWORD = "FX_KAFKA_SASL_PASSWORD"
ENV_PASSWORD_FILE = "FX_KAFKA_SASL_PASSWORD_FILE"
ENV_CA_FILE = "FX_KAFKA_CA_FILE"
ENV_CHECK_HOSTNAME = "FX_KAFKA_SSL_CHECK_HOSTNAME"
_ALL_ENV = (ENV_PROTOCOL, ENV_MECHANISM, ENV_USERNAME, ENV_PASSWORD, ENV_PASSWORD_FILE,
            ENV_CA_FILE, ENV_CHECK_HOSTNAME)

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]
_PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS: tuple[str, ...] = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


class SecurityConfigError(ValueError):
    """The client security settings are incomplete or contradictory (names the variable)."""


@dataclass(frozen=True)
class ClientSecurity:
    """How a client connects: protocol, SASL mechanism and credentials, CA file.

    ``password`` is kept out of ``repr``. :meth:`client_options` gives aiokafka's keyword
    arguments (the same for producers, consumers and admin clients)."""

    protocol: Protocol = "PLAINTEXT"
    mechanism: Mechanism = "SCRAM-SHA-512"
    username: str | None = None
    password: str | None = None
    ca_file: Path | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in _PROTOCOLS:
            raise SecurityConfigError(f"{ENV_PROTOCOL}={self.protocol!r}: one of "
                                      f"{', '.join(_PROTOCOLS)}")
        if self.mechanism not in _MECHANISMS:
            raise SecurityConfigError(f"{ENV_MECHANISM}={self.mechanism!r}: one of "
                                      f"{', '.join(_MECHANISMS)}")
        if self.sasl and (not self.username or self.password is None):
            raise SecurityConfigError(
                f"{self.protocol} needs a user name and a password ({ENV_USERNAME} and "
                f"{ENV_PASSWORD} or {ENV_PASSWORD_FILE})")

    def __repr__(self) -> str:
        return (f"ClientSecurity(protocol={self.protocol!r}, mechanism={self.mechanism!r}, "
                f"username={self.username!r}, password={'***' if self.password else None}, "
                f"ca_file={str(self.ca_file) if self.ca_file else None!r})")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def principal(self) -> str:
        """``User:<name>`` as the broker's authorizer sees this client (``User:ANONYMOUS``
        without SASL)."""
        return f"User:{self.username}" if self.sasl and self.username else "User:ANONYMOUS"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSecurity:
        """The settings in ``environ`` (default ``os.environ``); see the module docstring."""
        env = os.environ if environ is None else environ
        username = env.get(ENV_USERNAME) or None
        protocol = (env.get(ENV_PROTOCOL) or ("SASL_SSL" if username else "PLAINTEXT")).upper()
        password = env.get(ENV_PASSWORD)
        pw_file = env.get(ENV_PASSWORD_FILE)
        if pw_file:
            try:
                lines = Path(pw_file).read_text().splitlines()
            except OSError as exc:
                raise SecurityConfigError(f"{ENV_PASSWORD_FILE}={pw_file}: {exc}") from exc
            password = lines[0] if lines else ""
        ca = env.get(ENV_CA_FILE)
        if ca and not Path(ca).is_file():
            raise SecurityConfigError(f"{ENV_CA_FILE}={ca}: no such file")
        check = env.get(ENV_CHECK_HOSTNAME, "1").strip().lower() not in ("0", "false", "no")
        return cls(protocol=protocol,  # type: ignore[arg-type]  # checked in __post_init__
                   mechanism=(env.get(ENV_MECHANISM) or "SCRAM-SHA-512").upper(),  # type: ignore[arg-type]
                   username=username, password=password,
                   ca_file=Path(ca) if ca else None, check_hostname=check)

    def to_env(self, *, password_file: Path | None = None) -> dict[str, str]:
        """The variables that make :meth:`from_env` give these settings back (a child process's
        environment). With ``password_file`` the password is named by its file, not inlined."""
        env: dict[str, str] = {ENV_PROTOCOL: self.protocol}
        if self.sasl:
            env[ENV_MECHANISM] = self.mechanism
            env[ENV_USERNAME] = self.username or ""
            if password_file is not None:
                env[ENV_PASSWORD_FILE] = str(password_file)
            else:
                env[ENV_PASSWORD] = self.password or ""
        if self.ca_file is not None:
            env[ENV_CA_FILE] = str(self.ca_file)
        if not self.check_hostname:
            env[ENV_CHECK_HOSTNAME] = "0"
        return env

    def apply_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with every ``FX_KAFKA_*`` security variable replaced by these settings."""
        for key in _ALL_ENV:
            env.pop(key, None)
        env.update(self.to_env())
        return env

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context (certificate and host name checked), or None without TLS."""
        if not self.tls:
            return None
        return _ssl_context(str(self.ca_file) if self.ca_file else None, self.check_hostname)

    def client_options(self) -> dict[str, Any]:
        """aiokafka keyword arguments (``security_protocol``, ``sasl_*``, ``ssl_context``)."""
        options: dict[str, Any] = {"security_protocol": self.protocol}
        if self.sasl:
            options["sasl_mechanism"] = self.mechanism
            options["sasl_plain_username"] = self.username
            options["sasl_plain_password"] = self.password
        context = self.ssl_context()
        if context is not None:
            options["ssl_context"] = context
        return options


PLAINTEXT = ClientSecurity()


@functools.lru_cache(maxsize=16)
def _ssl_context(ca_file: str | None, check_hostname: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file)
    context.check_hostname = check_hostname
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


_CURRENT: contextvars.ContextVar[ClientSecurity | None] = contextvars.ContextVar(
    "fx_kafka_client_security", default=None)


def current() -> ClientSecurity:
    """The settings in force: those of :func:`use_security` in this context, else the
    environment's."""
    chosen = _CURRENT.get()
    return chosen if chosen is not None else ClientSecurity.from_env()


@contextlib.contextmanager
def use_security(security: ClientSecurity) -> Iterator[ClientSecurity]:
    """Make every client created in this context (and tasks started from it) use
    ``security``; :func:`child_env` hands it on to child processes."""
    token = _CURRENT.set(security)
    try:
        yield security
    finally:
        _CURRENT.reset(token)


def child_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child process: with :func:`use_security` in force, its settings replace
    the ``FX_KAFKA_*`` security variables; otherwise ``env`` as it is."""
    chosen = _CURRENT.get()
    return chosen.apply_env(env) if chosen is not None else env
