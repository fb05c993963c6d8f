"""A local Apache Kafka broker (KRaft, one combined broker + controller on 127.0.0.1), no Docker.

The jars come from Maven Central through ``deploy/local-kafka/fetch.sh`` (cached); the broker runs
as ``java -cp 'lib/*' kafka.Kafka server.properties`` in its own session, so it can outlive the
process that started it (``fx broker start``). Everything about one broker lives in its data dir:

    data_dir/state.json         pid, bootstrap, ports, cluster id (see BrokerState)
    data_dir/server.properties  rendered from deploy/local-kafka/server.properties.template
    data_dir/kraft/             the log dir (formatted with StorageTool format --standalone)
    data_dir/broker.log         the broker's log4j2 log
    data_dir/stdout.log         the JVM's own stdout/stderr (JVM errors land here)
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
from fx_kafka.client import wait_ready
from fx_kafka.errors import (
    BrokerAlreadyRunningError,
    BrokerNotReadyError,
    BrokerStartError,
    FetchError,
    JavaNotFoundError,
)

__all__ = [
    "DEFAULT_HEAP",
    "DEFAULT_KAFKA_VERSION",
    "BrokerState",
    "BrokerStatus",
    "LocalKafka",
    "check_java",
    "default_cache_dir",
    "deploy_dir",
    "find_java",
    "java_major_version",
    "pick_free_ports",
    "pid_alive",
    "port_open",
    "read_state",
    "render_server_properties",
    "write_state",
]

log = logging.getLogger(__name__)

#: Must equal <kafka.version> in deploy/local-kafka/pom.xml (a unit test checks).
DEFAULT_KAFKA_VERSION = "4.1.1"
DEFAULT_HEAP = "512m"
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
    template: str, *, port: int, controller_port: int, log_dir: Path | str
) -> str:
    """Fill the template's placeholders; a placeholder left unfilled raises ``KeyError``."""
    if port == controller_port:
        raise ValueError("the broker and controller ports must differ")
    return string.Template(template).substitute(
        port=port, controller_port=controller_port, log_dir=str(log_dir)
    )


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


def _port_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


@dataclass(frozen=True)
class BrokerState:
    """What ``data_dir/state.json`` records about the broker started from that dir.

    ``pid`` is None once the broker was stopped (ports and cluster id stay, so a restart can reuse
    the formatted storage).
    """

    pid: int | None
    bootstrap: str
    port: int
    controller_port: int
    version: str
    cluster_id: str
    started_at: float
    start_seconds: float


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
        return BrokerState(**raw)
    except (OSError, ValueError, TypeError):
        return None


@dataclass(frozen=True)
class BrokerStatus:
    """The answer of :meth:`LocalKafka.status`."""

    running: bool
    bootstrap: str | None
    pid: int | None
    data_dir: Path


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


@dataclass
class _Plan:
    java: str
    port: int
    controller_port: int
    cluster_id: str
    t0: float


