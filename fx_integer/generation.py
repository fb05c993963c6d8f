"""Prefill + decode loops over any backend's ``Ops`` (batched), with a logits digest, and the
teacher-forced re-execution of a claimed output (:func:`teacher_force`)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from .oracle import KVCache, Ops, forward
from .sampling import SamplingParams, choose


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenRequest:
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    stop_token: int | None  # stop after emitting this token (it is included in the output)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenResult:
    output_tokens: list[int]
    logits_digest: str  # sha256 over every step's logits row, int64 little-endian
    #: sha256 (hex) of each step's logits row alone (the parity gate names the first that differs)
    step_digests: tuple[str, ...] = ()


def to_host(a: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
    get = getattr(a, "get", None)
    return np.asarray(get() if callable(get) else a, dtype=np.int64)


def generate_batch(ops: Ops, reqs: Sequence[GenRequest]) -> list[GenResult]:
    """Run requests side by side: one prefill forward for all prompts, then one decode forward
    per step over the still-active sequences. A request's bytes do not depend on its batch."""
    caches = [KVCache(ops) for _ in reqs]
    outs: list[list[int]] = [[] for _ in reqs]
    digests = [hashlib.sha256() for _ in reqs]
    steps: list[list[str]] = [[] for _ in reqs]
    active = [i for i, r in enumerate(reqs) if r.max_tokens > 0]
    feed: dict[int, list[int]] = {i: list(reqs[i].prompt_tokens) for i in active}
    for i in active:
        if not reqs[i].prompt_tokens:
            raise ValueError("empty prompt")
    while active:
        logits = forward(ops, [(caches[i], feed[i]) for i in active])
        still = []
        for i, lg in zip(active, logits, strict=True):
            row = to_host(lg)[0]
            raw = row.astype("<i8").tobytes()
            digests[i].update(raw)
            steps[i].append(hashlib.sha256(raw).hexdigest())
            r = reqs[i]
            tok = choose(row, r.sampling, len(outs[i]))
            outs[i].append(tok)
            if len(outs[i]) < r.max_tokens and tok != r.stop_token:
                feed[i] = [tok]
                still.append(i)
        active = still
    return [GenResult(output_tokens=o, logits_digest=d.hexdigest(), step_digests=tuple(st))
            for o, d, st in zip(outs, digests, steps, strict=True)]


def generate(ops: Ops, req: GenRequest) -> GenResult:
    return generate_batch(ops, [req])[0]


def teacher_force(ops: Ops, req: GenRequest, claimed: Sequence[int]) -> GenResult:
    """Exactly what ``generate(ops, req)`` returns, computed by teacher-forcing ``claimed``.

    One forward over the prompt and the claimed output (but its last token) gives, at each
    output position, the very logits row the step-by-step decode computes there (a row's bytes
    do not depend on how the tokens were chunked into forwards: every op is row-local except
    attention, which reads the same cache rows). Walking those rows with the request's
    sampling parameters and seed reproduces the decode's tokens and digest while they agree
    with ``claimed``. At the first step where they do not (a different token, or a claimed
    output that stops early or runs on), the cache is cut back to that position and decoding
    continues token by token, as the step-by-step path would: the result is the same in every
    case, and a receipt that tells the truth costs one forward.
    """
    if req.max_tokens <= 0:
        return GenResult(output_tokens=[], logits_digest=hashlib.sha256().hexdigest())
    prompt = list(req.prompt_tokens)
    if not prompt:
        raise ValueError("empty prompt")
    vocab = ops.config.vocab_size
    forced: list[int] = []
    for t in list(claimed)[:max(0, req.max_tokens - 1)]:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
            break  # the decode cannot emit it: it diverges here at the latest
        forced.append(int(t))
    cache = KVCache(ops)
    n = len(prompt)
    rows = to_host(forward(ops, [(cache, prompt + forced)], all_logits=True,
                           logits_from=n - 1)[0])
    out: list[int] = []
    digest = hashlib.sha256()
    for i in range(len(forced) + 1):
        row = rows[i]
        digest.update(row.astype("<i8").tobytes())
        tok = choose(row, req.sampling, i)
        out.append(tok)
        if len(out) >= req.max_tokens or tok == req.stop_token:
            return GenResult(output_tokens=out, logits_digest=digest.hexdigest())
        if i < len(forced) and tok == forced[i]:
            continue
        # diverged after out[:i] == forced[:i]: the cache holds prompt + out[:i] up to n + i
        cache.length = n + i
        del cache.tokens[n + i:]
        break
    while True:
        row = to_host(forward(ops, [(cache, [out[-1]])])[0])[0]
        digest.update(row.astype("<i8").tobytes())
        tok = choose(row, req.sampling, len(out))
        out.append(tok)
        if len(out) >= req.max_tokens or tok == req.stop_token:
            return GenResult(output_tokens=out, logits_digest=digest.hexdigest())
