"""llama.cpp as an optional float reference (``pip install .[llamacpp]``).

Nothing in the integer engine needs it: ``llama_cpp`` (the ``llama-cpp-python`` bindings) is
imported lazily, only when a :class:`LlamaCppReference` is built, so ``fx_integer`` imports and
``make test`` runs without it (the tests that use it skip). It serves three comparisons:

* fidelity: :meth:`LlamaCppReference.logits` returns llama.cpp's float logits for every
  position of a teacher-forced sequence, to compare with the integer engine's top-1/top-3;
* tokenizer agreement: :meth:`LlamaCppReference.tokenize` is llama.cpp's own tokenizer of the
  same GGUF;
* speed: :meth:`LlamaCppReference.decode_speed` measures greedy decode tokens/s for 1 stream or
  several streams decoded together (one ``llama_decode`` per step over a ``llama_batch`` holding
  one token for each of ``batch`` sequence ids), on the same thread count as the integer engine.

llama.cpp is a float engine: its numbers are a reference to agree with, never bytes to match.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["LlamaCppReference", "available"]


def _lib() -> Any:
    """The ``llama_cpp`` module (raises ImportError/OSError where it is absent or broken)."""
    return importlib.import_module("llama_cpp")


def available() -> bool:
    """True when the llama-cpp-python bindings import (their shared library included)."""
    try:
        _lib()
    except (ImportError, OSError):
        return False
    return True


class LlamaCppReference:
    """One GGUF loaded by llama.cpp (CPU), for float logits, tokenization and decode speed.

    ``n_ctx`` bounds every sequence given to :meth:`logits` / :meth:`greedy` (prompt plus
    generated tokens); ``n_threads`` is used for both single-token and batch evaluation.
    """

    def __init__(self, gguf_path: str | Path, *, n_ctx: int = 2048, n_threads: int = 1) -> None:
        if n_ctx <= 0 or n_threads <= 0:
            raise ValueError("n_ctx and n_threads must be positive")
        lib = _lib()
        self._lib = lib
        self.gguf_path = Path(gguf_path)
        self.n_ctx = int(n_ctx)
        self.n_threads = int(n_threads)
        self._llm: Any = lib.Llama(
            model_path=str(self.gguf_path), n_ctx=self.n_ctx, n_batch=min(self.n_ctx, 512),
            n_threads=self.n_threads, n_threads_batch=self.n_threads, logits_all=True,
            verbose=False)
        self.n_vocab = int(self._llm.n_vocab())

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Free the model and its context."""
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.close()

    def __enter__(self) -> LlamaCppReference:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---------------------------------------------------------------- queries

    def _check_ids(self, token_ids: Sequence[int], extra: int = 0) -> list[int]:
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ValueError("token_ids is empty")
        if len(ids) + extra > self.n_ctx:
            raise ValueError(f"{len(ids)} + {extra} tokens exceed n_ctx={self.n_ctx}")
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:
            raise ValueError(f"token ids outside the vocabulary ({self.n_vocab}): {bad[:5]}")
        return ids

    def logits(self, token_ids: Sequence[int]) -> npt.NDArray[np.float32]:
        """Teacher-forced float logits, ``[len(token_ids), n_vocab]`` float32 (a copy): row i
        is llama.cpp's prediction for the token after ``token_ids[: i + 1]``. The sequence is
        evaluated from an empty cache (prefill in chunks of at most 512 tokens)."""
        ids = self._check_ids(token_ids)
        self._llm.reset()
        self._llm.eval(ids)
        return np.array(self._llm.scores[: len(ids)], dtype=np.float32, copy=True)

    def tokenize(self, text: str, add_bos: bool, special: bool) -> list[int]:
        """llama.cpp's tokenizer of this GGUF: ``add_bos`` adds BOS where the GGUF's
        ``tokenizer.ggml.add_bos_token`` allows it; ``special`` parses control-token text
        (``<|im_start|>``…) as the control tokens, else as plain text."""
        return [int(t) for t in self._llm.tokenize(text.encode("utf-8"), add_bos=add_bos,
                                                  special=special)]

    def greedy(self, token_ids: Sequence[int], n: int) -> list[int]:
        """``n`` greedy (argmax of the float logits) tokens after ``token_ids``, decoded one
        token at a time on the KV cache (no stop at EOS). Ties go to the lowest id."""
        if n < 0:
            raise ValueError("n must be >= 0")
        ids = self._check_ids(token_ids, extra=n)
        self._llm.reset()
        self._llm.eval(ids)
        out: list[int] = []
        for _ in range(n):
            tok = int(np.argmax(self._llm.scores[self._llm.n_tokens - 1]))
            out.append(tok)
            self._llm.eval([tok])
        return out

    def decode_speed(self, prompt_ids: Sequence[int], n_tokens: int, batch: int = 1) -> float:
        """Greedy decode throughput in tokens/s, ``batch`` streams together: see
        :meth:`decode_streams`; ``batch * n_tokens / seconds`` (every token of every stream
        counts; the prefill is not timed)."""
        _, seconds = self.decode_streams(prompt_ids, n_tokens, batch)
        return batch * n_tokens / seconds

    def decode_streams(self, prompt_ids: Sequence[int], n_tokens: int,
                       batch: int = 1) -> tuple[list[list[int]], float]:
        """Greedy-decode ``batch`` streams of the same prompt together; returns the tokens of
        each stream and the seconds the ``n_tokens`` decode steps took.

        A fresh llama.cpp context with ``n_seq_max = batch`` (same model, same thread count)
        prefills ``prompt_ids`` on each of the ``batch`` sequence ids (one ``llama_decode``,
        untimed), then runs ``n_tokens`` timed steps: one ``llama_decode`` of a ``llama_batch``
        holding the next token of every sequence (sequence s at position ``len(prompt)+step``),
        followed by the argmax of each sequence's logits (the first generated token comes from
        the prefill, so the last step's logits are computed and not used)."""
        if n_tokens <= 0 or batch <= 0:
            raise ValueError("n_tokens and batch must be positive")
        lib = self._lib
        prompt = self._check_ids(prompt_ids, extra=n_tokens)
        n_prompt = len(prompt)
        per_seq = -(-(n_prompt + n_tokens) // 256) * 256  # room for each stream, padded
        params = lib.llama_context_default_params()
        params.n_ctx = per_seq * batch
        params.n_batch = max(n_prompt * batch, batch)
        params.n_ubatch = min(params.n_batch, 512)
        params.n_seq_max = batch
        params.n_threads = self.n_threads
        params.n_threads_batch = self.n_threads
        ctx = lib.llama_init_from_model(self._llm.model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context with n_seq_max={batch}")
        cap = max(n_prompt * batch, batch)
        lb = lib.llama_batch_init(cap, 0, 1)
        try:
            n = 0
            for s in range(batch):
                for i, tok in enumerate(prompt):
                    self._put(lb, n, tok, i, s, i == n_prompt - 1)
                    n += 1
            lb.n_tokens = n
            self._decode(ctx, lb)
            # llama_get_logits_ith takes the index in the batch: sequence s's last prompt token
            nxt = [self._argmax(ctx, (s + 1) * n_prompt - 1) for s in range(batch)]
            streams: list[list[int]] = [[] for _ in range(batch)]
            t0 = time.perf_counter()
            for step in range(n_tokens):
                for s in range(batch):
                    streams[s].append(nxt[s])
                    self._put(lb, s, nxt[s], n_prompt + step, s, True)
                lb.n_tokens = batch
                self._decode(ctx, lb)
                nxt = [self._argmax(ctx, s) for s in range(batch)]
            elapsed = time.perf_counter() - t0
        finally:
            lib.llama_batch_free(lb)
            lib.llama_free(ctx)
        return streams, elapsed

    # ---------------------------------------------------------------- helpers

    @staticmethod
    def _put(lb: Any, i: int, tok: int, pos: int, seq: int, want_logits: bool) -> None:
        lb.token[i] = tok
        lb.pos[i] = pos
        lb.n_seq_id[i] = 1
        lb.seq_id[i][0] = seq
        lb.logits[i] = 1 if want_logits else 0

    def _decode(self, ctx: Any, lb: Any) -> None:
        rc = int(self._lib.llama_decode(ctx, lb))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _argmax(self, ctx: Any, i: int) -> int:
        ptr = self._lib.llama_get_logits_ith(ctx, i)
        row = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        return int(np.argmax(row))
