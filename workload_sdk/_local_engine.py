"""Mode A's engine: the integer engine (``fx_integer``) on its canonical CPU backend.

Imported only when a step runs a local model (:mod:`workload_sdk._local`), so a workload without
mode A never loads it. ``fx_integer`` imports no service, so this keeps ``workload_sdk`` apart
from ``executor``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from workload_sdk._local import LocalModelUnavailable

#: The one backend mode A runs on (pinned: mode A is experimental).
BACKEND = "oracle"


class IntegerLocalEngine:
    """One loaded integer artifact, run greedily on the CPU backend."""

    def __init__(self, artifact: object) -> None:
        self.artifact = artifact

    def encode(self, text: str, *, chat: bool) -> list[int]:
        import fx_integer

        return list(fx_integer.tokenize(self.artifact, text, chat=chat))  # type: ignore[arg-type]

    def decode(self, token_ids: Sequence[int]) -> str:
        import fx_integer

        return str(fx_integer.detokenize(self.artifact, list(token_ids)))  # type: ignore[arg-type]

    def generate(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        import fx_integer

        out = fx_integer.generate(self.artifact, [int(t) for t in token_ids],  # type: ignore[arg-type]
                                  max_tokens=max_tokens, temperature=0, backend=BACKEND)
        return [int(t) for t in out.output_tokens]

    def logits(self, token_ids: Sequence[int]) -> list[list[int]]:
        import fx_integer

        rows = fx_integer.teacher_forced_logits(self.artifact,  # type: ignore[arg-type]
                                                [int(t) for t in token_ids], backend=BACKEND)
        return [[int(v) for v in row] for row in rows.tolist()]


def load_local_engine(model_dir: Path, model_hash: str) -> IntegerLocalEngine:
    """The artifact ``model_hash`` from the store at ``model_dir``, hash-checked."""
    try:
        import fx_integer
    except ImportError as exc:  # pragma: no cover - the package is part of the project
        raise LocalModelUnavailable(f"the integer engine is not importable: {exc}") from exc
    try:
        art = fx_integer.load_by_hash(model_hash, model_dir)
    except (OSError, ValueError, fx_integer.ArtifactError) as exc:
        raise LocalModelUnavailable(f"cannot load mode A model {model_hash} from {model_dir}: "
                                    f"{exc}") from exc
    return IntegerLocalEngine(art)
