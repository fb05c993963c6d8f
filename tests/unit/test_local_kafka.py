"""The pure parts of fx_kafka.local, testing and cli: no Java, no broker, no network."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_schema.limits import BROKER_MESSAGE_MAX_BYTES, MAX_RECORD_BYTES
from fx_kafka import cli, testing
from fx_kafka.client import FRAME_CAP_BYTES
from fx_kafka.errors import BrokerStartError, FetchError, JavaNotFoundError, NoBrokerError
from fx_kafka.local import (
    DEFAULT_KAFKA_VERSION,
    BrokerState,
    LocalKafka,
    deploy_dir,
    find_java,
    java_major_version,
    pick_free_ports,
    read_state,
    render_server_properties,
    write_state,
)

DEPLOY = deploy_dir()


def _properties(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def _rendered(tmp_path: Path) -> dict[str, str]:
    template = (DEPLOY / "server.properties.template").read_text()
    text = render_server_properties(
        template, port=19092, controller_port=19093, log_dir=tmp_path / "kraft"
    )
    assert "${" not in text
    return _properties(text)


def test_template_renders_a_one_node_kraft_broker(tmp_path: Path) -> None:
    props = _rendered(tmp_path)
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    assert "controller.quorum.voters" not in props  # dynamic quorum: format --standalone
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == props["listeners"]
    assert props["log.dirs"] == str(tmp_path / "kraft")
    for key in (
        "offsets.topic.replication.factor",
        "offsets.topic.num.partitions",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "transaction.state.log.num.partitions",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
        "share.coordinator.state.topic.num.partitions",
        "min.insync.replicas",
        "num.partitions",
    ):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"
    # no read or write creates a topic (a request naming a missing topic must not make one)
    assert props["auto.create.topics.enable"] == "false"
    # any topic created without its own timestamp type stamps records with the broker's clock
    assert props["log.message.timestamp.type"] == "LogAppendTime"


def test_frame_cap_agrees_with_the_schema(tmp_path: Path) -> None:
    props = _rendered(tmp_path)
    assert BROKER_MESSAGE_MAX_BYTES == MAX_RECORD_BYTES + 65_536 == FRAME_CAP_BYTES
    assert int(props["message.max.bytes"]) == BROKER_MESSAGE_MAX_BYTES
    assert int(props["replica.fetch.max.bytes"]) == BROKER_MESSAGE_MAX_BYTES


def test_render_refuses_equal_ports_and_unknown_placeholders(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        render_server_properties("x", port=1, controller_port=1, log_dir=tmp_path)
    with pytest.raises(KeyError):
        render_server_properties("${nope}", port=1, controller_port=2, log_dir=tmp_path)


def test_default_version_matches_the_pom() -> None:
    pom = (DEPLOY / "pom.xml").read_text()
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert match is not None and match.group(1) == DEFAULT_KAFKA_VERSION


def test_deploy_files_are_there() -> None:
    for name in ("fetch.sh", "server.properties.template", "log4j2.properties", "pom.xml"):
        assert (DEPLOY / name).is_file(), name
    assert os.access(DEPLOY / "fetch.sh", os.X_OK)


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = pick_free_ports(2)
    assert len(set(ports)) == 2
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def _state(pid: int | None) -> BrokerState:
    return BrokerState(
        pid=pid,
        bootstrap="127.0.0.1:19092",
        port=19092,
        controller_port=19093,
        version=DEFAULT_KAFKA_VERSION,
        cluster_id="abc",
        started_at=1.0,
        start_seconds=2.5,
    )


def test_state_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "d" / "state.json"
    assert read_state(path) is None
    write_state(path, _state(123))
    assert read_state(path) == _state(123)
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]  # no temp file left
    path.write_text("{not json")
    assert read_state(path) is None
    path.write_text('{"pid": 1}')
    assert read_state(path) is None


def test_status_and_stop_ignore_a_pid_that_is_not_our_broker(tmp_path: Path) -> None:
    # The state names this very test process: a reused pid must never be signalled.
    kafka = LocalKafka(data_dir=tmp_path)
    assert not kafka.status().running
    write_state(kafka.state_file, _state(os.getpid()))
    status = kafka.status()
    assert (status.running, status.pid, status.bootstrap) == (False, None, None)
    assert kafka.stop() is False
    state = read_state(kafka.state_file)
    assert state is not None and state.pid is None and state.port == 19092
    with pytest.raises(RuntimeError):
        _ = kafka.bootstrap


def _fake_java(directory: Path, version_line: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    java = directory / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return java


def test_java_version_parsing(tmp_path: Path) -> None:
    assert java_major_version(str(_fake_java(tmp_path / "a", 'openjdk version "17.0.15"'))) == 17
    assert java_major_version(str(_fake_java(tmp_path / "b", 'java version "1.8.0_392"'))) == 8
    assert java_major_version(str(_fake_java(tmp_path / "c", 'openjdk version "21" 2023'))) == 21
    with pytest.raises(JavaNotFoundError):
        java_major_version(str(tmp_path / "missing"))


def test_old_or_missing_java_is_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_java(tmp_path / "jdk11" / "bin", 'openjdk version "11.0.2"')
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk11"))
    with pytest.raises(JavaNotFoundError, match="needs 17"):
        find_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(JavaNotFoundError, match="no java"):
        find_java()
    kafka = LocalKafka(data_dir=tmp_path / "data", java=str(tmp_path / "jdk11" / "bin" / "java"))
    with pytest.raises(JavaNotFoundError):
        kafka.start(timeout=1)


def test_fetch_failure_is_a_typed_error(tmp_path: Path) -> None:
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "fetch.sh").write_text("echo 'fetch.sh: mvn not found' >&2; exit 2\n")
    kafka = LocalKafka(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", deploy=deploy)
    with pytest.raises(FetchError, match="mvn not found"):
        kafka.fetch()


def test_broker_start_error_carries_the_log_tail() -> None:
    exc = BrokerStartError("did not come up", log_tail="ERROR boom")
    assert exc.log_tail == "ERROR boom"
    assert "ERROR boom" in str(exc) and "did not come up" in str(exc)


class _NoJavaKafka:
    def __init__(self, **_: object) -> None:
        pass

    def start(self, timeout: float) -> str:
        raise JavaNotFoundError("no java found")


def test_chooser_without_any_broker_raises_no_broker_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(testing.BOOTSTRAP_ENV, raising=False)
    monkeypatch.setattr(testing, "LocalKafka", _NoJavaKafka)

    @contextlib.contextmanager
    def no_docker(reasons: list[str]) -> Iterator[str | None]:
        reasons.append("Redpanda: no Docker engine answers")
        yield None

    monkeypatch.setattr(testing, "_redpanda", no_docker)
    monkeypatch.setenv("FX_DOCKER", "fx-no-such-docker-client")  # the Kafka image path: none
    monkeypatch.delenv(testing.CHOICE_ENV, raising=False)
    with pytest.raises(NoBrokerError) as info, testing.kafka_for_tests():
        pass
    assert len(info.value.reasons) == 4
    assert "no java found" in info.value.reasons[1]
    assert info.value.reasons[2] == "Kafka image: no docker client"


def test_chooser_docker_choice_skips_the_local_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(testing.BOOTSTRAP_ENV, raising=False)
    monkeypatch.setenv(testing.CHOICE_ENV, "docker")
    monkeypatch.setattr(testing, "LocalKafka", None)  # must not be touched
    monkeypatch.setattr(testing, "docker_client", lambda: "/usr/bin/docker")
    monkeypatch.setattr(testing, "image_present", lambda docker, image: True)
    started: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def fake_run(docker: str, image: str, **_: object) -> Iterator[str]:
        started.append((docker, image))
        yield "127.0.0.1:1"

    monkeypatch.setattr(testing, "docker_kafka", fake_run)
    monkeypatch.setenv("FX_KAFKA_IMAGE", "my-kafka:1")
    with testing.kafka_for_tests() as bootstrap:
        assert bootstrap == "127.0.0.1:1"
    assert started == [("/usr/bin/docker", "my-kafka:1")]


def test_chooser_prefers_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    async def ready(bootstrap: str, timeout: float) -> None:
        assert bootstrap == "broker.example:9092"

    monkeypatch.setenv(testing.BOOTSTRAP_ENV, "broker.example:9092")
    monkeypatch.setattr(testing, "wait_ready", ready)
    monkeypatch.setattr(testing, "LocalKafka", None)  # must not be touched
    with testing.kafka_for_tests() as bootstrap:
        assert bootstrap == "broker.example:9092"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fx")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_status_and_stop_on_an_empty_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parse(["broker", "status", "--data-dir", str(tmp_path)])
    assert args.func(args) == cli.EXIT_STOPPED
    assert capsys.readouterr().out.strip() == "stopped"
    args = _parse(["broker", "stop", "--data-dir", str(tmp_path)])
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == "not running"
    args = _parse(["broker", "start"])
    assert args.data_dir == Path(".fx") / "broker"
