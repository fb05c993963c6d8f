"""A local Apache Kafka (KRaft) on 127.0.0.1, no Docker: one combined broker + controller, or a
cluster of N such nodes (``fx broker start --nodes 3``).

The jars come from Maven Central through ``deploy/local-kafka/fetch.sh`` (cached); each node runs
as ``java -cp 'lib/*' kafka.Kafka server.properties`` in its own session, so it can outlive the
process that started it (``fx broker start``). Everything lives in the data dir:

    data_dir/state.json         pids, bootstrap, ports, cluster id (see BrokerState)
    data_dir/server.properties  rendered from deploy/local-kafka/server.properties.template
    data_dir/kraft/             the log dir (formatted once with StorageTool)
    data_dir/broker.log         the broker's log4j2 log
    data_dir/stdout.log         the JVM's own stdout/stderr (JVM errors land here)

A cluster keeps the same files per node under ``data_dir/node-<id>/`` and one ``state.json``.

``secure=True`` (``fx broker start --secure``) runs the client listener with SASL/SCRAM-SHA-512
over TLS, the controller listener with TLS + SASL/PLAIN for the broker's own principal, and the
KRaft standard authorizer with ``allow.everyone.if.no.acl.found=false``
(``deploy/local-kafka/server-secure.properties.fragment``). Its CA, certificate and passwords are
generated once under ``data_dir/security`` (see :mod:`fx_kafka.local_security`); the SCRAM
credentials are written at format time. A data dir formatted secured stays secured.

A start on a data dir that holds formatted storage always reuses it: the same cluster id, the
same logs and the same listener ports. Nothing here deletes a log dir that holds data except
:meth:`LocalKafka.reset`, which a user asks for by name (``fx broker reset``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from fx_kafka._sync import run_sync
from fx_kafka.client import wait_brokers, wait_ready
from fx_kafka.errors import (
    BrokerAlreadyRunningError,
    BrokerNotReadyError,
    BrokerStartError,
    FetchError,
    JavaNotFoundError,
    PortInUseError,
)
from fx_kafka.local_security import ADMIN_USER, DEFAULT_USERS, LocalSecrets, check_user_name
from fx_kafka.replication import default_for
from fx_kafka.security import ClientSecurity

__all__ = [
    "DEFAULT_HEAP",
    "DEFAULT_KAFKA_VERSION",
    "BrokerState",
    "BrokerStatus",
    "LocalKafka",
    "NodeState",
    "check_java",
    "default_cache_dir",
    "deploy_dir",
    "find_java",
    "java_major_version",
    "merge_properties",
    "pick_free_ports",
    "pid_alive",
    "port_bindable",
    "port_open",
    "port_owner",
    "read_state",
    "render_server_properties",
    "write_state",
]

log = logging.getLogger(__name__)

#: Must equal <kafka.version> in deploy/local-kafka/pom.xml (a unit test checks).
DEFAULT_KAFKA_VERSION = "4.1.1"
DEFAULT_HEAP = "512m"
#: The security lines of a secured broker, merged into the rendered template.
SECURE_FRAGMENT = "server-secure.properties.fragment"
MIN_JAVA = 17
HOST = "127.0.0.1"


def deploy_dir() -> Path:
    """``deploy/local-kafka`` of this checkout (``FX_LOCAL_KAFKA_DIR`` overrides)."""
    env = os.environ.get("FX_LOCAL_KAFKA_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "deploy" / "local-kafka"


def default_cache_dir() -> Path:
    """``$FX_CACHE_DIR`` or ``~/.cache/ninelives-fx`` (the same rule as fetch.sh)."""
    env = os.environ.get("FX_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ninelives-fx"


def render_server_properties(
    template: str,
    *,
    port: int,
    controller_port: int,
    log_dir: Path | str,
    node_id: int = 1,
    voters: dict[int, int] | None = None,
) -> str:
    """Fill the template's placeholders; a placeholder left unfilled raises ``KeyError``.

    ``voters`` (node id -> controller port) makes the node one voter of a static quorum of that
    many nodes, with the internal topics replicated ``min(3, nodes)`` times and a min ISR of 2
    from 3 nodes on. Without it the node is a one-node dynamic quorum (format ``--standalone``).
    """
    if port == controller_port:
        raise ValueError("the broker and controller ports must differ")
    if voters:
        if voters.get(node_id) != controller_port:
            raise ValueError(f"node {node_id} must be a voter on its controller port")
        quorum = "controller.quorum.voters=" + ",".join(
            f"{nid}@{HOST}:{cport}" for nid, cport in sorted(voters.items())
        )
        replication, min_isr = default_for(len(voters))
    else:
        quorum = f"controller.quorum.bootstrap.servers={HOST}:{controller_port}"
        replication, min_isr = 1, 1
    return string.Template(template).substitute(
        port=port,
        controller_port=controller_port,
        log_dir=str(log_dir),
        node_id=node_id,
        quorum=quorum,
        replication_factor=replication,
        min_isr=min_isr,
    )


def merge_properties(base: str, overrides: str) -> str:
    """``base`` (a ``.properties`` text) with every line whose key ``overrides`` sets removed,
    then ``overrides`` appended: one line per key, the override's."""
    def key_of(line: str) -> str | None:
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")) or "=" not in stripped:
            return None
        return stripped.split("=", 1)[0].strip()

    replaced = {k for k in map(key_of, overrides.splitlines()) if k}
    kept = [line for line in base.splitlines() if key_of(line) not in replaced]
    return "\n".join(kept).rstrip("\n") + "\n\n" + overrides.rstrip("\n") + "\n"


