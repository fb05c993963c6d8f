"""The local broker keeps its record across restarts: ``fx broker stop`` then ``fx broker start``
on the same data dir comes back with the same cluster, ports, topics, records and committed
offsets, even while the last clients' connections sit in TIME_WAIT. A taken port is a clear error
that deletes nothing, and only ``fx broker reset`` removes data."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from fx_kafka.client import create_topics, make_consumer, make_producer
from fx_kafka.errors import BrokerStartError, PortInUseError
from fx_kafka.local import LocalKafka, read_state

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def fx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fx_cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, check=False,
                          stdin=subprocess.DEVNULL)


async def _write_and_commit(bootstrap: str, topic: str, n: int, group: str) -> None:
    await create_topics(bootstrap, [topic])
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        for i in range(n):
            await producer.send_and_wait(topic, value=b"record-%d" % i, partition=0)
    finally:
        await producer.stop()
    consumer = make_consumer(bootstrap, group_id=group)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.commit({tp: OffsetAndMetadata(n - 1, "")})
    finally:
        await consumer.stop()


async def _read(bootstrap: str, topic: str, group: str) -> tuple[list[bytes], int | None]:
    consumer = make_consumer(bootstrap, group_id=group)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        committed = await consumer.committed(tp)
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        values: list[bytes] = []
        for _ in range(60):
            if len(values) >= end:
                break
            batch = await consumer.getmany(tp, timeout_ms=500)
            values += [m.value or b"" for m in batch.get(tp, [])]
        return values, committed
    finally:
        await consumer.stop()


async def test_fx_broker_stop_start_keeps_everything(tmp_path: Path) -> None:
    data = tmp_path / "broker"
    started = fx("broker", "start", "--data-dir", str(data))
    assert started.returncode == 0, started.stderr
    bootstrap = started.stdout.strip()
    first = read_state(data / "state.json")
    assert first is not None
    try:
        await _write_and_commit(bootstrap, "kept", 20, "g1")
        stopped = fx("broker", "stop", "--data-dir", str(data))
        assert stopped.returncode == 0 and "stopped" in stopped.stdout
        # at once: the clients' connections to the old port are in TIME_WAIT now
        again = fx("broker", "start", "--data-dir", str(data))
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == bootstrap
        second = read_state(data / "state.json")
        assert second is not None and second.cluster_id == first.cluster_id
        values, committed = await _read(bootstrap, "kept", "g1")
        assert values == [b"record-%d" % i for i in range(20)]
        assert committed == 19
    finally:
        fx("broker", "stop", "--data-dir", str(data))


async def test_taken_port_is_a_clear_error_and_deletes_nothing(tmp_path: Path) -> None:
    kafka = LocalKafka(data_dir=tmp_path / "b", die_with_parent=True)
    bootstrap = kafka.start()
    try:
        await _write_and_commit(bootstrap, "kept", 3, "g")
    finally:
        kafka.stop()
    state = read_state(kafka.state_file)
    assert state is not None
    port = state.port
    meta = kafka.log_dir / "meta.properties"
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", port))
    blocker.listen()
    try:
        with pytest.raises(PortInUseError) as info:
            kafka.start()
        assert info.value.port == port
        assert f"port {port}" in str(info.value) and f"pid {os.getpid()}" in str(info.value)
        assert "fx broker reset" in str(info.value)
        assert meta.exists(), "a failed start must not delete the data"
        cli = fx("broker", "start", "--data-dir", str(kafka.data_dir))
        assert cli.returncode == 1 and f"port {port}" in cli.stderr
    finally:
        blocker.close()
    assert kafka.start() == bootstrap
    try:
        values, _ = await _read(bootstrap, "kept", "g")
        assert values == [b"record-0", b"record-1", b"record-2"]
    finally:
        kafka.stop()


async def test_only_reset_deletes_data(tmp_path: Path) -> None:
    data = tmp_path / "b"
    kafka = LocalKafka(data_dir=data, die_with_parent=True)
    bootstrap = kafka.start()
    cluster_id = read_state(kafka.state_file).cluster_id  # type: ignore[union-attr]
    try:
        await _write_and_commit(bootstrap, "doomed", 2, "g")
        running = fx("broker", "reset", "--data-dir", str(data), "--yes")
        assert running.returncode == 1 and "is running" in running.stderr
    finally:
        kafka.stop()
    unasked = fx("broker", "reset", "--data-dir", str(data))
    assert unasked.returncode == 2 and "--yes" in unasked.stderr
    assert "will delete" in unasked.stderr and "partition dirs" in unasked.stderr
    assert (kafka.log_dir / "meta.properties").exists()
    done = fx("broker", "reset", "--data-dir", str(data), "--yes")
    assert done.returncode == 0, done.stderr
    assert str(kafka.log_dir) in done.stdout and not kafka.log_dir.exists()
    assert not kafka.state_file.exists()
    fresh = kafka.start()
    try:
        assert read_state(kafka.state_file).cluster_id != cluster_id  # type: ignore[union-attr]
        consumer = make_consumer(fresh)
        await consumer.start()
        try:
            assert "doomed" not in await consumer.topics()
        finally:
            await consumer.stop()
    finally:
        kafka.stop()


def test_storage_without_state_or_with_stray_files_is_refused(tmp_path: Path) -> None:
    kafka = LocalKafka(data_dir=tmp_path / "orphan")
    kafka.log_dir.mkdir(parents=True)
    (kafka.log_dir / "meta.properties").write_text("cluster.id=x\n")
    with pytest.raises(BrokerStartError, match=r"state\.json"):
        kafka.start()
    assert (kafka.log_dir / "meta.properties").exists()

    stray = LocalKafka(data_dir=tmp_path / "stray")
    stray.log_dir.mkdir(parents=True)
    (stray.log_dir / "important").write_text("keep me")
    with pytest.raises(BrokerStartError, match=r"no meta\.properties"):
        stray.start()
    assert (stray.log_dir / "important").read_text() == "keep me"

    # a one-node data dir is not started as a cluster (or the reverse)
    state = tmp_path / "one" / "state.json"
    state.parent.mkdir()
    state.write_text(json.dumps({"pid": None, "bootstrap": "127.0.0.1:1", "port": 1,
                                 "controller_port": 2, "version": kafka.version,
                                 "cluster_id": "c", "started_at": 0.0, "start_seconds": 0.0}))
    with pytest.raises(BrokerStartError, match="--nodes 1"):
        LocalKafka(data_dir=state.parent, nodes=3).start()
