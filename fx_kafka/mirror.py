"""``fx mirror start|stop|status``: a site's log forwarded to the fleet's cluster.

A site runs its own broker; its workload streams (``wl.<id>.*``) and the system topics its
records name (``sys.facts``, ``sys.keys``, ``sys.chunks``, ``sys.rejects``, ``sys.modules``,
``sys.ledger.<node>``) reach the fleet's cluster through Apache Kafka's MirrorMaker 2
(``connect-mirror`` from Maven Central, built by ``deploy/local-kafka/fetch.sh --mirror``), run
in dedicated mode as a background ``java`` process, with:

- **topic names kept**: ``IdentityReplicationPolicy``;
- **exactly-once** (KIP-618, Kafka 3.5+): ``exactly.once.source.support=enabled`` on the fleet's
  herder, the site consumer ``read_committed`` (aborted holder transactions are not copied), the
  mirror's source offsets committed in the same transaction as the records it copies;
- **the site's times kept**: MirrorMaker 2 copies each record's timestamp, and the fleet topics
  are created here, before it starts, with ``message.timestamp.type=CreateTime`` (the site's
  topics use ``LogAppendTime``; a fleet topic with ``LogAppendTime`` would overwrite the site's
  times with the fleet's append time, and deadlines and ``fx why --at`` would change);
- **the site's offsets kept, in a header**: the copy's own offsets differ from the site's (the
  site's transaction markers and aborted records take offsets the copy never sees; the mirror's
  own transactions put markers on the fleet), and records name each other by offset. This
  project's transform ``SourceOffsetHeader`` (deploy/local-kafka/mirror) writes each record's
  site offset in ``fx.mirror.offset``; :func:`fx_kafka.client.read_partition`, the one partition
  reader of replay, why, verify and audit, reports those offsets, so the commands give the same
  answers on the fleet's copy as on the site.

State lives in ``--dir`` (default ``.fx/mirror``): ``state.json`` (pid, site, fleet, topics),
``mm2.properties`` (the MirrorMaker 2 config, readable), ``log4j2.properties``, ``mirror.log``
and ``stdout.log``. MirrorMaker 2's own state (source offsets, config, status) is on the fleet,
in ``mm2-offsets.<site>.internal``, ``mm2-configs.<site>.internal`` and
``mm2-status.<site>.internal``; a restart resumes from it, so ``fx mirror stop`` (a cut link) and
``fx mirror start`` again copy what the site appended meanwhile, once.

A mirrored copy is read-only: nothing on the fleet may write to it (a fleet executor skips
requests that carry the header; a lease holder refuses the copy, whose topics are not
``LogAppendTime``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from broker_schema import topics as T
from fx_kafka.client import (
    FRAME_CAP_BYTES,
    MIRROR_OFFSET_HEADER,
    make_admin,
    make_consumer,
    mirror_header,
    wait_ready,
)
from fx_kafka.errors import BrokerError, FetchError, MirrorError
from fx_kafka.local import (
    DEFAULT_KAFKA_VERSION,
    check_java,
    default_cache_dir,
    deploy_dir,
    find_java,
    pid_alive,
)
from fx_kafka.local_process import cmdline, die_with_parent, log_tail
from fx_kafka.replication import default_for

__all__ = [
    "DEFAULT_HEAP",
    "DEFAULT_STATE_DIR",
    "FLEET_ALIAS",
    "Mirror",
    "MirrorState",
    "MirrorStatus",
    "TopicLag",
    "fleet_topic_configs",
    "register",
    "render_mm2_properties",
    "select_topics",
]

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path(".fx") / "mirror"
DEFAULT_HEAP = "256m"
FLEET_ALIAS = "fleet"
MAIN_CLASS = "org.apache.kafka.connect.mirror.MirrorMaker"
TRANSFORM_CLASS = "dev.ninelives.fx.mirror.SourceOffsetHeader"
#: The system topics a site's records name (their keys, facts, chunks, rejects, the code their
#: specs name); ledgers too.
SYSTEM_TOPICS = (T.FACTS, T.KEYS, T.CHUNKS, T.REJECTS, T.MODULES)
#: Long.MAX_VALUE: a site clock ahead of the fleet's must not get the copy refused
#: (``message.timestamp.after.max.ms`` defaults to one hour in Kafka 4).
_LONG_MAX = "9223372036854775807"
#: Topic configs copied from the site topic to the fleet's copy (the rest: the fleet's defaults).
_COPIED_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes", "max.message.bytes",
                   "min.compaction.lag.ms", "delete.retention.ms")
#: status exit code when no mirror runs (as ``fx broker status``).
EXIT_STOPPED = 3


# ----------------------------------------------------------------------------- pure parts
def select_topics(site_topics: Iterable[str], *, workloads: Sequence[str] = (),
                  all_workloads: bool = False, system: bool = True) -> list[str]:
    """The site topics to mirror (sorted): every topic of each named workload (its six streams,
    which must all be there, and its shadow evaluations' topics), or of every workload with
    ``all_workloads``; with ``system``, the system topics and ledgers the site has.
    :class:`MirrorError` for an invalid or unknown workload id, or no workload at all."""
    present = set(site_topics)
    chosen: set[str] = set()
    if all_workloads:
        ids = {wid for wid in map(_workload_of, present) if wid is not None}
        if not ids:
            raise MirrorError("--all: the site holds no workload (no wl.<id>.* topic)")
        workloads = sorted(ids)
    if not workloads:
        raise MirrorError("name the workloads to mirror (--workload ID, repeatable) or --all")
    for wid in workloads:
        try:
            prefix = T.prefix(wid)
        except ValueError as exc:
            raise MirrorError(str(exc)) from None
        missing = [t for t in T.all_topics(wid) if t not in present]
        if missing:
            raise MirrorError(f"unknown workload {wid!r} on the site: no topic "
                              f"{', '.join(missing)}")
        chosen.update(t for t in present if t.startswith(prefix))
    if system:
        chosen.update(t for t in present
                      if t in SYSTEM_TOPICS or t.startswith(T.LEDGER_PREFIX))
    return sorted(chosen)


def _workload_of(topic: str) -> str | None:
    """The workload id of a workload stream or shadow evaluation topic, else None."""
    for parse in (T.parse, T.parse_shadow):
        try:
            return parse(topic)[0]
        except ValueError:
            continue
    return None


def fleet_topic_configs(site_config: dict[str, str]) -> dict[str, str]:
    """The configs of a topic's fleet copy: the site topic's retention and cleanup settings,
    the site's record times kept (``CreateTime``, no limit on how far ahead they may be)."""
    out = {k: site_config[k] for k in _COPIED_CONFIGS if k in site_config}
    out["message.timestamp.type"] = "CreateTime"
    out["message.timestamp.after.max.ms"] = _LONG_MAX
    out["message.timestamp.before.max.ms"] = _LONG_MAX
    return out


def _topic_regex(name: str) -> str:
    # a Java regex in a .properties value: the backslash itself is escaped for Properties.load
    return name.replace(".", "\\\\.")


def render_mm2_properties(*, site: str, fleet: str, site_alias: str, topics: Sequence[str],
                          log_starts: dict[tuple[str, int], int], fleet_brokers: int,
                          exactly_once: bool = True) -> str:
    """The MirrorMaker 2 (dedicated mode) configuration of one site -> fleet flow. Pure."""
    rf, _ = default_for(fleet_brokers)
    a, f = site_alias, FLEET_ALIAS
    flow = f"{a}->{f}"
    starts = ",".join(f"{t}:{p}={o}" for (t, p), o in sorted(log_starts.items()))
    lines = [
        "# Written by `fx mirror start` (fx_kafka.mirror); MirrorMaker 2 in dedicated mode:",
        f"#   java -cp 'lib/*:mirror/*' {MAIN_CLASS} mm2.properties",
        f"clusters = {a}, {f}",
        f"{a}.bootstrap.servers = {site}",
        f"{f}.bootstrap.servers = {fleet}",
        f"{flow}.enabled = true",
        f"{f}->{a}.enabled = false",
        "",
        "# topic names kept; nothing is written to the site",
        "replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
        f"{flow}.topics = {', '.join(_topic_regex(t) for t in topics)}",
        f"{flow}.groups.exclude = .*",
        f"{flow}.refresh.topics.enabled = false",
        f"{flow}.refresh.groups.enabled = false",
        f"{flow}.sync.topic.configs.enabled = false",
        f"{flow}.sync.topic.acls.enabled = false",
        f"{flow}.sync.group.offsets.enabled = false",
        f"{flow}.emit.checkpoints.enabled = false",
        f"{flow}.emit.offset-syncs.enabled = false",
        "emit.heartbeats.enabled = false",
        f"{flow}.emit.heartbeats.enabled = false",
        f"replication.factor = {rf}",
        f"heartbeats.topic.replication.factor = {rf}",
        f"checkpoints.topic.replication.factor = {rf}",
        "tasks.max = 1",
        "",
        "# the site offset of every record in a header (fx.mirror.offset), the site's log start",
        "# on the first record copied from a partition (fx.mirror.log_start)",
        f"{flow}.transforms = fxoffset",
        f"{flow}.transforms.fxoffset.type = {TRANSFORM_CLASS}",
        f"{flow}.transforms.fxoffset.site = {a}",
        f"{flow}.transforms.fxoffset.log.starts = {starts}",
        "",
        "# read only committed records on the site (aborted holder transactions are not copied)",
        f"{a}.consumer.isolation.level = read_committed",
        f"{a}.consumer.max.partition.fetch.bytes = {FRAME_CAP_BYTES}",
        f"{f}.producer.max.request.size = {FRAME_CAP_BYTES}",
        "",
        "# the mirror's own state, on the fleet: source offsets, config, status",
        f"offset.storage.replication.factor = {rf}",
        f"config.storage.replication.factor = {rf}",
        f"status.storage.replication.factor = {rf}",
        "offset.storage.partitions = 1",
        "status.storage.partitions = 1",
        "",
        "# every plugin here has a ServiceLoader manifest: skip the 7 s classpath scan",
        "plugin.discovery = service_load",
        f"{f}.plugin.discovery = service_load",
    ]
    if exactly_once:
        lines += [
            "",
            "# exactly-once (KIP-618): records and source offsets in one transaction on the",
            "# fleet; a crashed mirror's open transaction is aborted within 10 s",
            f"{f}.exactly.once.source.support = enabled",
            f"{f}.producer.transaction.timeout.ms = 10000",
        ]
    return "\n".join(lines) + "\n"


LOG4J2 = """# log4j2 for fx mirror (MirrorMaker 2): WARN, but start/stop and what each task copies
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
logger.mm.name = org.apache.kafka.connect.mirror.MirrorMaker
logger.mm.level = INFO
logger.task.name = org.apache.kafka.connect.mirror.MirrorSourceTask
logger.task.level = INFO
# the checkpoint connector is off (no consumer groups are mirrored), and MirrorMaker 2 says so
# at ERROR on every start: that one message is dropped, every other error is kept
logger.herder.name = org.apache.kafka.connect.mirror.MirrorHerder
logger.herder.filter.checkpoint.type = RegexFilter
logger.herder.filter.checkpoint.regex = Failed to configure MirrorCheckpointConnector.*
logger.herder.filter.checkpoint.onMatch = DENY
logger.herder.filter.checkpoint.onMismatch = NEUTRAL
"""


# ------------------------------------------------------------------------------- state
@dataclass(frozen=True)
class MirrorState:
    """What ``state.json`` records about the mirror started from a state dir."""

    pid: int | None
    site: str
    fleet: str
    site_alias: str
    workloads: tuple[str, ...]
    all_workloads: bool
    topics: tuple[str, ...]
    exactly_once: bool
    started_at: float
    start_seconds: float = 0.0


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_mirror_state(path: Path) -> MirrorState | None:
    """The state in ``path``; None if there is none or it cannot be read."""
    try:
        raw = json.loads(path.read_text())
        raw["workloads"] = tuple(raw.get("workloads", ()))
        raw["topics"] = tuple(raw.get("topics", ()))
        return MirrorState(**raw)
    except (OSError, ValueError, TypeError, KeyError):
        return None


@dataclass(frozen=True)
class TopicLag:
    """How far one partition's fleet copy is behind the site, in site offsets.

    ``site_last``: the offset of the site's last committed record (None: it has none);
    ``fleet_last``: the site offset of the copy's last record (None: the copy is empty, or the
    fleet has no such topic: ``fleet_exists``). ``behind`` is ``site_last - fleet_last``, an
    upper bound of the records still to copy (the site's markers count too)."""

    topic: str
    partition: int
    site_end: int
    site_last: int | None
    fleet_last: int | None
    fleet_exists: bool = True

    @property
    def caught_up(self) -> bool:
        return self.site_last is None or (self.fleet_last is not None
                                          and self.fleet_last >= self.site_last)

    @property
    def behind(self) -> int:
        if self.site_last is None:
            return 0
        return self.site_last - (-1 if self.fleet_last is None else self.fleet_last)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "caught_up": self.caught_up, "behind": self.behind}


