"""How the project's topics are replicated: one typed setting, read from the environment, resolved
against the cluster it is used on.

Defaults (any Kafka: the local one, Redpanda, MSK, Confluent): replication factor
``min(3, brokers)``; ``min.insync.replicas`` 2 where the factor is 3 or more, else 1;
``unclean.leader.election.enable=false``. Producers use ``acks=all`` with idempotence
(:func:`fx_kafka.client.make_producer`), so an acknowledged record is on ``min.insync.replicas``
replicas, and no replica that missed it can become leader.

Override for your own cluster with ``FX_REPLICATION_FACTOR`` and ``FX_MIN_INSYNC_REPLICAS`` (every
process that creates topics reads them: the lease holder, ``fx workload ...``, the executor).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from fx_kafka.errors import ReplicationConfigError

__all__ = [
    "MIN_ISR_ENV",
    "REPLICATION_FACTOR_ENV",
    "ReplicationSettings",
    "default_for",
]

REPLICATION_FACTOR_ENV = "FX_REPLICATION_FACTOR"
MIN_ISR_ENV = "FX_MIN_INSYNC_REPLICAS"


def default_for(brokers: int) -> tuple[int, int]:
    """``(replication factor, min.insync.replicas)`` for a cluster of ``brokers``: the factor is
    ``min(3, brokers)``; the min ISR is 2 where there are 3 or more replicas (a write is on two
    disks before it is acknowledged, and one node may be down), else 1."""
    if brokers < 1:
        raise ValueError("a cluster has at least one broker")
    factor = min(3, brokers)
    return factor, 2 if factor >= 3 else 1


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ReplicationConfigError(f"{name}={raw!r} is not an integer") from None
    if value < 1:
        raise ReplicationConfigError(f"{name}={value}: must be 1 or more")
    return value


@dataclass(frozen=True)
class ReplicationSettings:
    """Replication of the topics the project creates. ``None`` fields mean "the default for the
    cluster" (:func:`default_for`)."""

    replication_factor: int | None = None
    min_insync_replicas: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ReplicationSettings:
        """From ``FX_REPLICATION_FACTOR`` / ``FX_MIN_INSYNC_REPLICAS`` (unset: the defaults)."""
        env = os.environ if env is None else env
        return cls(_env_int(env, REPLICATION_FACTOR_ENV), _env_int(env, MIN_ISR_ENV))

    def resolve(self, brokers: int) -> tuple[int, int]:
        """The ``(replication factor, min.insync.replicas)`` to create topics with on a cluster
        of ``brokers``; :class:`ReplicationConfigError` for settings that cannot work there."""
        factor, min_isr = default_for(brokers)
        if self.replication_factor is not None:
            factor = self.replication_factor
            if self.min_insync_replicas is None:
                min_isr = 2 if factor >= 3 else 1
        if self.min_insync_replicas is not None:
            min_isr = self.min_insync_replicas
        if factor > brokers:
            raise ReplicationConfigError(
                f"replication factor {factor} ({REPLICATION_FACTOR_ENV}) is more than the "
                f"{brokers} broker(s) of the cluster")
        if min_isr > factor:
            raise ReplicationConfigError(
                f"min.insync.replicas {min_isr} ({MIN_ISR_ENV}) is more than the replication "
                f"factor {factor}: every acks=all write would fail")
        return factor, min_isr

    def topic_configs(self, brokers: int) -> dict[str, str]:
        """The replication-related topic configs for a cluster of ``brokers``."""
        _, min_isr = self.resolve(brokers)
        return {"min.insync.replicas": str(min_isr), "unclean.leader.election.enable": "false"}
