"""The shipped systemd units under a real systemd: a Debian container with systemd as PID 1 on the
host network (deploy/systemd/host/Dockerfile), ninelives-fx installed in it the way
docs/operations.md ("systemd") documents, the units installed and started the documented way.

For each of ``fx-broker``, ``fx-executor@`` and ``fx-workload@``: it starts and answers (the broker
takes clients; the executor answers a real workload's requests with magika from the model store;
the holder runs the workload and merges the answers), it comes back after ``kill -9`` of its main
PID (``NRestarts`` counts it, and it answers again), its ``MemoryMax`` is the limit of its cgroup
(cgroup v1: ``memory.limit_in_bytes``), and inside its sandbox (``ProtectSystem=strict``...) every
path it writes is writable, as its own user: state, cache, CuPy's kernel cache, chunks and keys,
while the model store stays read-only for the services.

The container is not ``--privileged``: the engines here lack ``CAP_SYS_RESOURCE``, which
``--privileged`` asks for ("unable to apply caps"). It gets every other capability, no seccomp
or AppArmor profile and the host's ``/sys/fs/cgroup`` read-write, which is what systemd and the
units' sandboxes need. Java for the broker is the host's (mounted read-only, ``JAVA_HOME`` in
/etc/ninelives-fx/broker.env); Kafka's jars are the host's fetch.sh cache, copied in.
Everything it makes is named ``fx27b-...`` and removed at the end.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fx_kafka.local import DEFAULT_KAFKA_VERSION, default_cache_dir
from fx_kafka.local_process import find_java

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
DOCKERFILE = UNITS / "host" / "Dockerfile"
FX = "/opt/ninelives-fx/.venv/bin/fx"
STATE = "/var/lib/ninelives-fx"
CACHE = "/var/cache/ninelives-fx"
MAGIKA = "sha256:fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c"
KIND = "ninelives:inference/run@0.1.0"
#: the whole module's bound: image build, units, three kills (cold build ~2 min on 2 cores)
BUDGET_S = 900

#: a workload of the operator's own, outside the venv: put on the holder's path by its env file
WORKLOAD = '''"""Asks the model bound as ``filetype`` what each input is; emits the label."""
from workload_sdk import InputEvent, Workload, emit, infer
from workload_sdk.examples.filetype_gate import label_of


class FileTypeLabels(Workload):
    def initial_state(self):
        return {"files": 0}

    def step(self, state, event):
        if isinstance(event, InputEvent):
            return (dict(state, files=state["files"] + 1),
                    [infer(model="filetype", input=event.body, deadline_ms=20_000)])
        label = label_of(event.json()) if event.ok else None
        return state, [emit({"outcome": event.outcome, "label": label})]
'''


@dataclass
class Host:
    docker: str
    name: str
    times: dict[str, float] = field(default_factory=dict)
    bootstrap: str = ""
    workload: str = ""
    deadline: float = 0.0
    executor_port: int = 0
    holder_port: int = 0

    def sh(self, script: str, *, timeout: float = 120, check: bool = True,
           stdin: bytes | None = None) -> str:
        left = self.deadline - time.monotonic()
        assert left > 0, "the module ran past its time bound"
        done = subprocess.run([self.docker, "exec", "-i", self.name, "bash", "-euo", "pipefail",
                               "-c", script], input=stdin, capture_output=True,
                              timeout=min(timeout, left))
        out = done.stdout.decode(errors="replace")
        if check and done.returncode != 0:
            raise AssertionError(f"in the container, exit {done.returncode}: {script}\n{out}\n"
                                 f"{done.stderr.decode(errors='replace')[-3000:]}")
        return out

    def show(self, unit: str, prop: str) -> str:
        return self.sh(f"systemctl show -P {prop} {unit}").strip()

    def wait(self, what: str, check, timeout: float) -> float:  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if check():
                return time.monotonic() - t0
            time.sleep(0.5)
        raise AssertionError(f"{what} not within {timeout:.0f} s")

    def active(self, unit: str) -> bool:
        return self.show(unit, "ActiveState") == "active"


def _run(argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def _context(tmp: Path) -> None:
    """The build context: the Dockerfile, the checkout's tracked files, the dependencies."""
    (tmp / "Dockerfile").write_bytes(DOCKERFILE.read_bytes())
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout
    subprocess.run(["tar", "--null", "-T", "-", "-cf", str(tmp / "src.tar")], cwd=ROOT,
                   input=files, check=True)
    wheels = tmp / "wheels"
    done = _run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels),
                 str(ROOT), "setuptools", "wheel"], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for own in wheels.glob("ninelives_fx-*.whl"):
        own.unlink()  # the image installs the checkout itself (editable), not a wheel of it


