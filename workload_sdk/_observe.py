"""What the lease holder's metrics say, computed from what the pure code holds: no I/O, no
Prometheus (replay and the test simulator never import this module's users).

The holder's shell (:mod:`workload_sdk._holder`) calls these with its state and the broker's
answers (committed offsets of the executor groups, end offsets), and hands the results to
:class:`~workload_sdk._holder_metrics.HolderMetrics`; nothing here decides anything the log
records.

Unread requests (``fx_workload_unread_requests{workload,group}``): the requests of this workload
still waiting for an answer whose ``.out`` offset the executor group serving their kind has not
committed past. An executor commits the lowest offset it has not settled (answered), so this counts
requests no executor of the group has read yet and, for a moment, those read and still being
answered (``fx_executor_workload_queue_depth`` counts those). Counting the holder's own pending
requests, not ``end offset - committed``, leaves out the step outputs and transaction markers that
share ``.out``: an idle workload reads 0, exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker_schema import FactsRecord, ResponseRecord
from workload_sdk._why import verify_signature

if TYPE_CHECKING:
    from broker_schema.key_history import KeyHistory

__all__ = ["DEFAULT_GROUP_PREFIXES", "SIGNATURE_FAILURE_REASONS", "PendingRequest",
           "SignatureFailure", "SignatureTally", "check_signatures", "executor_groups",
           "holder_written", "latest_keys",
           "merge_lag", "outstanding_by_kind", "unread_requests"]

#: The consumer group prefixes whose groups read ``wl.*.out``: executors
#: (``executor.config.ExecutorConfig.group_prefix``) and actuator gateways
#: (``actuator.config``); a group is ``<prefix>.<kind>``.
DEFAULT_GROUP_PREFIXES: tuple[str, ...] = ("fx-executor", "fx-actuator")


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """A request of this workload waiting for its answer: its kind and its offset on ``.out``."""

    effect_kind: str
    offset: int


def outstanding_by_kind(kinds: Iterable[str], pending_kinds: Iterable[str]) -> dict[str, int]:
    """Requests written and not yet merged, per kind: every kind in ``kinds`` (the spec's, so a
    kind that drains reads 0 rather than vanishing) plus any other kind still pending."""
    counts = dict.fromkeys(kinds, 0)
    for kind in pending_kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def executor_groups(prefixes: Sequence[str], kinds: Iterable[str],
                    existing: Set[str]) -> dict[str, str]:
    """The consumer groups that serve each kind, as ``group -> kind``: ``<prefix>.<kind>`` for
    every prefix whose group exists on the broker (``existing``); for a kind no such group
    exists for, the first prefix's (nobody has ever read its requests: all of them are unread)."""
    out: dict[str, str] = {}
    for kind in kinds:
        found = [f"{p}.{kind}" for p in prefixes if f"{p}.{kind}" in existing]
        for group in found or ([f"{prefixes[0]}.{kind}"] if prefixes else []):
            out[group] = kind
    return out


def unread_requests(groups: Mapping[str, str], committed: Mapping[str, int | None],
                    pending: Iterable[PendingRequest]) -> dict[str, int]:
    """Per group of ``groups`` (``group -> kind``): the pending requests of its kind at or past
    the offset it committed on ``.out`` (``committed[group]``; None or absent: nothing committed,
    so every one is unread)."""
    requests = list(pending)
    out: dict[str, int] = {}
    for group, kind in groups.items():
        position = committed.get(group)
        start = 0 if position is None or position < 0 else position
        out[group] = sum(1 for r in requests if r.effect_kind == kind and r.offset >= start)
    return out


def merge_lag(end_offset: int | None, position: int | None) -> int | None:
    """Records on ``.resp`` the holder has not read yet: ``end_offset - position`` (never below
    0); None when either is not known yet."""
    if end_offset is None or position is None:
        return None
    return max(0, end_offset - position)


# -- signatures (fx_holder_signatures_checked_total, fx_holder_signature_failures_total) -----

#: Why a response's signature failed, as ``fx_holder_signature_failures_total`` labels it:
#: ``invalid`` (it does not verify: a forged or altered response, or a key another node
#: publishes, or with a key history one the fleet key does not certify for that node),
#: ``unknown_key`` (no facts record publishes the signer's key, even after reading
#: ``sys.facts`` again), ``unsigned`` (no signature, and not a lease holder's
#: ``timeout``/``unknown``: every executor and gateway signs what it writes).
SIGNATURE_FAILURE_REASONS: tuple[str, ...] = ("invalid", "unknown_key", "unsigned")

#: The outcomes a lease holder writes itself, unsigned (it has no node key).
_HOLDER_OUTCOMES = frozenset({"timeout", "unknown"})


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
    retry: list[tuple[int, ResponseRecord]] = field(default_factory=list)


def holder_written(resp: ResponseRecord, holder_ids: Set[str]) -> bool:
    """A ``timeout``/``unknown`` a lease holder wrote: unsigned, no executor block, written by
    the holder id of a claim (the rule of ``fx audit``)."""
    return (resp.outcome in _HOLDER_OUTCOMES and resp.signature is None
            and resp.executor is None and resp.written_by in holder_ids)


def check_signatures(responses: Iterable[tuple[int, ResponseRecord]],
                     facts: list[FactsRecord], history: KeyHistory | None = None, *,
                     holder_ids: Set[str], final: bool) -> SignatureTally:
    """Check each ``(offset, response)`` read from ``.resp`` with the rule of ``fx why`` and
    ``fx audit`` (:func:`workload_sdk._why.verify_signature`: against ``facts``, the records on
    ``sys.facts``, or the fleet ``history``). A lease holder's own unsigned ``timeout`` or
    ``unknown`` (:func:`holder_written`) is neither checked nor a failure; an unsigned
    response of anyone else is an ``unsigned`` failure. A signed one that does not verify is
    put in ``retry`` unless ``final`` (the keys may be behind the response: read them again
    first); when ``final``, it is ``invalid`` (``valid`` False) or ``unknown_key`` (no key
    found). Pure: it decides nothing the merge log records."""
    tally = SignatureTally()
    for offset, resp in responses:
        node = resp.executor.node_id if resp.executor is not None else resp.written_by
        if resp.signature is None:
            if holder_written(resp, holder_ids):
                continue
            tally.checked += 1
            tally.failures.append(SignatureFailure(offset, resp.effect_id, node, "unsigned",
                                                   "the response carries no signature"))
            continue
        verdict = verify_signature(resp, facts, history)
        valid = verdict.get("valid")
        if valid is True:
            tally.checked += 1
            continue
        if not final:
            tally.retry.append((offset, resp))
            continue
        tally.checked += 1
        tally.failures.append(SignatureFailure(
            offset, resp.effect_id, node, "invalid" if valid is False else "unknown_key",
            str(verdict.get("reason", ""))))
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
