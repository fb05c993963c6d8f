"""The integer engine: SmolLM2-135M in integer fixed point, byte-identical on every backend.

Importable without the executor service. Importing this package loads nothing beyond the
standard library: its public names are imported on first use, so a GPU check that needs only
numpy, CuPy and the engine's modules (``artifact``, ``oracle``, ``cupy_backend``...) runs where
``cryptography`` (receipts) or ``gguf`` (model import) is not installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .artifact import Artifact, ArtifactError, load
    from .engine import ENGINE_NAME, ENGINE_VERSION, KIND, IntegerEngine, ParamError
    from .oracle import FixedPointOverflow
    from .receipt import ReceiptSigner
    from .verifier import VerifyResult, verify, verify_chain

#: public name -> the submodule that defines it
_LAZY = {
    "Artifact": ".artifact",
    "ArtifactError": ".artifact",
    "load": ".artifact",
    "ENGINE_NAME": ".engine",
    "ENGINE_VERSION": ".engine",
    "KIND": ".engine",
    "IntegerEngine": ".engine",
    "ParamError": ".engine",
    "FixedPointOverflow": ".oracle",
    "ReceiptSigner": ".receipt",
    "VerifyResult": ".verifier",
    "verify": ".verifier",
    "verify_chain": ".verifier",
}

__all__ = [
    "ENGINE_NAME",
    "ENGINE_VERSION",
    "KIND",
    "Artifact",
    "ArtifactError",
    "FixedPointOverflow",
    "IntegerEngine",
    "ParamError",
    "ReceiptSigner",
    "VerifyResult",
    "load",
    "verify",
    "verify_chain",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
