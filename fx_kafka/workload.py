"""Topic set-up for workloads and the system topics, with the configs the design relies on."""

from __future__ import annotations

from broker_schema import topics
from fx_kafka.client import create_topics

#: Per-workload topics use the broker's append time as the record timestamp: deadlines, timeouts
#: and `--at TIME` look-ups are judged against it, never against a producer's clock.
WORKLOAD_TOPIC_CONFIGS = {"message.timestamp.type": "LogAppendTime"}


async def ensure_workload_topics(bootstrap: str, workload_id: str) -> list[str]:
    """Create ``wl.<id>.in/.spec/.claims/.out/.resp/.merge`` (one partition each, append-time
    timestamps) if they do not exist yet; return their names."""
    names = topics.all_topics(workload_id)
    await create_topics(bootstrap, names, partitions=1, configs=WORKLOAD_TOPIC_CONFIGS)
    return names


async def ensure_system_topics(bootstrap: str) -> None:
    """Create ``sys.facts`` and ``sys.chunks`` (compacted) and ``sys.rejects`` if missing."""
    await create_topics(bootstrap, [topics.FACTS, topics.CHUNKS], compacted=True)
    await create_topics(bootstrap, [topics.REJECTS])