def _java_mounts() -> tuple[list[str], str]:
    """The host's Java for the broker: its home read-only, and Debian's /etc/java-N-openjdk
    that its conf links point at."""
    java = Path(os.path.realpath(find_java()))
    home = java.parent.parent
    mounts = ["-v", f"{home}:{home}:ro"]
    for etc in Path("/etc").glob("java-*"):
        mounts += ["-v", f"{etc}:{etc}:ro"]
    return mounts, str(home)


@pytest.fixture(scope="module")
def host(docker_engine: str, debian_base: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    docker = docker_engine
    tag = f"fx27b-systemd-host:{uuid.uuid4().hex[:8]}"
    h = Host(docker=docker, name=f"fx27b-systemd-{uuid.uuid4().hex[:8]}",
             deadline=time.monotonic() + BUDGET_S)
    ctx = tmp_path_factory.mktemp("fx27b-ctx")
    try:
        t0 = time.monotonic()
        _context(ctx)
        h.times["context"] = time.monotonic() - t0
        t0 = time.monotonic()
        built = _run([docker, "build", "--network", "host", "--build-arg", f"BASE={debian_base}",
                      "-t", tag, str(ctx)], timeout=600)
        assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
        h.times["build"] = time.monotonic() - t0
        java_mounts, java_home = _java_mounts()
        t0 = time.monotonic()
        started = _run([docker, "run", "-d", "--name", h.name, "--network", "host",
                        "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
                        "--security-opt", "seccomp=unconfined",
                        "--security-opt", "apparmor=unconfined",
                        "--tmpfs", "/run", "--tmpfs", "/run/lock",
                        "-v", "/sys/fs/cgroup:/sys/fs/cgroup", *java_mounts, tag], timeout=120)
        assert started.returncode == 0, started.stderr
        h.wait("systemd running", lambda: h.sh("systemctl is-system-running || true").strip()
               in ("running", "degraded"), 90)
        h.times["boot"] = time.monotonic() - t0
        assert h.sh("cat /proc/1/comm").strip() == "systemd"
        _install(h, java_home)
        yield h
    finally:
        if os.environ.get("FX27B_KEEP"):
            print(f"kept {h.name} ({tag})")
        else:
            _run([docker, "rm", "-f", h.name], timeout=120)
            _run([docker, "rmi", "-f", tag], timeout=120)
        print("systemd host times:", json.dumps({k: round(v, 1) for k, v in h.times.items()}))


def _install(h: Host, java_home: str) -> None:
    """docs/operations.md, systemd: steps 3 to 5 and the broker (1 and 2 are in the image)."""
    h.sh("cd /opt/ninelives-fx\n"
         "install -m 0644 deploy/systemd/*.slice deploy/systemd/*.service /etc/systemd/system/\n"
         "systemd-analyze verify /etc/systemd/system/fx-executor@cpu0.service "
         "/etc/systemd/system/fx-workload@x.service /etc/systemd/system/fx-broker.service\n"
         "systemctl daemon-reload\n"
         "install -d -m 0750 -g fx /etc/ninelives-fx\n"
         f"echo JAVA_HOME={java_home} > /etc/ninelives-fx/broker.env\n")
    # the broker: the jars from this machine's fetch.sh cache (nothing fetched in the container)
    fetched = _run(["bash", str(ROOT / "deploy/local-kafka/fetch.sh")], timeout=600)
    assert fetched.returncode == 0, fetched.stderr
    kafka = default_cache_dir() / f"kafka-{DEFAULT_KAFKA_VERSION}"
    jars = subprocess.run(["tar", "-C", str(kafka.parent), "-cf", "-", f"{kafka.name}/lib",
                           f"{kafka.name}/.fetched"], capture_output=True, check=True).stdout
    h.sh(f"tar -C {CACHE} -xf - && chown -R fx:fx {CACHE}", stdin=jars)
    h.sh(f"cd /opt/ninelives-fx && runuser -u fx -- env FX_CACHE_DIR={CACHE} "
         "bash deploy/local-kafka/fetch.sh")
    t0 = time.monotonic()
    h.sh("systemctl enable --now fx-broker", timeout=240)
    h.times["broker_start"] = time.monotonic() - t0
    status = h.sh(f"runuser -u fx -- {FX} broker status --data-dir {STATE}/broker")
    h.bootstrap = status.split()[1]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", h.bootstrap), status
    # an executor (port: any free one; 8088 may be another service's on this host network)
    http = _free_port()
    h.sh("cat > /etc/ninelives-fx/executor-cpu0.env <<'CONF'\n"
         f"FX_EXECUTOR_BOOTSTRAP={h.bootstrap}\nFX_EXECUTOR_HTTP_HOST=127.0.0.1\n"
         f"FX_EXECUTOR_HTTP_PORT={http}\nFX_EXECUTOR_INTEGER_BACKEND=oracle\nCONF\n")
    t0 = time.monotonic()
    h.sh("systemctl enable --now fx-executor@cpu0")
    h.wait("the executor's /healthz", lambda: _http_ok(h, http, "/healthz"), 120)
    h.times["executor_start"] = time.monotonic() - t0
    h.executor_port = http
    # a lease holder of a workload of the operator's own
    h.workload = f"fx27b-{uuid.uuid4().hex[:8]}"
    holder = _free_port()
    h.sh("install -d /etc/ninelives-fx/workloads && "
         "cat > /etc/ninelives-fx/workloads/fx27b_filetype.py", stdin=WORKLOAD.encode())
    module = "fx27b_filetype:FileTypeLabels"
    h.sh(f"cd /opt/ninelives-fx && PYTHONPATH=/etc/ninelives-fx/workloads {FX} workload spec "
         f"{h.workload} --module {module} --kind {KIND} --model filetype={MAGIKA} "
         f"--bootstrap {h.bootstrap}")
    h.sh(f"cat > /etc/ninelives-fx/workload-{h.workload}.env <<'CONF'\n"
         f"FX_WORKLOAD_MODULE={module}\nPYTHONPATH=/etc/ninelives-fx/workloads\n"
         f"FX_KAFKA_BOOTSTRAP={h.bootstrap}\nFX_HOLDER_HTTP_HOST=127.0.0.1\n"
         f"FX_HOLDER_HTTP_PORT={holder}\nCONF\n")
    t0 = time.monotonic()
    h.sh(f"systemctl enable --now fx-workload@{h.workload}")
    h.wait("the holder's /readyz", lambda: _http_ok(h, holder, "/readyz"), 120)
    h.times["holder_start"] = time.monotonic() - t0
    h.holder_port = holder


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http_ok(h: Host, port: int, path: str) -> bool:
    code = (f"import urllib.request,sys\ntry:\n    urllib.request.urlopen("
            f"'http://127.0.0.1:{port}{path}', timeout=3)\nexcept Exception:\n    sys.exit(1)")
    return h.sh(f"python3 -c {shlex.quote(code)} && echo yes || true").strip() == "yes"


def _answered(h: Host, text: str, count: int, timeout: float = 90) -> float:
    """Send one input; wait until ``count`` ok answers by the executor and as many emitted
    labels are on the workload's log. Returns the seconds it took."""
    h.sh(f"{FX} workload input {h.workload} --text {shlex.quote(text)} "
         f"--bootstrap {h.bootstrap}")

    def rows(*args: str) -> list[dict]:  # type: ignore[type-arg]
        out = h.sh(f"{FX} log {h.workload} {' '.join(args)} --json --bootstrap {h.bootstrap}")
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def done() -> bool:
        ok = [r for r in rows("--kind", "response", "--outcome", "ok")
              if r["model"] == MAGIKA and r["who"].endswith("-cpu0")]
        outs = [r for r in rows("--kind", "output") if '"label"' in r["summary"]]
        return len(ok) >= count and len(outs) >= count

    return h.wait(f"answer {count} of {h.workload}", done, timeout)


def _kill9(h: Host, unit: str, answers: list[str] | None = None) -> float:
    """kill -9 the unit's main PID; wait for systemd to restart it (NRestarts + 1, a new main
    PID, active). Returns the seconds from the kill to active again."""
    before = int(h.show(unit, "NRestarts"))
    pid = h.show(unit, "MainPID")
    assert pid != "0", f"{unit} has no main PID"
    t0 = time.monotonic()
    h.sh(f"kill -9 {pid}")
    h.wait(f"{unit} restarted", lambda: int(h.show(unit, "NRestarts")) == before + 1
           and h.active(unit) and h.show(unit, "MainPID") not in ("0", pid), 240)
    return time.monotonic() - t0


def _memory_max(unit_file: str) -> int:
    value = re.search(r"^MemoryMax=(\d+)G$", (UNITS / unit_file).read_text(), re.M)
    assert value, unit_file
    return int(value.group(1)) << 30


def _cgroup_limit(h: Host, unit: str) -> int:
    cgroup = h.show(unit, "ControlGroup")
    return int(h.sh(f"cat /sys/fs/cgroup/memory{cgroup}/memory.limit_in_bytes"))


def _writable_in_sandbox(h: Host, unit: str, paths: list[str]) -> dict[str, str]:
    """Each path tried from inside the unit's mount namespace as its user: 'rw' or the error."""
    pid = h.show(unit, "MainPID")
    out = {}
    for path in paths:
        probe = f"{path}/.fx27b-probe"
        said = h.sh(f"nsenter -t {pid} -m setpriv --reuid fx --regid fx --init-groups "
                    f"sh -c 'mkdir -p {path} && touch {probe} && rm {probe}' 2>&1 && echo rw "
                    "|| true")
        out[path] = said.strip().splitlines()[-1] if said.strip() else "?"
    return out


def _env(h: Host, unit: str) -> dict[str, str]:
    pid = h.show(unit, "MainPID")
    raw = h.sh(f"tr '\\0' '\\n' < /proc/{pid}/environ")
    return dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)


