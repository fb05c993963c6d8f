"""The images the deploy tests run, built on the local Debian base (deploy/docker): the project's
``cpu`` target, and the Apache Kafka and Prometheus images of the host-network compose stack.

Builds go through BuildKit, whose cache lives in the engine: a second session rebuilds nothing
that did not change (seconds); a clean machine builds once (docs/operations.md, "Images", gives
the times). Tags start with ``FX_TEST_IMAGE_PREFIX`` (default ``ninelives-fx-test``), so the tests
never replace an image a user built with ``make images``.
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PREFIX = os.environ.get("FX_TEST_IMAGE_PREFIX", "ninelives-fx-test")
#: the names of the containers (and the compose project) the tests start
CONTAINER_PREFIX = os.environ.get("FX_TEST_CONTAINER_PREFIX", "fx-test")
#: each build's bound: a clean machine downloads the wheels and Debian packages once
BUILD_TIMEOUT_S = 1500


def ca_bundle() -> str | None:
    """A CA bundle for HTTPS inside the build (a machine behind an intercepting proxy), passed as
    the build secret ``ca``: FX_BUILD_CA_BUNDLE, else PIP_CERT, else SSL_CERT_FILE, if it exists."""
    for name in ("FX_BUILD_CA_BUNDLE", "PIP_CERT", "SSL_CERT_FILE"):
        path = os.environ.get(name)
        if path and Path(path).is_file():
            return path
    return None


@dataclass(frozen=True)
class Built:
    """An image tag and the seconds its build took (cache hits included)."""

    tag: str
    seconds: float


def _env(docker: str) -> dict[str, str]:
    return {**os.environ, "DOCKER_BUILDKIT": "1", "DOCKER": docker}


def build_cpu(docker: str, base: str) -> Built:
    """The Dockerfile's ``cpu`` target on ``base`` (the local Debian base), as ``make images``."""
    tag = f"{PREFIX}:cpu"
    cmd = [docker, "build", "--network", "host", "--build-arg", f"PYTHON_IMAGE={base}",
           "--target", "cpu", "-t", tag]
    bundle = ca_bundle()
    if bundle:
        cmd += ["--secret", f"id=ca,src={bundle}"]
    t0 = time.monotonic()
    done = subprocess.run([*cmd, str(ROOT)], capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, env=_env(docker), check=False)
    if done.returncode != 0:
        raise AssertionError(f"docker build --target cpu failed:\n{done.stderr[-4000:]}")
    return Built(tag, time.monotonic() - t0)


def build_extra(docker: str, base: str, which: str) -> Built:
    """``kafka`` or ``prometheus`` (deploy/docker/extra-images.sh) on ``base``."""
    t0 = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "deploy/docker/extra-images.sh"), base,
                           PREFIX, which], capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, env=_env(docker), check=False)
    if done.returncode != 0:
        raise AssertionError(f"extra-images.sh {which} failed:\n{done.stderr[-4000:]}")
    return Built(done.stdout.strip().splitlines()[-1], time.monotonic() - t0)


def remove_containers(docker: str, *names: str) -> None:
    """``docker rm -f`` each of ``names`` (with their anonymous volumes); absent ones are fine."""
    if names:
        subprocess.run([docker, "rm", "-f", "-v", *names], capture_output=True, check=False,
                       timeout=120)
