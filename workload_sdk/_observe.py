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
from dataclasses import dataclass

__all__ = ["DEFAULT_GROUP_PREFIXES", "PendingRequest", "executor_groups", "merge_lag",
           "outstanding_by_kind", "unread_requests"]

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
