"""Mode A (experimental): integer models the step runs itself, recomputed bit for bit on replay.

A spec binds mode A models by name to the content hash of an integer artifact
(``SpecRecord.local_models``) and limits what a step may ask of them
(``local_max_tokens_per_step``). Inside ``step``, :func:`local_generate` and
:func:`local_logits` run the bound model in process: no effect, no round trip through the log.
The lease holder and replay load exactly the bytes the spec names (hash-checked, from a model
store directory) and run the same integer engine on the CPU backend, so a step that uses them is
as deterministic as any other: replay recomputes the inference and lands on the same bytes.

Rules, so that every node decides the same at the same input:

- only integer models (the ``fx_integer`` engine), only its CPU backend (pinned: mode A is
  experimental until a determinism ABI covers more);
- a step's calls are charged against ``local_max_tokens_per_step`` (prompt tokens plus the tokens
  asked for, per call) before they run; a step that goes over raises
  :class:`~workload_sdk.WorkloadError` ``local_limit`` at the same input everywhere;
- a name the spec does not bind is ``local_unbound`` (a ``WorkloadError`` too);
- a runtime that cannot load the named bytes (no model store, a file that does not hash to its
  name) raises :class:`LocalModelUnavailable`, which is not a decision of the workload: the
  holder or replay stops and says which hash it needs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from workload_sdk._api import WorkloadError

__all__ = [
    "LocalAnswer",
    "LocalModelUnavailable",
    "LocalRuntime",
    "default_runtime",
    "local_generate",
    "local_logits",
    "local_tokenize",
    "set_default_model_dir",
]


class LocalModelUnavailable(Exception):
    """The runtime cannot hand the step the model bytes the spec names (not a workload
    decision: the holder or replay stops and says which hash it needs, and where it looked)."""


class LocalEngine(Protocol):
    """What mode A needs of a loaded integer model."""

    def encode(self, text: str, *, chat: bool) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def generate(self, token_ids: Sequence[int], max_tokens: int) -> list[int]: ...

    def logits(self, token_ids: Sequence[int]) -> list[list[int]]: ...


@dataclass(frozen=True)
class LocalAnswer:
    """What a mode A generation returned: the new token ids, their text, the model's hash and
    how many tokens of the step's budget the call used."""

    model_hash: str
    prompt_tokens: int
    tokens: tuple[int, ...]
    text: str
    charged: int


class LocalRuntime:
    """Loads the integer artifacts a spec names, by hash, from a model store directory
    (``<dir>/sha256/<hex>``, the executor's layout), once per process. Thread-safe."""

    def __init__(self, model_dir: str | Path | None) -> None:
        self.model_dir = None if model_dir is None else Path(model_dir)
        self._loaded: dict[str, LocalEngine] = {}
        self._lock = threading.Lock()

    def engine(self, model_hash: str) -> LocalEngine:
        """The loaded model of ``model_hash`` (:class:`LocalModelUnavailable` if it cannot be
        loaded)."""
        with self._lock:
            found = self._loaded.get(model_hash)
            if found is not None:
                return found
            if self.model_dir is None:
                raise LocalModelUnavailable(
                    f"the step runs mode A model {model_hash}, and this runtime has no model "
                    "store (give --model-dir DIR or set FX_MODEL_DIR)")
            engine = load_local_engine(self.model_dir, model_hash)
            self._loaded[model_hash] = engine
            return engine


_DEFAULT: LocalRuntime | None = None


def default_runtime() -> LocalRuntime:
    """The process's runtime: the model store named by ``FX_MODEL_DIR`` (none if unset), or
    the one :func:`set_default_model_dir` gave (``--model-dir`` of the commands)."""
    global _DEFAULT
    if _DEFAULT is None:
        import os

        _DEFAULT = LocalRuntime(os.environ.get("FX_MODEL_DIR") or None)
    return _DEFAULT


def set_default_model_dir(model_dir: str | Path | None) -> None:
    """Use ``model_dir`` for mode A models in this process (``--model-dir``)."""
    global _DEFAULT
    _DEFAULT = LocalRuntime(model_dir)


