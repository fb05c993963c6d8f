"""Routing by model (issue 27, part 5): the pure decision of which executor reads which workload
topic (:func:`broker_schema.routing.route`) and the member metadata it decides from."""

from __future__ import annotations

from broker_schema.records import INFERENCE_KIND, BindingSwitch, SpecRecord
from broker_schema.routing import (
    MemberOffer,
    needed_models,
    offer_bytes,
    parse_offer,
    route,
    serves,
)

A, B, C = ("sha256:" + c * 64 for c in "abc")


def offer(node: str, *models: str, capacity: int = 4) -> MemberOffer:
    return MemberOffer(node_id=node, models=frozenset(models), kinds=frozenset({"k"}),
                       capacity=capacity)


def test_offer_round_trips_and_bad_bytes_are_no_offer() -> None:
    o = offer("n1", B, A, capacity=8)
    assert parse_offer(offer_bytes(o)) == o
    assert offer_bytes(o) == offer_bytes(offer("n1", A, B, capacity=8))  # canonical
    for bad in (b"", b"7", b"not json", b'{"fx_route": 2}', b'{"fx_route": 1}',
                b'{"fx_route":1,"node":"n","models":[1],"kinds":[],"capacity":1}',
                b'{"fx_route":1,"node":"n","models":[],"kinds":[],"capacity":true}',
                b"x" * 70_000):
        assert parse_offer(bad) is None, bad
    assert parse_offer(b'{"fx_route":1,"node":"n","models":[],"kinds":[],"capacity":0}'
                       ) == MemberOffer("n", capacity=1)


def test_each_workload_goes_to_a_member_holding_all_its_models() -> None:
    members = {"m1": offer("n1", A), "m2": offer("n2", B), "m3": offer("n3", A, B)}
    parts = {f"wl.w{i}.out": [0] for i in range(6)}
    needs = {"wl.w0.out": frozenset({A}), "wl.w1.out": frozenset({B}),
             "wl.w2.out": frozenset({A, B}), "wl.w3.out": frozenset({A}),
             "wl.w4.out": frozenset({B}), "wl.w5.out": None}
    r = route(members, parts, needs)
    owner = {tp[0]: m for m, tps in r.assignment.items() for tp in tps}
    assert sorted(owner) == sorted(parts) and not r.unserved
    assert owner["wl.w2.out"] == "m3"  # the only one with both
    for topic, m in owner.items():
        assert serves(members[m].models, needs[topic]), (topic, m)  # type: ignore[union-attr]
    # balanced: six topics over three members of equal capacity, two each
    assert sorted(len(v) for v in r.assignment.values()) == [2, 2, 2]
    assert r == route(dict(reversed(members.items())), parts, needs)  # order-free


def test_capacity_weights_the_balance() -> None:
    members = {"big": offer("n1", A, capacity=30), "small": offer("n2", A, capacity=10)}
    parts = {f"wl.w{i}.out": [0] for i in range(8)}
    r = route(members, parts, dict.fromkeys(parts, frozenset({A})))
    assert (len(r.assignment["big"]), len(r.assignment["small"])) == (6, 2)


def test_a_workload_nobody_can_serve_is_reported_and_still_assigned() -> None:
    members = {"m1": offer("n1", A), "m2": offer("n2", B)}
    parts = {"wl.w0.out": [0], "wl.w1.out": [0]}
    r = route(members, parts, {"wl.w0.out": frozenset({A, B}), "wl.w1.out": frozenset({A})})
    assert r.unserved == {"wl.w0.out": tuple(sorted((A, B)))}
    owner = {tp[0]: m for m, tps in r.assignment.items() for tp in tps}
    assert owner["wl.w1.out"] == "m1" and owner["wl.w0.out"] == "m2"  # the least loaded
    assert route({}, parts, {"wl.w0.out": frozenset({C})}).unserved == {
        "wl.w0.out": (C,), "wl.w1.out": ()}


