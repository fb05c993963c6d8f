"""Placement: may a holder claim a workload here and now? Pure (the holder reads ``sys.facts``).

A workload is placed only where what it binds can run: every effect kind its spec binds is
served by a live node (an executor or an actuator gateway) on ``sys.facts``, at the guarantee
the spec declares for it (``SpecRecord.guarantees``), and every model hash of its latest binding
(what its steps from the latest switch on name) is present on a live node that serves one of the
kinds it binds. "Live": its latest facts were written at most ``max_age_s`` ago by the holder's
clock (nodes republish every ``facts_interval_s``, 60 s by default). docs/actuation.md,
"Placement".
"""

from __future__ import annotations

from collections.abc import Iterable

from broker_schema import FactsRecord, SpecRecord

__all__ = ["LATEST_BINDING", "chunk_store_problem", "live_facts", "placement_missing"]

#: The input offset whose binding :func:`placement_missing` checks: past every switch.
LATEST_BINDING = 2**53 - 1


def live_facts(facts: Iterable[FactsRecord], *, now_us: int, max_age_s: float
               ) -> list[FactsRecord]:
    """Each node's latest facts (the last in log order), if written within ``max_age_s``."""
    latest: dict[str, FactsRecord] = {}
    for record in facts:
        latest[record.node_id] = record
    horizon = now_us - int(max_age_s * 1_000_000)
    return [f for f in latest.values() if f.updated_us >= horizon]


def placement_missing(spec: SpecRecord, facts: Iterable[FactsRecord], *, now_us: int,
                      max_age_s: float) -> list[str]:
    """What no live node serves, as ``kind <kind>``, ``kind <kind> as <guarantee>`` and
    ``model <hash>``; empty when the workload can be placed."""
    live = live_facts(facts, now_us=now_us, max_age_s=max_age_s)
    missing: list[str] = []
    for kind in spec.effect_kinds:
        want = spec.guarantees.get(kind)
        if not any(k.kind == kind and (want is None or k.guarantee == want)
                   for f in live for k in f.kinds):
            missing.append(f"kind {kind}" + (f" as {want}" if want else ""))
    bound = set(spec.effect_kinds)
    for model in sorted(set(spec.models_at(LATEST_BINDING).values())):
        if not any(model in f.models_present and bound & {k.kind for k in f.kinds}
                   for f in live):
            missing.append(f"model {model}")
    return missing


def chunk_store_problem(spec: SpecRecord, facts: Iterable[FactsRecord], *, holder_store: str,
                        holder_where: str, now_us: int, max_age_s: float
                        ) -> tuple[str | None, list[str]]:
    """Whether a holder whose chunk store is ``holder_store`` (``kafka`` or ``fs``;
    ``holder_where`` says where, for people) may run ``spec``: ``(refusal, strays)``.

    Every service of a workload keeps chunks in one store, the spec's ``chunk_store``. The
    refusal (one line, None when it may run): the holder's store is not it, or some kind the
    spec binds is served by live nodes none of which uses it (what they write, the holder could
    never read). ``strays``: live nodes serving a bound kind with another store while others
    serve it with the spec's (``node (store)``): a node may serve other workloads only (its
    ``topic_pattern``), so these are worth a warning, not a refusal."""
    fix = "use one chunk store for every service (docs/operations.md, \"One chunk store\")"
    if holder_store != spec.chunk_store:
        return (f"this holder keeps chunks in {holder_where} ({holder_store}); the spec of "
                f"{spec.workload_id} says chunk_store = {spec.chunk_store}: {fix}"), []
    live = live_facts(facts, now_us=now_us, max_age_s=max_age_s)
    strays: set[str] = set()
    for kind in spec.effect_kinds:
        serving = [f for f in live if any(k.kind == kind for k in f.kinds)]
        others = sorted(f"{f.node_id} ({f.chunk_store})" for f in serving
                        if f.chunk_store != spec.chunk_store)
        if serving and len(others) == len(serving):
            return (f"the spec of {spec.workload_id} says chunk_store = {spec.chunk_store} and "
                    f"this holder uses it, but every live node serving {kind} keeps chunks "
                    f"elsewhere: {', '.join(others)}: {fix}"), []
        strays.update(others)
    return None, sorted(strays)
