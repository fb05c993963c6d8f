"""The public functions of :mod:`fx_integer` (re-exported there; see its docstring).

Thin wrappers over the engine's modules: every number they return comes from the same code the
executor runs (:class:`~fx_integer.engine.IntegerEngine`), so nothing here is a second
implementation. numpy is the only third-party import on this path.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from . import artifact, fixed_point
from .artifact import Artifact, ArtifactError
from .engine import IntegerEngine, ParamError
from .tokenizer import AnyTokenizer, tokenizer_for

#: Bits after the binary point of the engine's activations and logits: an integer ``v`` holds
#: the value ``v / 2**16``.
Q16_FRAC_BITS: Final[int] = fixed_point.ACT_FRAC
#: ``1.0`` in Q.16 (65536): divide a logit by it for the real value it stands for.
Q16_SCALE: Final[int] = 1 << Q16_FRAC_BITS

_HEX64: Final = re.compile(r"[0-9a-f]{64}")


def load_artifact(path: str | os.PathLike[str], *, expected_hash: str | None = None) -> Artifact:
    """Read and check an integer artifact file (magic, format version, header, tensor bounds).

    ``expected_hash`` (the modelHash: hex sha256 of the whole file) pins it: a file that hashes
    to anything else is refused with :class:`ArtifactError`. The artifact's own
    ``model_hash`` is always the hash of the bytes read."""
    return artifact.load(path, expected_hash=expected_hash)


def load_by_hash(model_hash: str, store_dir: str | os.PathLike[str]) -> Artifact:
    """The artifact whose modelHash is ``model_hash``, from a model store laid out as the
    executor's (``<store_dir>/sha256/<hex>``, the file byte for byte).

    ``model_hash`` is the hex sha256 (as receipts spell it), or the store's
    ``sha256:<hex>``. The file is hashed as it is read and refused (:class:`ArtifactError`)
    unless it hashes to ``model_hash``; :class:`FileNotFoundError` if the store has no such
    file. Needs no executor: only the layout is shared."""
    hex_hash = model_hash
    if ":" in model_hash:
        from broker_schema.canonical import hex_of_hash  # the one home of that spelling

        try:
            hex_hash = hex_of_hash(model_hash)
        except ValueError as exc:
            raise ArtifactError(f"not a model hash: {model_hash!r}") from exc
    hex_hash = hex_hash.lower()
    if not _HEX64.fullmatch(hex_hash):  # never let a hash name a path outside the store
        raise ArtifactError(f"not a model hash: {model_hash!r}")
    return artifact.load(Path(store_dir) / "sha256" / hex_hash, expected_hash=hex_hash)


# ------------------------------------------------------------------------------ per model
#: The engines the functions below built, by (modelHash, backend): building one prepares the
#: oracle's weights (a couple of seconds for SmolLM2), so the last few are kept.
_ENGINES: OrderedDict[tuple[str, str], IntegerEngine] = OrderedDict()
_ENGINES_MAX: Final = 2
_TOKENIZERS: OrderedDict[str, AnyTokenizer] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def engine_for(art: Artifact, *, backend: str = "oracle") -> IntegerEngine:
    """An unsigned :class:`IntegerEngine` over ``art`` (kept for reuse, by modelHash and
    backend: the same hash is the same bytes). ``backend``: ``oracle`` (numpy, the canonical
    definition), ``oracle-native`` (its compiled exact-integer twin, ``int_kernel``),
    ``cpu-kernel`` (the CUDA sources compiled for the CPU) or ``cupy``."""
    key = (art.model_hash, backend)
    with _CACHE_LOCK:
        eng = _ENGINES.get(key)
        if eng is not None:
            _ENGINES.move_to_end(key)
            return eng
    eng = IntegerEngine.from_artifact(art, backend=backend)
    with _CACHE_LOCK:
        _ENGINES[key] = eng
        while len(_ENGINES) > _ENGINES_MAX:
            _ENGINES.popitem(last=False)
    return eng


def _tokenizer(art: Artifact) -> AnyTokenizer:
    """The artifact's tokenizer (byte-level BPE or SentencePiece, by its GGUF's tokenizer
    model; kept for reuse, by modelHash)."""
    with _CACHE_LOCK:
        tok = _TOKENIZERS.get(art.model_hash)
        if tok is None:
            tok = _TOKENIZERS[art.model_hash] = tokenizer_for(art.tokenizer)
            while len(_TOKENIZERS) > _ENGINES_MAX:
                _TOKENIZERS.popitem(last=False)
        return tok


def tokenize(art: Artifact, text: str, *, chat: bool = False) -> list[int]:
    """Token ids of ``text`` as the engine tokenizes a ``prompt``: every character is text (a
    special token's string such as ``<|im_start|>`` is never its control id). ``chat=True``
    wraps it as one chat user turn (ChatML with the default system prompt for SmolLM2, Gemma's
    template for Gemma) and opens the assistant's turn, the control tokens inserted as ids (the
    engine's ``chat`` parameter)."""
    tok = _tokenizer(art)
    return tok.chat_tokens(text) if chat else tok.encode(text)


def detokenize(art: Artifact, token_ids: Sequence[int]) -> str:
    """The text of ``token_ids`` (invalid UTF-8 becomes U+FFFD, as in the engine's ``text``)."""
    return _tokenizer(art).decode(token_ids)


def teacher_forced_logits(art: Artifact, token_ids: Sequence[int], *,
                          backend: str = "oracle") -> npt.NDArray[np.int64]:
    """The integer logits after every prefix of ``token_ids``, in one forward pass.

    Returns an int64 array of shape ``[len(token_ids), vocab_size]``: row ``i`` is the
    prediction for the token after ``token_ids[: i + 1]``, in Q.16 (``Q16_SCALE`` is 1.0).
    Exact integers: the same on every machine, thread count and backend, and equal to the row
    the generation path computes at that position. :class:`ParamError` for an empty sequence,
    an id outside the vocabulary or more tokens than the context holds."""
    return engine_for(art, backend=backend).teacher_forced_logits(token_ids)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Generation:
    """What :func:`generate` produced."""

    prompt_tokens: list[int]
    #: the generated ids, a final stop token (EOS) included when it ended the run
    output_tokens: list[int]
    #: the decoding of ``output_tokens`` without a final stop token
    text: str
    #: ``"stop"`` (the stop token was generated) or ``"length"`` (``max_tokens`` reached)
    finish_reason: str
    #: sha256 (hex) over every step's logits row as int64 little-endian: the receipt's
    #: ``logits_digest``, which pins every logit the run computed
    logits_digest: str


def generate(art: Artifact, prompt: str | Sequence[int], *, max_tokens: int = 64,
             chat: bool = False, temperature: Any = 0, seed: int = 0, top_k: int = 0,
             top_p: Any = 1, stop_at_eos: bool = True, backend: str = "oracle") -> Generation:
    """Generate from ``prompt`` (text, tokenized as :func:`tokenize` does, or token ids sent
    as they are), deterministically: the same arguments give the same bytes everywhere.

    The parameters are the engine's request parameters (``docs/integer-engine.md``):
    ``temperature`` 0 is greedy (ties to the lowest id); ``temperature`` and ``top_p`` are
    numbers (or decimal strings) parsed exactly to Q.16; ``seed`` keys the sampler's counter
    stream; ``top_k`` 0 and ``top_p`` 1 are off. :class:`ParamError` for invalid parameters."""
    params: dict[str, Any] = {"max_tokens": max_tokens, "chat": chat, "temperature": temperature,
                              "seed": seed, "top_k": top_k, "top_p": top_p,
                              "stop_at_eos": stop_at_eos}
    if isinstance(prompt, str):
        params["prompt"] = prompt
    else:
        if chat:
            raise ParamError("chat wraps prompt text; token ids are sent as they are")
        params["prompt_tokens"] = [int(t) if isinstance(t, np.integer) else t for t in prompt]
    out = engine_for(art, backend=backend).run(params)
    return Generation(prompt_tokens=out["prompt_tokens"], output_tokens=out["output_tokens"],
                      text=out["text"], finish_reason=out["finish_reason"],
                      logits_digest=out["receipt"]["logits_digest"])