@dataclass(frozen=True)
class MirrorStatus:
    """The answer of :meth:`Mirror.astatus`: running or not, and each topic's lag when the
    brokers could be asked (``error`` says why not)."""

    running: bool
    pid: int | None
    state: MirrorState | None
    lags: tuple[TopicLag, ...] = ()
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"running": self.running, "pid": self.pid,
                "site": self.state.site if self.state else None,
                "fleet": self.state.fleet if self.state else None,
                "site_alias": self.state.site_alias if self.state else None,
                "topics": [lag.as_dict() for lag in self.lags], "error": self.error}


# -------------------------------------------------------------------------- broker reads
async def _answers(bootstrap: str, role: str, timeout: float) -> None:
    try:
        await wait_ready(bootstrap, timeout)
    except BrokerError as exc:
        raise MirrorError(f"the {role} broker {bootstrap} does not answer: {exc}") from None


async def _cluster_info(bootstrap: str) -> tuple[str, int, list[str]]:
    """(cluster id, broker count, topic names) of the cluster at ``bootstrap``."""
    admin = make_admin(bootstrap)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        names = await admin.list_topics()
        return str(cluster["cluster_id"]), len(cluster["brokers"]), list(names)
    finally:
        await admin.close()


async def _partitions(bootstrap: str, names: Sequence[str]) -> dict[str, int]:
    """How many partitions each of ``names`` has (0 for a topic that is not there)."""
    if not names:
        return {}
    admin = make_admin(bootstrap)
    try:
        await admin.start()
        described = await admin.describe_topics(list(names))
    finally:
        await admin.close()
    counts = {str(d["topic"]): (len(d["partitions"]) if d["error_code"] == 0 else 0)
              for d in described}
    return {n: counts.get(n, 0) for n in names}


