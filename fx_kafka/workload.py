"""Topic set-up for workloads and the system topics, with the configs the design relies on."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from broker_schema import topics
from fx_kafka.client import create_topics
from fx_kafka.errors import TopicConfigError

#: Per-workload topics use the broker's append time as the record timestamp: deadlines, timeouts
#: and `--at TIME` look-ups are judged against it, never against a producer's clock.
WORKLOAD_TOPIC_CONFIGS = {"message.timestamp.type": "LogAppendTime"}


async def ensure_workload_topics(bootstrap: str, workload_id: str) -> list[str]:
    """Create ``wl.<id>.in/.spec/.claims/.out/.resp/.merge`` (one partition each, append-time
    timestamps) if they do not exist yet; return their names."""
    names = topics.all_topics(workload_id)
    await create_topics(bootstrap, names, partitions=1, configs=WORKLOAD_TOPIC_CONFIGS)
    await check_workload_topics(bootstrap, workload_id)
    return names


async def topic_configs(bootstrap: str, names: list[str]) -> dict[str, dict[str, str]]:
    """The effective configs of ``names`` (``{topic: {key: value}}``), by DescribeConfigs."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name, None) for name in names])
    finally:
        await admin.close()
    out: dict[str, dict[str, str]] = {}
    for response in responses:
        for error_code, message, _type, name, entries in response.resources:
            if error_code:
                raise TopicConfigError(f"describing topic {name!r}: error {error_code} {message}")
            out[name] = {entry[0]: entry[1] for entry in entries}
    return out


async def check_workload_topics(bootstrap: str, workload_id: str) -> None:
    """Raise :class:`TopicConfigError` if a workload topic does not use the broker's append
    time (a topic auto-created by a producer's first write on a broker whose default is
    ``CreateTime``): deadlines would then be judged on producer clocks."""
    configs = await topic_configs(bootstrap, topics.all_topics(workload_id))
    wrong = sorted(name for name, cfg in configs.items()
                   if cfg.get("message.timestamp.type") != "LogAppendTime")
    if wrong:
        raise TopicConfigError(
            f"{', '.join(wrong)}: message.timestamp.type is not LogAppendTime, so record times "
            "would be producer clocks; fix with `kafka-configs --alter --entity-type topics "
            "--entity-name TOPIC --add-config message.timestamp.type=LogAppendTime`, or set the "
            "broker default log.message.timestamp.type=LogAppendTime")


async def ensure_system_topics(bootstrap: str) -> None:
    """Create ``sys.facts`` and ``sys.chunks`` (compacted) and ``sys.rejects`` if missing."""
    await create_topics(bootstrap, [topics.FACTS, topics.CHUNKS], compacted=True)
    await create_topics(bootstrap, [topics.REJECTS])