def test_units_start_and_answer(host: Host) -> None:
    """The broker takes clients, the executor answers the holder's request with magika."""
    for unit in ("fx-broker.service", "fx-executor@cpu0.service",
                 f"fx-workload@{host.workload}.service"):
        assert host.active(unit), host.sh(f"systemctl status --no-pager {unit} || true")
    host.times["first_answer"] = _answered(host, "[tool.x]\nname = 'a'\nversion = '1'\n", 1)
    labels = host.sh(f"{FX} log {host.workload} --kind output --json --bootstrap {host.bootstrap}")
    assert '\\"outcome\\":\\"ok\\"' in labels, labels


def test_restart_after_kill_9(host: Host) -> None:
    """Each unit comes back after kill -9 of its main PID, and the workload is answered again."""
    host.times["executor_restart"] = _kill9(host, "fx-executor@cpu0.service")
    host.wait("the executor's /healthz after restart",
              lambda: _http_ok(host, host.executor_port, "/healthz"), 120)
    _answered(host, "def f(x):\n    return x + 1\n\nprint(f(2))\n", 2)
    holder = f"fx-workload@{host.workload}.service"
    host.times["holder_restart"] = _kill9(host, holder)
    _answered(host, '{"a": [1, 2, 3], "b": {"c": "d"}}\n', 3)
    host.times["broker_restart"] = _kill9(host, "fx-broker.service")
    status = host.sh(f"runuser -u fx -- {FX} broker status --data-dir {STATE}/broker")
    assert status.split()[:2] == ["running", host.bootstrap], status  # same ports, same data
    _answered(host, "<html><body><p>hello</p></body></html>\n", 4, timeout=180)
    for unit in ("fx-broker.service", "fx-executor@cpu0.service", holder):
        assert host.show(unit, "NRestarts") == "1", unit


