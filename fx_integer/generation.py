"""Prefill + decode loops over any backend's ``Ops`` (batched), with a logits digest."""

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