def pick_free_ports(n: int = 2, host: str = HOST) -> list[int]:
    """``n`` distinct ports that are free on ``host`` right now (the OS picks them).

    All sockets stay bound until every port is chosen, so the ports differ. Another process may
    still take one before the broker binds it; the broker then fails fast and start() says so.
    """
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def port_open(port: int, host: str = HOST, timeout: float = 0.25) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_bindable(port: int, host: str = HOST) -> bool:
    """Whether a listener could bind ``host:port`` now, with ``SO_REUSEADDR`` as the JVM binds:
    connections of a stopped broker left in TIME_WAIT do not count, another listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_owner(port: int) -> str | None:
    """``"pid N (command)"`` of the process listening on TCP ``port`` (Linux ``/proc``), or None
    when it cannot be told (not Linux, or the process belongs to another user)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            listening = len(fields) > 9 and fields[3] == "0A"  # TCP_LISTEN
            if listening and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target in wanted:
                cmd = _cmdline(int(proc.name)) or []
                return f"pid {proc.name} ({' '.join(c for c in cmd if c)[:200]})"
    return None


@dataclass(frozen=True)
class NodeState:
    """One node of a local broker: its id, pid (None when not running) and ports."""

    node_id: int
    pid: int | None
    port: int
    controller_port: int


@dataclass(frozen=True)
class BrokerState:
    """What ``data_dir/state.json`` records about the broker started from that dir.

    ``pid`` is None once the broker was stopped (ports and cluster id stay, so a restart reuses
    the formatted storage). ``pid``, ``port`` and ``controller_port`` are node 1's; ``nodes`` lists
    every node of a cluster (empty in state files of a one-node broker written before clusters).
    ``bootstrap`` names every node's listener, comma-separated.
    """

    pid: int | None
    bootstrap: str
    port: int
    controller_port: int
    version: str
    cluster_id: str
    started_at: float
    start_seconds: float
    nodes: tuple[NodeState, ...] = ()
    #: SASL_SSL + ACLs (``fx broker start --secure``); credentials in ``data_dir/security``
    secure: bool = False

    def node_states(self) -> tuple[NodeState, ...]:
        """Every node (one, synthesised from the top-level fields, for an old one-node file)."""
        return self.nodes or (NodeState(1, self.pid, self.port, self.controller_port),)


def write_state(path: Path, state: BrokerState) -> None:
    """Write ``state`` as JSON, atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_state(path: Path) -> BrokerState | None:
    """The state in ``path``; None if there is none or it cannot be read."""
    try:
        raw = json.loads(path.read_text())
        raw["nodes"] = tuple(NodeState(**node) for node in raw.get("nodes", ()))
        return BrokerState(**raw)
    except (OSError, ValueError, TypeError, KeyError):
        return None


@dataclass(frozen=True)
class BrokerStatus:
    """The answer of :meth:`LocalKafka.status`: ``running`` when any node runs; ``alive`` and
    ``stopped`` name the node ids that run and that do not (a one-node broker is node 1)."""

    running: bool
    bootstrap: str | None
    pid: int | None
    data_dir: Path
    alive: tuple[int, ...] = ()
    stopped: tuple[int, ...] = ()


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (not Linux): trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode(errors="replace").split("\0")


def java_major_version(java: str) -> int:
    """The major version of ``java`` (8 for ``1.8.0_x``); JavaNotFoundError if it won't run."""
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaNotFoundError(f"cannot run {java!r}: {exc}") from exc
    text = out.stderr + out.stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if out.returncode != 0 or match is None:
        raise JavaNotFoundError(f"{java!r} -version failed: {text.strip()[:500]}")
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    return major


def check_java(java: str) -> str:
    """``java`` if it runs and is Java 17 or newer, else JavaNotFoundError."""
    major = java_major_version(java)
    if major < MIN_JAVA:
        raise JavaNotFoundError(f"{java} is Java {major}; the Kafka 4.x broker needs {MIN_JAVA}+")
    return java


