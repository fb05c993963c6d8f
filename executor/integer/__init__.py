"""The integer engine: SmolLM2-135M in integer fixed point, byte-identical on every backend.

Importable without the executor service (numpy and cryptography only; gguf only to import a
model; cupy only for the GPU backend).
"""

from .artifact import Artifact, ArtifactError, load
from .engine import ENGINE_NAME, ENGINE_VERSION, KIND, IntegerEngine, ParamError
from .oracle import FixedPointOverflow
from .receipt import ReceiptSigner, VerifyResult, verify, verify_chain

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
