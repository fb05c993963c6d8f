"""The integer engine: SmolLM2-135M in integer fixed point, byte-identical on every backend.

A package of its own, for the executor, the workload SDK and third-party verifiers alike: it
imports no service (``executor``, ``workload_sdk``, ``fx_kafka``, ``fx_cli``). Loading,
tokenizing and running the model need numpy alone; signing and verifying receipts also use the
wire contract (:mod:`broker_schema`, for its one signature check), imported only when used.

The public API (``docs/integer-engine.md``, "Using the engine from your own code")::

    import fx_integer as fi

    art = fi.load_artifact(path)                    # or fi.load_by_hash(model_hash, store_dir)
    ids = fi.tokenize(art, "The capital of France is")
    logits = fi.teacher_forced_logits(art, ids)     # int64 [len(ids), vocab], Q.16
    real = logits / fi.Q16_SCALE                    # what the integers stand for
    out = fi.generate(art, "The capital of France is", max_tokens=8)
    out.output_tokens, out.text, out.logits_digest

* ``Q16_FRAC_BITS`` (16), ``Q16_SCALE`` (``1 << 16``): the fixed-point format of activations
  and logits (an integer ``v`` holds ``v / Q16_SCALE``).
* ``load_artifact(path, *, expected_hash=None) -> Artifact``,
  ``load_by_hash(model_hash, store_dir) -> Artifact``: a hash-checked artifact.
* ``tokenize(art, text, *, chat=False) -> list[int]``, ``detokenize(art, ids) -> str``,
  ``Tokenizer`` (``Tokenizer(art.tokenizer)``).
* ``teacher_forced_logits(art, token_ids, *, backend="oracle") -> int64 array``.
* ``generate(art, prompt, *, max_tokens=64, chat=False, temperature=0, seed=0, top_k=0, top_p=1,
  stop_at_eos=True, backend="oracle") -> Generation``.
* ``engine_for(art, *, backend="oracle") -> IntegerEngine``; ``IntegerEngine`` itself (requests
  as the executor runs them, signed receipts with a ``ReceiptSigner``).
* ``verify(receipt, ...) -> VerifyResult``, ``verify_chain``, ``check_record``: receipts.
* ``ArtifactError``, ``ParamError``, ``FixedPointOverflow``; ``ENGINE_NAME``,
  ``ENGINE_VERSION``, ``KIND``.

Importing this package loads nothing beyond the standard library: each public name is imported
on first use, so a GPU check that needs only numpy, CuPy and the engine's modules (``artifact``,
``oracle``, ``cupy_backend``...) runs where ``cryptography`` (receipts) or ``gguf`` (model import)
is not installed. No public name is also the name of a submodule (importing the submodule would
replace it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._api import (
        Q16_FRAC_BITS,
        Q16_SCALE,
        Generation,
        detokenize,
        engine_for,
        generate,
        load_artifact,
        load_by_hash,
        teacher_forced_logits,
        tokenize,
    )
    from .artifact import Artifact, ArtifactError
    from .engine import ENGINE_NAME, ENGINE_VERSION, KIND, IntegerEngine, ParamError
    from .oracle import FixedPointOverflow
    from .receipt import ReceiptSigner
    from .tokenizer import Tokenizer, tokenizer_for
    from .tokenizer_spm import SpmTokenizer
    from .verifier import VerifyResult, check_record, verify, verify_chain

#: public name -> the submodule that defines it
_LAZY = {
    "Q16_FRAC_BITS": "._api",
    "Q16_SCALE": "._api",
    "Generation": "._api",
    "detokenize": "._api",
    "engine_for": "._api",
    "generate": "._api",
    "load_artifact": "._api",
    "load_by_hash": "._api",
    "teacher_forced_logits": "._api",
    "tokenize": "._api",
    "Artifact": ".artifact",
    "ArtifactError": ".artifact",
    "ENGINE_NAME": ".engine",
    "ENGINE_VERSION": ".engine",
    "KIND": ".engine",
    "IntegerEngine": ".engine",
    "ParamError": ".engine",
    "FixedPointOverflow": ".oracle",
    "ReceiptSigner": ".receipt",
    "Tokenizer": ".tokenizer",
    "tokenizer_for": ".tokenizer",
    "SpmTokenizer": ".tokenizer_spm",
    "VerifyResult": ".verifier",
    "check_record": ".verifier",
    "verify": ".verifier",
    "verify_chain": ".verifier",
}

__all__ = [
    "ENGINE_NAME",
    "ENGINE_VERSION",
    "KIND",
    "Q16_FRAC_BITS",
    "Q16_SCALE",
    "Artifact",
    "ArtifactError",
    "FixedPointOverflow",
    "Generation",
    "IntegerEngine",
    "ParamError",
    "ReceiptSigner",
    "SpmTokenizer",
    "Tokenizer",
    "VerifyResult",
    "check_record",
    "detokenize",
    "engine_for",
    "generate",
    "load_artifact",
    "load_by_hash",
    "teacher_forced_logits",
    "tokenize",
    "tokenizer_for",
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


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