def find_java() -> str:
    """``$JAVA_HOME/bin/java``, else ``java`` on PATH, checked to be Java 17 or newer."""
    candidates: list[str] = []
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        candidates.append(str(Path(java_home) / "bin" / "java"))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(on_path)
    if not candidates:
        raise JavaNotFoundError(
            f"no java found (JAVA_HOME unset and no java on PATH); Kafka needs Java {MIN_JAVA}+"
        )
    return check_java(candidates[0])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass(frozen=True)
class _NodeFiles:
    """Where one node's files live (the data dir itself for a one-node broker)."""

    node_id: int
    root: Path

    @property
    def log_dir(self) -> Path:
        return self.root / "kraft"

    @property
    def properties(self) -> Path:
        return self.root / "server.properties"

    @property
    def broker_log(self) -> Path:
        return self.root / "broker.log"

    @property
    def stdout_log(self) -> Path:
        return self.root / "stdout.log"

    def formatted(self) -> bool:
        return (self.log_dir / "meta.properties").exists()

    def holds_files(self) -> bool:
        return self.log_dir.is_dir() and any(self.log_dir.iterdir())


@dataclass
class _Plan:
    java: str
    cluster_id: str
    nodes: list[NodeState]
    t0: float
    reused: bool
    #: users that got a password after the storage was formatted: added once the broker runs
    new_users: list[str] = dataclasses.field(default_factory=list)


def _bootstrap_of(nodes: list[NodeState] | tuple[NodeState, ...]) -> str:
    return ",".join(f"{HOST}:{n.port}" for n in nodes)


