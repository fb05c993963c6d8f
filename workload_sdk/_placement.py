"""Placement: may a holder claim a workload here and now? Pure (the holder reads ``sys.facts``).

A workload is placed only where what it binds can run: every effect kind its spec binds is
served by a live node (an executor or an actuator gateway) on ``sys.facts``, at the guarantee
the spec declares for it (``SpecRecord.guarantees``), every model hash of its latest binding
(what its steps from the latest switch on name) is present on a live node that serves one of the
kinds it binds, and one such node holds all of them: executors route by model (a workload's
requests go to one member of a kind's group, one holding every model of that binding,
:mod:`broker_schema.routing`), so models spread over several nodes serve nothing. "Live": its
latest facts were written at most ``max_age_s`` ago by the holder's clock (nodes republish
every ``facts_interval_s``, 60 s by default). docs/actuation.md, "Placement".
"""

from __future__ import annotations

from collections.abc import Iterable

from broker_schema import FactsRecord, SpecRecord
from broker_schema.routing import LATEST_BINDING, needed_models, serves

__all__ = ["LATEST_BINDING", "chunk_store_problem", "live_facts", "placement_missing"]


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
    """What no live node serves, as ``kind <kind>``, ``kind <kind> as <guarantee>``,
    ``model <hash>`` and, when each model is held by some node but none holds them all,
    ``models <hash> + <hash> together``; empty when the workload can be placed."""
    live = live_facts(facts, now_us=now_us, max_age_s=max_age_s)
    missing: list[str] = []
    for kind in spec.effect_kinds:
        want = spec.guarantees.get(kind)
        if not any(k.kind == kind and (want is None or k.guarantee == want)
                   for f in live for k in f.kinds):
            missing.append(f"kind {kind}" + (f" as {want}" if want else ""))
    bound = set(spec.effect_kinds)
    holders = [f for f in live if bound & {k.kind for k in f.kinds}]
    needed = needed_models(spec) or frozenset()
    for model in sorted(needed):
        if not any(model in f.models_present for f in holders):
            missing.append(f"model {model}")
    if (len(needed) > 1 and not any(m.startswith("model ") for m in missing)
            and not any(serves(f.models_present, needed) for f in holders)):
        missing.append(f"models {' + '.join(sorted(needed))} together")
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
