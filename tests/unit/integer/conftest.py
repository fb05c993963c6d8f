"""Fixtures for the integer engine tests: a small synthetic artifact and the real model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fx_integer import artifact
from fx_integer.oracle import OracleOps
from tests.unit.integer.real_model import real_artifact


@pytest.fixture(scope="session")
def synth_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("synth") / "synthetic.nlfxint"
    artifact.write(p, artifact.synthetic(seed=7))
    return p


@pytest.fixture(scope="session")
def synth(synth_path: Path) -> artifact.Artifact:
    return artifact.load(synth_path)


@pytest.fixture(scope="session")
def synth_oracle(synth: artifact.Artifact) -> OracleOps:
    return OracleOps(synth)


@pytest.fixture(scope="session")
def real_path() -> Path:
    return real_artifact()


@pytest.fixture(scope="session")
def real(real_path: Path) -> artifact.Artifact:
    return artifact.load(real_path)


@pytest.fixture(scope="session")
def real_oracle(real: artifact.Artifact) -> Iterator[OracleOps]:
    yield OracleOps(real)
