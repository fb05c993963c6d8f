"""Edge to fleet: a site's log reaches the fleet's cluster through MirrorMaker 2 (``fx mirror``).

Two real local brokers, a site and a fleet. On the site, the file-type gate runs with the
project's real executor and magika (as in workload_sdk/test_e2e_executor.py). The mirror copies
the workload's streams and the system topics to the fleet; then the link is cut (the mirror is
stopped) while the site keeps appending inputs and deciding, and restored (started again on the
same state). The fleet's copy of every topic is then the site's: the same records, in the same
order, none twice, with the same offsets (as the project's reader reports them: the copy's own
offsets differ, which the test shows too) and the same times; and ``fx replay``, ``fx why``,
``fx verify`` and ``fx audit`` give the same answers on the fleet as on the site.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from broker_schema import OutputRecord, decode, topics
from fx_kafka.client import (
    MIRROR_OFFSET_HEADER,
    make_consumer,
    make_producer,
    mirror_header,
    read_partition,
)
from fx_kafka.errors import FetchError, JavaNotFoundError, MirrorError
from fx_kafka.local import LocalKafka
from fx_kafka.mirror import Mirror
from fx_kafka.workload import ensure_workload_topics
from tests.integration.harness import ExecutorHarness
from workload_sdk import WorkloadLog
from workload_sdk.examples.filetype_gate import GATE_KIND

pytestmark = pytest.mark.integration

MODULE = "workload_sdk.examples.filetype_gate:FiletypeGate"
ROOT = Path(__file__).resolve().parents[2]

BEFORE_CUT = (
    b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" * 20,
    b"import os\n\ndef main() -> None:\n    print(os.getcwd())\n\n" * 20,
)
WHILE_CUT = (
    b"<!DOCTYPE html>\n<html><head><title>t</title></head><body><p>hi</p></body></html>\n" * 20,
    b'{"name": "site", "values": [1, 2, 3], "nested": {"ok": true}}\n' * 20,
    b"#!/bin/bash\nset -euo pipefail\necho \"$HOME\"\nls -la /tmp\n" * 20,
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.fixture
async def site_and_fleet(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """Two local brokers of their own (the session broker is not used)."""
    site = LocalKafka(data_dir=tmp_path / "site", die_with_parent=True)
    fleet = LocalKafka(data_dir=tmp_path / "fleet", die_with_parent=True)
    try:
        try:
            await site.astart()
            await fleet.astart()
            # MirrorMaker 2 and the transform (deploy/local-kafka/fetch.sh --mirror: a JDK)
            await asyncio.to_thread(Mirror(state_dir=tmp_path / "fetch").fetch)
        except (JavaNotFoundError, FetchError) as exc:
            if _in_ci():
                pytest.fail(f"CI=true and no local Kafka or MirrorMaker 2: {exc}")
            pytest.skip(f"no local Kafka or MirrorMaker 2: {exc}")
        yield site.bootstrap, fleet.bootstrap
    finally:
        await asyncio.gather(site.astop(), fleet.astop())


def _decisions(log: WorkloadLog) -> list[dict[str, object]]:
    return [o.body.data for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
            and "decision" in o.body.data]


def _gates(log: WorkloadLog) -> list[dict[str, object]]:
    return [o.body.data for o in (decode(r.value) for r in log["out"])
            if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
            and "gate" in o.body.data]


async def _decided(h: ExecutorHarness, n: int, executor: subprocess.Popen[bytes]
                   ) -> WorkloadLog:
    deadline = time.monotonic() + 120
    while True:
        log = await h.read_log()
        if len(_decisions(log)) == n and len(_gates(log)) == n:
            return log
        assert executor.poll() is None, h.tail()
        assert time.monotonic() < deadline, h.tail()
        await asyncio.sleep(0.3)


async def _raw(bootstrap: str, topic: str) -> list[tuple[int, int, bytes, tuple[tuple[str, bytes],
                                                                              ...]]]:
    """Every committed record of partition 0 as the broker stores it: (offset, time, value,
    headers), no translation."""
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        begin = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        out = []
        consumer.seek(tp, begin)
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=500)
            out += [(m.offset, m.timestamp, m.value or b"", tuple(m.headers))
                    for m in batch.get(tp, []) if m.offset < end]
        return out
    finally:
        await consumer.stop()


async def _read(bootstrap: str, topic: str) -> tuple[int, list[tuple[int, int, bytes]]]:
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        read = await read_partition(consumer, topic)
        return read.begin, read.records
    finally:
        await consumer.stop()


def _fx(*args: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "fx_cli.main", *args], capture_output=True,
                          cwd=ROOT, timeout=180, check=False)
    return proc.returncode, proc.stdout.decode()


async def test_site_log_reaches_fleet_through_a_cut_link(
    site_and_fleet: tuple[str, str], unique_workload_id: str, tmp_path: Path,
    magika_store: tuple[Path, str], executor_harness: Callable[..., ExecutorHarness],
) -> None:
    site, fleet = site_and_fleet
    store, model_hash = magika_store
    wid = unique_workload_id
    state = tmp_path / "mirror"
    mirror = Mirror(site, fleet, state_dir=state, workloads=[wid], die_with_parent=True)
    try:
        async with executor_harness(site, wid, store, models={"filetype": model_hash}) as h:
            executor, holder = h.start_nodes("site-holder")
            for data in BEFORE_CUT:
                await h.send_input(data, source="upload")
            await _decided(h, len(BEFORE_CUT), executor)

            # the link up: the copy catches up with the site
            mirrored = await mirror.astart(timeout=240)
            assert set(topics.all_topics(wid)) <= set(mirrored)
            assert topics.FACTS in mirrored, mirrored

            # the link cut: the site keeps appending and deciding on its own
            assert await mirror.astop()
            fleet_at_cut = await _read(fleet, topics.inputs(wid))
            for data in WHILE_CUT:
                await h.send_input(data, source="upload")
            site_log = await _decided(h, len(BEFORE_CUT) + len(WHILE_CUT), executor)
            assert (await _read(fleet, topics.inputs(wid))) == fleet_at_cut  # nothing moved

            # the link restored: the same state dir, the settings it recorded
            restored = Mirror(state_dir=state, die_with_parent=True)
            await restored.astart(timeout=240)
            mirror = restored
            assert h.stop(holder) == 0
            h.stop(executor)
            await mirror.wait_caught_up(timeout=120)
            site_log = await h.read_log()

        # the fleet's copy of every topic is the site's: complete, in order, no duplicates,
        # the same offsets (as read_partition reports them) and the same times
        differing_raw = []
        for topic in mirror.topics:
            (site_begin, site_records), (fleet_begin, fleet_records) = await asyncio.gather(
                _read(site, topic), _read(fleet, topic))
            assert fleet_records == site_records, topic
            assert fleet_begin == site_begin, topic
            raw = await _raw(fleet, topic)
            site_offsets = [mirror_header(r[3], MIRROR_OFFSET_HEADER) for r in raw]
            assert site_offsets == [r[0] for r in site_records], topic  # none twice, in order
            if [r[0] for r in raw] != site_offsets:
                differing_raw.append(topic)
            site_raw = await _raw(site, topic)
            assert [(r[2], r[3]) for r in site_raw] == [
                (r[2], tuple(kv for kv in r[3] if not kv[0].startswith("fx.mirror.")))
                for r in raw], topic  # the site's own headers are kept
        # the copy's own offsets differ where the site holds transaction markers (the holder's
        # every transaction) and the mirror wrote transactions of its own
        assert topics.merge(wid) in differing_raw and topics.out(wid) in differing_raw
        assert len(_decisions(site_log)) == len(BEFORE_CUT) + len(WHILE_CUT)

        # the same answers on the fleet's copy as on the site
        gate_offset, _ = h.requests(site_log, GATE_KIND)[-1]
        at_ms = site_log["out"].raw(gate_offset).time_ms
        for command in (
            ("replay", wid, "--module", MODULE, "--json"),
            ("replay", wid, "--module", MODULE, "--json", "--from-start"),
            ("why", wid, "--output", str(gate_offset), "--json"),
            ("why", wid, "--at", str(at_ms), "--json"),
            ("audit", wid, "--module", MODULE, "--json"),
            ("verify", "--workload", wid, "--no-reexecute"),
        ):
            on_site = _fx(*command, "--bootstrap", site)
            on_fleet = _fx(*command, "--bootstrap", fleet)
            assert on_fleet == on_site, (command, on_site, on_fleet)
            if command[0] != "verify":
                assert on_site[0] == 0, (command, on_site)
        tree = json.loads(_fx("why", wid, "--output", str(gate_offset), "--json",
                              "--bootstrap", fleet)[1])
        signature = tree["step"]["response"]["signature"]
        assert signature["signed"] is True and signature["valid"] is True, signature
    finally:
        await mirror.astop()


async def _write_site(site: str, wid: str, stop: asyncio.Event) -> int:
    """Until ``stop``: inputs (plain writes), and merge/out pairs in transactions, every fifth
    one aborted, as a lease holder writes them. Returns the rounds written."""
    producer = make_producer(site)
    holder = make_producer(site, transactional_id=f"fx-test-holder.{wid}")
    await producer.start()
    await holder.start()
    i = 0
    try:
        while not stop.is_set():
            await producer.send_and_wait(topics.inputs(wid), value=b"in %d" % i, partition=0)
            await holder.begin_transaction()
            await holder.send(topics.merge(wid), value=b"merge %d" % i, partition=0)
            await holder.send(topics.out(wid), value=b"out %d" % i, partition=0)
            if i % 5 == 4:
                await holder.abort_transaction()
            else:
                await holder.commit_transaction()
            i += 1
            await asyncio.sleep(0.02)
    finally:
        await holder.stop()
        await producer.stop()
    return i


async def test_a_crashed_mirror_copies_each_record_once(
    site_and_fleet: tuple[str, str], unique_workload_id: str, tmp_path: Path,
) -> None:
    """SIGKILL while the site appends (no clean stop: whatever MirrorMaker 2 had copied but not
    committed is aborted on the fleet); started again, it resumes from the offsets it committed
    in the same transactions as the records: nothing is missing, nothing is there twice, and
    aborted site transactions are not copied."""
    site, fleet = site_and_fleet
    wid = unique_workload_id
    await ensure_workload_topics(site, wid)
    state = tmp_path / "mirror"
    mirror = Mirror(site, fleet, state_dir=state, workloads=[wid], die_with_parent=True)
    stop = asyncio.Event()
    writer = asyncio.create_task(_write_site(site, wid, stop))
    try:
        await asyncio.sleep(1.0)
        await mirror.astart(timeout=240)
        await asyncio.sleep(2.0)
        assert not writer.done(), writer
        mirror.kill()
        await asyncio.sleep(1.0)
        mirror = Mirror(state_dir=state, die_with_parent=True)
        await mirror.astart(timeout=240)
        await asyncio.sleep(1.0)
        stop.set()
        rounds = await writer
        await mirror.wait_caught_up(timeout=120)
        code, out = _fx("mirror", "status", "--dir", str(state), "--json")
        assert code == 0 and all(t["caught_up"] for t in json.loads(out)["topics"]), out
    finally:
        stop.set()
        await asyncio.gather(writer, return_exceptions=True)
        await mirror.astop()
    for topic in mirror.topics:
        (_, site_records), (_, fleet_records) = await asyncio.gather(
            _read(site, topic), _read(fleet, topic))
        assert fleet_records == site_records, topic
        raw = await _raw(fleet, topic)
        assert [mirror_header(r[3], MIRROR_OFFSET_HEADER) for r in raw] == \
            [r[0] for r in site_records], topic
    merges = [v for _, _, v in (await _read(fleet, topics.merge(wid)))[1]]
    assert merges == [b"merge %d" % i for i in range(rounds) if i % 5 != 4]

    # the copy is not trimmed on the fleet (its offsets are not the site's)
    code, out = _fx("trim", wid, "--bootstrap", fleet)
    assert code == 0 and "copy made by fx mirror: nothing is trimmed" in out, out

    # refused before MirrorMaker 2 starts: a fleet topic that would overwrite the site's
    # times, and a workload the site does not have
    other = f"{wid}x"
    await ensure_workload_topics(site, other)
    await ensure_workload_topics(fleet, other)  # LogAppendTime: the fleet's own
    with pytest.raises(MirrorError, match=r"message\.timestamp\.type=LogAppendTime on the fleet"):
        await Mirror(site, fleet, state_dir=tmp_path / "m2", workloads=[other]).astart()
    with pytest.raises(MirrorError, match="unknown workload 'nosuch' on the site"):
        await Mirror(site, fleet, state_dir=tmp_path / "m3", workloads=["nosuch"]).astart()
