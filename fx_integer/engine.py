"""IntegerEngine: load a committed artifact, run requests, produce (signed) receipts.

Request parameters (``run(params)``), every one that changes the result, with defaults:

    prompt        str    text, tokenized as text: a special token's string such as <|im_start|>
                         is ordinary text (never its control id)
    prompt_tokens [int]  token ids instead of ``prompt`` (exactly one of the two; the way to
                         send control tokens, recorded verbatim in the receipt)
    chat          bool   false; true wraps ``prompt`` as one ChatML user turn with the model's
                         default system prompt and opens the assistant turn: the template's
                         control tokens are inserted as ids, the user text stays text
                         (``Tokenizer.chat_tokens``)
    max_tokens    int    64 (1..ctx_len)
    temperature   number 0 (greedy); parsed exactly to Q.16
    seed          int    0 (PRNG key; only used when temperature > 0)
    top_k         int    0 (off)
    top_p         number 1 (off); parsed exactly to Q.16
    stop_at_eos   bool   true: stop after emitting <|im_end|> (the EOS id)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Final

import numpy as np

from . import artifact
from .generation import GenRequest, GenResult, generate_batch, teacher_force, to_host
from .oracle import KVCache, Ops, OracleOps, forward
from .receipt import (
    RECEIPT_VERSION,
    RECEIPT_VERSION_GATED,
    ReceiptSigner,
    input_hash,
    output_hash,
    text_hash,
)
from .sampling import SamplingParams
from .tokenizer import tokenizer_for

ENGINE_NAME: Final = "ninelives-integer"
ENGINE_VERSION: Final = "0.1.0"
KIND: Final = "ninelives:inference/run@0.1.0"
DEFAULTS: Final[dict[str, Any]] = {
    "chat": False, "max_tokens": 64, "temperature": 0, "seed": 0, "top_k": 0, "top_p": 1,
    "stop_at_eos": True,
}
_KNOWN = frozenset({"prompt", "prompt_tokens", *DEFAULTS})
BACKENDS: Final = ("oracle", "oracle-native", "cpu-kernel", "cupy")


class ParamError(ValueError):
    """Invalid request parameters (a terminal, non-retriable error)."""

    retriable: ClassVar[bool] = False


def make_ops(art: artifact.Artifact, backend: str) -> Ops:
    if backend == "oracle":
        return OracleOps(art)
    if backend == "oracle-native":
        from .int_kernel import NativeOps

        return NativeOps(art)
    if backend == "cpu-kernel":
        from .cpu_kernel import CpuKernelOps, env_defines

        return CpuKernelOps(art, defines=env_defines())
    if backend == "cupy":
        from .cupy_backend import CupyOps

        return CupyOps(art)
    raise ValueError(f"unknown backend {backend!r}; one of {BACKENDS}")


class IntegerEngine:
    """The integer engine over one committed artifact.

    ``IntegerEngine(path, expected_model_hash=H)`` refuses a file whose sha256 is not ``H``.
    ``run`` is serialised by a lock (one forward at a time per engine).
    """

    name: ClassVar[str] = ENGINE_NAME
    version: ClassVar[str] = ENGINE_VERSION
    kind: ClassVar[str] = KIND
    _cache: ClassVar[dict[tuple[str, str, str], IntegerEngine]] = {}

    def __init__(self, artifact_path: str | os.PathLike[str], *,
                 expected_model_hash: str | None = None, backend: str = "oracle",
                 signer: ReceiptSigner | None = None) -> None:
        art = artifact.load(Path(artifact_path), expected_hash=expected_model_hash)
        self._setup(art, backend=backend, signer=signer)

    @classmethod
    def from_bytes(cls, data: bytes, *, expected_model_hash: str | None = None,
                   backend: str = "oracle", signer: ReceiptSigner | None = None
                   ) -> IntegerEngine:
        """An engine over artifact bytes already in memory (the executor's model store hands
        over the bytes it hash-checked, so what runs is what was checked). ``expected_model_hash``
        (hex sha256) pins them as in the constructor."""
        art = artifact.parse(data)
        if expected_model_hash is not None and art.model_hash != expected_model_hash.lower():
            raise artifact.ArtifactError(
                f"modelHash mismatch: the bytes hash to {art.model_hash}, "
                f"expected {expected_model_hash}")
        return cls.from_artifact(art, backend=backend, signer=signer)

    @classmethod
    def from_artifact(cls, art: artifact.Artifact, *, backend: str = "oracle",
                      signer: ReceiptSigner | None = None) -> IntegerEngine:
        """An engine over an artifact already loaded (and so already hash-checked)."""
        eng = cls.__new__(cls)
        eng._setup(art, backend=backend, signer=signer)
        return eng

    def _setup(self, art: artifact.Artifact, *, backend: str,
               signer: ReceiptSigner | None) -> None:
        self.artifact_path: Path | None = art.path
        #: the loaded artifact (the parity gate builds its oracle reference from it)
        self.artifact = art
        #: the parity gate's verdict this engine serves under (:func:`parity_gate.receipt_field`),
        #: bound into every receipt (version 3); None: no gate ran (version 2 receipts)
        self.parity_gate: dict[str, Any] | None = None
        self.model_hash = art.model_hash
        self.config = art.config
        self.tokenizer = tokenizer_for(art.tokenizer)
        self.backend = backend
        self.ops = make_ops(art, backend)
        self.device_class = "cuda" if backend == "cupy" else "cpu"
        self.signer = signer
        self._lock = threading.Lock()

    @classmethod
    def cached(cls, path: str | os.PathLike[str], *,
               expected_model_hash: str | None = None,
               backend: str = "oracle") -> IntegerEngine:
        """A process-wide engine per (file, hash, backend): what verifiers reuse (``oracle``
        or its compiled twin ``oracle-native``)."""
        key = (str(Path(path).resolve()), expected_model_hash or "", backend)
        eng = cls._cache.get(key)
        if eng is None:
            eng = cls(path, expected_model_hash=expected_model_hash, backend=backend)
            cls._cache[key] = eng
        return eng

    # ------------------------------------------------------------------ parameters
    def prepare(self, params: dict[str, Any]) -> tuple[GenRequest, dict[str, Any]]:
        """Validate and normalise request params -> (request, canonical receipt params)."""
        if not isinstance(params, dict):
            raise ParamError("params must be an object")
        unknown = sorted(set(params) - _KNOWN)
        if unknown:
            raise ParamError(f"unknown parameters: {', '.join(unknown)}")
        p = {**DEFAULTS, **params}
        if ("prompt" in params) == ("prompt_tokens" in params):
            raise ParamError("give exactly one of prompt, prompt_tokens")
        if "prompt" in params:
            if not isinstance(p["prompt"], str):
                raise ParamError("prompt must be a string")
            # user text is text: control tokens only where the chat template puts them
            toks = (self.tokenizer.chat_tokens(p["prompt"]) if p["chat"]
                    else self.tokenizer.encode(p["prompt"]))
        else:
            raw = p["prompt_tokens"]
            if not isinstance(raw, list) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in raw):
                raise ParamError("prompt_tokens must be a list of integers")
            toks = list(raw)
        if not toks:
            raise ParamError("the prompt is empty")
        if any(t < 0 or t >= self.config.vocab_size for t in toks):
            raise ParamError("prompt token id out of range")
        mt = p["max_tokens"]
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise ParamError("max_tokens must be a positive integer")
        if len(toks) + mt > self.config.ctx_len:
            raise ParamError(f"prompt + max_tokens exceeds the context of {self.config.ctx_len}")
        try:
            sp = SamplingParams.parse(p)
        except (ValueError, TypeError) as e:
            raise ParamError(str(e)) from e
        # a chat answer ends at its turn's end (Gemma: <end_of_turn>; ChatML: <|im_end|>, the
        # eos id); the receipt records which token it was
        end_of_turn = getattr(self.tokenizer, "end_of_turn_id", None) if p["chat"] else None
        stop = (end_of_turn if end_of_turn is not None else self.tokenizer.eos_id) \
            if p["stop_at_eos"] else None
        req = GenRequest(prompt_tokens=tuple(toks), max_tokens=mt, sampling=sp, stop_token=stop)
        canon = {"max_tokens": mt, **sp.canonical(), "stop_token": stop}
        return req, canon

    # ------------------------------------------------------------------ running
    def teacher_forced_logits(self, token_ids: Sequence[int]
                              ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The logits after every prefix of ``token_ids``: row ``i`` ([vocab_size] int64, Q.16)
        is what the model predicts for the token after ``token_ids[: i + 1]``, computed in one
        forward pass over the whole sequence. Each row is byte-identical to the row the
        generation path computes at that position (prefill, then one token per step)."""
        toks = list(token_ids)
        if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in toks):
            raise ParamError("token ids must be integers")
        toks = [int(t) for t in toks]
        if not toks:
            raise ParamError("no token ids")
        if any(t < 0 or t >= self.config.vocab_size for t in toks):
            raise ParamError("token id out of range")
        if len(toks) > self.config.ctx_len:
            raise ParamError(f"{len(toks)} tokens exceed the context of {self.config.ctx_len}")
        with self._lock:
            rows = forward(self.ops, [(KVCache(self.ops), toks)], all_logits=True)[0]
        return to_host(rows)

    def run(self, params: dict[str, Any],
            context: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run one request; returns a JSON-serialisable dict (see ``_result``). ``context`` is
        the receipt's ``context`` (:func:`receipt.receipt_context`; None outside an executor)."""
        return self.run_batch([params], [context])[0]

    def run_batch(self, batch: Sequence[dict[str, Any]],
                  contexts: Sequence[dict[str, Any] | None] | None = None
                  ) -> list[dict[str, Any]]:
        """Run several requests together (one batched forward per step); each result is
        byte-identical to running it alone. ``contexts``: each request's receipt context."""
        prepared = [self.prepare(p) for p in batch]
        ctxs = list(contexts) if contexts is not None else [None] * len(batch)
        texts = [p["prompt"] if isinstance(p.get("prompt"), str) else None for p in batch]
        with self._lock:
            results = generate_batch(self.ops, [r for r, _ in prepared])
            return [self._result(req, canon, res, prompt_text=text, context=ctx)
                    for (req, canon), res, text, ctx
                    in zip(prepared, results, texts, ctxs, strict=True)]

    def _result(self, req: GenRequest, canon: dict[str, Any], res: GenResult, *,
                prompt_text: str | None = None,
                context: dict[str, Any] | None = None) -> dict[str, Any]:
        toks = res.output_tokens
        finish = "stop" if toks and toks[-1] == req.stop_token else "length"
        text_toks = toks[:-1] if finish == "stop" else toks
        text = self.tokenizer.decode(text_toks)
        gate = self.parity_gate
        body: dict[str, Any] = {
            "receipt_version": RECEIPT_VERSION if gate is None else RECEIPT_VERSION_GATED,
            "kind": KIND,
            "model_hash": self.model_hash,
            "engine": {"name": ENGINE_NAME, "version": ENGINE_VERSION, "backend": self.backend,
                       "device_class": self.device_class},
            "context": None if context is None else dict(context),
            "prompt_tokens": list(req.prompt_tokens),
            "input_hash": input_hash(req.prompt_tokens),
            "prompt_text_hash": None if prompt_text is None else text_hash(prompt_text),
            "params": canon,
            "output_tokens": list(toks),
            "output_hash": output_hash(toks),
            "output_text_hash": text_hash(text),
            "logits_digest": res.logits_digest,
        }
        if gate is not None:
            body["parity_gate"] = dict(gate)
        receipt = self.signer.sign(body) if self.signer is not None else body
        return {
            "output_tokens": list(toks),
            "text": text,
            "finish_reason": finish,
            "prompt_tokens": list(req.prompt_tokens),
            "model_hash": self.model_hash,
            "receipt": receipt,
        }


def reexecute_receipt(eng: IntegerEngine, receipt: dict[str, Any], *,
                      step_by_step: bool = False) -> tuple[list[int], str]:
    """Re-run a receipt's request on ``eng`` -> (output tokens, logits digest).

    By default the receipt's ``output_tokens`` are teacher-forced in one forward
    (:func:`generation.teacher_force`: the same tokens and digest as decoding, by
    construction); ``step_by_step`` decodes token by token instead (the cross-check)."""
    prm = receipt["params"]
    try:
        sp = SamplingParams(temperature_q16=int(prm["temperature_q16"]), top_k=int(prm["top_k"]),
                            top_p_q16=int(prm["top_p_q16"]), seed=int(prm["seed"]))
        stop = prm["stop_token"]
        toks = [int(t) for t in receipt["prompt_tokens"]]
        max_tokens = int(prm["max_tokens"])
    except (KeyError, TypeError, ValueError) as e:
        raise ParamError(f"receipt params invalid: {e}") from e
    if not toks or any(t < 0 or t >= eng.config.vocab_size for t in toks):
        raise ParamError("receipt prompt_tokens invalid")
    if max_tokens < 1 or len(toks) + max_tokens > eng.config.ctx_len:
        raise ParamError(f"receipt max_tokens {max_tokens} is outside 1..context - prompt")
    req = GenRequest(prompt_tokens=tuple(toks), max_tokens=max_tokens, sampling=sp,
                     stop_token=None if stop is None else int(stop))
    claimed = receipt.get("output_tokens")
    with eng._lock:
        if step_by_step or not isinstance(claimed, list):
            res = generate_batch(eng.ops, [req])[0]
        else:
            res = teacher_force(eng.ops, req, claimed)
    return res.output_tokens, res.logits_digest
