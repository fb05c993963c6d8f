"""Replication settings and the cluster rendering of the broker template: no broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from fx_kafka.errors import ReplicationConfigError
from fx_kafka.local import deploy_dir, render_server_properties
from fx_kafka.replication import ReplicationSettings, default_for
from tests.unit.test_local_kafka import _properties


def test_defaults_follow_the_broker_count() -> None:
    assert default_for(1) == (1, 1)
    assert default_for(2) == (2, 1)
    assert default_for(3) == (3, 2)
    assert default_for(7) == (3, 2)
    with pytest.raises(ValueError):
        default_for(0)


def test_settings_from_the_environment() -> None:
    assert ReplicationSettings.from_env({}) == ReplicationSettings(None, None)
    s = ReplicationSettings.from_env({"FX_REPLICATION_FACTOR": "3",
                                      "FX_MIN_INSYNC_REPLICAS": "3"})
    assert s.resolve(5) == (3, 3)
    assert ReplicationSettings(replication_factor=2).resolve(5) == (2, 1)
    assert ReplicationSettings(replication_factor=5).resolve(5) == (5, 2)
    for bad in ("zero", "0", "-1", "2.5"):
        with pytest.raises(ReplicationConfigError, match="FX_REPLICATION_FACTOR"):
            ReplicationSettings.from_env({"FX_REPLICATION_FACTOR": bad})


def test_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ReplicationConfigError, match="more than the 1 broker"):
        ReplicationSettings(replication_factor=3).resolve(1)
    with pytest.raises(ReplicationConfigError, match="every acks=all write would fail"):
        ReplicationSettings(min_insync_replicas=2).resolve(1)
    configs = ReplicationSettings().topic_configs(3)
    assert configs == {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}


def test_template_renders_one_node_of_a_three_node_cluster(tmp_path: Path) -> None:
    template = (deploy_dir() / "server.properties.template").read_text()
    voters = {1: 19093, 2: 19095, 3: 19097}
    props = _properties(render_server_properties(
        template, port=19094, controller_port=19095, log_dir=tmp_path, node_id=2, voters=voters))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:19093,2@127.0.0.1:19095,3@127.0.0.1:19097")
    assert "controller.quorum.bootstrap.servers" not in props  # static quorum: no --standalone
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "share.coordinator.state.topic.replication.factor", "default.replication.factor"):
        assert props[key] == "3", key
    for key in ("transaction.state.log.min.isr", "share.coordinator.state.topic.min.isr",
                "min.insync.replicas"):
        assert props[key] == "2", key
    assert props["unclean.leader.election.enable"] == "false"
    assert props["log.retention.ms"] == "-1" and props["log.retention.bytes"] == "-1"
    with pytest.raises(ValueError, match="voter"):
        render_server_properties(template, port=1, controller_port=2, log_dir=tmp_path,
                                 node_id=2, voters={1: 3})