async def _last_record(consumer: Any, tp: TopicPartition, begin: int, end: int) -> Any:
    """The last committed record of ``tp`` below ``end`` (None when there is none): read from
    a small window before ``end``, widened while it holds only markers or aborted records."""
    window = 8
    while True:
        lo = max(begin, end - window)
        consumer.seek(tp, lo)
        last = None
        deadline = time.monotonic() + 30
        while await consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise MirrorError(f"reading the tail of {tp.topic}: stuck at "
                                  f"{await consumer.position(tp)} of {end}")
            batch = await consumer.getmany(tp, timeout_ms=500)
            for m in batch.get(tp, []):
                if m.offset < end:
                    last = m
        if last is not None or lo == begin:
            return last
        window *= 8


async def _tails(bootstrap: str, names: Sequence[str], *, mirrored: bool
                 ) -> dict[tuple[str, int], tuple[int, int | None] | None]:
    """For each partition of ``names``: (last stable offset, offset of the last committed
    record), in site offsets on a mirrored copy; None for a topic the cluster does not have."""
    counts = await _partitions(bootstrap, names)
    out: dict[tuple[str, int], tuple[int, int | None] | None] = {}
    tps: list[TopicPartition] = []
    for name in names:
        if counts[name] == 0:
            out[(name, 0)] = None
        tps += [TopicPartition(name, p) for p in range(counts[name])]
    if not tps:
        return out
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        consumer.assign(tps)
        begins = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            last = await _last_record(consumer, tp, begins[tp], ends[tp]) \
                if ends[tp] > begins[tp] else None
            offset: int | None
            if last is None:
                offset = None
            elif mirrored:
                offset = mirror_header(last.headers, MIRROR_OFFSET_HEADER)
                if offset is None:
                    raise MirrorError(f"{tp.topic} on the fleet holds records the mirror did "
                                      f"not write (offset {last.offset} has no "
                                      f"{MIRROR_OFFSET_HEADER} header)")
            else:
                offset = last.offset
            out[(tp.topic, tp.partition)] = (ends[tp], offset)
    finally:
        await consumer.stop()
    return out


