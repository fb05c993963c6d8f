"""Fixtures shared by the integration tests."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.harness import ExecutorHarness
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


@pytest.fixture
def executor_harness(tmp_path: Path) -> Callable[..., ExecutorHarness]:
    """Make an :class:`~tests.integration.harness.ExecutorHarness` working in ``tmp_path``:
    ``async with executor_harness(bootstrap, workload_id, model_dir, models={...}) as h:``,
    then ``executor, holder = h.start_nodes("holder-id")`` (or start them one by one). The
    executor's config is ``tmp_path / "executor.json"``; ``executor={...}`` overrides settings
    of it; the processes are stopped when the block ends."""
    return functools.partial(ExecutorHarness, work=tmp_path)


#: The second magika model: standard_v3_2 from the magika 0.6.1 wheel that `make install`
#: downloads (never installs) into the virtual environment.
MAGIKA_WHEEL_GLOB = "magika-0.6.1-*.whl"


@pytest.fixture(scope="session")
def magika_pair_store(magika_store: tuple[Path, str],
                      tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A model store of its own with magika 0.6.1's ``standard_v3_2`` imported beside the
    installed ``standard_v3_3``: ``(store, v3_3 hash, v3_2 hash)``. Two real models that decide
    differently on some files (docs/model-changes.md, "A real case")."""
    import sys

    _, v33 = magika_store
    wheels = sorted((Path(sys.prefix) / "model-wheels").glob(MAGIKA_WHEEL_GLOB))
    if not wheels:
        pytest.fail(f"no {MAGIKA_WHEEL_GLOB} under {Path(sys.prefix) / 'model-wheels'}: "
                    "`make install` downloads it (pip download --no-deps magika==0.6.1)")
    store = tmp_path_factory.mktemp("models-pair")
    for source in ("magika", str(wheels[0])):
        subprocess.run([*fx_command(), "models", "import", source, "--store", str(store)],
                       check=True, capture_output=True, timeout=300, cwd=ROOT)
    listed = subprocess.run([*fx_command(), "models", "list", "--store", str(store), "--json"],
                            check=True, capture_output=True, timeout=120, cwd=ROOT)
    names = {m["name"]: m["hash"] for m in json.loads(listed.stdout)}
    assert names["magika-standard_v3_3"] == v33, names
    return store, v33, str(names["magika-standard_v3_2"])
