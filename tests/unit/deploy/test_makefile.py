"""The Makefile's broker and image plumbing (issue 27): FX_KAFKA_BOOTSTRAP makes `make test`
and `make demo` skip fetching Kafka; `make images` builds the cpu target on the local Debian base
and the stack's Kafka and Prometheus images; system-deps installs what the deploy tests need."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.unit.deploy.helpers import DEPLOY, ROOT, need_tool


def _dry(target: str, **env: str) -> str:
    make = need_tool("make", "Debian package make")
    done = subprocess.run([make, "-n", target], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("target", ["test", "demo", "test-integration", "test-deploy"])
def test_a_given_broker_skips_the_kafka_fetch(target: str) -> None:
    assert "fetch.sh" not in _dry(target, FX_KAFKA_BOOTSTRAP="127.0.0.1:9092")
    assert "deploy/local-kafka/fetch.sh --mirror" in _dry(target, FX_KAFKA_BOOTSTRAP="")


def test_images() -> None:
    plan = _dry("images", FX_KAFKA_BOOTSTRAP="")
    assert "deploy/docker/base-image.sh fx-debian-base:bookworm" in plan
    assert "--network host" in plan
    assert "--build-arg PYTHON_IMAGE=fx-debian-base:bookworm --target cpu" in plan
    assert "deploy/docker/extra-images.sh fx-debian-base:bookworm ninelives-fx" in plan
    plan = _dry("images", BASE_IMAGE="python:3.11-slim-bookworm", FX_KAFKA_BOOTSTRAP="")
    assert "--build-arg PYTHON_IMAGE=python:3.11-slim-bookworm --target cpu" in plan


def test_system_deps_install_the_engine_and_debootstrap() -> None:
    script = (DEPLOY / "system-packages.sh").read_text()
    pkgs = next(ln for ln in script.splitlines() if ln.startswith("pkgs=("))
    assert "docker.io" in pkgs and "debootstrap" in pkgs and "docker-compose" in pkgs
