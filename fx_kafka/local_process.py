"""The JVMs of a local Kafka's data dir: running Kafka's tools, launching a node
(``kafka.Kafka``), telling whether a pid is one of this data dir's nodes, and ending one.
Used by :class:`fx_kafka.local.LocalKafka`."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fx_kafka.errors import BrokerStartError, JavaNotFoundError
from fx_kafka.local_state import HOST, NodeFiles

__all__ = ["MIN_JAVA", "NodeProcesses", "check_java", "cmdline", "die_with_parent", "find_java",
           "java_major_version", "log_tail", "pick_free_ports", "pid_alive", "port_bindable",
           "port_open", "port_owner"]

log = logging.getLogger("fx_kafka.local")

MIN_JAVA = 17


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


def cmdline(pid: int) -> list[str] | None:
    """The command line of ``pid`` (Linux ``/proc``), or None when it cannot be read."""
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


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of the log file ``path`` (of its last 64 KiB; empty if
    unreadable)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to send this process SIGTERM when the thread that started it exits (a
    ``preexec_fn``)."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


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
                cmd = cmdline(int(proc.name)) or []
                return f"pid {proc.name} ({' '.join(c for c in cmd if c)[:200]})"
    return None


class NodeProcesses:
    """The node processes started from one data dir (``procs``, by node id) and Kafka's tools,
    run with the jars in ``lib_dir`` and the log4j2 config of ``deploy``."""

    def __init__(self, *, data_dir: Path, deploy: Path, lib_dir: Path, heap: str,
                 die_with_parent: bool) -> None:
        self.data_dir = data_dir
        self.deploy = deploy
        self.lib_dir = lib_dir
        self.heap = heap
        self.die_with_parent = die_with_parent
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def java_base(self, java: str, logs: Path | None = None) -> list[str]:
        return [
            java,
            f"-Dlog4j2.configurationFile={self.deploy / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={logs or self.data_dir}",
            "-cp",
            f"{self.lib_dir}/*",
        ]

    def storage_tool(self, java: str, *args: str) -> str:
        cmd = [*self.java_base(java), "kafka.tools.StorageTool", *args]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        if out.returncode != 0:
            raise BrokerStartError(
                f"StorageTool {args[0]} failed (exit {out.returncode})",
                log_tail=(out.stdout + out.stderr).strip()[-4000:],
            )
        return out.stdout

    def launch(self, java: str, files: NodeFiles) -> subprocess.Popen[bytes]:
        cmd = [
            java,
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            *self.java_base(java, files.root)[1:],
            "kafka.Kafka",
            str(files.properties),
        ]
        preexec = die_with_parent if self.die_with_parent and sys.platform == "linux" else None
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
        self.procs[files.node_id] = proc
        log.debug("started kafka.Kafka node %d pid %d", files.node_id, proc.pid)
        return proc

    def owns(self, pid: int, files: NodeFiles) -> bool:
        """Whether ``pid`` is a live node started from this data dir (guards pid reuse)."""
        proc = self.procs.get(files.node_id)
        if proc is not None and proc.pid == pid and proc.poll() is not None:
            return False
        if not pid_alive(pid):
            return False
        cmd = cmdline(pid)
        if cmd is None:
            return True  # no /proc: trust the pid
        return "kafka.Kafka" in cmd and str(files.properties) in cmd

    def wait_gone(self, pid: int, timeout: float, node_id: int | None = None) -> bool:
        deadline = time.monotonic() + timeout
        proc = None
        for candidate in self.procs.values():
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

    def kill(self, pid: int, timeout: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not self.wait_gone(pid, timeout):
            log.warning("broker pid %d ignored SIGTERM for %.0f s; sending SIGKILL", pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.wait_gone(pid, 10.0)