async def lags(site: str, fleet: str, names: Sequence[str]) -> list[TopicLag]:
    """Each partition's lag (:class:`TopicLag`), from the two clusters' tails: two small reads
    per partition."""
    s, f = await asyncio.gather(_tails(site, names, mirrored=False),
                                _tails(fleet, names, mirrored=True))
    out = []
    for (topic, partition), tail in sorted(s.items()):
        if tail is None:
            continue
        fleet_tail = f.get((topic, partition))
        out.append(TopicLag(topic, partition, tail[0], tail[1],
                            None if fleet_tail is None else fleet_tail[1],
                            fleet_exists=fleet_tail is not None))
    return out


async def _log_starts(site: str, names: Sequence[str]) -> dict[tuple[str, int], int]:
    counts = await _partitions(site, names)
    tps = [TopicPartition(n, p) for n in names for p in range(counts[n])]
    if not tps:
        return {}
    consumer = make_consumer(site)
    await consumer.start()
    try:
        begins = await consumer.beginning_offsets(tps)
        return {(tp.topic, tp.partition): int(o) for tp, o in begins.items()}
    finally:
        await consumer.stop()


async def _prepare_fleet_topics(site: str, fleet: str, names: Sequence[str]) -> None:
    """Create each topic's fleet copy (same partitions, :func:`fleet_topic_configs`) if the
    fleet does not have it; refuse a fleet topic that would not keep the site's offsets and
    times (``LogAppendTime``, other partition counts)."""
    from fx_kafka.client import create_topics
    from fx_kafka.workload import topic_configs

    site_configs = await topic_configs(site, list(names))
    site_parts = await _partitions(site, names)
    fleet_parts = await _partitions(fleet, names)
    for name in names:
        if fleet_parts[name] == 0:
            await create_topics(fleet, [name], partitions=site_parts[name],
                                configs=fleet_topic_configs(site_configs.get(name, {})))
    fleet_configs = await topic_configs(fleet, list(names))
    fleet_parts = await _partitions(fleet, names)
    problems = []
    for name in names:
        stamp = fleet_configs.get(name, {}).get("message.timestamp.type")
        if stamp != "CreateTime":
            problems.append(f"{name}: message.timestamp.type={stamp} on the fleet (the copy must "
                            "be CreateTime, or the fleet's append time replaces the site's "
                            "times); delete that topic on the fleet or alter it with "
                            "--add-config message.timestamp.type=CreateTime")
        if fleet_parts[name] != site_parts[name]:
            problems.append(f"{name}: {fleet_parts[name]} partitions on the fleet, "
                            f"{site_parts[name]} on the site")
    if problems:
        raise MirrorError("the fleet's topics cannot hold a copy of the site's:\n  "
                          + "\n  ".join(problems))


