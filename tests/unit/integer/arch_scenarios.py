"""The scenarios every backend runs on fx_integer.synthetic_archs' models (shared by the unit
parity tests and tests/gpu): logits of every row, as bytes, to compare with the oracle's."""

from __future__ import annotations

from typing import Any

import numpy as np

from fx_integer import artifact, synthetic_archs
from fx_integer.forward import KVCache, Ops, forward
from fx_integer.generation import to_host

SEEDS = {"gemma3": 11, "qwen3": 12, "cohere2-moe": 13}
_RNG = np.random.Generator(np.random.PCG64(5))
#: five times the window of 8; a shorter prompt; decode tokens
LONG = [int(t) for t in _RNG.integers(3, synthetic_archs.VOCAB, size=40)]
SHORT = [int(t) for t in _RNG.integers(3, synthetic_archs.VOCAB, size=9)]
NEXT = [[int(t)] for t in _RNG.integers(3, synthetic_archs.VOCAB, size=8)]


def arts() -> dict[str, artifact.Artifact]:
    """The three synthetic format 2 artifacts, parsed."""
    return {a: artifact.parse(synthetic_archs.synthetic_v2(SEEDS[a], arch=a))
            for a in synthetic_archs.ARCHS}


def b(a: Any) -> bytes:
    """A backend array's int64 bytes on the host."""
    h = to_host(a)
    assert h.dtype == np.int64
    return h.tobytes()


def scenarios(ops: Ops, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """name -> the bytes of each scenario's logits (every row of each prompt): ``long`` (40
    tokens), ``long+short`` and ``short+long`` (two sequences of different lengths in one
    forward), ``split`` (the long prompt fed as 20 + 20 tokens), ``decode`` (a batch of two
    sequences decoding side by side past the window). ``names``: only those."""
    out: dict[str, Any] = {}

    def want(name: str) -> bool:
        return names is None or name in names

    def rows(seqs: list[list[int]]) -> list[bytes]:
        caches = [KVCache(ops) for _ in seqs]
        return [b(r) for r in forward(ops, list(zip(caches, seqs, strict=True)),
                                      all_logits=True)]

    if want("long"):
        out["long"] = rows([LONG])[0]
    if want("long+short"):
        out["long+short"] = rows([LONG, SHORT])
    if want("short+long"):
        out["short+long"] = rows([SHORT, LONG])
    if want("split"):
        c = KVCache(ops)
        first = b(forward(ops, [(c, LONG[:20])], all_logits=True)[0])
        out["split"] = first + b(forward(ops, [(c, LONG[20:])], all_logits=True)[0])
    if want("decode"):
        caches = [KVCache(ops), KVCache(ops)]
        forward(ops, [(caches[0], LONG[:30]), (caches[1], SHORT)])
        steps = []
        for i in range(4):
            steps.append([b(r) for r in forward(
                ops, [(caches[0], NEXT[2 * i]), (caches[1], NEXT[2 * i + 1])])])
        out["decode"] = steps
    return out
