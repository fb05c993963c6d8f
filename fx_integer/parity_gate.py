"""The parity gate: a backend other than the numpy oracle serves only after it reproduced the
oracle byte for byte on a fixed set of canary prompts.

The canaries are the committed ``parity_canaries.json`` (a few prompts of different lengths,
greedy and sampled, a few tokens each: seconds on a CPU). Each canary runs alone through the
oracle and through the gated backend; every decoding step's logits row (its sha256 over the int64
little-endian bytes) and every token must be equal. The first difference, or any exception the
backend raises (a fixed-point bound violation included), refuses the backend.

* :func:`decide` is the decision, a pure function of the two sides' runs;
* :func:`run_gate` runs the canaries and decides (what the executor and ``bench/gpu_check.py``
  call);
* :func:`receipt_field` is the verdict as a version 3 receipt binds it.

``canary_set_hash`` is ``sha256:`` + the sha256 of the canary file's canonical JSON; the module
keeps the hex digest (it imports no wire contract, so that the GPU check runs with numpy alone)
and spells it with :mod:`broker_schema` only in :func:`receipt_field`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from .artifact import canonical_json
from .generation import generate_batch

if TYPE_CHECKING:
    from .engine import IntegerEngine

CANARIES_PATH: Final = Path(__file__).resolve().parent / "parity_canaries.json"
CANARY_FORMAT: Final = "fx-parity-canaries/1"
#: backends the gate applies to (the oracle is the reference, never gated)
GATED_BACKENDS: Final = ("oracle-native", "cpu-kernel", "cupy")

GateVerdict = Literal["passed", "refused"]


@dataclasses.dataclass(frozen=True)
class Canary:
    name: str
    params: dict[str, Any]  # IntegerEngine request parameters


@dataclasses.dataclass(frozen=True)
class CanarySet:
    canaries: tuple[Canary, ...]
    sha256: str  # hex digest of the file's canonical JSON


@dataclasses.dataclass(frozen=True)
class CanaryRun:
    """One canary on one side: its tokens and each step's logits digest, or the error."""

    tokens: tuple[int, ...] = ()
    step_digests: tuple[str, ...] = ()
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """Where the backend first departed from the oracle. ``what``: ``logits`` (the step's row
    differs), ``token``, ``length`` (one side stopped earlier) or ``error`` (the backend raised);
    ``step``: the decoding step (0 = the prefill's row), None for an error before any step."""

    canary: str
    step: int | None
    what: Literal["logits", "token", "length", "error"]
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class GateResult:
    model_hash: str  # hex modelHash
    backend: str
    result: GateVerdict
    canary_set_sha256: str  # hex
    canaries: int
    mismatch: Mismatch | None = None

    @property
    def passed(self) -> bool:
        return self.result == "passed"


class CanaryError(ValueError):
    """The canary file is not a valid canary set."""


