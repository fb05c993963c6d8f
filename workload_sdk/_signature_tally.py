"""The signature tally: which responses on ``.resp`` are validly signed by a key trusted for
their node (:func:`broker_schema.key_history.response_key_problem`, the one rule), counted one
way for the lease holder's signature watcher (``fx_holder_signature*``) and ``fx audit``'s
``signatures`` invariant. Pure: it decides nothing the merge log records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker_schema import HOLDER_OUTCOMES, FactsRecord, ResponseRecord
from broker_schema.key_history import response_key_problem, response_node

if TYPE_CHECKING:
    from broker_schema.key_history import KeyHistory

__all__ = ["SIGNATURE_FAILURE_REASONS", "ReadResponse", "SignatureFailure", "SignatureTally",
           "check_signatures", "holder_written", "latest_keys"]


#: Why a response's signature failed, as ``fx_holder_signature_failures_total`` labels it:
#: ``invalid`` (it does not verify: a forged or altered response, or a key another node
#: publishes, or with a key history one the fleet key does not certify for that node),
#: ``unknown_key`` (no facts record publishes the signer's key, even after reading
#: ``sys.facts`` again), ``unsigned`` (no signature, and not a lease holder's
#: ``timeout``/``unknown``: every executor and gateway signs what it writes).
SIGNATURE_FAILURE_REASONS: tuple[str, ...] = ("invalid", "unknown_key", "unsigned")

#: The outcomes a lease holder writes itself, unsigned (it has no node key).


#: A response as read from ``.resp``: its offset, the record and the broker's append time of the
#: record in µs (the time its signer's key is judged at; None when not known).
ReadResponse = tuple[int, ResponseRecord, "int | None"]


@dataclass(frozen=True, slots=True)
class SignatureFailure:
    """One response whose signature failed: where it is, whom it names, and why."""

    offset: int
    effect_id: str
    node_id: str
    reason: str  # one of SIGNATURE_FAILURE_REASONS
    detail: str


@dataclass
class SignatureTally:
    """What :func:`check_signatures` found: ``checked`` responses settled (verified or
    failed), the ``failures`` among them, and ``retry``: those not verified that are to be
    checked again once the keys are read again (only when not ``final``)."""

    checked: int = 0
    failures: list[SignatureFailure] = field(default_factory=list)
    retry: list[ReadResponse] = field(default_factory=list)


def holder_written(resp: ResponseRecord, holder_ids: Set[str]) -> bool:
    """A ``timeout``/``unknown`` a lease holder wrote: unsigned, no executor block, written by
    the holder id of a claim (the rule of ``fx audit``)."""
    return (resp.outcome in HOLDER_OUTCOMES and resp.signature is None
            and resp.executor is None and resp.written_by in holder_ids)


def check_signatures(responses: Iterable[ReadResponse],
                     facts: Sequence[FactsRecord], history: KeyHistory | None = None, *,
                     holder_ids: Set[str], final: bool) -> SignatureTally:
    """Check each ``(offset, response, append_us)`` read from ``.resp`` with the one rule
    (:func:`broker_schema.key_history.response_key_problem`: against ``facts``, the records on
    ``sys.facts``, or the fleet ``history``). A lease holder's own unsigned ``timeout`` or
    ``unknown`` (:func:`holder_written`) is neither checked nor a failure; an unsigned
    response of anyone else is an ``unsigned`` failure. A signed one that does not verify is
    put in ``retry`` unless ``final`` (the keys may be behind the response: read them again
    first); when ``final``, it is ``invalid`` (``valid`` False) or ``unknown_key`` (no key
    found). Pure: it decides nothing the merge log records."""
    tally = SignatureTally()
    for offset, resp, appended_us in responses:
        node = response_node(resp)
        if resp.signature is None:
            if holder_written(resp, holder_ids):
                continue
            tally.checked += 1
            tally.failures.append(SignatureFailure(offset, resp.effect_id, node, "unsigned",
                                                   "the response carries no signature"))
            continue
        problem = response_key_problem(resp, facts, history, appended_us=appended_us)
        if problem is None:
            tally.checked += 1
            continue
        if not final:
            tally.retry.append((offset, resp, appended_us))
            continue
        tally.checked += 1
        tally.failures.append(SignatureFailure(
            offset, resp.effect_id, node,
            "unknown_key" if problem.code == "unknown_key" else "invalid", problem.detail))
    return tally


def latest_keys(facts: Iterable[FactsRecord]) -> list[FactsRecord]:
    """``facts`` (oldest first) with only the latest record of each (node, key id, public key):
    all that :func:`check_signatures` reads of them, so a holder that reads ``sys.facts`` for
    weeks keeps one record per key, not every heartbeat."""
    latest: dict[tuple[str, str, str], FactsRecord] = {}
    for f in facts:
        key = (f.node_id, f.key_id, f.public_key)
        latest.pop(key, None)
        latest[key] = f
    return list(latest.values())