class LocalKafka:
    """One local Kafka broker whose files live in ``data_dir``.

    Sync use::

        with LocalKafka(data_dir=Path("/tmp/k")) as kafka:
            print(kafka.bootstrap)

    Async use: ``async with LocalKafka(...) as kafka`` (or ``await kafka.astart()`` /
    ``await kafka.astop()``). ``start`` leaves the broker running in its own session; ``stop``
    ends it by the pid in ``state.json``, so a different process may stop it.

    ``die_with_parent`` (Linux) makes the broker get SIGTERM when the thread that started it
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
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.version = version
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.heap = heap
        self.java = java
        self.deploy = Path(deploy) if deploy is not None else deploy_dir()
        self.die_with_parent = die_with_parent
        self.last_fetch_seconds: float | None = None
        self.last_start_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._bootstrap: str | None = None

    def __repr__(self) -> str:
        return f"LocalKafka(version={self.version!r}, data_dir={str(self.data_dir)!r})"

    # -- paths -----------------------------------------------------------------------------------
    @property
    def lib_dir(self) -> Path:
        return self.cache_dir / f"kafka-{self.version}" / "lib"

    @property
    def state_file(self) -> Path:
        return self.data_dir / "state.json"

    @property
    def properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "kraft"

    @property
    def broker_log(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def stdout_log(self) -> Path:
        return self.data_dir / "stdout.log"

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the running broker (RuntimeError if it was never started)."""
        if self._bootstrap is None:
            state = read_state(self.state_file)
            if state is None or state.pid is None:
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
    def _owns(self, pid: int) -> bool:
        """Whether ``pid`` is a live broker started from this data dir (guards pid reuse)."""
        if self._proc is not None and self._proc.pid == pid and self._proc.poll() is not None:
            return False
        if not pid_alive(pid):
            return False
        cmd = _cmdline(pid)
        if cmd is None:
            return True  # no /proc: trust the pid
        return "kafka.Kafka" in cmd and str(self.properties_file) in cmd

    def status(self) -> BrokerStatus:
        """Running or not, with bootstrap and pid, from ``state.json`` and the process table."""
        state = read_state(self.state_file)
        if state is None or state.pid is None or not self._owns(state.pid):
            return BrokerStatus(False, None, None, self.data_dir)
        return BrokerStatus(True, state.bootstrap, state.pid, self.data_dir)

    # -- start -----------------------------------------------------------------------------------
    def _prepare(self) -> _Plan:
        t0 = time.perf_counter()
        current = self.status()
        if current.running:
            assert current.bootstrap is not None and current.pid is not None
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
        reuse = (
            previous is not None
            and previous.version == self.version
            and (self.log_dir / "meta.properties").exists()
            and _port_free(previous.port)
            and _port_free(previous.controller_port)
        )
        if reuse:
            assert previous is not None
            port, controller_port = previous.port, previous.controller_port
            cluster_id = previous.cluster_id
            log.info("reusing formatted storage in %s (cluster %s)", self.log_dir, cluster_id)
        else:
            port, controller_port = pick_free_ports(2)
            shutil.rmtree(self.log_dir, ignore_errors=True)

        template = (self.deploy / "server.properties.template").read_text()
        self.properties_file.write_text(
            render_server_properties(
                template, port=port, controller_port=controller_port, log_dir=self.log_dir
            )
        )
        if not reuse:
            cluster_id = self._storage_tool(java, "random-uuid").strip().splitlines()[-1]
            self._storage_tool(
                java, "format", "--standalone", "-t", cluster_id, "-c", str(self.properties_file)
            )
        return _Plan(java, port, controller_port, cluster_id, t0)

    def _java_base(self, java: str) -> list[str]:
        return [
            java,
            f"-Dlog4j2.configurationFile={self.deploy / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.data_dir}",
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

    def _launch(self, plan: _Plan) -> subprocess.Popen[bytes]:
        cmd = [
            plan.java,
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            *self._java_base(plan.java)[1:],
            "kafka.Kafka",
            str(self.properties_file),
        ]
        preexec = _die_with_parent if self.die_with_parent and sys.platform == "linux" else None
        with self.stdout_log.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
                preexec_fn=preexec,  # only prctl(2); safe between fork and exec
            )
        self._proc = proc
        log.debug("started kafka.Kafka pid %d on %s:%d", proc.pid, HOST, plan.port)
        return proc

    def _log_tail(self) -> str:
        parts = []
        for path in (self.stdout_log, self.broker_log):
            tail = _tail(path)
            if tail:
                parts.append(f"[{path}]\n{tail}")
        return "\n".join(parts)

    def _check_alive(self, proc: subprocess.Popen[bytes]) -> None:
        code = proc.poll()
        if code is not None:
            raise BrokerStartError(
                f"the broker exited with code {code} while starting", log_tail=self._log_tail()
            )

    def _fail(self, proc: subprocess.Popen[bytes], message: str) -> BrokerStartError:
        tail = self._log_tail()
        self._kill(proc.pid, timeout=5.0)
        return BrokerStartError(message, log_tail=tail)

    def _finish(self, plan: _Plan, proc: subprocess.Popen[bytes]) -> str:
        bootstrap = f"{HOST}:{plan.port}"
        elapsed = time.perf_counter() - plan.t0
        write_state(
            self.state_file,
            BrokerState(
                pid=proc.pid,
                bootstrap=bootstrap,
                port=plan.port,
                controller_port=plan.controller_port,
                version=self.version,
                cluster_id=plan.cluster_id,
                started_at=time.time(),
                start_seconds=round(elapsed, 3),
            ),
        )
        self._bootstrap = bootstrap
        self.last_start_seconds = elapsed
        log.info(
            "Kafka %s ready at %s (pid %d) in %.1f s", self.version, bootstrap, proc.pid, elapsed
        )
        return bootstrap

    def start(self, timeout: float = 90.0) -> str:
        """Fetch if needed, format storage, start the broker, and wait until an admin call
        (list topics) succeeds. Returns the bootstrap address. Raises BrokerStartError (with the
        broker's log tail), JavaNotFoundError, FetchError or BrokerAlreadyRunningError."""
        plan = self._prepare()
        proc = self._launch(plan)
        deadline = time.monotonic() + timeout
        while not port_open(plan.port):
            self._check_alive(proc)
            if time.monotonic() > deadline:
                raise self._fail(proc, f"port {plan.port} not open after {timeout:.0f} s")
            time.sleep(0.1)
        bootstrap = f"{HOST}:{plan.port}"
        remaining = max(1.0, deadline - time.monotonic())
        try:
            run_sync(lambda: wait_ready(bootstrap, remaining))
        except BrokerNotReadyError as exc:
            raise self._fail(proc, str(exc)) from exc
        self._check_alive(proc)
        return self._finish(plan, proc)

    async def astart(self, timeout: float = 90.0) -> str:
        """:meth:`start` for async callers (the blocking steps run in a worker thread; the broker
        process itself is spawned from the calling thread, see ``die_with_parent``)."""
        plan = await asyncio.to_thread(self._prepare)
        proc = self._launch(plan)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not await asyncio.to_thread(port_open, plan.port):
            self._check_alive(proc)
            if loop.time() > deadline:
                raise await asyncio.to_thread(
                    self._fail, proc, f"port {plan.port} not open after {timeout:.0f} s"
                )
            await asyncio.sleep(0.1)
        bootstrap = f"{HOST}:{plan.port}"
        try:
            await wait_ready(bootstrap, max(1.0, deadline - loop.time()))
        except BrokerNotReadyError as exc:
            raise await asyncio.to_thread(self._fail, proc, str(exc)) from exc
        self._check_alive(proc)
        return self._finish(plan, proc)

    # -- stop ------------------------------------------------------------------------------------
    def _wait_gone(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is not None and self._proc.pid == pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=0.1)
                if self._proc.poll() is not None:
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
        """Stop the broker by the pid in ``state.json``: SIGTERM, wait up to ``timeout`` s, then
        SIGKILL. Returns whether a running broker was stopped."""
        state = read_state(self.state_file)
        self._bootstrap = None
        if state is None or state.pid is None:
            return False
        stopped = False
        if self._owns(state.pid):
            t0 = time.perf_counter()
            self._kill(state.pid, timeout)
            log.info("stopped Kafka pid %d in %.1f s", state.pid, time.perf_counter() - t0)
            stopped = True
        else:
            # Not running any more (or the pid now belongs to someone else): just forget it.
            log.debug("broker pid %d from %s is not running", state.pid, self.state_file)
        write_state(self.state_file, dataclasses.replace(state, pid=None))
        self._proc = None
        return stopped

    async def astop(self, timeout: float = 30.0) -> bool:
        """:meth:`stop` for async callers."""
        return await asyncio.to_thread(self.stop, timeout)

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
