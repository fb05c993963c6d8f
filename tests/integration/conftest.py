"""Fixtures shared by the integration tests."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from workload_sdk.testing import executor_available, fx_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def magika_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A model store with magika imported from its PyPI package, and magika's model hash."""
    if not executor_available():
        # the executor is part of this project: in CI its absence is a failure, never a skip
        message = "`fx executor run --help` does not work here: the executor is not installed"
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(message)
        pytest.skip(message)
    store = tmp_path_factory.mktemp("models")
    subprocess.run([*fx_command(), "models", "import", "magika", "--store", str(store)],
                   check=True, capture_output=True, timeout=300, cwd=ROOT)
    listed = subprocess.run([*fx_command(), "models", "list", "--store", str(store), "--json"],
                            check=True, capture_output=True, timeout=120, cwd=ROOT)
    (model,) = [m for m in json.loads(listed.stdout) if m["interface"] == "magika"]
    return store, str(model["hash"])