def test_members_without_an_offer_take_only_workloads_needing_nothing() -> None:
    members = {"old": None, "new": offer("n", A)}
    parts = {"wl.a.out": [0], "wl.b.out": [0], "wl.c.out": [0, 1]}
    r = route(members, parts, {"wl.a.out": frozenset({A})})
    assert ("wl.a.out", 0) in r.assignment["new"]
    assert sum(len(v) for v in r.assignment.values()) == 4 and not r.unserved


def test_needed_models_is_the_latest_binding() -> None:
    switch = BindingSwitch(at_input_offset=10, models={"m": B, "n": C})
    spec = SpecRecord(workload_id="w", module_hash=C, effect_kinds=(INFERENCE_KIND,),
                      models={"m": A}, binding_switches=(switch,))
    assert needed_models(spec) == frozenset({B, C})
    assert needed_models(None) is None
    assert serves([A], None) and serves([A, B], frozenset({A})) and not serves([A],
                                                                              frozenset({B}))


def test_a_member_gets_only_topics_it_subscribed_to() -> None:
    """Members subscribe by pattern and see a new topic at their own metadata refresh: a topic
    given to a member that has not seen it would be refused by its client (a rejoin, and on a
    broker where topics keep coming, rebalances without end: seen before this rule)."""
    members = {"m1": offer("n1", A), "m2": offer("n2", A), "m3": offer("n3", A, B)}
    parts = {"wl.new.out": [0], "wl.old.out": [0], "wl.b.out": [0], "wl.none.out": [0]}
    needs = {"wl.new.out": frozenset({A}), "wl.old.out": frozenset({A}),
             "wl.b.out": frozenset({B}), "wl.none.out": frozenset({C})}
    subs = {"m1": ["wl.old.out"], "m2": ["wl.old.out", "wl.new.out", "wl.none.out"],
            "m3": ["wl.old.out", "wl.b.out"]}
    r = route(members, parts, needs, subs)
    owner = {tp[0]: m for m, tps in r.assignment.items() for tp in tps}
    assert owner["wl.new.out"] == "m2" and owner["wl.b.out"] == "m3"
    for topic, m in owner.items():
        assert topic in subs[m], (topic, m)
    # nobody holds C: reported, and given to a member that subscribed to it
    assert r.unserved == {"wl.none.out": (C,)} and owner["wl.none.out"] == "m2"
    # the rule only narrows: with every member subscribed to everything, the same routing
    everything = {m: list(parts) for m in members}
    assert route(members, parts, needs, everything) == route(members, parts, needs)


def test_the_join_metadata_is_the_same_bytes_for_the_same_facts() -> None:
    # the coordinator starts a rebalance whenever a known member rejoins with other metadata:
    # the same models, in whatever order the facts list them, must give the same bytes
    from broker_schema.records import FactsRecord, KindServed
    from fx_node.routing import ModelRouting

    def facts(*models: str) -> FactsRecord:
        return FactsRecord(node_id="n1", kinds=(KindServed(kind=INFERENCE_KIND, queue_limit=4),),
                           models_present=models, models_loaded=models[:1],
                           public_key="MCowBQYDK2VwAyEA", key_id=A, updated_us=1)

    async def read(_: str) -> None:
        return None

    seen = [facts(A, B, C), facts(C, A, B), facts(B, C, A)]
    routing = ModelRouting(node_id="n1", kind=INFERENCE_KIND, capacity=4, facts=lambda: seen[0],
                           spec_of=lambda _: None, read_spec=read)
    assignor = routing.assignor()
    built = set()
    for _ in range(3):
        built.add(assignor.metadata({"wl.b.out", "wl.a.out", "wl.c.out"}).encode())
        seen.pop(0)
    assert len(built) == 1
    assert routing.sent == offer_bytes(MemberOffer(
        node_id="n1", models=frozenset({A, B, C}), kinds=frozenset({INFERENCE_KIND}), capacity=4))