def test_memory_max_is_the_cgroup_limit(host: Host) -> None:
    for unit, file in (("fx-broker.service", "fx-broker.service"),
                       ("fx-executor@cpu0.service", "fx-executor@.service"),
                       (f"fx-workload@{host.workload}.service", "fx-workload@.service")):
        assert _cgroup_limit(host, unit) == _memory_max(file), unit
        assert host.show(unit, "MemoryMax") == str(_memory_max(file)), unit
    assert host.show("fx-executor@cpu0.service", "Slice") == "fx-executors.slice"
    assert host.show(f"fx-workload@{host.workload}.service", "Slice") == "fx-workloads.slice"
    # the slice's own cap (75% of this machine's memory), in force on the slice's cgroup
    total = int(host.sh("awk '/MemTotal/ {print $2}' /proc/meminfo")) * 1024
    slice_limit = _cgroup_limit(host, "fx-executors.slice")
    assert abs(slice_limit - total * 0.75) < total * 0.01, (slice_limit, total)


def test_sandbox_leaves_written_paths_writable(host: Host) -> None:
    executor = "fx-executor@cpu0.service"
    env = _env(host, executor)
    assert env["CUPY_CACHE_DIR"] == f"{CACHE}/cupy", env
    written = [env["FX_DATA_DIR"], env["CUPY_CACHE_DIR"], env["FX_CACHE_DIR"],
               env["XDG_CACHE_HOME"], f"{env['FX_DATA_DIR']}/chunks"]
    assert _writable_in_sandbox(host, executor, written) == dict.fromkeys(written, "rw")
    # the node key and what the executor wrote are in its state directory
    assert "node.key" in host.sh(f"ls {env['FX_DATA_DIR']}")
    # the model store: written by `fx models import` as fx, read-only for the services
    store = env["FX_EXECUTOR_MODEL_DIR"]
    assert _writable_in_sandbox(host, executor, [store])[store] != "rw"
    assert host.sh(f"runuser -u fx -- sh -c 'touch {store}/.p && rm {store}/.p' && echo rw"
                   ).strip() == "rw"
    holder = f"fx-workload@{host.workload}.service"
    henv = _env(host, holder)
    written = [henv["FX_DATA_DIR"], henv["FX_CACHE_DIR"], henv["XDG_CACHE_HOME"]]
    assert _writable_in_sandbox(host, holder, written) == dict.fromkeys(written, "rw")
    broker = "fx-broker.service"
    written = [f"{STATE}/broker", f"{CACHE}/kafka-{DEFAULT_KAFKA_VERSION}"]
    assert _writable_in_sandbox(host, broker, written) == dict.fromkeys(written, "rw")
    # and none of them met a read-only or forbidden path while it ran
    journal = host.sh("journalctl --no-pager -o cat -u 'fx-*' || true")
    bad = [ln for ln in journal.splitlines()
           if re.search(r"Read-only file system|Permission denied|Failed to persist", ln)]
    assert not bad, "\n".join(bad[:20])
