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
import logging
import os
import shutil
import signal
import subprocess
import time
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
)
from fx_kafka.local_process import (
    NodeProcesses,
    check_java,
    find_java,
    java_major_version,
    log_tail,
    pick_free_ports,
    pid_alive,
    port_bindable,
    port_open,
    port_owner,
)
from fx_kafka.local_security import ADMIN_USER, DEFAULT_USERS, LocalSecrets, check_user_name
from fx_kafka.local_state import (
    BrokerState,
    BrokerStatus,
    NodeFiles,
    NodeState,
    bootstrap_of,
    read_state,
    write_state,
)
from fx_kafka.local_storage import (
    SECURE_FRAGMENT,
    LocalStorage,
    StartPlan,
    merge_properties,
    render_server_properties,
)
from fx_kafka.security import ClientSecurity

__all__ = [
    "DEFAULT_HEAP",
    "DEFAULT_KAFKA_VERSION",
    "SECURE_FRAGMENT",
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
        self._bootstrap: str | None = None
        #: the node processes and Kafka's tools
        self.processes = NodeProcesses(data_dir=self.data_dir, deploy=self.deploy,
                                       lib_dir=self.lib_dir, heap=heap,
                                       die_with_parent=die_with_parent)
        #: the storage: node files, configs, ``state.json``, formatting
        self.storage = LocalStorage(data_dir=self.data_dir, nodes=nodes, version=version,
                                    deploy=self.deploy, users=self.users,
                                    secrets=self.secrets, processes=self.processes)

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
    def _files(self, node_id: int, count: int | None = None) -> NodeFiles:
        return self.storage.files(node_id, count)

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
    def _alive(self, state: BrokerState) -> list[NodeState]:
        nodes = state.node_states()
        return [n for n in nodes if n.pid is not None
                and self.processes.owns(n.pid, self._files(n.node_id, len(nodes)))]

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
    def _prepare(self) -> StartPlan:
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

        plan = self.storage.plan(java, t0, secure=self.secure)
        self.secure = plan.secure
        return plan

    def _log_tail(self, node_ids: list[int] | None = None) -> str:
        parts = []
        for node_id in node_ids or [1]:
            f = self._files(node_id)
            for path in (f.stdout_log, f.broker_log):
                tail = log_tail(path)
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
            self.processes.kill(proc.pid, timeout=5.0)
        return BrokerStartError(message, log_tail=tail)

    def _finish(self, plan: StartPlan, procs: dict[int, subprocess.Popen[bytes]]) -> str:
        nodes = [dataclasses.replace(n, pid=procs[n.node_id].pid) for n in plan.nodes]
        self.storage.write_state(plan.cluster_id, nodes, plan.t0, secure=self.secure)
        bootstrap = bootstrap_of(nodes)
        elapsed = time.perf_counter() - plan.t0
        self._bootstrap = bootstrap
        self.last_start_seconds = elapsed
        log.info("Kafka %s ready at %s (%s) in %.1f s%s", self.version, bootstrap,
                 ", ".join(f"pid {p.pid}" for p in procs.values()), elapsed,
                 " (storage reused)" if plan.reused else "")
        return bootstrap

    def _launch_all(self, plan: StartPlan) -> dict[int, subprocess.Popen[bytes]]:
        return {n.node_id: self.processes.launch(plan.java, self._files(n.node_id))
                for n in plan.nodes}

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
        bootstrap = bootstrap_of(plan.nodes)
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

    def _add_users(self, plan: StartPlan, bootstrap: str) -> None:
        """SCRAM credentials for users that got a password after the format (a restart with
        new ``users``), through the admin API (``kafka.admin.ConfigCommand``)."""
        if not plan.new_users:
            return
        config = self.secrets.client_properties(ADMIN_USER)
        for user in plan.new_users:
            cmd = [*self.processes.java_base(plan.java), "kafka.admin.ConfigCommand",
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
            await self._wait_cluster(bootstrap_of(plan.nodes), max(1.0, deadline - loop.time()))
        except BrokerNotReadyError as exc:
            raise await asyncio.to_thread(self._fail, procs, str(exc)) from exc
        self._check_alive(procs)
        await asyncio.to_thread(self._add_users, plan, bootstrap_of(plan.nodes))
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
        if not self.processes.wait_gone(pid, 30.0, node_id):
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
        self.storage.check_ports_free([node])
        java = check_java(self.java) if self.java else find_java()
        proc = self.processes.launch(java, self._files(node_id, len(state.node_states())))
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
            self.processes.kill(node.pid, max(1.0, timeout - (time.perf_counter() - t0)))
        if alive:
            log.info("stopped Kafka (%s) in %.1f s",
                     ", ".join(f"pid {n.pid}" for n in alive), time.perf_counter() - t0)
        nodes = tuple(dataclasses.replace(n, pid=None) for n in state.node_states())
        write_state(self.state_file, dataclasses.replace(
            state, pid=None, nodes=nodes if state.nodes else ()))
        self.processes.procs.clear()
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
            f = NodeFiles(0, root)
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
