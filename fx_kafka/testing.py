"""A Kafka broker for tests, chosen in a fixed order:

1. ``FX_KAFKA_BOOTSTRAP`` if set (it must answer; an unreachable one is an error, not a fallback);
2. the local Apache Kafka of :mod:`fx_kafka.local`, started for the session and stopped after;
3. with a Docker engine holding the Kafka image ``make images`` builds (``FX_KAFKA_IMAGE``,
   default ``ninelives-fx-kafka:<version>``), that image in a container on the host network
   (:mod:`fx_kafka.docker_kafka`; plain ``docker run``, see there why not testcontainers);
4. with a Docker engine that can pull images, Redpanda through testcontainers (the optional
   ``docker`` extra; not run on the machines this project is built on, which reach no hub).

``FX_TEST_BROKER=docker`` skips step 2 (the tests then run against the Kafka image).

If none can be had, :class:`~fx_kafka.errors.NoBrokerError` lists why each was not available.
A local broker that is available (Java and jars present) but fails to start raises
:class:`~fx_kafka.errors.BrokerStartError` instead: that is a bug to see, not a reason to fall back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from fx_kafka._sync import run_sync
from fx_kafka.client import wait_ready
from fx_kafka.docker_kafka import default_image, docker_client, docker_kafka, image_present
from fx_kafka.errors import BrokerNotReadyError, FetchError, JavaNotFoundError, NoBrokerError
from fx_kafka.local import LocalKafka

__all__ = [
    "BOOTSTRAP_ENV",
    "CHOICE_ENV",
    "REDPANDA_IMAGE",
    "broker_for_tests",
    "kafka_for_tests",
]

log = logging.getLogger(__name__)

BOOTSTRAP_ENV = "FX_KAFKA_BOOTSTRAP"
#: ``docker``: skip the local Apache Kafka (step 2), so the Kafka image serves the tests
CHOICE_ENV = "FX_TEST_BROKER"
#: Pinned: testcontainers' default Redpanda image is old.
REDPANDA_IMAGE = "docker.redpanda.com/redpandadata/redpanda:v24.2.7"
REDPANDA_START_TIMEOUT_S = 180


@contextlib.contextmanager
def _local_kafka(reasons: list[str], start_timeout: float) -> Iterator[str | None]:
    data_dir = Path(tempfile.mkdtemp(prefix="fx-kafka-test-"))
    # die_with_parent ties the broker to the starting thread: only safe from the main thread.
    in_main = threading.current_thread() is threading.main_thread()
    kafka = LocalKafka(data_dir=data_dir, die_with_parent=in_main)
    try:
        try:
            bootstrap = kafka.start(timeout=start_timeout)
        except (JavaNotFoundError, FetchError) as exc:
            reasons.append(f"local Apache Kafka: {exc}")
            yield None
            return
        log.info(
            "test broker: local Apache Kafka %s at %s (started in %.1f s)",
            kafka.version,
            bootstrap,
            kafka.last_start_seconds or 0.0,
        )
        try:
            yield bootstrap
        finally:
            kafka.stop()
    finally:
        if os.environ.get("FX_KEEP_TEST_BROKER_DIR"):
            log.info("kept test broker dir %s", data_dir)
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


@contextlib.contextmanager
def _kafka_image(reasons: list[str], start_timeout: float) -> Iterator[str | None]:
    docker = docker_client()
    image = default_image()
    if docker is None:
        reasons.append("Kafka image: no docker client")
        yield None
        return
    if not image_present(docker, image):
        reasons.append(f"Kafka image: no engine answers or it has no {image} (make images)")
        yield None
        return
    with docker_kafka(docker, image, start_timeout=start_timeout) as bootstrap:
        yield bootstrap


@contextlib.contextmanager
def _redpanda(reasons: list[str]) -> Iterator[str | None]:
    try:
        import docker
    except ImportError:
        reasons.append("Redpanda: the 'docker' extra (testcontainers[kafka]) is not installed")
        yield None
        return
    try:
        docker.from_env().ping()
    except Exception as exc:  # docker.errors.DockerException and whatever the transport raises
        reasons.append(f"Redpanda: no Docker engine answers ({exc.__class__.__name__}: {exc})")
        yield None
        return
    try:
        from testcontainers.community.kafka import RedpandaContainer
    except ImportError:
        try:  # testcontainers before the community.* namespace
            from testcontainers.kafka import RedpandaContainer
        except ImportError:
            reasons.append("Redpanda: testcontainers[kafka] (the 'docker' extra) is not installed")
            yield None
            return

    container: Any = RedpandaContainer(REDPANDA_IMAGE)
    _start_with_timeout(container, REDPANDA_START_TIMEOUT_S)
    try:
        bootstrap = str(container.get_bootstrap_server())
        log.info("test broker: Redpanda %s at %s", REDPANDA_IMAGE, bootstrap)
        yield bootstrap
    finally:
        container.stop()


def _start_with_timeout(container: Any, timeout: int) -> None:
    # testcontainers' wait timeout is global config; in 4.x ``timeout`` is computed as
    # max_tries * sleep_time, so raise max_tries for this start (a cold image pull) and restore it.
    try:
        from testcontainers.core.config import testcontainers_config as config
    except ImportError:
        container.start()
        return
    original = getattr(config, "max_tries", None)
    sleep_time = float(getattr(config, "sleep_time", 1) or 1)
    if original is not None:
        config.max_tries = max(int(original), int(timeout / sleep_time) + 1)
    try:
        container.start()
    finally:
        if original is not None:
            config.max_tries = original


@contextlib.contextmanager
def kafka_for_tests(*, start_timeout: float = 120.0) -> Iterator[str]:
    """Yield a bootstrap address of a ready broker (see the module docstring for the order).

    Raises NoBrokerError when no way works, BrokerNotReadyError when FX_KAFKA_BOOTSTRAP does not
    answer, BrokerStartError when the local broker fails to start.
    """
    given = os.environ.get(BOOTSTRAP_ENV)
    if given:
        try:
            run_sync(lambda: wait_ready(given, 30.0))
        except BrokerNotReadyError as exc:
            raise BrokerNotReadyError(f"{BOOTSTRAP_ENV}={given} does not answer: {exc}") from exc
        log.info("test broker: %s=%s", BOOTSTRAP_ENV, given)
        yield given
        return

    reasons: list[str] = [f"{BOOTSTRAP_ENV} is not set"]
    if os.environ.get(CHOICE_ENV, "").strip().lower() == "docker":
        reasons.append(f"local Apache Kafka: skipped ({CHOICE_ENV}=docker)")
    else:
        with _local_kafka(reasons, start_timeout) as bootstrap:
            if bootstrap is not None:
                yield bootstrap
                return
    with _kafka_image(reasons, start_timeout) as bootstrap:
        if bootstrap is not None:
            yield bootstrap
            return
    with _redpanda(reasons) as bootstrap:
        if bootstrap is not None:
            yield bootstrap
            return
    raise NoBrokerError(reasons)


@contextlib.asynccontextmanager
async def broker_for_tests(*, start_timeout: float = 120.0) -> AsyncIterator[str]:
    """:func:`kafka_for_tests` for async callers (setup and teardown run in a worker thread)."""
    cm = kafka_for_tests(start_timeout=start_timeout)
    bootstrap = await asyncio.to_thread(cm.__enter__)
    try:
        yield bootstrap
    except BaseException as exc:
        if not await asyncio.to_thread(cm.__exit__, type(exc), exc, exc.__traceback__):
            raise
    else:
        await asyncio.to_thread(cm.__exit__, None, None, None)
