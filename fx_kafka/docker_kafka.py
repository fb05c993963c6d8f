"""Apache Kafka in a container of the image built from the Maven-fetched jars
(deploy/docker/kafka, ``make images``), for tests on a machine with a Docker engine and no Java.

Plain ``docker run --network host`` on two free ports of the host, not testcontainers: its
containers publish ports through a bridge network (``get_exposed_port``) and it starts a Ryuk
reaper container pulled from Docker Hub; an engine without bridge networking or without hub access
(``dockerd --bridge=none``) has neither. The container is removed (with its volume) on leaving.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from fx_kafka._sync import run_sync
from fx_kafka.client import wait_ready
from fx_kafka.errors import BrokerNotReadyError
from fx_kafka.local import DEFAULT_KAFKA_VERSION

__all__ = ["IMAGE_ENV", "default_image", "docker_client", "docker_kafka", "image_present"]

log = logging.getLogger(__name__)

#: the Kafka image to run; default ``ninelives-fx-kafka:<the pom's Kafka version>``
IMAGE_ENV = "FX_KAFKA_IMAGE"


def default_image() -> str:
    """``FX_KAFKA_IMAGE``, else the tag ``make images`` gives the Kafka image."""
    return os.environ.get(IMAGE_ENV) or f"ninelives-fx-kafka:{DEFAULT_KAFKA_VERSION}"


def docker_client() -> str | None:
    """The Docker client: ``FX_DOCKER``, else Debian's ``/usr/bin/docker``, else ``docker``."""
    given = os.environ.get("FX_DOCKER")
    if given:
        return shutil.which(given)
    if Path("/usr/bin/docker").exists():
        return "/usr/bin/docker"
    return shutil.which("docker")


def image_present(docker: str, image: str) -> bool:
    """Whether an engine answers and holds ``image``."""
    try:
        done = subprocess.run([docker, "image", "inspect", image], capture_output=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _logs(docker: str, name: str) -> str:
    done = subprocess.run([docker, "logs", "--tail", "30", name], capture_output=True, text=True,
                          check=False, timeout=30)
    return (done.stdout + done.stderr)[-3000:]


@contextlib.contextmanager
def docker_kafka(docker: str, image: str, *, start_timeout: float = 120.0,
                 name: str | None = None) -> Iterator[str]:
    """Run ``image`` on the host network (container ``name``, default ``fx-test-kafka-<hex>``);
    yield its bootstrap address once it answers."""
    port, controller = _free_port(), _free_port()
    name = name or f"fx-test-kafka-{uuid.uuid4().hex[:8]}"
    subprocess.run([docker, "run", "-d", "--name", name, "--network", "host",
                    "-e", f"KAFKA_PORT={port}", "-e", f"KAFKA_CONTROLLER_PORT={controller}",
                    image], check=True, capture_output=True, timeout=120)
    bootstrap = f"127.0.0.1:{port}"
    t0 = time.monotonic()
    try:
        try:
            run_sync(lambda: wait_ready(bootstrap, start_timeout))
        except BrokerNotReadyError as exc:
            raise BrokerNotReadyError(f"{image} ({name}) did not answer: {exc}\n"
                                      f"{_logs(docker, name)}") from exc
        log.info("test broker: %s in container %s at %s (ready in %.1f s)", image, name,
                 bootstrap, time.monotonic() - t0)
        yield bootstrap
    finally:
        subprocess.run([docker, "rm", "-f", "-v", name], capture_output=True, check=False,
                       timeout=120)