class LocalKafka:
    """A local Kafka whose files live in ``data_dir``: one node, or ``nodes`` of them.

    Sync use::

        with LocalKafka(data_dir=Path("/tmp/k")) as kafka:
            print(kafka.bootstrap)

    Async use: ``async with LocalKafka(...) as kafka`` (or ``await kafka.astart()`` /
    ``await kafka.astop()``). ``start`` leaves the nodes running in their own sessions; ``stop``
    ends them by the pids in ``state.json``, so a different process may stop them.
    :meth:`kill_node` and :meth:`start_node` take one node of a cluster down and up (fault
    tests).

    ``die_with_parent`` (Linux) makes each node get SIGTERM when the thread that started it
    exits: a test session that is killed leaves no broker behind. ``fx broker start`` leaves it off.
    """

    def __init__(
        self,
        *,
        data_dir: Path | str,
        version: str = DEFAULT_KAFKA_VERSION,
        cache_dir: Path | str | None = None,
        heap: str = DEFAULT_HEAP,
        java: str | None = None,
        deploy: Path | str | None = None,
        die_with_parent: bool = False,
        nodes: int = 1,
        secure: bool = False,
        users: tuple[str, ...] | list[str] = (),
    ) -> None:
        if not 1 <= nodes <= 9:
            raise ValueError(f"a local cluster has 1 to 9 nodes, not {nodes}")
        self.secure = secure
        self.users = tuple(dict.fromkeys((*DEFAULT_USERS, *map(check_user_name, users))))
        self.data_dir = Path(data_dir).resolve()
        self.version = version
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.heap = heap
        self.java = java
        self.deploy = Path(deploy) if deploy is not None else deploy_dir()
        self.die_with_parent = die_with_parent
        self.nodes = nodes
        self.last_fetch_seconds: float | None = None
        self.last_start_seconds: float | None = None
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._bootstrap: str | None = None

    def __repr__(self) -> str:
        return (f"LocalKafka(version={self.version!r}, data_dir={str(self.data_dir)!r}, "
                f"nodes={self.nodes}{', secure=True' if self.secure else ''})")

    # -- security --------------------------------------------------------------------------------
    @property
    def secrets(self) -> LocalSecrets:
        """The CA, certificate and passwords of a secured broker (``data_dir/security``)."""
        return LocalSecrets(self.data_dir / "security")

    def security_for(self, user: str = ADMIN_USER) -> ClientSecurity:
        """The client settings of ``user`` on this (secured) broker; PLAINTEXT when it is not
        secured."""
        if not self._is_secure():
            return ClientSecurity()
        return self.secrets.client_security(user)

    @property
    def admin_security(self) -> ClientSecurity:
        """The broker's own principal (the super user), or PLAINTEXT when not secured."""
        return self.security_for(ADMIN_USER)

    def _is_secure(self) -> bool:
        state = read_state(self.state_file)
        return self.secure or (state is not None and state.secure)

    # -- paths -----------------------------------------------------------------------------------
    def _files(self, node_id: int, count: int | None = None) -> _NodeFiles:
        count = self.nodes if count is None else count
        root = self.data_dir if count == 1 else self.data_dir / f"node-{node_id}"
        return _NodeFiles(node_id, root)

    @property
    def lib_dir(self) -> Path:
        return self.cache_dir / f"kafka-{self.version}" / "lib"

    @property
    def state_file(self) -> Path:
        return self.data_dir / "state.json"

    @property
    def properties_file(self) -> Path:
        """Node 1's ``server.properties``."""
        return self._files(1).properties

    @property
    def log_dir(self) -> Path:
        """Node 1's log dir."""
        return self._files(1).log_dir

    @property
    def broker_log(self) -> Path:
        """Node 1's log4j2 log."""
        return self._files(1).broker_log

    @property
    def stdout_log(self) -> Path:
        """Node 1's JVM stdout/stderr."""
        return self._files(1).stdout_log

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT[,...]`` of the running broker (RuntimeError if it was never started)."""
        if self._bootstrap is None:
            state = read_state(self.state_file)
            if state is None or not any(n.pid for n in state.node_states()):
                raise RuntimeError(f"{self!r} is not running")
            self._bootstrap = state.bootstrap
        return self._bootstrap

    # -- fetch -----------------------------------------------------------------------------------
    def fetch(self) -> float:
        """Make sure the jars are in the cache (fetch.sh; idempotent). Returns the seconds taken."""
        t0 = time.perf_counter()
        script = self.deploy / "fetch.sh"
        marker = self.lib_dir.parent / ".fetched"
        if not script.exists():
            if marker.exists():
                return 0.0
            raise FetchError(f"{script} not found and no complete cache at {self.lib_dir}")
        env = dict(os.environ, FX_CACHE_DIR=str(self.cache_dir), KAFKA_VERSION=self.version)
        try:
            out = subprocess.run(
                ["bash", str(script)], env=env, capture_output=True, text=True, check=False
            )
        except OSError as exc:
            raise FetchError(f"cannot run {script}: {exc}") from exc
        if out.returncode != 0 or not self.lib_dir.is_dir():
            raise FetchError(
                f"{script} failed (exit {out.returncode}):\n{out.stderr.strip()[-4000:]}"
            )
        elapsed = time.perf_counter() - t0
        self.last_fetch_seconds = elapsed
        if "fetching" in out.stderr:
            log.info("fetched Kafka %s into %s in %.1f s", self.version, self.lib_dir, elapsed)
        else:
            log.debug("Kafka %s already cached at %s (%.3f s)", self.version, self.lib_dir, elapsed)
        return elapsed

    # -- status ----------------------------------------------------------------------------------
    def _owns(self, pid: int, files: _NodeFiles | None = None) -> bool:
        """Whether ``pid`` is a live node started from this data dir (guards pid reuse)."""
        files = files or self._files(1)
        proc = self._procs.get(files.node_id)
        if proc is not None and proc.pid == pid and proc.poll() is not None:
            return False
        if not pid_alive(pid):
            return False
        cmd = _cmdline(pid)
        if cmd is None:
            return True  # no /proc: trust the pid
        return "kafka.Kafka" in cmd and str(files.properties) in cmd

    def _alive(self, state: BrokerState) -> list[NodeState]:
        nodes = state.node_states()
        return [n for n in nodes
                if n.pid is not None and self._owns(n.pid, self._files(n.node_id, len(nodes)))]

    def status(self) -> BrokerStatus:
        """Running or not, with bootstrap and pid, from ``state.json`` and the process table."""
        state = read_state(self.state_file)
        if state is None:
            return BrokerStatus(False, None, None, self.data_dir)
        alive = self._alive(state)
        ids = tuple(n.node_id for n in alive)
        stopped = tuple(n.node_id for n in state.node_states() if n.node_id not in ids)
        if not alive:
            return BrokerStatus(False, None, None, self.data_dir, (), stopped)
        return BrokerStatus(True, state.bootstrap, alive[0].pid, self.data_dir, ids, stopped)

    # -- start -----------------------------------------------------------------------------------
    def _check_ports_free(self, nodes: list[NodeState]) -> None:
        for node in nodes:
            for what, port in (("listener", node.port), ("controller", node.controller_port)):
                if port_bindable(port):
                    continue
                owner = port_owner(port)
                raise PortInUseError(
                    f"port {port} ({'node ' + str(node.node_id) + ' ' if self.nodes > 1 else ''}"
                    f"{what}, recorded in {self.state_file}) is in use by "
                    f"{owner or 'another process'}. The data in {self.data_dir} is kept and "
                    "needs this port: stop that process and start again, or delete the data "
                    f"with `fx broker reset --data-dir {self.data_dir}` to start afresh on new "
                    "ports",
                    port=port,
                    owner=owner,
                )

    def _prepare(self) -> _Plan:
        t0 = time.perf_counter()
        current = self.status()
        if current.running:
            assert current.bootstrap is not None and current.pid is not None
            if current.stopped:
                raise BrokerStartError(
                    f"nodes {', '.join(map(str, current.stopped))} of the cluster in "
                    f"{self.data_dir} are down while others run: start them with "
                    "start_node(), or stop the cluster first")
            raise BrokerAlreadyRunningError(
                f"a broker from {self.data_dir} is already running "
                f"(pid {current.pid}, {current.bootstrap})",
                bootstrap=current.bootstrap,
                pid=current.pid,
            )
        java = check_java(self.java) if self.java else find_java()
        self.fetch()
        self.data_dir.mkdir(parents=True, exist_ok=True)

        previous = read_state(self.state_file)
        files = [self._files(i) for i in range(1, self.nodes + 1)]
        if previous is not None:
            count = len(previous.node_states())
            if count != self.nodes:
                raise BrokerStartError(
                    f"{self.data_dir} holds a {count}-node broker; start it with --nodes {count} "
                    f"(or delete its data with `fx broker reset --data-dir {self.data_dir}`)")
        formatted = [f for f in files if f.formatted()]
        if formatted:
            if previous is None:
                raise BrokerStartError(
                    f"{formatted[0].log_dir} holds Kafka data but {self.state_file} is missing "
                    "or unreadable, so its ports and cluster id are unknown. Nothing was "
                    f"deleted; `fx broker reset --data-dir {self.data_dir}` removes the data")
            if previous.version != self.version:
                raise BrokerStartError(
                    f"{self.data_dir} holds data of Kafka {previous.version}, not {self.version}: "
                    f"start it with --version {previous.version}")
            if len(formatted) != len(files):
                missing = [f.node_id for f in files if not f.formatted()]
                raise BrokerStartError(
                    f"node(s) {missing} of {self.data_dir} have no formatted storage while the "
                    "others have: nothing was deleted; restore them or `fx broker reset`")
            if previous.secure != self.secure:
                if not previous.secure:
                    raise BrokerStartError(
                        f"{self.data_dir} was formatted without --secure: its SCRAM credentials "
                        "are written at format time, so it cannot become secured in place; "
                        f"`fx broker reset --data-dir {self.data_dir}` and start again with "
                        "--secure")
                log.info("%s was formatted secured: starting it secured", self.data_dir)
                self.secure = True
            nodes = list(previous.node_states())
            self._check_ports_free(nodes)
            new_users = self.secrets.ensure(self.users) if self.secure else []
            log.info("reusing the storage in %s (cluster %s, ports %s)", self.data_dir,
                     previous.cluster_id, ", ".join(str(n.port) for n in nodes))
            self._render(files, nodes)
            return _Plan(java, previous.cluster_id, nodes, t0, reused=True, new_users=new_users)

        for f in files:
            if f.holds_files():
                raise BrokerStartError(
                    f"{f.log_dir} holds files but no meta.properties (not a formatted Kafka log "
                    f"dir): nothing was deleted; `fx broker reset --data-dir {self.data_dir}` "
                    "removes it")
        ports = pick_free_ports(2 * self.nodes)
        nodes = [NodeState(i + 1, None, ports[2 * i], ports[2 * i + 1])
                 for i in range(self.nodes)]
        scram: list[str] = []
        if self.secure:
            self.secrets.ensure(self.users)
            scram = self.secrets.scram_args()
        self._render(files, nodes)
        cluster_id = self._storage_tool(java, "random-uuid").strip().splitlines()[-1]
        for f in files:
            extra = ("--standalone",) if self.nodes == 1 else ()
            self._storage_tool(java, "format", *extra, "-t", cluster_id, "-c", str(f.properties),
                               *scram)
        # recorded before the first launch: a start that fails after formatting is resumed by the
        # next start on the same ports, never formatted again
        self._write_state(cluster_id, nodes, t0, started=False)
        return _Plan(java, cluster_id, nodes, t0, reused=False)

    def _render(self, files: list[_NodeFiles], nodes: list[NodeState]) -> None:
        template = (self.deploy / "server.properties.template").read_text()
        fragment = (self.deploy / SECURE_FRAGMENT).read_text() if self.secure else None
        voters = {n.node_id: n.controller_port for n in nodes} if len(nodes) > 1 else None
        for f, node in zip(files, nodes, strict=True):
            f.root.mkdir(parents=True, exist_ok=True)
            text = render_server_properties(
                template, port=node.port, controller_port=node.controller_port,
                log_dir=f.log_dir, node_id=node.node_id, voters=voters)
            if fragment is None:
                f.properties.write_text(text)
                continue
            sec = self.secrets
            text = merge_properties(text, string.Template(fragment).substitute(
                port=node.port, controller_port=node.controller_port, admin_user=ADMIN_USER,
                admin_password=sec.password(ADMIN_USER), keystore=sec.keystore,
                truststore=sec.ca_cert))
            # it holds the broker's password: readable by its owner only
            fd = os.open(f.properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.chmod(f.properties, 0o600)
        if self.secure:
            # the metadata log holds the SCRAM credentials (salted), the configs a password
            os.chmod(self.data_dir, 0o700)
            self.secrets.write_env_files(_bootstrap_of(nodes))
            self.secrets.write_client_properties()

    def _java_base(self, java: str, logs: Path | None = None) -> list[str]:
        return [
            java,
            f"-Dlog4j2.configurationFile={self.deploy / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={logs or self.data_dir}",
            "-cp",
            f"{self.lib_dir}/*",
        ]

    def _storage_tool(self, java: str, *args: str) -> str:
        cmd = [*self._java_base(java), "kafka.tools.StorageTool", *args]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        if out.returncode != 0:
            raise BrokerStartError(
                f"StorageTool {args[0]} failed (exit {out.returncode})",
                log_tail=(out.stdout + out.stderr).strip()[-4000:],
            )
        return out.stdout

    def _launch(self, java: str, files: _NodeFiles) -> subprocess.Popen[bytes]:
        cmd = [
            java,
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            *self._java_base(java, files.root)[1:],
            "kafka.Kafka",
            str(files.properties),
        ]
        preexec = _die_with_parent if self.die_with_parent and sys.platform == "linux" else None
        with files.stdout_log.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=files.root,
                start_new_session=True,
                preexec_fn=preexec,  # only prctl(2); safe between fork and exec
            )
        self._procs[files.node_id] = proc
        log.debug("started kafka.Kafka node %d pid %d", files.node_id, proc.pid)
        return proc

    def _log_tail(self, node_ids: list[int] | None = None) -> str:
        parts = []
        for node_id in node_ids or [1]:
            f = self._files(node_id)
            for path in (f.stdout_log, f.broker_log):
                tail = _tail(path)
                if tail:
                    parts.append(f"[{path}]\n{tail}")
        return "\n".join(parts)

    def _check_alive(self, procs: dict[int, subprocess.Popen[bytes]]) -> None:
        for node_id, proc in procs.items():
            code = proc.poll()
            if code is not None:
                raise self._fail(procs, f"{self._node_name(node_id)} exited with code {code} "
                                 "while starting", [node_id])

    def _node_name(self, node_id: int) -> str:
        return "the broker" if self.nodes == 1 else f"node {node_id}"

    def _fail(self, procs: dict[int, subprocess.Popen[bytes]], message: str,
              node_ids: list[int] | None = None) -> BrokerStartError:
        tail = self._log_tail(node_ids or sorted(procs))
        for proc in procs.values():
            self._kill(proc.pid, timeout=5.0)
        return BrokerStartError(message, log_tail=tail)

    def _write_state(self, cluster_id: str, nodes: list[NodeState], t0: float,
                     started: bool = True) -> None:
        first = nodes[0]
        secure = self.secure
        write_state(
            self.state_file,
            BrokerState(
                pid=first.pid,
                bootstrap=_bootstrap_of(nodes),
                port=first.port,
                controller_port=first.controller_port,
                version=self.version,
                cluster_id=cluster_id,
                started_at=time.time(),
                start_seconds=round(time.perf_counter() - t0, 3) if started else 0.0,
                nodes=tuple(nodes),
                secure=secure,
            ),
        )

    def _finish(self, plan: _Plan, procs: dict[int, subprocess.Popen[bytes]]) -> str:
        nodes = [dataclasses.replace(n, pid=procs[n.node_id].pid) for n in plan.nodes]
        self._write_state(plan.cluster_id, nodes, plan.t0)
        bootstrap = _bootstrap_of(nodes)
        elapsed = time.perf_counter() - plan.t0
        self._bootstrap = bootstrap
        self.last_start_seconds = elapsed
        log.info("Kafka %s ready at %s (%s) in %.1f s%s", self.version, bootstrap,
                 ", ".join(f"pid {p.pid}" for p in procs.values()), elapsed,
                 " (storage reused)" if plan.reused else "")
        return bootstrap

    def _launch_all(self, plan: _Plan) -> dict[int, subprocess.Popen[bytes]]:
        return {n.node_id: self._launch(plan.java, self._files(n.node_id)) for n in plan.nodes}

    def start(self, timeout: float = 90.0) -> str:
        """Fetch if needed, format storage on a first start (reuse it after), start every node,
        and wait until an admin call (list topics) succeeds and every broker is registered.
        Returns the bootstrap address. Raises BrokerStartError (with the broker's log tail),
        PortInUseError, JavaNotFoundError, FetchError or BrokerAlreadyRunningError."""
        plan = self._prepare()
        procs = self._launch_all(plan)
        deadline = time.monotonic() + timeout
        for node in plan.nodes:
            while not port_open(node.port):
                self._check_alive(procs)
                if time.monotonic() > deadline:
                    raise self._fail(procs, f"port {node.port} not open after {timeout:.0f} s")
                time.sleep(0.1)
        bootstrap = _bootstrap_of(plan.nodes)
        remaining = max(1.0, deadline - time.monotonic())
        try:
            run_sync(lambda: self._wait_cluster(bootstrap, remaining))
        except BrokerNotReadyError as exc:
            raise self._fail(procs, str(exc)) from exc
        self._check_alive(procs)
        self._add_users(plan, bootstrap)
        return self._finish(plan, procs)

    async def _wait_cluster(self, bootstrap: str, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        security = self.admin_security
        await wait_ready(bootstrap, timeout, security=security)
        if self.nodes > 1:
            await wait_brokers(bootstrap, self.nodes, max(1.0, deadline - loop.time()),
                               security=security)

    def _add_users(self, plan: _Plan, bootstrap: str) -> None:
        """SCRAM credentials for users that got a password after the format (a restart with
        new ``users``), through the admin API (``kafka.admin.ConfigCommand``)."""
        if not plan.new_users:
            return
        config = self.secrets.client_properties(ADMIN_USER)
        for user in plan.new_users:
            cmd = [*self._java_base(plan.java), "kafka.admin.ConfigCommand",
                   "--bootstrap-server", bootstrap, "--command-config", str(config),
                   "--alter", "--entity-type", "users", "--entity-name", user,
                   "--add-config", f"SCRAM-SHA-512=[password={self.secrets.password(user)}]"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
            if out.returncode != 0:
                # the password file is removed: the next start tries again
                self.secrets.password_file(user).unlink(missing_ok=True)
                raise BrokerStartError(f"adding SCRAM user {user!r} failed",
                                       log_tail=(out.stdout + out.stderr).strip()[-4000:])
            log.info("added SCRAM-SHA-512 user %s", user)

    async def astart(self, timeout: float = 90.0) -> str:
        """:meth:`start` for async callers (the blocking steps run in a worker thread; the broker
        process itself is spawned from the calling thread, see ``die_with_parent``)."""
        plan = await asyncio.to_thread(self._prepare)
        procs = self._launch_all(plan)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for node in plan.nodes:
            while not await asyncio.to_thread(port_open, node.port):
                self._check_alive(procs)
                if loop.time() > deadline:
                    raise await asyncio.to_thread(
                        self._fail, procs, f"port {node.port} not open after {timeout:.0f} s"
                    )
                await asyncio.sleep(0.1)
        try:
            await self._wait_cluster(_bootstrap_of(plan.nodes), max(1.0, deadline - loop.time()))
        except BrokerNotReadyError as exc:
            raise await asyncio.to_thread(self._fail, procs, str(exc)) from exc
        self._check_alive(procs)
        await asyncio.to_thread(self._add_users, plan, _bootstrap_of(plan.nodes))
        return self._finish(plan, procs)

    # -- one node of a cluster (fault tests) ----------------------------------------------------
    def node_pid(self, node_id: int) -> int | None:
        """The pid of ``node_id`` if it runs, else None."""
        state = read_state(self.state_file)
        if state is None:
            return None
        for node in self._alive(state):
            if node.node_id == node_id:
                return node.pid
        return None

    def _set_pid(self, node_id: int, pid: int | None) -> None:
        state = read_state(self.state_file)
        if state is None:
            raise RuntimeError(f"{self!r} has no state")
        nodes = tuple(dataclasses.replace(n, pid=pid) if n.node_id == node_id else n
                      for n in state.node_states())
        write_state(self.state_file, dataclasses.replace(state, nodes=nodes, pid=nodes[0].pid))

    def kill_node(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL: no clean shutdown) to ``node_id`` and wait until it is
        gone. Its data stays; :meth:`start_node` brings it back."""
        pid = self.node_pid(node_id)
        if pid is None:
            raise RuntimeError(f"node {node_id} of {self!r} is not running")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        if not self._wait_gone(pid, 30.0, node_id):
            raise RuntimeError(f"node {node_id} (pid {pid}) still runs after signal {sig}")
        self._set_pid(node_id, None)
        log.info("node %d (pid %d) of %s ended by signal %d", node_id, pid, self.data_dir, sig)

    def start_node(self, node_id: int, timeout: float = 90.0) -> int:
        """Start ``node_id`` again on its storage and ports; return once its listener accepts
        connections and every broker is registered. Returns its pid."""
        state = read_state(self.state_file)
        if state is None:
            raise RuntimeError(f"{self!r} has no state")
        running = self.node_pid(node_id)
        if running is not None:
            raise BrokerAlreadyRunningError(f"node {node_id} already runs",
                                            bootstrap=state.bootstrap, pid=running)
        node = next(n for n in state.node_states() if n.node_id == node_id)
        self._check_ports_free([node])
        java = check_java(self.java) if self.java else find_java()
        proc = self._launch(java, self._files(node_id, len(state.node_states())))
        procs = {node_id: proc}
        deadline = time.monotonic() + timeout
        while not port_open(node.port):
            self._check_alive(procs)
            if time.monotonic() > deadline:
                raise self._fail(procs, f"node {node_id}: port {node.port} not open after "
                                 f"{timeout:.0f} s")
            time.sleep(0.1)
        count = len(state.node_states())
        try:
            run_sync(lambda: wait_brokers(state.bootstrap, count,
                                          max(1.0, deadline - time.monotonic()),
                                          security=self.admin_security))
        except BrokerNotReadyError as exc:
            raise self._fail(procs, str(exc)) from exc
        self._set_pid(node_id, proc.pid)
        return proc.pid

    # -- stop ------------------------------------------------------------------------------------
    def _wait_gone(self, pid: int, timeout: float, node_id: int | None = None) -> bool:
        deadline = time.monotonic() + timeout
        proc = None
        for candidate in self._procs.values():
            if candidate.pid == pid:
                proc = candidate
        while True:
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.1)
                if proc.poll() is not None:
                    return True
            elif not pid_alive(pid):
                return True
            else:
                time.sleep(0.1)
            if time.monotonic() > deadline:
                return False

    def _kill(self, pid: int, timeout: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not self._wait_gone(pid, timeout):
            log.warning("broker pid %d ignored SIGTERM for %.0f s; sending SIGKILL", pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._wait_gone(pid, 10.0)

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop every node by the pids in ``state.json``: SIGTERM to all, wait up to ``timeout``
        s, then SIGKILL. The data stays. Returns whether a running node was stopped."""
        state = read_state(self.state_file)
        self._bootstrap = None
        if state is None:
            return False
        alive = self._alive(state)
        t0 = time.perf_counter()
        for node in alive:
            assert node.pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.pid, signal.SIGTERM)
        for node in alive:
            assert node.pid is not None
            self._kill(node.pid, max(1.0, timeout - (time.perf_counter() - t0)))
        if alive:
            log.info("stopped Kafka (%s) in %.1f s",
                     ", ".join(f"pid {n.pid}" for n in alive), time.perf_counter() - t0)
        nodes = tuple(dataclasses.replace(n, pid=None) for n in state.node_states())
        write_state(self.state_file, dataclasses.replace(
            state, pid=None, nodes=nodes if state.nodes else ()))
        self._procs.clear()
        return bool(alive)

    async def astop(self, timeout: float = 30.0) -> bool:
        """:meth:`stop` for async callers."""
        return await asyncio.to_thread(self.stop, timeout)

    # -- reset -----------------------------------------------------------------------------------
    def reset(self) -> list[Path]:
        """Delete this data dir's Kafka data (every topic, offset and the cluster id), the
        rendered configs, logs and ``state.json``: what a user asks for with ``fx broker reset``.
        Refuses while a node runs. Returns the paths removed."""
        status = self.status()
        if status.running:
            raise BrokerAlreadyRunningError(
                f"a broker from {self.data_dir} is running (pid {status.pid}): stop it first",
                bootstrap=status.bootstrap or "", pid=status.pid or 0)
        state = read_state(self.state_file)
        count = len(state.node_states()) if state is not None else self.nodes
        removed: list[Path] = []
        roots = {self._files(i, count).root for i in range(1, count + 1)} | {self.data_dir}
        for root in sorted(roots):
            f = _NodeFiles(0, root)
            for path in (f.log_dir, f.properties, f.broker_log, f.stdout_log):
                if path.is_dir():
                    shutil.rmtree(path)
                    removed.append(path)
                elif path.exists():
                    path.unlink()
                    removed.append(path)
            if root != self.data_dir and root.is_dir() and not any(root.iterdir()):
                root.rmdir()
                removed.append(root)
        if self.state_file.exists():
            self.state_file.unlink()
            removed.append(self.state_file)
        return removed

    # -- context managers ------------------------------------------------------------------------
    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await self.astart()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.astop()
