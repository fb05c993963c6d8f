"""The claims/spec catch-up (fx_node.sync.ClaimsSpecReader) on a real broker: every claim and
spec written before a read is seen by it, a new workload is added without re-reading the others,
and the side consumer is left with nothing to fetch between reads."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest

from broker_schema import INFERENCE_KIND, ExecutorInfo, encode, topics
from fx_kafka.client import make_consumer, make_producer
from fx_kafka.workload import ensure_shadow_topics, ensure_workload_topics
from fx_node.admission import ExecutorState
from fx_node.sync import ClaimsSpecReader
from tests.unit.executor.helpers import claim, spec

pytestmark = pytest.mark.integration

MODEL = "sha256:" + "ab" * 32


class CountingReader(ClaimsSpecReader):
    """The reader, counting the records it reads by topic."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: Counter[str] = Counter()

    def _observe(self, workload_id: str, msg: Any) -> None:
        self.seen[msg.topic] += 1
        super()._observe(workload_id, msg)


async def test_reads_everything_written_before_it_and_never_rereads(kafka_bootstrap: str) -> None:
    run = uuid.uuid4().hex[:8]
    wids = [f"sync-{run}-{i}" for i in range(3)]
    for wid in wids:
        await ensure_workload_topics(kafka_bootstrap, wid)
    producer = make_producer(kafka_bootstrap)
    side = make_consumer(kafka_bootstrap, isolation_level="read_uncommitted")
    probe = make_consumer(kafka_bootstrap, isolation_level="read_uncommitted")
    state = ExecutorState(node_id="n1", kinds={INFERENCE_KIND: 4}, engine_info=ExecutorInfo(
        node_id="n1", engine="none", engine_version="0", device_class="cpu"))
    undecodable: list[str] = []
    reader = CountingReader(state, side, probe, on_undecodable=undecodable.append)
    try:
        for client in (producer, side, probe):
            await client.start()
        for i, wid in enumerate(wids):
            await producer.send_and_wait(topics.spec(wid), encode(spec(wid, {"m": MODEL})),
                                         partition=0)
            await producer.send_and_wait(topics.claims(wid), encode(claim(wid, i + 1)),
                                         partition=0)

        await reader.read(wids[0])
        assert state.workload(wids[0]).highest_epoch == 1
        assert state.workload(wids[0]).spec is not None
        assert side.paused() == side.assignment()  # nothing fetched between reads

        # a claim written after the first read is seen by the next one
        await producer.send_and_wait(topics.claims(wids[0]), encode(claim(wids[0], 7)),
                                     partition=0)
        await reader.read(wids[0])
        assert state.workload(wids[0]).highest_epoch == 7

        # two more workloads: each read from its beginning, the first never read again
        first = dict(reader.seen)
        await reader.read(wids[1])
        await reader.read(wids[2])
        assert {tp.topic for tp in side.assignment()} == {
            t for wid in wids for t in (topics.claims(wid), topics.spec(wid))}
        assert side.paused() == side.assignment()
        for topic, n in first.items():
            assert reader.seen[topic] == n, topic
        assert state.workload(wids[1]).highest_epoch == 2
        assert state.workload(wids[2]).highest_epoch == 3
        assert reader.seen[topics.claims(wids[1])] == reader.seen[topics.claims(wids[2])] == 1

        # and the first workload's later records are still read from where it left off
        await producer.send_and_wait(topics.claims(wids[0]), encode(claim(wids[0], 9)),
                                     partition=0)
        await producer.send_and_wait(topics.claims(wids[0]), b"not a record", partition=0)
        await reader.read(wids[0])
        assert state.workload(wids[0]).highest_epoch == 9
        assert reader.seen[topics.claims(wids[0])] == 4
        assert undecodable == ["not_json"]
        # a shadow evaluation of a watched workload adds its .eval only
        await ensure_shadow_topics(kafka_bootstrap, wids[1], "eval-1")
        before = dict(reader.seen)
        await reader.read(wids[1], shadow="eval-1")
        assert topics.shadow_stream(wids[1], "eval-1", "eval") in {
            tp.topic for tp in side.assignment()}
        assert dict(reader.seen) == before
        # nothing new: a read reads nothing
        before = dict(reader.seen)
        for wid in wids:
            await reader.read(wid)
        assert dict(reader.seen) == before
    finally:
        for client in (producer, side, probe):
            await client.stop()