def parse_canaries(data: bytes) -> CanarySet:
    """A canary set from the file's bytes (format ``fx-parity-canaries/1``)."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise CanaryError(f"canary file is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != CANARY_FORMAT:
        raise CanaryError(f"canary file is not {CANARY_FORMAT}")
    items = doc.get("canaries")
    if not isinstance(items, list) or not items:
        raise CanaryError("canary file lists no canaries")
    out: list[Canary] = []
    for c in items:
        if not (isinstance(c, dict) and isinstance(c.get("name"), str)
                and isinstance(c.get("params"), dict)):
            raise CanaryError(f"a canary is {{name, params}}, not {c!r}")
        out.append(Canary(name=c["name"], params=dict(c["params"])))
    if len({c.name for c in out}) != len(out):
        raise CanaryError("canary names must be unique")
    return CanarySet(canaries=tuple(out), sha256=hashlib.sha256(canonical_json(doc)).hexdigest())


def load_canaries(path: Path = CANARIES_PATH) -> CanarySet:
    """The committed canary set (or another file's)."""
    return parse_canaries(path.read_bytes())


def decide(*, model_hash: str, backend: str, canary_set: CanarySet,
           reference: Sequence[CanaryRun], gated: Sequence[CanaryRun]) -> GateResult:
    """Pure: the gate's verdict from the oracle's runs and the backend's, canary by canary in
    the set's order. Passed only when every canary's steps, logits digests and tokens are equal
    and the backend raised nothing; otherwise refused, naming the first difference."""
    names = [c.name for c in canary_set.canaries]
    if len(reference) != len(names) or len(gated) != len(names):
        raise ValueError("one run per canary on each side")

    def verdict(m: Mismatch | None) -> GateResult:
        return GateResult(model_hash=model_hash, backend=backend,
                          result="passed" if m is None else "refused",
                          canary_set_sha256=canary_set.sha256, canaries=len(names), mismatch=m)

    for name, ref, got in zip(names, reference, gated, strict=True):
        if ref.error is not None:  # the reference must run: a bug, not a verdict
            raise RuntimeError(f"the oracle failed on canary {name}: {ref.error}")
        if got.error is not None:
            return verdict(Mismatch(name, len(got.step_digests) or None, "error", got.error))
        for step in range(max(len(ref.step_digests), len(got.step_digests))):
            if step >= len(ref.step_digests) or step >= len(got.step_digests):
                return verdict(Mismatch(name, step, "length",
                                        f"oracle ran {len(ref.step_digests)} steps, the "
                                        f"backend {len(got.step_digests)}"))
            if ref.step_digests[step] != got.step_digests[step]:
                return verdict(Mismatch(name, step, "logits",
                                        f"logits row sha256 {got.step_digests[step]} != the "
                                        f"oracle's {ref.step_digests[step]}"))
            if step >= len(ref.tokens) or step >= len(got.tokens) \
                    or ref.tokens[step] != got.tokens[step]:
                return verdict(Mismatch(name, step, "token",
                                        f"token {got.tokens[step:step + 1]} != the oracle's "
                                        f"{ref.tokens[step:step + 1]}"))
        if ref.tokens != got.tokens:
            return verdict(Mismatch(name, None, "token", "output tokens differ"))
    return verdict(None)


def refused_on_error(*, model_hash: str, backend: str, canary_set: CanarySet,
                     error: BaseException) -> GateResult:
    """Pure: the verdict on a backend that could not even be started (its kernels did not build
    or load): refused, the error named, before any canary."""
    return GateResult(model_hash=model_hash, backend=backend, result="refused",
                      canary_set_sha256=canary_set.sha256, canaries=len(canary_set.canaries),
                      mismatch=Mismatch("(backend start)", None, "error",
                                        f"{type(error).__name__}: {error}"))


def run_canaries(engine: IntegerEngine, canary_set: CanarySet, *,
                 catch: bool = True) -> list[CanaryRun]:
    """Each canary alone on ``engine`` (no receipt, no signer). ``catch``: an exception becomes
    the run's ``error`` (the gated side) instead of propagating (the reference side)."""
    runs: list[CanaryRun] = []
    for c in canary_set.canaries:
        req, _ = engine.prepare(c.params)  # a canary this model cannot take is a bug: raises
        try:
            with engine._lock:
                res = generate_batch(engine.ops, [req])[0]
        except Exception as exc:
            if not catch:
                raise
            runs.append(CanaryRun(error=f"{type(exc).__name__}: {exc}"))
            continue
        runs.append(CanaryRun(tokens=tuple(res.output_tokens), step_digests=res.step_digests))
    return runs


#: (model hash, canary set digest) -> the oracle's runs (deterministic: computed once per process)
_REFERENCE: dict[tuple[str, str], list[CanaryRun]] = {}


def reference_runs(oracle: IntegerEngine, canary_set: CanarySet) -> list[CanaryRun]:
    """The oracle's runs of ``canary_set`` (cached per model and canary set)."""
    if oracle.backend != "oracle":
        raise ValueError(f"the reference is the oracle, not {oracle.backend!r}")
    key = (oracle.model_hash, canary_set.sha256)
    runs = _REFERENCE.get(key)
    if runs is None:
        runs = run_canaries(oracle, canary_set, catch=False)
        _REFERENCE[key] = runs
    return list(runs)


def run_gate(gated: IntegerEngine, *, oracle: IntegerEngine | None = None,
             canary_set: CanarySet | None = None) -> GateResult:
    """Run the canaries on ``gated`` and on the oracle (``oracle``, else one built from the
    gated engine's artifact) and decide. Never raises for what the backend does."""
    from .engine import IntegerEngine

    cs = canary_set or load_canaries()
    if gated.backend not in GATED_BACKENDS:
        raise ValueError(f"backend {gated.backend!r} is not gated (one of {GATED_BACKENDS})")
    ref_engine = oracle or IntegerEngine.from_artifact(gated.artifact)
    if ref_engine.model_hash != gated.model_hash:
        raise ValueError("the oracle and the gated engine hold different models")
    from .engine import ParamError

    try:
        reference = reference_runs(ref_engine, cs)
    except ParamError as exc:  # a model the canaries do not fit cannot be shown equal: refused
        return GateResult(model_hash=gated.model_hash, backend=gated.backend, result="refused",
                          canary_set_sha256=cs.sha256, canaries=len(cs.canaries),
                          mismatch=Mismatch("(canary set)", None, "error",
                                            f"the canaries do not fit this model: {exc}"))
    return decide(model_hash=gated.model_hash, backend=gated.backend, canary_set=cs,
                  reference=reference, gated=run_canaries(gated, cs))


def receipt_field(result: GateResult) -> dict[str, Any]:
    """The verdict as a version 3 receipt's ``parity_gate`` binds it."""
    from broker_schema.canonical import hash_from_hex

    return {"backend": result.backend, "result": result.result,
            "canary_set_hash": hash_from_hex(result.canary_set_sha256)}
