"""Fidelity eval: integer engine vs the float32 reference, teacher-forced next-token choices.

For each committed prompt (``fidelity_prompts.json``: plain text and ChatML questions), both
forwards run over the same tokens; at every position we compare the integer argmax with the
float argmax (top-1 agreement) and with the float top-3 (integer choice within float top-3).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import artifact
from .float_ref import FloatOps
from .generation import to_host
from .oracle import KVCache, Ops, OracleOps, forward
from .tokenizer import Tokenizer

PROMPTS_FILE = Path(__file__).resolve().parent / "fidelity_prompts.json"


def load_prompts() -> list[dict[str, Any]]:
    return list(json.loads(PROMPTS_FILE.read_text(encoding="utf-8"))["prompts"])


@dataclasses.dataclass
class PromptScore:
    id: str
    positions: int
    top1: int
    top3: int


@dataclasses.dataclass
class FidelityReport:
    prompts: int
    positions: int
    top1: int
    top3: int
    per_prompt: list[PromptScore]
    seconds_int: float
    seconds_float: float

    @property
    def top1_rate(self) -> float:
        return self.top1 / max(1, self.positions)

    @property
    def top3_rate(self) -> float:
        return self.top3 / max(1, self.positions)

    def worst(self, n: int = 5) -> list[PromptScore]:
        return sorted(self.per_prompt, key=lambda s: (s.top1 / max(1, s.positions), s.id))[:n]

    def to_json(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts, "positions": self.positions, "top1": self.top1,
            "top3": self.top3, "top1_rate": round(self.top1_rate, 6),
            "top3_rate": round(self.top3_rate, 6),
            "seconds_int": round(self.seconds_int, 2),
            "seconds_float": round(self.seconds_float, 2),
            "worst": [dataclasses.asdict(s) for s in self.worst()],
        }

    def table(self) -> str:
        lines = [
            f"prompts {self.prompts}, teacher-forced positions {self.positions}",
            f"top-1 agreement               {self.top1}/{self.positions} = "
            f"{100 * self.top1_rate:.2f}%",
            f"integer choice in float top-3 {self.top3}/{self.positions} = "
            f"{100 * self.top3_rate:.2f}%",
            "worst prompts (top-1):",
        ]
        for s in self.worst():
            lines.append(f"  {s.id:10s} {s.top1}/{s.positions} top-1, {s.top3}/{s.positions} top-3")
        return "\n".join(lines)


def _logits(ops: Ops, toks: list[int]) -> np.ndarray[Any, Any]:
    out = forward(ops, [(KVCache(ops), toks)], all_logits=True)[0]
    get = getattr(out, "get", None)
    return np.asarray(get() if callable(get) else out)


def evaluate(art: artifact.Artifact, *, prompts: list[dict[str, Any]] | None = None,
             int_ops: Ops | None = None, float_ops: FloatOps | None = None,
             progress: bool = False) -> FidelityReport:
    tok = Tokenizer(art.tokenizer)
    iops = int_ops if int_ops is not None else OracleOps(art)
    fops = float_ops if float_ops is not None else FloatOps(art)
    ps = prompts if prompts is not None else load_prompts()
    scores = []
    ti = tf = 0.0
    for i, p in enumerate(ps):
        toks = tok.chat_tokens(p["text"]) if p.get("chat") else tok.encode(p["text"])
        t0 = time.perf_counter()
        li = to_host(_logits(iops, toks))
        t1 = time.perf_counter()
        lf = _logits(fops, toks)
        t2 = time.perf_counter()
        ti += t1 - t0
        tf += t2 - t1
        ci = li.argmax(axis=1)
        cf = lf.argmax(axis=1)
        top3 = np.argsort(-lf, axis=1, kind="stable")[:, :3]
        s = PromptScore(id=p["id"], positions=len(toks), top1=int((ci == cf).sum()),
                        top3=int((top3 == ci[:, None]).any(axis=1).sum()))
        scores.append(s)
        if progress:
            print(f"fidelity {i + 1}/{len(ps)} {s.id}: {s.top1}/{s.positions} top-1, "
                  f"{s.top3}/{s.positions} top-3", file=sys.stderr, flush=True)
    return FidelityReport(prompts=len(ps), positions=sum(s.positions for s in scores),
                          top1=sum(s.top1 for s in scores), top3=sum(s.top3 for s in scores),
                          per_prompt=scores, seconds_int=ti, seconds_float=tf)
