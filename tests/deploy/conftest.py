"""The deploy tests: real images, a real compose stack, real systemd, on a real Docker engine.

The engine is started here when none answers (deploy/docker/engine.sh, no bridge network, every
container on the host network) and stopped after when this session started it. Without an engine
the tests skip, except under ``CI=true``, where they fail: CI must run them.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fx_kafka.docker_kafka import docker_client
from tests.deploy import images

ROOT = Path(__file__).resolve().parents[2]
#: the local Debian base every image here is built on (deploy/docker/base-image.sh)
BASE_IMAGE = os.environ.get("FX_BASE_IMAGE", "fx-debian-base:bookworm")


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"deploy tests under CI=true need a Docker engine: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[str]:
    """The docker client's path, with an engine answering (started for the session if needed)."""
    docker = docker_client()
    if docker is None:
        _unavailable("no docker client on PATH (make system-deps installs docker.io)")
        raise AssertionError  # unreachable
    run = subprocess.run(["bash", str(ROOT / "deploy/docker/engine.sh")], capture_output=True,
                         text=True, env={**os.environ, "DOCKER": docker})
    if run.returncode != 0:
        _unavailable(f"the engine could not start: {run.stderr.strip()[-800:]}")
    started = run.stdout.strip() == "started"
    yield docker
    if started:
        subprocess.run(["bash", str(ROOT / "deploy/docker/engine.sh"), "--stop"], check=False)


@pytest.fixture(scope="session")
def debian_base(docker_engine: str) -> str:
    """The tag of the local Debian base image, made with debootstrap when absent."""
    run = subprocess.run(["bash", str(ROOT / "deploy/docker/base-image.sh"), BASE_IMAGE],
                         capture_output=True, text=True,
                         env={**os.environ, "DOCKER": docker_engine})
    if run.returncode != 0:
        _unavailable(f"the Debian base image could not be made: {run.stderr.strip()[-800:]}")
    return BASE_IMAGE


@pytest.fixture(scope="session")
def cpu_image(docker_engine: str, debian_base: str) -> str:
    """The project's ``cpu`` image on the local base (built, or found in the build cache)."""
    built = images.build_cpu(docker_engine, debian_base)
    print(f"cpu image {built.tag}: {built.seconds:.1f} s")
    return built.tag


@pytest.fixture(scope="session")
def kafka_image(docker_engine: str, debian_base: str) -> str:
    """The Apache Kafka image (deploy/docker/kafka) on the local base."""
    built = images.build_extra(docker_engine, debian_base, "kafka")
    print(f"kafka image {built.tag}: {built.seconds:.1f} s")
    return built.tag


@pytest.fixture(scope="session")
def prometheus_image(docker_engine: str, debian_base: str) -> str:
    """The Prometheus image (deploy/docker/prometheus, Debian's package) on the local base."""
    built = images.build_extra(docker_engine, debian_base, "prometheus")
    print(f"prometheus image {built.tag}: {built.seconds:.1f} s")
    return built.tag
