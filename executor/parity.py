"""The integer engine's parity gate in the executor: what a gate run becomes on the node.

The gate itself (canaries, the byte-for-byte decision) is :mod:`fx_integer.parity_gate`; this
module turns its verdict into the node's fact (:func:`gate_fact`, pure), its log line and
metrics (:func:`observe`), and says what serves the model afterwards (:func:`serving_backend`,
pure): the gated backend when it passed; after a refusal the oracle (``fallback``) or nothing
(``refuse``: the model's requests are answered ``parity_gate_refused``). A refused backend never
serves a byte.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

from broker_schema.canonical import hash_from_hex
from broker_schema.records import ParityGateFact

if TYPE_CHECKING:
    from fx_integer.parity_gate import GateResult

__all__ = ["ParityPolicy", "gate_fact", "log_gate", "serving_backend"]

log = logging.getLogger(__name__)

ParityPolicy = Literal["fallback", "refuse"]


def serving_backend(result: GateResult, policy: ParityPolicy) -> str | None:
    """Pure: the backend that answers the model's requests after ``result``; None = none."""
    if result.passed:
        return result.backend
    return "oracle" if policy == "fallback" else None


def _mismatch_text(result: GateResult) -> str | None:
    m = result.mismatch
    if m is None:
        return None
    step = "" if m.step is None else f" step {m.step}"
    return f"canary {m.canary}{step}: {m.what}: {m.detail}"[:2000]


def gate_fact(result: GateResult, policy: ParityPolicy, *, now_us: int) -> ParityGateFact:
    """Pure: the gate run as ``sys.facts`` carries it (``FactsRecord.parity_gates``)."""
    return ParityGateFact(
        model=hash_from_hex(result.model_hash),
        backend=result.backend,
        result=result.result,
        canary_set_hash=hash_from_hex(result.canary_set_sha256),
        serving=serving_backend(result, policy),
        mismatch=_mismatch_text(result),
        checked_us=now_us,
    )


def log_gate(fact: ParityGateFact) -> None:
    """The gate's log line: INFO when passed, ERROR naming model, backend and canary when not."""
    if fact.result == "passed":
        log.info("parity gate passed: model %s on backend %s (canary set %s)", fact.model,
                 fact.backend, fact.canary_set_hash)
        return
    then = (f"serving it on the {fact.serving} instead" if fact.serving is not None
            else "not serving the model (parity_failure = refuse)")
    log.error("parity gate REFUSED backend %s for model %s (canary set %s): %s; %s",
              fact.backend, fact.model, fact.canary_set_hash, fact.mismatch, then)

