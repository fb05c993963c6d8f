"""``fx mirror`` without a broker: which topics go, the fleet copies' configs, the MirrorMaker 2
config, the site-offset headers and how a copy is read back, and the CLI's errors."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker_schema import topics as T
from fx_cli.main import main as fx
from fx_kafka import client
from fx_kafka.client import _site_records, mirror_header
from fx_kafka.errors import MirrorCopyError, MirrorError
from fx_kafka.local import DEFAULT_KAFKA_VERSION, deploy_dir
from fx_kafka.mirror import (
    Mirror,
    fleet_topic_configs,
    render_mm2_properties,
    select_topics,
)

MIRROR = deploy_dir() / "mirror"
JAVA = MIRROR / "src/main/java/dev/ninelives/fx/mirror/SourceOffsetHeader.java"


def _site(*wids: str, extra: tuple[str, ...] = ()) -> list[str]:
    names = [t for w in wids for t in T.all_topics(w)]
    return [*names, *extra, "__consumer_offsets", "other.topic"]


def test_a_named_workload_goes_with_its_shadows_and_the_system_topics() -> None:
    shadow = T.shadow_stream("w1", "e1", "out")
    names = select_topics(_site("w1", "w2", extra=(shadow, T.FACTS, T.KEYS, T.CHUNKS,
                                                    T.MODULES, T.ledger("node-a"))),
                          workloads=["w1"])
    assert names == sorted([*T.all_topics("w1"), shadow, T.FACTS, T.KEYS, T.CHUNKS, T.MODULES,
                            T.ledger("node-a")])
    assert not any(n.startswith(T.prefix("w2")) for n in names)
    bare = select_topics(_site("w1", extra=(T.FACTS,)), workloads=["w1"], system=False)
    assert bare == sorted(T.all_topics("w1"))


def test_all_takes_every_workload_on_the_site() -> None:
    names = select_topics(_site("w1", "w2"), all_workloads=True, system=False)
    assert names == sorted(T.all_topics("w1") + T.all_topics("w2"))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"workloads": ["nope"]}, "unknown workload 'nope' on the site: no topic wl.nope.in"),
    ({"workloads": ["bad.id"]}, "invalid workload id"),
    ({}, "--workload ID"),
])
def test_bad_workloads_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(MirrorError, match=re.escape(message)):
        select_topics(_site("w1"), **kwargs)
    with pytest.raises(MirrorError, match="no workload"):
        select_topics(["other"], all_workloads=True)


def test_a_partly_created_workload_is_unknown() -> None:
    with pytest.raises(MirrorError, match=r"no topic wl\.w1\.merge"):
        select_topics([t for t in T.all_topics("w1") if not t.endswith(".merge")],
                      workloads=["w1"])


def test_the_fleet_copy_keeps_the_site_times_and_retention() -> None:
    site = {"message.timestamp.type": "LogAppendTime", "retention.ms": "-1",
            "retention.bytes": "-1", "cleanup.policy": "compact", "segment.bytes": "1000"}
    got = fleet_topic_configs(site)
    assert got["message.timestamp.type"] == "CreateTime"
    assert got["message.timestamp.after.max.ms"] == str(2**63 - 1)
    assert got["retention.ms"] == "-1" and got["cleanup.policy"] == "compact"
    assert "segment.bytes" not in got


def _properties(text: str) -> dict[str, str]:
    """Java Properties.load for the subset the config uses (key = value, \\\\ escapes)."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = re.sub(r"\\(.)", r"\1", value.strip())
    return out


def test_the_mm2_config() -> None:
    names = [T.inputs("w1"), T.merge("w1"), T.FACTS]
    text = render_mm2_properties(site="s:1", fleet="f:2", site_alias="site-A", topics=names,
                                 log_starts={(T.inputs("w1"), 0): 3}, fleet_brokers=3)
    props = _properties(text)
    flow = "site-A->fleet"
    assert props["clusters"] == "site-A, fleet"
    assert props["replication.policy.class"].endswith("IdentityReplicationPolicy")
    # after Properties.load, each name is a Java regex that matches only itself
    regexes = [r.strip() for r in props[f"{flow}.topics"].split(",")]
    assert regexes == [n.replace(".", "\\.") for n in names]
    assert all(re.fullmatch(r, n) for r, n in zip(regexes, names, strict=True))
    assert not re.fullmatch(regexes[0], "wlXw1Xin")
    assert props["fleet.exactly.once.source.support"] == "enabled"
    assert props["site-A.consumer.isolation.level"] == "read_committed"
    assert props[f"{flow}.transforms.fxoffset.type"] == "dev.ninelives.fx.mirror.SourceOffsetHeader"
    assert props[f"{flow}.transforms.fxoffset.log.starts"] == "wl.w1.in:0=3"
    assert props["replication.factor"] == "3" and props["offset.storage.replication.factor"] == "3"
    assert props[f"{flow}.sync.topic.configs.enabled"] == "false"
    # offset syncs off, and no offset-syncs.* key (MirrorMaker 2 refuses the two together)
    assert props[f"{flow}.emit.offset-syncs.enabled"] == "false"
    assert not [k for k in props if "offset-syncs.topic" in k]
    once = _properties(render_mm2_properties(site="s:1", fleet="f:2", site_alias="a",
                                             topics=names, log_starts={}, fleet_brokers=1,
                                             exactly_once=False))
    assert "fleet.exactly.once.source.support" not in once
    assert once["replication.factor"] == "1"


