"""The shell of routing by model (the decision: :func:`broker_schema.routing.route`, pure).

For each effect kind whose requests name models (an executor's kinds that are not handler
kinds), the kind's consumer group uses :class:`ModelRouting`'s assignor: every member's
subscription carries its offer (:func:`broker_schema.routing.offer_bytes`: the model hashes in
its latest facts, present or loaded, its kinds, and the kind's queue limit as capacity), and the
group leader assigns with :func:`~broker_schema.routing.route` from the offers and what each
workload's spec binds. The specs are read here, in the background (:meth:`ModelRouting.watch`):
the assignor runs synchronously inside aiokafka's join, so it only reads what was gathered. When
what this member offers or what it knows of the specs changes, it asks the group to rebalance.
Round robin stays the fallback protocol (a group with an older member uses it).

A workload no member can serve is logged (a warning naming the models), counted in the
executor's ``fx_executor_unrouted_workloads{kind}`` gauge, and still assigned (answered
``model_unknown`` rather than left to time out); the lease holder's placement check refuses it
in the first place (``workload_sdk._placement``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from broker_schema import FactsRecord, SpecRecord, topics
from broker_schema.routing import (
    MemberOffer,
    Routing,
    needed_models,
    offer_bytes,
    parse_offer,
    route,
)

__all__ = ["ROUTING_CHECK_S", "ModelRouting", "routing_for"]

log = logging.getLogger(__name__)


class ModelRouting:
    """One kind's routing on one node: its assignor class, and the gathering of its inputs."""

    def __init__(self, *, node_id: str, kind: str, capacity: int,
                 facts: Callable[[], FactsRecord | None],
                 spec_of: Callable[[str], SpecRecord | None],
                 read_spec: Callable[[str], Awaitable[None]],
                 on_unrouted: Callable[[int], None] | None = None) -> None:
        self.node_id, self.kind, self.capacity = node_id, kind, capacity
        self._facts, self._spec_of, self._read_spec = facts, spec_of, read_spec
        self._on_unrouted = on_unrouted
        #: topic -> the models its workload binds (None: spec not known yet); what assign reads
        self.needs: dict[str, frozenset[str] | None] = {}
        #: the offer this member last sent, and the last routing it computed as the leader
        self.sent: bytes | None = None
        self.last: Routing | None = None
        #: what the last decision (as the group leader) took each topic to need
        self.last_needs: dict[str, frozenset[str] | None] | None = None
        #: this member led the generation being synced (see ``on_assignment``)
        self.decided = False

    # -- inputs ----------------------------------------------------------------------------------
    def offer(self) -> MemberOffer:
        """What this member serves, from its latest facts."""
        facts = self._facts()
        models = frozenset() if facts is None else frozenset(
            facts.models_present) | frozenset(facts.models_loaded)
        kinds = frozenset() if facts is None else frozenset(k.kind for k in facts.kinds)
        return MemberOffer(node_id=self.node_id, models=models, kinds=kinds,
                           capacity=max(1, self.capacity))

    def need_of(self, topic: str) -> frozenset[str] | None:
        """What a request topic's workload binds (shadow evaluations: None, any member)."""
        try:
            wid, shadow = topics.request_topic(topic)
        except ValueError:
            return None
        return None if shadow is not None else needed_models(self._spec_of(wid))

    async def refresh(self, subscribed: Iterable[str]) -> bool:
        """Read the spec of every subscribed workload not yet known, recompute the needs;
        whether the needs or this member's offer changed since the last join."""
        for topic in sorted(set(subscribed)):
            try:
                wid, shadow = topics.request_topic(topic)
            except ValueError:
                continue
            if shadow is None and self._spec_of(wid) is None:
                try:
                    await self._read_spec(wid)
                except Exception as exc:  # a workload being deleted, a broker away: next round
                    log.debug("routing: spec of %s not read: %r", wid, exc)
        subscribed = set(subscribed)
        self.needs.update({t: self.need_of(t) for t in subscribed})
        # the leader: a workload's spec learned or changed since its last decision; any
        # member: what it offers changed since it last joined (topics coming and going
        # rebalance by themselves: aiokafka watches the pattern)
        stale = self.last_needs is not None and any(
            t in self.last_needs and self.last_needs[t] != self.needs[t] for t in subscribed)
        offer_changed = self.sent is not None and offer_bytes(self.offer()) != self.sent
        return stale or offer_changed

    async def watch(self, consumer: Any, interval_s: float) -> None:
        """Every ``interval_s``: refresh, and ask for a rebalance when something changed."""
        while True:
            await asyncio.sleep(interval_s)
            subscribed = consumer.subscription() or set()
            if await self.refresh(subscribed) and consumer.assignment() is not None:
                log.info("%s: models or specs changed: rebalancing to route by model",
                         self.kind)
                consumer._coordinator.request_rejoin()

    # -- the assignor ----------------------------------------------------------------------------
    def decide(self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
               ) -> Routing:
        """The group leader's decision, from the members' offers and the gathered needs."""
        subscribed = {t for md in members.values() for t in md.subscription}
        partitions = {t: sorted(cluster.partitions_for_topic(t) or ()) for t in subscribed}
        partitions = {t: p for t, p in partitions.items() if p}
        needs = {t: self.need_of(t) for t in partitions}
        self.needs.update(needs)
        self.last_needs = needs
        routing = route({m: parse_offer(md.user_data) for m, md in members.items()},
                        partitions, needs,
                        {m: md.subscription for m, md in members.items()})
        self.last = routing
        for topic, models in sorted(routing.unserved.items()):
            log.warning("%s: no executor in the group serves every model %s binds (%s): "
                        "its requests are answered model_unknown until one does", self.kind,
                        topic, ", ".join(models) or "none known")
        if self._on_unrouted is not None:
            self._on_unrouted(len(routing.unserved))
        return routing

    def assignor(self) -> type[AbstractPartitionAssignor]:
        """An assignor class bound to this routing (aiokafka calls assignors as classes)."""
        routing = self

        class ModelAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
            name = "fx-model"
            version = 0

            @classmethod
            def metadata(cls, topics_: Iterable[str]) -> ConsumerProtocolMemberMetadata:
                routing.sent = offer_bytes(routing.offer())
                log.debug("%s: joining with offer %s", routing.kind, routing.sent.decode())
                return ConsumerProtocolMemberMetadata(cls.version, sorted(topics_), routing.sent)

            @classmethod
            def assign(cls, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
                       ) -> dict[str, ConsumerProtocolMemberAssignment]:
                decided = routing.decide(cluster, members)
                routing.decided = True
                out = {}
                for m in members:
                    by_topic: dict[str, list[int]] = {}
                    for topic, p in decided.assignment.get(m, ()):
                        by_topic.setdefault(topic, []).append(p)
                    out[m] = ConsumerProtocolMemberAssignment(
                        cls.version, sorted(by_topic.items()), b"")
                return out

            @classmethod
            def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
                # every member, after each generation: one that did not lead it keeps no
                # decision of its own to compare specs against (the leader's is what counts)
                if not routing.decided:
                    routing.last_needs = None
                routing.decided = False

        return ModelAssignor


#: How often a member looks again at its models and the workloads' specs (seconds).
ROUTING_CHECK_S = 2.0


def routing_for(node: Any, kind: str) -> tuple[tuple[type[AbstractPartitionAssignor], ...],
                                               ModelRouting | None]:
    """The assignors of ``kind``'s consumer group on ``node`` (a :class:`fx_node.shell.NodeShell`)
    and its routing: by model (round robin as the fallback protocol) when the runner says the
    kind's requests name models (``model_kinds``), else round robin alone (one partition per
    workload topic: the default range assignor would give every topic's partition 0 to the
    same member)."""
    runner = node.runner
    if kind not in getattr(runner, "model_kinds", frozenset()):
        return (RoundRobinPartitionAssignor,), None
    gauge = getattr(node.metrics, "unrouted_workloads", None)
    routing = ModelRouting(
        node_id=node.settings.node_id, kind=kind,
        capacity=int(runner.state.queue_limits.get(kind) or 1), facts=lambda: node.facts,
        spec_of=lambda wid: getattr(runner.state.workloads.get(wid), "spec", None),
        read_spec=node.sync_read,
        on_unrouted=None if gauge is None else gauge.labels(kind=kind).set)
    return (routing.assignor(), RoundRobinPartitionAssignor), routing
