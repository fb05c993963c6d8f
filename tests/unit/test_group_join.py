"""fx_kafka.group_join: a consumer with several assignors sends one JoinGroup per rejoin.

aiokafka 0.14.0 sent one per assignor (the first with the first assignor's protocol alone),
which kept a group routed by model rebalancing without end (the module's docstring). What is
checked here is the request the join sends: the coordinator's answers are recorded ones, the
group's behaviour on a real broker is tests/integration/executor/test_routing.py's.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import aiokafka
import pytest
from aiokafka.consumer.group_coordinator import CoordinatorGroupRebalance
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocol

from fx_kafka import group_join, make_consumer
from fx_node.routing import ModelRouting

UNKNOWN_MEMBER_ID, MEMBER_ID_REQUIRED = 25, 79


class _Coordinator:
    """What a join asks of aiokafka's group coordinator; the broker's answers are ``answers``
    (error codes, in order), every request sent is kept."""

    def __init__(self, answers: list[int]) -> None:
        self.answers, self.sent = list(answers), []  # type: list[int], list[Any]
        self.member_id, self._group_instance_id, self.generation = "", None, -1
        self.reset, self._rebalance_timeout_ms = 0, 6000

    async def _send_req(self, request: Any) -> Any:
        # as sent (aiokafka builds the bytes at sending: what the request held then)
        self.sent.append(SimpleNamespace(member_id=request._member_id,
                                         protocols=list(request._group_protocols)))
        return SimpleNamespace(error_code=self.answers.pop(0), member_id="m-1")

    def reset_generation(self) -> None:
        self.reset += 1


def _rebalance(coordinator: _Coordinator, assignors: tuple[Any, ...]) -> Any:
    subscription = SimpleNamespace(topics={"wl.a.out", "wl.b.out"}, active=True)
    return CoordinatorGroupRebalance(coordinator, "g", 1, subscription, assignors, 6000, 100)


def _routing() -> ModelRouting:
    async def read(_: str) -> None:
        return None

    return ModelRouting(node_id="n1", kind="k", capacity=4, facts=lambda: None,
                        spec_of=lambda _: None, read_spec=read)


def test_installed_for_the_pinned_aiokafka() -> None:
    async def build() -> None:
        make_consumer("127.0.0.1:9")  # what installs it (not started: no broker asked)

    asyncio.run(build())
    assert aiokafka.__version__ in group_join.FIXED_VERSIONS, (
        "aiokafka is not the version fx_kafka.group_join fixes: check whether it still sends "
        "one JoinGroup per assignor (aio-libs/aiokafka#1168) and update FIXED_VERSIONS")
    assert group_join.installed()


@pytest.mark.parametrize("answers", [[UNKNOWN_MEMBER_ID], [MEMBER_ID_REQUIRED, UNKNOWN_MEMBER_ID]])
def test_one_join_request_carries_every_assignors_protocol(answers: list[int]) -> None:
    group_join.install()
    coordinator = _Coordinator(answers)
    assignors = (_routing().assignor(), RoundRobinPartitionAssignor)
    assert asyncio.run(_rebalance(coordinator, assignors).perform_group_join()) is None
    # one request (and, after MEMBER_ID_REQUIRED, the same one again with the id given)
    assert len(coordinator.sent) == len(answers)
    for request in coordinator.sent:
        assert [name for name, _ in request.protocols] == ["fx-model", "roundrobin"]
    assert [r.member_id for r in coordinator.sent] == ["", "m-1"][:len(answers)]
    assert coordinator.reset == 1  # UNKNOWN_MEMBER_ID handled as aiokafka does
    # the same protocol metadata every time it is built: sorted topics, canonical offer bytes
    first = dict(coordinator.sent[0].protocols)
    again = _Coordinator([UNKNOWN_MEMBER_ID])
    asyncio.run(_rebalance(again, assignors).perform_group_join())
    assert dict(again.sent[0].protocols) == first
    decoded = ConsumerProtocol.METADATA.decode(first["fx-model"])
    assert decoded.subscription == ["wl.a.out", "wl.b.out"]
