"""Typed errors of fx_kafka. Every one derives from :class:`BrokerError`."""

from __future__ import annotations

__all__ = [
    "BrokerAlreadyRunningError",
    "BrokerAuthError",
    "BrokerError",
    "BrokerNotReadyError",
    "BrokerStartError",
    "FetchError",
    "JavaNotFoundError",
    "MirrorCopyError",
    "MirrorError",
    "NoBrokerError",
    "PortInUseError",
    "ReplicationConfigError",
    "TopicConfigError",
]


class BrokerError(Exception):
    """Base class of every fx_kafka error."""


class JavaNotFoundError(BrokerError):
    """No usable Java (17 or newer) to run the local Kafka broker."""


class FetchError(BrokerError):
    """The Kafka jars could not be fetched from Maven Central (no mvn, offline, bad pom)."""


class BrokerStartError(BrokerError):
    """The local broker did not come up. ``log_tail`` holds the end of its logs."""

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        self.log_tail = log_tail
        full = f"{message}\n--- broker log tail ---\n{log_tail}" if log_tail else message
        super().__init__(full)


class PortInUseError(BrokerStartError):
    """A port the local broker's data needs (recorded in ``state.json``) is taken by another
    process. ``port`` is the port, ``owner`` who holds it when that can be told."""

    def __init__(self, message: str, *, port: int, owner: str | None = None) -> None:
        self.port = port
        self.owner = owner
        super().__init__(message)


class BrokerAlreadyRunningError(BrokerError):
    """A broker started from the same data dir is still running."""

    def __init__(self, message: str, *, bootstrap: str, pid: int) -> None:
        self.bootstrap = bootstrap
        self.pid = pid
        super().__init__(message)


class BrokerNotReadyError(BrokerError, TimeoutError):
    """A bootstrap address did not answer an admin call (list topics) in time."""


class BrokerAuthError(BrokerError):
    """The broker refused this client's credentials (SASL authentication failed) or its TLS
    certificate could not be verified: a retry cannot help. The message says which, and names
    the ``FX_KAFKA_*`` settings in use (never the password)."""


class NoBrokerError(BrokerError):
    """No broker could be had for tests: no FX_KAFKA_BOOTSTRAP, no local Kafka, no Docker.

    ``reasons`` says, for each way tried, why it was not available.
    """

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = list(reasons)
        super().__init__("no Kafka broker available:\n  - " + "\n  - ".join(self.reasons))


class TopicConfigError(BrokerError):
    """A topic exists with a configuration the design relies on being different (for example a
    workload topic whose timestamps are the producer's clock instead of the broker's)."""


class RetentionTooShortError(TopicConfigError):
    """A workload topic exists with time or size retention that would delete records the
    workload's audit horizon promises to keep (or, on ``.spec`` and ``.claims``, any record at
    all: those are never trimmed).

    ``problems`` holds one ``(topic, config key, value)`` per offending setting;
    ``audit_horizon_ms`` is the horizon checked against (None: forever; ``"unknown"``: checked
    before the spec was read, so only ``.spec`` and ``.claims``).
    """

    def __init__(self, message: str, *, problems: list[tuple[str, str, int]],
                 audit_horizon_ms: int | str | None) -> None:
        self.problems = list(problems)
        self.audit_horizon_ms = audit_horizon_ms
        super().__init__(message)


class ReplicationConfigError(BrokerError):
    """Replication settings (``FX_REPLICATION_FACTOR``, ``FX_MIN_INSYNC_REPLICAS``) that cannot
    work on the cluster: a factor above the broker count, a min ISR above the factor, a bad
    value."""


class MirrorCopyError(BrokerError):
    """A mirrored copy on the fleet (``fx mirror``) that is not a copy of the site's log: a
    record without the site-offset header among copied ones, or two different records that
    name the same site offset."""


class MirrorError(BrokerError):
    """``fx mirror`` cannot start, stop or tell its state: a broker that does not answer, an
    unknown workload, a fleet topic that would not keep the site's times, MirrorMaker 2 that
    exits or does not replicate in time (``log_tail`` holds the end of its log)."""

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        super().__init__(message + (f"\n--- MirrorMaker 2 log tail ---\n{log_tail}"
                                    if log_tail else ""))
        self.log_tail = log_tail
