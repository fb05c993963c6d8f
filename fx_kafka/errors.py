"""Typed errors of fx_kafka. Every one derives from :class:`BrokerError`."""

from __future__ import annotations

__all__ = [
    "BrokerAlreadyRunningError",
    "BrokerError",
    "BrokerNotReadyError",
    "BrokerStartError",
    "FetchError",
    "JavaNotFoundError",
    "NoBrokerError",
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


class BrokerAlreadyRunningError(BrokerError):
    """A broker started from the same data dir is still running."""

    def __init__(self, message: str, *, bootstrap: str, pid: int) -> None:
        self.bootstrap = bootstrap
        self.pid = pid
        super().__init__(message)


class BrokerNotReadyError(BrokerError, TimeoutError):
    """A bootstrap address did not answer an admin call (list topics) in time."""


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
