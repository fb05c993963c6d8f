"""Fixtures for executor unit tests: a model store holding the real magika and silero-vad."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from executor.models import ModelManifest, ModelStore


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    """A store with magika and silero-vad imported from their wheels."""
    store = ModelStore(tmp_path_factory.mktemp("models"))
    store.import_package("magika")
    store.import_package("silero-vad")
    return store


@pytest.fixture(scope="session")
def magika(model_store: ModelStore) -> ModelManifest:
    """The magika manifest."""
    return next(m for m in model_store.list() if m.interface == "magika")


@pytest.fixture(scope="session")
def silero(model_store: ModelStore) -> ModelManifest:
    """The silero-vad manifest."""
    return next(m for m in model_store.list() if m.interface == "silero-vad")


@pytest.fixture(scope="session")
def onnx_engine(model_store: ModelStore, magika: ModelManifest,
                silero: ModelManifest) -> Iterator[object]:
    """An ONNX engine with both models loaded."""
    from executor.engines.onnx import OnnxEngine

    engine = OnnxEngine()
    for m in (magika, silero):
        engine.load(m, model_store.read_verified(m.hash))
    yield engine


@pytest.fixture
def fresh_store(tmp_path: Path) -> ModelStore:
    """An empty store per test."""
    return ModelStore(tmp_path / "store")