def _rec(offset: int, site: int | None, value: bytes = b"v", ts: int = 1,
         log_start: int | None = None) -> Any:
    headers = [] if site is None else [(client.MIRROR_OFFSET_HEADER, str(site).encode())]
    if log_start is not None:
        headers.append((client.MIRROR_LOG_START_HEADER, str(log_start).encode()))
    return SimpleNamespace(offset=offset, timestamp=ts, value=value, headers=headers)


def test_a_copy_is_read_in_site_offsets() -> None:
    raw = [_rec(0, 2, b"a", log_start=1), _rec(1, 5, b"b"),
           _rec(3, 6, b"c")]
    records, log_start = _site_records("t", raw)
    assert records == [(2, 1, b"a"), (5, 1, b"b"), (6, 1, b"c")] and log_start == 1


def test_a_record_copied_twice_is_kept_once_and_a_conflict_is_an_error() -> None:
    again = [_rec(0, 0, b"a"), _rec(1, 2, b"b"), _rec(2, 0, b"a"), _rec(3, 2, b"b"),
             _rec(4, 3, b"c")]
    assert [r[0] for r in _site_records("t", again)[0]] == [0, 2, 3]
    with pytest.raises(MirrorCopyError, match="other bytes"):
        _site_records("t", [_rec(0, 0, b"a"), _rec(1, 0, b"z")])
    with pytest.raises(MirrorCopyError, match="not written by the mirror"):
        _site_records("t", [_rec(0, 0), _rec(1, None)])
    with pytest.raises(MirrorCopyError, match="not an offset"):
        mirror_header([(client.MIRROR_OFFSET_HEADER, b"x1")], client.MIRROR_OFFSET_HEADER)
    assert mirror_header(None, client.MIRROR_OFFSET_HEADER) is None


def test_java_and_python_agree_on_the_headers_and_the_version() -> None:
    java = JAVA.read_text()
    for name, value in (("OFFSET_HEADER", client.MIRROR_OFFSET_HEADER),
                        ("SITE_HEADER", client.MIRROR_SITE_HEADER),
                        ("LOG_START_HEADER", client.MIRROR_LOG_START_HEADER)):
        assert f'String {name} = "{value}";' in java, name
    pom = (MIRROR / "pom.xml").read_text()
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert match is not None and match.group(1) == DEFAULT_KAFKA_VERSION
    services = MIRROR / "src/main/resources/META-INF/services"
    assert (services / "org.apache.kafka.connect.transforms.Transformation").read_text().strip() \
        == "dev.ninelives.fx.mirror.SourceOffsetHeader"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_unreachable_broker_is_said_at_once(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{_free_port()}"
    mirror = Mirror(dead, dead, state_dir=tmp_path, workloads=["w1"], connect_timeout=1.0)
    with pytest.raises(MirrorError, match=f"broker {dead} does not answer"):
        await mirror.astart()
    assert mirror.pid() is None and not (tmp_path / "state.json").exists()


def test_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fx(["mirror", "status", "--dir", str(tmp_path)]) == 3
    assert "never started" in capsys.readouterr().out
    assert fx(["mirror", "stop", "--dir", str(tmp_path)]) == 0
    assert "not running" in capsys.readouterr().out
    assert fx(["mirror", "start", "--dir", str(tmp_path)]) == 1
    assert "fx mirror start --from SITE --to FLEET" in capsys.readouterr().err
    dead = f"127.0.0.1:{_free_port()}"
    assert fx(["mirror", "start", "--from", dead, "--to", dead, "--workload", "w1",
               "--dir", str(tmp_path), "--connect-timeout", "1"]) == 1
    assert "does not answer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fx(["mirror", "start", "--from", dead, "--to", dead, "--workload", "w1", "--all"])
