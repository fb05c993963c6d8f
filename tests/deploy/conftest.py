"""The deploy tests: real images, a real compose stack, real systemd, on a real Docker engine.

The engine is started here when none answers (deploy/docker/engine.sh, no bridge network, every
container on the host network) and stopped after when this session started it. Without an engine
the tests skip, except under ``CI=true``, where they fail: CI must run them.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the local Debian base every image here is built on (deploy/docker/base-image.sh)
BASE_IMAGE = os.environ.get("FX_BASE_IMAGE", "fx-debian-base:bookworm")


def _docker() -> str | None:
    return shutil.which("docker")


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"deploy tests under CI=true need a Docker engine: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[str]:
    """The docker client's path, with an engine answering (started for the session if needed)."""
    docker = _docker()
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
    env = {**os.environ, "DOCKER": docker_engine}
    run = subprocess.run(["bash", str(ROOT / "deploy/docker/base-image.sh"), BASE_IMAGE],
                         capture_output=True, text=True, env=env)
    if run.returncode != 0:
        _unavailable(f"the Debian base image could not be made: {run.stderr.strip()[-800:]}")
    return BASE_IMAGE