@dataclass
class _StepLocal:
    runtime: LocalRuntime | None
    models: Mapping[str, str]
    budget: int
    seq: int
    used: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)


_CURRENT: ContextVar[_StepLocal | None] = ContextVar("fx_step_local", default=None)


@contextlib.contextmanager
def step_context(runtime: LocalRuntime | None, models: Mapping[str, str], budget: int,
                 seq: int) -> Iterator[_StepLocal]:
    """Make the spec's mode A models callable by the step running inside (the core's job)."""
    ctx = _StepLocal(runtime, dict(models), budget, seq)
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def _bound(model: str) -> tuple[_StepLocal, str, LocalEngine]:
    ctx = _CURRENT.get()
    if ctx is None:
        raise RuntimeError("local_generate/local_logits run only inside a workload's step")
    model_hash = ctx.models.get(model)
    if model_hash is None:
        raise WorkloadError("local_unbound", f"no mode A model named {model!r} is bound by the "
                            f"spec (local_models: {sorted(ctx.models)})", seq=ctx.seq)
    if ctx.runtime is None:
        raise LocalModelUnavailable(f"the step runs mode A model {model} ({model_hash}) and no "
                                    "local runtime was given")
    return ctx, model_hash, ctx.runtime.engine(model_hash)


def _charge(ctx: _StepLocal, cost: int, what: str) -> None:
    if ctx.used + cost > ctx.budget:
        raise WorkloadError("local_limit", f"{what} needs {cost} tokens and the step has "
                            f"{ctx.budget - ctx.used} of local_max_tokens_per_step "
                            f"{ctx.budget} left", seq=ctx.seq)
    ctx.used += cost


def local_generate(model: str, prompt: str | None = None, *,
                   token_ids: Sequence[int] | None = None, max_tokens: int = 8,
                   chat: bool = True) -> LocalAnswer:
    """Generate with the mode A model bound as ``model``, greedily (deterministic), from
    ``prompt`` (``chat``: wrapped in the model's chat template) or from ``token_ids``.
    Charged ``len(prompt tokens) + max_tokens`` against the step's budget before it runs."""
    if (prompt is None) == (token_ids is None):
        raise TypeError("give prompt or token_ids")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise TypeError("max_tokens must be a positive int")
    ctx, model_hash, engine = _bound(model)
    ids = list(token_ids) if token_ids is not None else engine.encode(str(prompt), chat=chat)
    cost = len(ids) + max_tokens
    _charge(ctx, cost, f"local_generate({model!r}, {len(ids)} prompt tokens, max_tokens="
            f"{max_tokens})")
    out = engine.generate(ids, max_tokens)
    answer = LocalAnswer(model_hash, len(ids), tuple(out), engine.decode(out), cost)
    ctx.calls.append({"model": model_hash, "prompt_tokens": len(ids), "tokens": len(out)})
    return answer


def local_logits(model: str, token_ids: Sequence[int]) -> list[list[int]]:
    """Teacher-forced logits of the mode A model bound as ``model`` for ``token_ids``: one row
    of exact integers (Q.16 fixed point) per position. Charged ``len(token_ids)``."""
    ids = [int(t) for t in token_ids]
    if not ids:
        raise TypeError("token_ids must not be empty")
    ctx, _model_hash, engine = _bound(model)
    _charge(ctx, len(ids), f"local_logits({model!r}, {len(ids)} tokens)")
    return engine.logits(ids)


def local_tokenize(model: str, text: str, *, chat: bool = True) -> list[int]:
    """The token ids the mode A model bound as ``model`` reads for ``text`` (``chat``: in its
    chat template). Free: tokenizing charges nothing against the step's budget."""
    _ctx, _model_hash, engine = _bound(model)
    return engine.encode(text, chat=chat)


# ------------------------------------------------------------------ the engine: fx_integer
# Imported only when a step runs a local model, so a workload without mode A never loads it;
# fx_integer imports no service, so this keeps workload_sdk apart from executor.

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
