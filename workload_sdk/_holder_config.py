"""How a lease holder is run (:class:`HolderConfig`) and what it counts (:class:`HolderStats`),
shared by the holder (:mod:`workload_sdk._holder`) and the objects it starts for its separate
jobs (signature watching, metrics observation, trimming).

The holder's jobs log under the holder's logger (:data:`HOLDER_LOG`, ``workload_sdk._holder``),
whichever module they live in, so its log lines read as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from workload_sdk._observe import DEFAULT_GROUP_PREFIXES

__all__ = ["HOLDER_LOG", "HolderConfig", "HolderStats"]

#: The logger of the lease holder and of every job it runs.
HOLDER_LOG = logging.getLogger("workload_sdk._holder")


@dataclass(frozen=True)
class HolderConfig:
    """How to run a lease holder.

    ``check_module``: refuse a module whose hash differs from the spec's ``module_hash``.
    ``max_batch``: most records per transaction. ``poll_ms``: longest wait for new records.
    ``tick_ms``: shortest gap between two ticks. ``trim_every_s``: trim the log by the spec's
    audit horizon this often (``fx trim``; None, the default: never). ``chunk_dir``: the chunk
    store is this directory (a filesystem store shared with the executors, the layout of
    :mod:`broker_schema.chunks`) instead of ``sys.chunks``. ``ref_wait_s``: how long a chunk or
    stream record an input or answer names is waited for before the holder stops.


    Placement (docs/actuation.md): before claiming a new epoch the holder checks that live nodes
    on ``sys.facts`` (facts at most ``facts_max_age_s`` old) serve every kind and model the spec
    binds; it waits up to ``placement_wait_s`` (None: for ever) for them, then raises
    :class:`Unplaced`. ``force_placement`` claims anyway and records what was missing in the
    claim (``ClaimRecord.forced``).

    Metrics (when the holder is given a :class:`~workload_sdk._holder_metrics.HolderMetrics`):
    every ``observe_every_s`` the shell asks the broker for the merge lag on ``.resp`` and the
    committed offsets on ``.out`` of the consumer groups ``<prefix>.<kind>`` for each prefix of
    ``executor_group_prefixes`` and each kind the spec binds (the executors' and actuator
    gateways' ``group_prefix``), for ``fx_workload_unread_requests``.

    Signatures (``check_signatures``; off by default here, on in ``fx workload run`` unless
    ``--no-signature-check``): the shell checks the signature of every response it reads from
    ``.resp`` once resumed, as an observation only (nothing merged, replayed or simulated
    depends on it), with the rule of ``fx why``/``fx audit``
    (:func:`workload_sdk._signature_tally.check_signatures`): against the keys on
    ``sys.facts``, read again every ``observe_every_s``, or, given ``fleet_keys`` (the fleet
    public keys, as ``--fleet-key``), against the key history they certify on ``sys.keys``.
    A response that does not verify is checked once more after the keys are read again;
    failures are counted (``fx_holder_signature_failures_total``) and logged at WARNING.
    """

    bootstrap: str
    workload_id: str
    holder_id: str
    check_module: bool = True
    max_batch: int = 500
    poll_ms: int = 100
    tick_ms: int = 20
    trim_every_s: float | None = None
    chunk_dir: str | None = None
    ref_wait_s: float = 30.0
    force_placement: bool = False
    placement_wait_s: float | None = 30.0
    facts_max_age_s: float = 300.0
    executor_group_prefixes: tuple[str, ...] = DEFAULT_GROUP_PREFIXES
    observe_every_s: float = 3.0
    check_signatures: bool = False
    fleet_keys: tuple[bytes, ...] = ()
    #: Sign every record written on ``.out`` (header ``fx-holder-sig``) with a key made for
    #: this holder, named in its claims (``holder_key``): executors answer only requests its
    #: epoch's holder signed (issue 30). Off: claims name no key, executors check nothing.
    sign_requests: bool = True


@dataclass
class HolderStats:
    """Counters of a running holder (and effect round trips, for benchmarks)."""

    steps: int = 0
    passed_over: int = 0
    outputs: int = 0
    transactions: int = 0
    ticks: int = 0
    outcomes_written: int = 0
    #: alarms written with at-most-once ``unknown`` outcomes (``sys.alarms``)
    alarms: int = 0
    rewritten_outputs: int = 0
    #: Snapshots written (``chunk_snapshots`` of them over the inline limit, their state a
    #: chunk), and snapshots that could not be made.
    snapshots: int = 0
    chunk_snapshots: int = 0
    snapshots_skipped: int = 0
    #: Referenced bodies (chunks, stream records) read before the step saw them.
    refs_resolved: int = 0
    #: Inputs skipped on the record (``quarantined``; an alarm each), and operators' skip
    #: orders for inputs already merged (nothing done).
    inputs_skipped: int = 0
    skip_orders_late: int = 0
    #: Where this holder started reading ``.in``/``.resp``/``.out`` on resume.
    resumed_from: dict[str, int] = field(default_factory=dict)
    #: In-process restarts from the log after a broker outage or a coordinator fence.
    broker_restarts: int = 0
    #: Specs appended while running: adopted from a later step, or refused (they would have
    #: rebound a step already taken).
    specs_adopted: int = 0
    specs_refused: int = 0
    #: Periodic trims run (``HolderConfig.trim_every_s``), and those that failed.
    trims: int = 0
    trims_failed: int = 0
    #: Response signatures checked (``HolderConfig.check_signatures``), and those that failed.
    signatures_checked: int = 0
    signature_failures: int = 0
    #: Responses left unchecked because the checks fell too far behind (logged).
    signatures_unchecked: int = 0
    #: ticks on ``.resp`` not written by their epoch's holder (rejected to ``sys.rejects``)
    foreign_ticks: int = 0
    #: Request append time (broker) to the step seeing its answer (local wall clock), in ms.
    roundtrips_ms: list[float] = field(default_factory=list)
