"""Small aiokafka helpers every part of the project uses: topics, producers, consumers, readiness.

The producer and consumer factories must be called with an event loop running (aiokafka binds
each client to the running loop in its constructor).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from broker_schema.limits import BROKER_MESSAGE_MAX_BYTES
from fx_kafka.errors import BrokerNotReadyError
from fx_kafka.replication import ReplicationSettings

__all__ = [
    "FRAME_CAP_BYTES",
    "create_topics",
    "make_consumer",
    "make_producer",
    "wait_brokers",
    "wait_ready",
]

log = logging.getLogger(__name__)

#: The broker's message.max.bytes (deploy/local-kafka/server.properties.template): the schema's
#: MAX_RECORD_BYTES plus 64 KiB for key, headers and batch overhead.
FRAME_CAP_BYTES: int = BROKER_MESSAGE_MAX_BYTES


async def wait_ready(bootstrap: str, timeout: float = 30.0) -> None:
    """Return once ``bootstrap`` answers an admin call (list topics); else raise
    :class:`~fx_kafka.errors.BrokerNotReadyError` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: BaseException | None = None
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise BrokerNotReadyError(
                f"Kafka at {bootstrap} not ready after {timeout:.1f} s (last error: {last!r})"
            )
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap,
            request_timeout_ms=max(1000, int(min(remaining, 10.0) * 1000)),
        )
        try:
            await asyncio.wait_for(_list_topics(admin), timeout=remaining)
            return
        except (TimeoutError, KafkaError, OSError) as exc:
            last = exc
        finally:
            await admin.close()
        await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))


async def broker_count(bootstrap: str) -> int:
    """How many brokers the cluster at ``bootstrap`` has registered (from its metadata)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        return len(cluster["brokers"])
    finally:
        await admin.close()


async def wait_brokers(bootstrap: str, count: int, timeout: float = 60.0) -> None:
    """Return once the cluster at ``bootstrap`` has ``count`` brokers registered; else raise
    :class:`~fx_kafka.errors.BrokerNotReadyError` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    seen: int | None = None
    last: BaseException | None = None
    while loop.time() < deadline:
        try:
            seen = await asyncio.wait_for(broker_count(bootstrap),
                                          timeout=max(0.5, deadline - loop.time()))
            if seen >= count:
                return
        except (TimeoutError, KafkaError, OSError) as exc:
            last = exc
        await asyncio.sleep(0.2)
    raise BrokerNotReadyError(f"Kafka at {bootstrap}: {seen} of {count} brokers registered after "
                              f"{timeout:.1f} s (last error: {last!r})")


async def _list_topics(admin: AIOKafkaAdminClient) -> list[str]:
    await admin.start()
    topics: list[str] = await admin.list_topics()
    return topics


async def create_topics(
    bootstrap: str,
    names: Iterable[str],
    *,
    partitions: int = 1,
    compacted: bool = False,
    replication: ReplicationSettings | None = None,
    configs: dict[str, str] | None = None,
) -> None:
    """Create ``names`` (idempotent: a topic that already exists is left as it is).

    Replication follows ``replication`` (default: :meth:`ReplicationSettings.from_env`, resolved
    against the cluster's broker count: factor ``min(3, brokers)``, ``min.insync.replicas`` 2 from
    3 replicas on, no unclean leader election). ``compacted`` sets ``cleanup.policy=compact``;
    ``configs`` adds topic configs (and may override the replication ones). Any other per-topic
    error raises the matching aiokafka exception.
    """
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return
    settings = replication if replication is not None else ReplicationSettings.from_env()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        brokers = len((await admin.describe_cluster())["brokers"])
        replication_factor, _ = settings.resolve(brokers)
        topic_configs = settings.topic_configs(brokers) | dict(configs or {})
        if compacted:
            topic_configs["cleanup.policy"] = "compact"
        resp = await admin.create_topics(
            [
                NewTopic(
                    name=name,
                    num_partitions=partitions,
                    replication_factor=replication_factor,
                    topic_configs=topic_configs,
                )
                for name in wanted
            ]
        )
        for entry in resp.topic_errors:
            topic, code = entry[0], entry[1]
            if code == 0:
                continue
            error_cls = for_code(code)
            if error_cls is TopicAlreadyExistsError:
                log.debug("topic %s already exists", topic)
                continue
            message = entry[2] if len(entry) > 2 else ""
            raise error_cls(f"creating topic {topic!r}: {message}")
    finally:
        await admin.close()


def make_producer(
    bootstrap: str,
    *,
    enable_idempotence: bool = True,
    transactional_id: str | None = None,
    **kw: Any,
) -> AIOKafkaProducer:
    """An (unstarted) producer with the project's defaults: ``acks="all"``, idempotence on,
    ``max_request_size`` equal to the broker's frame cap. ``kw`` overrides any of them."""
    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "acks": "all",
        "enable_idempotence": enable_idempotence or transactional_id is not None,
        "max_request_size": FRAME_CAP_BYTES,
        "linger_ms": 0,
    }
    if transactional_id is not None:
        options["transactional_id"] = transactional_id
    options.update(kw)
    return AIOKafkaProducer(**options)


def make_consumer(
    bootstrap: str,
    *topics: str,
    group_id: str | None = None,
    isolation_level: str = "read_committed",
    auto_offset_reset: str = "earliest",
    enable_auto_commit: bool = False,
    **kw: Any,
) -> AIOKafkaConsumer:
    """An (unstarted) consumer with the project's defaults: ``read_committed``, from the earliest
    offset, no auto commit, fetch sizes that admit a record at the frame cap. ``kw`` overrides."""
    options: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "group_id": group_id,
        "isolation_level": isolation_level,
        "auto_offset_reset": auto_offset_reset,
        "enable_auto_commit": enable_auto_commit,
        "max_partition_fetch_bytes": FRAME_CAP_BYTES,
        "fetch_max_bytes": max(52_428_800, FRAME_CAP_BYTES),
    }
    options.update(kw)
    return AIOKafkaConsumer(*topics, **options)
