"""Prometheus metrics of one lease holder process (``fx workload run --http-port``).

One :class:`~prometheus_client.CollectorRegistry` per process (per :class:`HolderMetrics`), as
the executor has. The holder's shell updates them from what the pure code returns
(:class:`~workload_sdk._round.MergedBatch`, :mod:`workload_sdk._observe`); replay and the test
simulator never import this module. Names and meanings: ``docs/operations.md``, "The lease
holder's metrics".
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from broker_schema import PassOverReason
from workload_sdk._round import Answer
from workload_sdk._signature_tally import SIGNATURE_FAILURE_REASONS

__all__ = ["REJECTED_REASONS", "HolderMetrics"]

#: Round trips run from milliseconds (a classifier) to the executor lease (30 s by default).
_ROUND_TRIP_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)

#: Why a record on ``.resp`` was passed over, as ``fx_holder_rejected_responses_total`` labels
#: it: the merge log's reasons (``broker_schema.PassOverReason``) less ``not_an_answer`` (an
#: ``accepted`` record is bookkeeping, not a rejection), and the shell's own: ``undecodable``
#: (no valid record) and ``wrong_record`` (a valid record of a kind that does not belong on
#: ``.resp``).
REJECTED_REASONS = (*(r for r in get_args(PassOverReason) if r != "not_an_answer"),
                    "undecodable", "wrong_record", "foreign_tick")


class HolderMetrics:
    """The lease holder's metrics (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.leader = Gauge(
            "fx_holder_leader", "1 while this process holds the workload's lease, else 0",
            ["workload"], registry=r)
        self.epoch = Gauge(
            "fx_holder_epoch", "The lease epoch this process holds (0: none)", ["workload"],
            registry=r)
        self.outstanding = Gauge(
            "fx_holder_outstanding_requests",
            "Requests written to .out and not yet answered in the merge log, per kind",
            ["workload", "kind"], registry=r)
        self.merge_lag = Gauge(
            "fx_holder_merge_lag_records",
            "Records on .resp not yet read by the holder (end offset minus its position)",
            ["workload"], registry=r)
        self.outcomes = Counter(
            "fx_holder_outcomes",
            "Answers merged (seen by a step), by effect kind and outcome",
            ["workload", "kind", "outcome"], registry=r)
        self.round_trip = Histogram(
            "fx_holder_round_trip_seconds",
            "Request written (its broker append time) to its answer merged (holder clock)",
            ["workload", "kind"], buckets=_ROUND_TRIP_BUCKETS, registry=r)
        self.snapshot_age = Gauge(
            "fx_holder_snapshot_age_seconds",
            "Age of the newest snapshot on .merge this holder wrote or resumed from",
            ["workload"], registry=r)
        self.rejected = Counter(
            "fx_holder_rejected_responses",
            "Records on .resp passed over, by reason (" + ", ".join(REJECTED_REASONS) + ")",
            ["workload", "reason"], registry=r)
        self.unread = Gauge(
            "fx_workload_unread_requests",
            "Requests on .out waiting for an answer that the executor consumer group serving "
            "their kind has not committed past (not read yet, or being answered)",
            ["workload", "group"], registry=r)
        self.signatures_checked = Counter(
            "fx_holder_signatures_checked",
            "Responses read from .resp whose signature this holder checked (verified or "
            "failed; a holder's own unsigned timeout/unknown is not checked)",
            ["workload"], registry=r)
        self.signature_failures = Counter(
            "fx_holder_signature_failures",
            "Responses read from .resp whose signature failed, by reason ("
            + ", ".join(SIGNATURE_FAILURE_REASONS) + ")",
            ["workload", "reason"], registry=r)
        self.inputs_skipped = Counter(
            "fx_holder_inputs_skipped",
            "Inputs skipped on the record (quarantined merge entries, each with an alarm), by "
            "cause (unresolvable, step_raised, operator)",
            ["workload", "cause"], registry=r)
        self._unread_groups: dict[str, set[str]] = {}
        self._kinds: dict[str, set[str]] = {}
        self._snapshot_at: dict[str, float] = {}

    # -- updates (called by the holder's shell) -------------------------------------------------
    def lease(self, workload: str, *, held: bool, epoch: int) -> None:
        """Whether this process holds ``workload``'s lease now, and at which epoch."""
        self.leader.labels(workload).set(1 if held else 0)
        self.epoch.labels(workload).set(epoch if held else 0)

    def set_outstanding(self, workload: str, counts: Mapping[str, int]) -> None:
        """Pending requests per kind (:func:`workload_sdk._observe.outstanding_by_kind`)."""
        known = self._kinds.setdefault(workload, set())
        for kind in known - set(counts):  # a kind a new spec no longer binds, drained
            self.outstanding.labels(workload, kind).set(0)
        for kind, n in counts.items():
            self.outstanding.labels(workload, kind).set(n)
        known.update(counts)

    def merged(self, workload: str, answers: Iterable[Answer],
               passed_over_by: Mapping[str, int],
               round_trips_s: Iterable[tuple[str, float]] = ()) -> None:
        """One merged batch: its answers by outcome, what it passed over (``not_an_answer``
        left out), and the round trips of the answers whose request time is known."""
        for a in answers:
            self.outcomes.labels(workload, a.effect_kind, a.outcome).inc()
        for reason, n in passed_over_by.items():
            if reason != "not_an_answer" and n:
                self.rejected.labels(workload, reason).inc(n)
        for kind, seconds in round_trips_s:
            self.round_trip.labels(workload, kind).observe(max(0.0, seconds))

    def inputs_skipped_by(self, workload: str, causes: Iterable[str]) -> None:
        """Inputs skipped on the record, one cause each."""
        for cause in causes:
            self.inputs_skipped.labels(workload, cause).inc()

    def skipped(self, workload: str, reason: str) -> None:
        """A record on ``.resp`` the shell skipped (``undecodable``, ``wrong_record``)."""
        self.rejected.labels(workload, reason).inc()

    def signatures_on(self, workload: str) -> None:
        """Signatures are checked for ``workload``: every series starts at 0 (an alert on
        ``increase()`` sees the first failure)."""
        self.signatures_checked.labels(workload).inc(0)
        for reason in SIGNATURE_FAILURE_REASONS:
            self.signature_failures.labels(workload, reason).inc(0)

    def signatures(self, workload: str, checked: int, failed_by: Mapping[str, int]) -> None:
        """Signatures checked, and failures by reason
        (:func:`workload_sdk._signature_tally.check_signatures`)."""
        if checked:
            self.signatures_checked.labels(workload).inc(checked)
        for reason, n in failed_by.items():
            if n:
                self.signature_failures.labels(workload, reason).inc(n)

    def snapshot(self, workload: str, written_at_s: float) -> None:
        """The newest snapshot known was appended at ``written_at_s`` (Unix seconds)."""
        first = workload not in self._snapshot_at
        self._snapshot_at[workload] = max(written_at_s, self._snapshot_at.get(workload, 0.0))
        if first:
            self.snapshot_age.labels(workload).set_function(
                lambda: time.time() - self._snapshot_at[workload])

    def set_merge_lag(self, workload: str, records: int) -> None:
        """Records on ``.resp`` not read yet (:func:`workload_sdk._observe.merge_lag`)."""
        self.merge_lag.labels(workload).set(records)

    def set_unread(self, workload: str, by_group: Mapping[str, int]) -> None:
        """Unread requests per executor group (:func:`workload_sdk._observe.unread_requests`);
        a group no longer listed is removed."""
        for group in self._unread_groups.get(workload, set()) - set(by_group):
            self.unread.remove(workload, group)
        for group, n in by_group.items():
            self.unread.labels(workload, group).set(n)
        self._unread_groups[workload] = set(by_group)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
