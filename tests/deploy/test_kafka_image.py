"""The tests' broker chooser's Docker path (issue 27, part 4): with no FX_KAFKA_BOOTSTRAP and the
local Apache Kafka skipped (``FX_TEST_BROKER=docker``), the chooser starts the Kafka image built
from the Maven-fetched jars (deploy/docker/kafka) on the host network, and two integration
modules run against it: the broker's guarantees (idempotence, transactions, fencing, the frame
cap) and the wire round trip (append time). The Redpanda path (testcontainers) needs an image hub
and is not run here."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from fx_kafka.docker_kafka import docker_kafka
from tests.deploy.images import CONTAINER_PREFIX, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.deploy]

MODULES = ["tests/integration/test_broker.py", "tests/integration/test_schema_roundtrip.py"]


def test_modules_run_against_the_kafka_image(docker_engine: str, kafka_image: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FX_KAFKA_BOOTSTRAP"}
    env.update({"FX_TEST_BROKER": "docker", "FX_KAFKA_IMAGE": kafka_image,
                "FX_DOCKER": docker_engine, "PYTHONPATH": str(ROOT)})
    done = subprocess.run([sys.executable, "-m", "pytest", *MODULES, "-q", "-p",
                           "no:cacheprovider", "-o", "log_cli=true", "-o", "log_cli_level=INFO"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert f"test broker: {kafka_image} in container" in out, out[-3000:]
    assert " passed" in out and " skipped" not in out.splitlines()[-1], out[-2000:]


def test_restart_keeps_what_was_written(docker_engine: str, kafka_image: str) -> None:
    """The container's storage is formatted once: a restarted broker keeps its cluster and logs."""
    from fx_kafka import run_sync
    from fx_kafka.client import create_topics, make_consumer, make_producer, wait_ready

    async def write(bootstrap: str, topic: str) -> None:
        await create_topics(bootstrap, [topic])
        producer = make_producer(bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"kept")
        finally:
            await producer.stop()

    async def read(bootstrap: str, topic: str) -> list[bytes]:
        from aiokafka import TopicPartition

        consumer = make_consumer(bootstrap)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            batch = await consumer.getmany(tp, timeout_ms=5000)
            return [m.value for m in batch.get(tp, [])]
        finally:
            await consumer.stop()

    name = f"{CONTAINER_PREFIX}-kafka-{uuid.uuid4().hex[:8]}"
    with docker_kafka(docker_engine, kafka_image, name=name) as bootstrap:
        run_sync(lambda: write(bootstrap, "fx-deploy-kept"))
        subprocess.run([docker_engine, "restart", name], check=True, capture_output=True,
                       timeout=120)
        run_sync(lambda: wait_ready(bootstrap, 90.0))
        assert run_sync(lambda: read(bootstrap, "fx-deploy-kept")) == [b"kept"]
    gone = subprocess.run([docker_engine, "ps", "-a", "-q", "--filter", f"name={name}"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert gone == [], "the broker's container is removed on leaving"