# -------------------------------------------------------------------------------- Mirror
class Mirror:
    """One site -> fleet flow of MirrorMaker 2, run as a background process from ``state_dir``.

    Use::

        mirror = Mirror(site, fleet, state_dir=Path("/tmp/m"), workloads=["w1"])
        await mirror.astart()                 # returns once the copy caught up with the site
        await mirror.wait_caught_up(timeout=60)
        await mirror.astop()                  # a cut link; astart() again resumes

    ``site`` and ``fleet`` may be omitted to act on a state dir's mirror (``stop``,
    ``status``, and ``start`` again with the settings it recorded).
    ``die_with_parent`` (Linux) makes the process get SIGTERM when the starting thread ends.
    """

    def __init__(self, site: str | None = None, fleet: str | None = None, *,
                 state_dir: Path | str = DEFAULT_STATE_DIR, workloads: Sequence[str] = (),
                 all_workloads: bool = False, system_topics: bool = True,
                 site_alias: str | None = None, heap: str = DEFAULT_HEAP,
                 exactly_once: bool = True, java: str | None = None,
                 version: str = DEFAULT_KAFKA_VERSION, cache_dir: Path | str | None = None,
                 deploy: Path | str | None = None, die_with_parent: bool = False,
                 connect_timeout: float = 15.0) -> None:
        self.connect_timeout = connect_timeout
        self.state_dir = Path(state_dir).resolve()
        saved = read_mirror_state(self.state_file)
        if (site is None) != (fleet is None):
            raise MirrorError("give both the site and the fleet bootstrap, or neither (to reuse "
                              f"the ones {self.state_file} records)")
        if site is None and saved is not None:
            site, fleet = saved.site, saved.fleet
            workloads = workloads or saved.workloads
            all_workloads = all_workloads or saved.all_workloads
            site_alias = site_alias or saved.site_alias
            exactly_once = exactly_once and saved.exactly_once
        self.site = site
        self.fleet = fleet
        self.workloads = tuple(workloads)
        self.all_workloads = all_workloads
        self.system_topics = system_topics
        self.site_alias = site_alias
        self.heap = heap
        self.exactly_once = exactly_once
        self.java = java
        self.version = version
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.deploy = Path(deploy) if deploy is not None else deploy_dir()
        self.die_with_parent = die_with_parent
        self.topics: list[str] = list(saved.topics) if saved else []
        self.last_start_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_mark = 0

    def __repr__(self) -> str:
        return f"Mirror({self.site!r} -> {self.fleet!r}, state_dir={str(self.state_dir)!r})"

    # -- paths -------------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def properties_file(self) -> Path:
        return self.state_dir / "mm2.properties"

    @property
    def log_file(self) -> Path:
        return self.state_dir / "mirror.log"

    @property
    def stdout_log(self) -> Path:
        return self.state_dir / "stdout.log"

    @property
    def lib_dirs(self) -> tuple[Path, Path]:
        root = self.cache_dir / f"kafka-{self.version}"
        return root / "lib", root / "mirror"

    def log_tail(self, lines: int = 40) -> str:
        tails = (log_tail(self.stdout_log, lines), log_tail(self.log_file, lines))
        return "\n".join(t for t in tails if t)

    # -- process -----------------------------------------------------------------------------
    def _owns(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid and self._proc.poll() is not None:
            return False
        if not pid_alive(pid):
            return False
        cmd = cmdline(pid)
        return cmd is None or (MAIN_CLASS in cmd and str(self.properties_file) in cmd)

    def pid(self) -> int | None:
        """The pid of this state dir's running mirror, or None."""
        state = read_mirror_state(self.state_file)
        if state is None or state.pid is None:
            return None
        return state.pid if self._owns(state.pid) else None

    def fetch(self) -> None:
        """Make sure MirrorMaker 2 and the transform are built (``fetch.sh --mirror``)."""
        script = self.deploy / "fetch.sh"
        _, mirror = self.lib_dirs
        if not script.exists():
            if (mirror / "fx-mirror-1.jar").exists():
                return
            raise FetchError(f"{script} not found and no MirrorMaker 2 build at {mirror}")
        env = dict(os.environ, FX_CACHE_DIR=str(self.cache_dir), KAFKA_VERSION=self.version)
        out = subprocess.run(["bash", str(script), "--mirror"], env=env, capture_output=True,
                             text=True, check=False)
        if out.returncode != 0 or not mirror.is_dir():
            raise FetchError(f"{script} --mirror failed (exit {out.returncode}):\n"
                             f"{out.stderr.strip()[-4000:]}")

    async def _check(self) -> tuple[list[str], int]:
        """Both brokers answer, the workloads are on the site, site and fleet differ: the
        topics to mirror and the fleet's broker count."""
        if self.site is None or self.fleet is None:
            raise MirrorError(f"no site and fleet given, and no {self.state_file} to take them "
                              "from: fx mirror start --from SITE --to FLEET")
        await asyncio.gather(_answers(self.site, "site", self.connect_timeout),
                             _answers(self.fleet, "fleet", self.connect_timeout))
        (site_id, _, site_topics), (fleet_id, fleet_brokers, _) = await asyncio.gather(
            _cluster_info(self.site), _cluster_info(self.fleet))
        names = select_topics(site_topics, workloads=self.workloads,
                              all_workloads=self.all_workloads, system=self.system_topics)
        if site_id == fleet_id:
            raise MirrorError(f"the site {self.site} and the fleet {self.fleet} are the same "
                              f"cluster ({site_id})")
        if self.site_alias is None:
            self.site_alias = f"site-{site_id}"
        return names, fleet_brokers

    async def _plan(self, names: list[str], fleet_brokers: int) -> str:
        """Create the fleet's copies and render the config."""
        assert self.site is not None and self.fleet is not None and self.site_alias is not None
        await _prepare_fleet_topics(self.site, self.fleet, names)
        starts = await _log_starts(self.site, names)
        text = render_mm2_properties(site=self.site, fleet=self.fleet,
                                     site_alias=self.site_alias, topics=names,
                                     log_starts=starts, fleet_brokers=fleet_brokers,
                                     exactly_once=self.exactly_once)
        return text

    def _launch(self, java: str) -> subprocess.Popen[bytes]:
        lib, mirror = self.lib_dirs
        cmd = [java, f"-Xms{self.heap}", f"-Xmx{self.heap}",
               f"-Dlog4j2.configurationFile={self.state_dir / 'log4j2.properties'}",
               "-cp", f"{lib}/*:{mirror}/*", MAIN_CLASS, str(self.properties_file)]
        with contextlib.suppress(OSError):
            self._log_mark = self.log_file.stat().st_size
        with open(self.stdout_log, "ab") as out:
            proc = subprocess.Popen(
                cmd, cwd=self.state_dir, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent if self.die_with_parent else None)
        self._proc = proc
        return proc

    def _write_state(self, pid: int | None, t0: float) -> None:
        assert self.site is not None and self.fleet is not None and self.site_alias is not None
        _write_json(self.state_file, asdict(MirrorState(
            pid=pid, site=self.site, fleet=self.fleet, site_alias=self.site_alias,
            workloads=self.workloads, all_workloads=self.all_workloads,
            topics=tuple(self.topics), exactly_once=self.exactly_once, started_at=time.time(),
            start_seconds=round(time.perf_counter() - t0, 3))))

    async def astart(self, timeout: float = 180.0, *, wait: bool = True) -> list[str]:
        """Start MirrorMaker 2 in the background and, with ``wait``, return once every topic's
        fleet copy holds what the site held when it started (:meth:`wait_caught_up`). Returns
        the topics mirrored. :class:`MirrorError` (with the log tail) when it exits or does not
        catch up within ``timeout`` (it is then left running: ``astop`` ends it)."""
        t0 = time.perf_counter()
        running = self.pid()
        if running is not None:
            raise MirrorError(f"a mirror already runs from {self.state_dir} (pid {running}): "
                              "fx mirror stop first")
        names, fleet_brokers = await self._check()
        java = check_java(self.java) if self.java else find_java()
        await asyncio.to_thread(self.fetch)
        text = await self._plan(names, fleet_brokers)
        self.topics = names
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.properties_file.write_text(text)
        (self.state_dir / "log4j2.properties").write_text(LOG4J2.format(log=self.log_file))
        targets = await self._site_targets(names)
        proc = self._launch(java)  # from the calling thread (die_with_parent)
        self._write_state(proc.pid, t0)
        log.info("MirrorMaker 2 (pid %d) %s -> %s: %d topics", proc.pid, self.site, self.fleet,
                 len(names))
        if wait:
            await self.wait_caught_up(timeout=max(1.0, timeout - (time.perf_counter() - t0)),
                                      targets=targets)
        self.last_start_seconds = time.perf_counter() - t0
        self._write_state(proc.pid, t0)
        return names

    def start(self, timeout: float = 180.0, *, wait: bool = True) -> list[str]:
        """:meth:`astart` for sync callers."""
        return asyncio.run(self.astart(timeout, wait=wait))

    async def _site_targets(self, names: Sequence[str]) -> dict[tuple[str, int], int | None]:
        assert self.site is not None
        tails = await _tails(self.site, names, mirrored=False)
        return {k: v[1] for k, v in tails.items() if v is not None}

    def _check_running(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise MirrorError(f"MirrorMaker 2 exited with code {self._proc.returncode}",
                              log_tail=self.log_tail())
        if self._proc is None and self.pid() is None:
            raise MirrorError(f"no mirror runs from {self.state_dir}", log_tail=self.log_tail())
        failed = self._connector_failure()
        if failed:
            raise MirrorError(f"MirrorMaker 2 refused its configuration ({self.properties_file}): "
                              f"{failed}", log_tail=self.log_tail())

    def _connector_failure(self) -> str | None:
        """The error MirrorMaker 2 logged since this start when the source connector's config
        was refused (it then runs on, replicating nothing)."""
        if self._proc is None:
            return None
        try:
            with self.log_file.open("rb") as fh:
                fh.seek(self._log_mark)
                text = fh.read().decode(errors="replace")
        except OSError:
            return None
        marker = "Failed to configure MirrorSourceConnector"
        at = text.find(marker)
        if at < 0:
            return None
        return " ".join(text[at:at + 600].split("\n")[1:3]).strip() or marker

    async def wait_caught_up(self, topics: Sequence[str] | None = None, timeout: float = 120.0,
                             *, targets: dict[tuple[str, int], int | None] | None = None
                             ) -> list[TopicLag]:
        """Return once each partition of ``topics`` (default: every mirrored topic) has on the
        fleet the site's last committed record as of this call (or ``targets``: the site offset
        each must reach). :class:`MirrorError` when the mirror is not running or ``timeout``
        passes. Returns the lags last seen."""
        assert self.site is not None and self.fleet is not None
        names = list(topics) if topics is not None else list(self.topics)
        if targets is None:
            targets = await self._site_targets(names)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self._check_running()
            fleet = await _tails(self.fleet, names, mirrored=True)
            behind = []
            for key, want in targets.items():
                if key[0] not in names or want is None:
                    continue
                got = fleet.get(key)
                if got is None or got[1] is None or got[1] < want:
                    behind.append((key, want, None if got is None else got[1]))
            if not behind:
                return await lags(self.site, self.fleet, names)
            if loop.time() > deadline:
                detail = ", ".join(f"{t}:{p} at {got} of {want}" for (t, p), want, got in behind)
                raise MirrorError(f"the fleet's copy did not catch up in {timeout:.0f} s: "
                                  f"{detail}", log_tail=self.log_tail())
            await asyncio.sleep(0.5)

    # -- stop / status -----------------------------------------------------------------------
    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM (a clean stop commits what was copied), SIGKILL after ``timeout``. Returns
        whether a running mirror was stopped. The fleet's copy and the mirror's offsets stay."""
        pid = self.pid()
        state = read_mirror_state(self.state_file)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not self._wait_gone(pid, timeout):
                log.warning("MirrorMaker 2 pid %d ignored SIGTERM for %.0f s: SIGKILL", pid,
                            timeout)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._wait_gone(pid, 10.0)
        if state is not None and state.pid is not None:
            _write_json(self.state_file, asdict(dataclasses.replace(state, pid=None)))
        self._proc = None
        return pid is not None

    async def astop(self, timeout: float = 30.0) -> bool:
        """:meth:`stop` for async callers."""
        return await asyncio.to_thread(self.stop, timeout)

    def _wait_gone(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(0.1)
                if self._proc.poll() is not None:
                    return True
            elif not pid_alive(pid):
                return True
            else:
                time.sleep(0.1)
        return False

    def kill(self) -> None:
        """SIGKILL the running mirror (no clean stop: a crash, for tests)."""
        pid = self.pid()
        if pid is None:
            raise MirrorError(f"no mirror runs from {self.state_dir}")
        os.kill(pid, signal.SIGKILL)
        self._wait_gone(pid, 10.0)
        self.stop()

    async def astatus(self) -> MirrorStatus:
        """Running or not (``state.json`` and the process table) and each topic's lag."""
        state = read_mirror_state(self.state_file)
        pid = self.pid()
        if state is None:
            return MirrorStatus(False, None, None, error=f"no mirror state in {self.state_dir}")
        try:
            found = await asyncio.wait_for(lags(state.site, state.fleet, list(state.topics)),
                                           timeout=30)
        except (BrokerError, TimeoutError, OSError) as exc:
            return MirrorStatus(pid is not None, pid, state, error=f"lag unknown: {exc!r}")
        except Exception as exc:  # an unreachable broker surfaces as aiokafka's own errors
            return MirrorStatus(pid is not None, pid, state, error=f"lag unknown: {exc!r}")
        return MirrorStatus(pid is not None, pid, state, tuple(found))


# ---------------------------------------------------------------------------------- CLI
def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx mirror start|stop|status``."""
    mirror = subparsers.add_parser(
        "mirror", help="forward a site's workload streams to the fleet's cluster (MirrorMaker 2)",
        description="MirrorMaker 2 (dedicated mode, exactly-once, topic names kept, the site's "
        "times and offsets kept) from a site's broker to the fleet's, as a background process. "
        "docs/operations.md, 'Mirroring a site to the fleet'.")
    actions = mirror.add_subparsers(dest="mirror_command", metavar="{start,stop,status}")
    actions.required = True

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--dir", type=Path, default=DEFAULT_STATE_DIR,
                       help=f"the mirror's state and logs (default: {DEFAULT_STATE_DIR})")

    start = actions.add_parser("start", help="start mirroring and wait until the copy caught up")
    common(start)
    start.add_argument("--from", dest="site", metavar="SITE_BOOTSTRAP",
                       help="the site's broker (default: the one --dir recorded)")
    start.add_argument("--to", dest="fleet", metavar="FLEET_BOOTSTRAP",
                       help="the fleet's broker (default: the one --dir recorded)")
    which = start.add_mutually_exclusive_group()
    which.add_argument("--workload", action="append", default=[], metavar="ID",
                       help="a workload to mirror (repeatable): its wl.<ID>.* topics")
    which.add_argument("--all", action="store_true", help="every workload on the site")
    start.add_argument("--no-system-topics", action="store_true",
                       help="leave sys.facts, sys.keys, sys.chunks, sys.rejects, sys.modules and "
                       "the ledgers out (the fleet then cannot check the site's signatures)")
    start.add_argument("--name", metavar="ALIAS",
                       help="the site's alias in MirrorMaker 2 (default: site-<cluster id>); "
                       "one per site: it names the mirror's state topics on the fleet")
    start.add_argument("--heap", default=DEFAULT_HEAP, help="JVM heap, e.g. 256m")
    start.add_argument("--at-least-once", action="store_true",
                       help="no transactions on the fleet (a crash may copy records twice; "
                       "readers keep each site offset once)")
    start.add_argument("--timeout", type=float, default=180.0,
                       help="seconds to wait for the copy to catch up")
    start.add_argument("--connect-timeout", type=float, default=15.0,
                       help="seconds to wait for each broker to answer")
    start.add_argument("--no-wait", action="store_true", help="return once it is started")
    start.set_defaults(func=cmd_start)

    stop = actions.add_parser("stop", help="stop the mirror (the copy and its offsets stay)")
    common(stop)
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds before SIGKILL")
    stop.set_defaults(func=cmd_stop)

    status = actions.add_parser("status", help="running or not, and each topic's lag "
                                "(exit 3 when stopped)")
    common(status)
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)


def _setup_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)


def _quiet() -> None:
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


def cmd_start(args: argparse.Namespace) -> int:
    _setup_logging()
    _quiet()
    try:
        mirror = Mirror(args.site, args.fleet, state_dir=args.dir, workloads=args.workload,
                        all_workloads=args.all, system_topics=not args.no_system_topics,
                        site_alias=args.name, heap=args.heap,
                        exactly_once=not args.at_least_once,
                        connect_timeout=args.connect_timeout)
        names = mirror.start(timeout=args.timeout, wait=not args.no_wait)
    except (BrokerError, ValueError) as exc:
        print(f"fx mirror start: {exc}", file=sys.stderr)
        return 1
    print(f"mirroring {len(names)} topics {mirror.site} -> {mirror.fleet} as "
          f"{mirror.site_alias} (pid {mirror.pid()}, "
          f"{'exactly-once' if mirror.exactly_once else 'at-least-once'})"
          + ("" if args.no_wait else f"; caught up in {mirror.last_start_seconds or 0:.1f} s")
          + f"; log {mirror.log_file}", file=sys.stderr)
    for name in names:
        print(name)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    _setup_logging()
    mirror = Mirror(state_dir=args.dir)
    pid = mirror.pid()
    print(f"stopped (pid {pid})" if mirror.stop(timeout=args.timeout) else "not running")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    _quiet()
    status = asyncio.run(Mirror(state_dir=args.dir).astatus())
    if args.json:
        print(json.dumps(status.as_dict(), indent=2, sort_keys=True))
    else:
        if status.state is None:
            print("stopped (never started here)")
            return EXIT_STOPPED
        st = status.state
        print(f"{'running' if status.running else 'stopped'} {st.site} -> {st.fleet} as "
              f"{st.site_alias}" + (f" pid {status.pid}" if status.pid else ""))
        if status.error:
            print(status.error)
        for lag in status.lags:
            where = ("no copy on the fleet" if not lag.fleet_exists
                     else "caught up" if lag.caught_up else f"{lag.behind} offsets behind")
            print(f"  {lag.topic}:{lag.partition}  site end {lag.site_end}, last record "
                  f"{lag.site_last}; fleet copy up to {lag.fleet_last}: {where}")
    return 0 if status.running else EXIT_STOPPED
