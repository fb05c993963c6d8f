"""Routing by model: which executor of an effect kind's consumer group reads which workload.

Each kind's consumer group (``fx_node.shell``, consumers on ``wl.*.out``) assigns the workload
topics' partitions to its members. Round robin is blind to models: a member without a
workload's model answers ``model_unknown`` forever (the retry lands on the same partition). So
every member says what it serves in its group member metadata (its subscription's user data,
:func:`offer_bytes`): the model hashes it holds, the kinds it serves and its capacity (the
kind's queue limit); and the group leader's assignor gives each workload topic's partitions to
a member that holds every model the workload's spec binds (its latest binding,
:func:`needed_models`), balanced by capacity (:func:`route`, pure). A workload no member can
serve is reported (:attr:`Routing.unserved`) and still assigned, to the least loaded member, so
its requests are answered (``model_unknown``) rather than left to time out.

One home for both sides: the executor's assignor (``fx_node.shell``) and the lease holder's
placement check (``workload_sdk._placement``) use :func:`serves` and :func:`needed_models`.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from broker_schema.records import SpecRecord

__all__ = ["LATEST_BINDING", "OFFER_VERSION", "MemberOffer", "Routing", "needed_models",
           "offer_bytes", "parse_offer", "route", "serves"]

#: The input offset past every binding switch: the latest binding.
LATEST_BINDING = 2**53 - 1
#: Version of the user-data document (``{"fx_route": 1, ...}``).
OFFER_VERSION = 1
_MAX_OFFER_BYTES = 64 * 1024


@dataclass(frozen=True)
class MemberOffer:
    """What one group member serves: model hashes it holds, effect kinds, capacity (> 0)."""

    node_id: str
    models: frozenset[str] = frozenset()
    kinds: frozenset[str] = frozenset()
    capacity: int = 1


def offer_bytes(offer: MemberOffer) -> bytes:
    """The member's user data: canonical JSON, sorted (the same offer, the same bytes)."""
    doc = {"fx_route": OFFER_VERSION, "node": offer.node_id, "models": sorted(offer.models),
           "kinds": sorted(offer.kinds), "capacity": offer.capacity}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def parse_offer(data: bytes) -> MemberOffer | None:
    """The offer in ``data``, or None when it holds none (empty, too large, not this format):
    a member that says nothing serves only workloads that need no model."""
    if not data or len(data) > _MAX_OFFER_BYTES:
        return None
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("fx_route") != OFFER_VERSION:
            return None
        models, kinds, capacity = doc["models"], doc["kinds"], doc["capacity"]
        if (not isinstance(models, list) or not isinstance(kinds, list)
                or not all(isinstance(m, str) for m in models + kinds)
                or not isinstance(capacity, int) or isinstance(capacity, bool)):
            return None
        return MemberOffer(node_id=str(doc["node"]), models=frozenset(models),
                           kinds=frozenset(kinds), capacity=max(1, capacity))
    except (ValueError, KeyError, TypeError):
        return None


def needed_models(spec: SpecRecord | None) -> frozenset[str] | None:
    """The model hashes a member must hold to serve the workload of ``spec``: its latest
    binding (what its steps from the latest switch on name). None when the spec is not known
    yet (any member will do until it is)."""
    if spec is None:
        return None
    return frozenset(spec.models_at(LATEST_BINDING).values())


def serves(held: Iterable[str], needed: frozenset[str] | None) -> bool:
    """Whether a member holding ``held`` serves a workload needing ``needed``."""
    return needed is None or needed <= set(held)


@dataclass(frozen=True)
class Routing:
    """The decision: member id -> its partitions (``(topic, partition)``, sorted), and the
    topics no member can serve -> the models none of the members holds all of (sorted)."""

    assignment: dict[str, tuple[tuple[str, int], ...]]
    unserved: dict[str, tuple[str, ...]] = field(default_factory=dict)


def route(members: Mapping[str, MemberOffer | None],
          partitions: Mapping[str, Iterable[int]],
          needs: Mapping[str, frozenset[str] | None],
          subscriptions: Mapping[str, Iterable[str]] | None = None) -> Routing:
    """Assign every partition of ``partitions`` (topic -> its partition numbers) to one of
    ``members`` (member id -> its offer, None: it said nothing). ``needs``: topic -> the model
    hashes its workload binds (:func:`needed_models`; a topic not in it needs nothing known).

    A topic's partitions go to the members that hold every model it needs (the eligible), each
    partition to the eligible member with the least load per capacity after taking it (ties:
    the smaller member id); topics with the fewest eligible members are placed first, so a
    topic that only one member can serve is never crowded out. A topic with no eligible member
    is in ``unserved`` and goes, after all the others, to the least loaded member of all.
    ``subscriptions`` (member id -> the topics it subscribed to, when given): a member only ever
    gets a topic it subscribed to. Members subscribe by pattern and learn of a new topic at
    their own next metadata refresh, so a topic given to a member that has not seen it yet is
    refused by that member's client, which rejoins: a rebalance after every new topic, without
    end on a broker where topics keep coming.
    Deterministic: the same inputs, the same routing, on whichever member leads the group."""
    ids = sorted(members)
    assigned: dict[str, list[tuple[str, int]]] = {m: [] for m in ids}
    if not ids:
        return Routing({}, {t: tuple(sorted(needs.get(t) or ())) for t in sorted(partitions)})
    load = dict.fromkeys(ids, 0)

    def capacity(m: str) -> int:
        offer = members[m]
        return offer.capacity if offer is not None else 1

    subscribed = None if subscriptions is None else {
        m: frozenset(subscriptions.get(m, ())) for m in ids}

    def takers(topic: str) -> list[str]:
        return [m for m in ids if subscribed is None or topic in subscribed[m]]

    def eligible(topic: str) -> list[str]:
        need = needs.get(topic)
        pool = []
        for m in takers(topic):
            offer = members[m]
            if not need or (offer is not None and serves(offer.models, need)):
                pool.append(m)
        return pool

    pools = {t: eligible(t) for t in partitions}
    # the hardest to place first; the ones nobody can serve last (they must not crowd others)
    order = sorted(partitions, key=lambda t: (not pools[t], len(pools[t]), t))
    unserved: dict[str, tuple[str, ...]] = {}
    for topic in order:
        pool = pools[topic]
        if not pool:
            unserved[topic] = tuple(sorted(needs.get(topic) or ()))
            pool = takers(topic)
            if not pool:  # nobody subscribed to it (cannot come from a group's own members)
                continue
        for p in sorted(set(partitions[topic])):
            best = min(pool, key=lambda m: ((load[m] + 1) / capacity(m), load[m], m))
            assigned[best].append((topic, p))
            load[best] += 1
    return Routing({m: tuple(sorted(v)) for m, v in assigned.items()}, unserved)
