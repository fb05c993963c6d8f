"""Describing a topic's configs right after (here: before) it exists, on a real broker: the
describe is asked again with backoff until the broker knows the topic (the flake seen on a
young broker in bench/executor_throughput.py), and gives up with a clear error when it never
appears."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from fx_kafka.client import create_topics
from fx_kafka.errors import TopicConfigError
from fx_kafka.workload import WORKLOAD_TOPIC_CONFIGS, topic_configs


async def test_a_topic_created_while_it_is_described_is_found(kafka_bootstrap: str) -> None:
    name = f"wl.describe-{uuid.uuid4().hex[:10]}.out"
    describing = asyncio.create_task(topic_configs(kafka_bootstrap, [name], settle_s=60.0))
    await asyncio.sleep(1.0)  # the describe has been answered "unknown topic" by now
    assert not describing.done()
    await create_topics(kafka_bootstrap, [name], configs=WORKLOAD_TOPIC_CONFIGS)
    configs = await asyncio.wait_for(describing, 60.0)
    assert configs[name]["message.timestamp.type"] == "LogAppendTime"


async def test_a_topic_that_never_appears_is_a_topic_config_error(kafka_bootstrap: str) -> None:
    name = f"wl.never-{uuid.uuid4().hex[:10]}.out"
    with pytest.raises(TopicConfigError, match=r"unknown topic.*still after 1\.0 s"):
        await topic_configs(kafka_bootstrap, [name], settle_s=1.0)
