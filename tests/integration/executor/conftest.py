"""Fixtures for executor integration tests: a model store with the real models, per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from executor.models import ModelStore


@pytest.fixture(scope="session")
def base_store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    """magika and silero-vad imported once per session."""
    store = ModelStore(tmp_path_factory.mktemp("models"))
    store.import_package("magika")
    store.import_package("silero-vad")
    return store


@pytest.fixture
def store(base_store: ModelStore, tmp_path: Path) -> ModelStore:
    """A private copy of the store (tests may tamper with it)."""
    root = tmp_path / "models"
    shutil.copytree(base_store.root, root)
    for p in (root / "sha256").iterdir():
        p.chmod(0o644 if p.suffix == ".json" else 0o444)
    return ModelStore(root)


@pytest.fixture
def magika_hash(store: ModelStore) -> str:
    """The magika model's hash."""
    return next(m.hash for m in store.list() if m.interface == "magika")


@pytest.fixture
def silero_hash(store: ModelStore) -> str:
    """The silero-vad model's hash."""
    return next(m.hash for m in store.list() if m.interface == "silero-vad")

