"""``fx executor run --processes N``: N executor nodes on one machine, each a child process with
a node identity of its own, all members of the same consumer groups (docs/executor.md,
"Several processes").

The decisions are pure functions (:func:`resolve_processes`, :func:`child_node_id`,
:func:`child_http_port`, :func:`child_state_dir`, :func:`child_config`, :func:`restart_delay`);
:class:`Supervisor` is the thin shell around them: it starts the children, forwards SIGTERM and
SIGINT, restarts a child that dies (with backoff, logged and counted) and waits for them all.

Child ``i`` of node ``NODE`` is node ``NODE-p<i>``: its own key (``<key dir>/NODE-p<i>/<key
file name>``, created on its first start like any node's), its own receipt chain and ledger-key
list beside that key, its own receipt ledger (``sys.ledger.NODE-p<i>``), HTTP on ``http_port +
i`` (0: a free port each; none: none). The model store and the chunk directory are shared (the
store is only read; chunks are content-addressed and written by rename).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from broker_schema import topics
from executor.affinity import child_engine_cpus
from executor.config import ENV_PREFIX, MAX_PROCESSES, ExecutorConfig
from fx_node.identity import NodeIdentity

__all__ = ["MAX_PROCESSES", "ProcessesError", "Supervisor", "child_config", "child_http_port",
           "child_node_id", "child_state_dir", "cores", "resolve_processes", "restart_delay",
           "run_processes"]

log = logging.getLogger(__name__)

#: A child that ran at least this long before it died is restarted after the first delay again.
STABLE_S = 60.0
#: Restart delays: ``FIRST_DELAY_S`` doubled per quick death in a row, at most ``MAX_DELAY_S``.
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
#: A child that exits with this status had its config refused: it is not restarted.
CONFIG_REFUSED = 2
#: How long children get after SIGTERM beyond their ``shutdown_grace_s`` before SIGKILL.
STOP_MARGIN_S = 30.0
#: The environment variable naming a child to itself: its log lines carry ``[<node id>]``.
PROCESS_NAME_ENV = "FX_PROCESS_NAME"


class ProcessesError(ValueError):
    """``--processes`` or the config cannot give N children (one line, for the user)."""


def cores() -> int:
    """The CPUs this process may run on (its affinity mask where the system has one, else
    ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def resolve_processes(value: int | str | None, n_cores: int) -> int:
    """How many processes ``value`` asks for: an integer 1..:data:`MAX_PROCESSES`, or ``auto``
    / None (one per core, at most :data:`MAX_PROCESSES`). Raises :class:`ProcessesError`."""
    if value is None or value == "auto":
        return max(1, min(n_cores, MAX_PROCESSES))
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ProcessesError(f"--processes must be a whole number or 'auto', not {value!r}"
                             ) from None
    if n < 1:
        raise ProcessesError(f"--processes must be at least 1, not {n}")
    if n > MAX_PROCESSES:
        raise ProcessesError(f"--processes must be at most {MAX_PROCESSES}, not {n} "
                             f"(this machine has {n_cores} cores)")
    return n


def child_node_id(node_id: str, index: int) -> str:
    """Child ``index``'s node id: ``<node_id>-p<index>``. Raises :class:`ProcessesError` when
    that is no valid node id (too long, or no valid ledger topic name)."""
    child = f"{node_id}-p{index}"
    if len(child) > 200:
        raise ProcessesError(f"node_id {node_id!r} is too long for per-process ids "
                             f"({child!r} is over 200 characters)")
    try:
        topics.ledger(child)
    except ValueError as exc:
        raise ProcessesError(f"per-process node id {child!r} is not valid: {exc}") from None
    return child


def child_http_port(base: int | None, index: int) -> int | None:
    """Child ``index``'s HTTP port: none without HTTP, 0 (a free port) for 0, else ``base +
    index``. Raises :class:`ProcessesError` past 65535."""
    if base is None or base == 0:
        return base
    port = base + index
    if port > 65535:
        raise ProcessesError(f"http_port {base} + process {index} is past 65535: "
                             "lower http_port, use 0 (a free port each) or null (no HTTP)")
    return port


def child_state_dir(key_file: Path, child_id: str) -> Path:
    """Where child ``child_id`` keeps its key, receipt chain and ledger-key list: a directory
    named after it beside the configured ``key_file``."""
    return key_file.parent / child_id


def child_config(config: ExecutorConfig, index: int) -> ExecutorConfig:
    """The config of child ``index``: ``config`` with the child's node id, key file (in
    :func:`child_state_dir`), HTTP port, its engine CPU (``engine_cpus[index mod K]``,
    :func:`executor.affinity.child_engine_cpus`; ``loop_cpus`` is every child's) and
    ``processes = 1``. Raises :class:`ProcessesError`."""
    child_id = child_node_id(config.node_id, index)
    data = config.model_dump()
    data.update(node_id=child_id, http_port=child_http_port(config.http_port, index),
                key_file=child_state_dir(config.key_file, child_id) / config.key_file.name,
                engine_cpus=child_engine_cpus(config.engine_cpus, index),
                processes=1)
    try:
        return ExecutorConfig.model_validate(data)
    except ValueError as exc:
        raise ProcessesError(f"process {index}: {exc}") from None


def restart_delay(quick_deaths: int) -> float:
    """The wait before restarting a child that died ``quick_deaths`` times in a row, each
    within :data:`STABLE_S` of its start (1 for the first): 1, 2, 4 ... s, at most 30."""
    return float(min(MAX_DELAY_S, FIRST_DELAY_S * 2.0 ** max(0, quick_deaths - 1)))


def child_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """A child's environment: ``environ`` without ``FX_EXECUTOR_*`` (its config file has the
    parent's resolved settings; those variables would override the child's own node id)."""
    return {k: v for k, v in environ.items() if not k.startswith(ENV_PREFIX)}


def prepare_child(config: ExecutorConfig) -> Path:
    """Create the child's state directory (0700) and its key (so the parent can name it), and
    write its config there (``executor.json``, 0600); returns that file. Raises
    :class:`ProcessesError` when the directory cannot be made."""
    state = config.key_file.parent
    try:
        state.mkdir(mode=0o700, parents=True, exist_ok=True)
        identity = NodeIdentity.load_or_create(config.key_file, config.key_type)
        path = state / "executor.json"
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(config.model_dump(mode="json"), f, indent=1)
        os.replace(tmp, path)
    except (OSError, ValueError) as exc:
        raise ProcessesError(f"cannot prepare the state directory {state} of "
                             f"{config.node_id}: {exc}") from None
    log.info("process %s: key %s (%s), state %s, http %s", config.node_id, identity.key_id,
             config.key_file, state, config.http_port)
    return path


def name_log_lines(environ: Mapping[str, str] | None = None) -> None:
    """In a child (``FX_PROCESS_NAME`` set): every log line of this process carries
    ``[<node id>]``, so the children's lines, interleaved on the parent's stderr, are told
    apart."""
    name = (os.environ if environ is None else environ).get(PROCESS_NAME_ENV)
    if not name:
        return
    fmt = logging.Formatter(f"%(asctime)s %(levelname)s [{name}] %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setFormatter(fmt)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the child gets SIGTERM (a graceful stop) if the parent dies, even by SIGKILL."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class Child:
    """One child: its config file, the running process, and its restart bookkeeping."""

    index: int
    node_id: str
    config_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    quick_deaths: int = 0
    restart_at: float | None = None
    exits: list[int] = field(default_factory=list)


class Supervisor:
    """Starts the children, restarts the ones that die, forwards stop signals. ``run()``
    returns the exit status."""

    def __init__(self, children: Sequence[Child], *, grace_s: float, verbose: bool = False,
                 command: Sequence[str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.children = list(children)
        self.grace_s = grace_s
        self.verbose = verbose
        self.command = list(command or [sys.executable, "-m", "fx_cli.main"])
        self.clock = clock
        self.stops = 0
        self.restarts_total = 0

    def _spawn(self, child: Child) -> None:
        argv = [*self.command, *(["-v"] if self.verbose else []), "executor", "run",
                "--config", str(child.config_path), "--processes", "1"]
        env = child_environ(os.environ)
        env[PROCESS_NAME_ENV] = child.node_id
        child.proc = subprocess.Popen(argv, env=env,
                                      start_new_session=True, preexec_fn=_die_with_parent)
        child.started = self.clock()
        child.restart_at = None
        log.info("process %s started (pid %d)", child.node_id, child.proc.pid)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stops += 1
        if self.stops == 1:
            log.info("stopping %d processes (grace %.1f s)", len(self.children), self.grace_s)
        else:
            log.warning("second signal: the processes exit now")
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM if self.stops == 1 else signum)

    def _reap(self, child: Child) -> int | None:
        """Handle child's exit, if it exited; returns a status to exit with, or None."""
        assert child.proc is not None
        code = child.proc.poll()
        if code is None or self.stops:
            return None
        child.exits.append(code)
        child.proc = None
        how = f"signal {-code}" if code < 0 else f"status {code}"
        if code == CONFIG_REFUSED:
            log.error("process %s exited with %s (its config was refused): stopping",
                      child.node_id, how)
            return CONFIG_REFUSED
        ran = self.clock() - child.started
        child.quick_deaths = child.quick_deaths + 1 if ran < STABLE_S else 1
        delay = restart_delay(child.quick_deaths)
        child.restart_at = self.clock() + delay
        log.warning("process %s exited with %s after %.1f s: restart %d in %.1f s",
                    child.node_id, how, ran, child.restarts + 1, delay)
        return None

    def run(self, poll_s: float = 0.2) -> int:
        """Serve until a stop signal (then wait for every child) or a child's refused config."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for child in self.children:
            if self.stops:  # a signal while starting: the rest are not started
                break
            self._spawn(child)
        status = 0
        while not self.stops:
            for child in self.children:
                if child.proc is not None:
                    verdict = self._reap(child)
                    if verdict is not None:
                        status = verdict
                        self._on_signal(signal.SIGTERM, None)
                        break
                elif child.restart_at is not None and self.clock() >= child.restart_at:
                    child.restarts += 1
                    self.restarts_total += 1
                    self._spawn(child)
                    log.info("process %s restarted (%d restarts, %d in all)", child.node_id,
                             child.restarts, self.restarts_total)
            time.sleep(poll_s)
        return self._wait_all(status)

    def _wait_all(self, status: int) -> int:
        deadline = self.clock() + self.grace_s + STOP_MARGIN_S
        bad: list[str] = []
        for child in self.children:
            if child.proc is None:
                continue
            try:
                code = child.proc.wait(timeout=max(0.0, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                log.error("process %s did not stop in time: killing it", child.node_id)
                child.proc.kill()
                code = child.proc.wait()
            if code != 0:
                bad.append(f"{child.node_id} ({code})")
        if bad and not status:
            print(f"fx executor run: processes exited non-zero: {', '.join(bad)}",
                  file=sys.stderr)
            status = 1
        log.info("all processes stopped (%d restarts in all)", self.restarts_total)
        return status


def plan_children(config: ExecutorConfig, n: int) -> list[ExecutorConfig]:
    """The configs of ``n`` children of ``config`` (pure). Raises :class:`ProcessesError`."""
    return [child_config(config, i) for i in range(n)]


def run_processes(command: str, config: ExecutorConfig, n: int, *,
                  verbose: bool = False) -> int:
    """Run ``n`` children of ``config`` under a :class:`Supervisor`; the CLI's exit status."""
    try:
        children = [Child(i, c.node_id, prepare_child(c))
                    for i, c in enumerate(plan_children(config, n))]
    except ProcessesError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    log.info("%s: %d processes of node %s (group prefix %s); certify each key with "
             "fx keys certify --node NODE-pI --from-facts", command, n, config.node_id,
             config.group_prefix)
    if 0 < len(config.engine_cpus) < n:
        log.warning("%s: %d processes share %d engine CPUs (engine_cpus %s): child i's engine "
                    "runs on engine_cpus[i mod %d]", command, n, len(config.engine_cpus),
                    config.engine_cpus, len(config.engine_cpus))
    return Supervisor(children, grace_s=config.shutdown_grace_s, verbose=verbose).run()


def describe(config: ExecutorConfig, n: int) -> dict[str, Any]:
    """What ``--processes n`` would run (``--print-config``): the child ids, key files, ports."""
    return {c.node_id: {"key_file": str(c.key_file), "http_port": c.http_port,
                        "engine_cpus": c.engine_cpus}
            for c in plan_children(config, n)}
