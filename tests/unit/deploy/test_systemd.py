"""deploy/systemd: ``systemd-analyze verify`` accepts every unit without a word about them, and the
properties the deployment relies on are set (own slices, limits, restart policy, sandbox, GPU
devices only).

The units name the install layout: a checkout at ``/opt/ninelives-fx`` with its venv at
``/opt/ninelives-fx/.venv``. ``verify`` checks that each ExecStart binary exists, so the test
renders the units into a temp dir with ``/opt/ninelives-fx/.venv`` replaced by this interpreter's
venv and ``/opt/ninelives-fx`` by this checkout (the one substitution docs/operations.md
documents for other layouts), and verifies the rendered copies.
"""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.deploy.helpers import DEPLOY, ROOT, need_tool
from tests.unit.deploy.test_fx_commands import assert_fx_command

UNITS = DEPLOY / "systemd"
INSTALL = "/opt/ninelives-fx"
FILES = ("fx.slice", "fx-executors.slice", "fx-workloads.slice", "fx-executor@.service",
         "fx-workload@.service", "fx-broker.service")
#: What verify is asked about: templates through an instance.
VERIFY = ("fx.slice", "fx-executors.slice", "fx-workloads.slice", "fx-executor@gpu0.service",
          "fx-workload@demo-llm.service", "fx-broker.service")


def render(text: str) -> str:
    """A unit with the install layout replaced by this checkout and this interpreter's venv."""
    return text.replace(f"{INSTALL}/.venv", sys.prefix).replace(INSTALL, str(ROOT))


def _unit(name: str) -> dict[str, dict[str, list[str]]]:
    """Section -> key -> values (a key may repeat)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for raw in (UNITS / name).read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
            continue
        assert section is not None, f"{name}: {line} before a section"
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return out


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = need_tool("systemd-analyze", "Debian package systemd: make system-deps")
    assert Path(sys.prefix, "bin", "fx").is_file(), "the venv's fx script (make install)"
    for name in FILES:
        (tmp_path / name).write_text(render((UNITS / name).read_text(encoding="utf-8")))
    done = subprocess.run([analyze, "verify", "--man=no", *(f"./{u}" for u in VERIFY)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    out = done.stdout + done.stderr
    ours = [ln for ln in out.splitlines()
            if str(tmp_path) in ln or re.search(r"\bfx[-.@]", ln)]
    assert done.returncode == 0 and not ours, out


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a unit with a bad value and a missing binary is reported."""
    analyze = need_tool("systemd-analyze", "Debian package systemd: make system-deps")
    text = render((UNITS / "fx-executor@.service").read_text(encoding="utf-8"))
    text = text.replace("MemoryMax=8G", "MemoryMax=8 lots").replace(
        f"{sys.prefix}/bin/fx executor run", "/nonexistent/fx executor run")
    for name in FILES:
        (tmp_path / name).write_text(render((UNITS / name).read_text(encoding="utf-8")))
    (tmp_path / "fx-executor@.service").write_text(text)
    done = subprocess.run([analyze, "verify", "--man=no", "./fx-executor@gpu0.service"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Invalid memory limit" in out and "/nonexistent/fx" in out, out


def test_executor_unit() -> None:
    unit = _unit("fx-executor@.service")
    service, head = unit["Service"], unit["Unit"]
    one = {k: v[-1] for k, v in service.items()}
    assert one["Slice"] == "fx-executors.slice"
    assert one["EnvironmentFile"] == "/etc/ninelives-fx/executor-%i.env"
    assert one["User"] == "fx" and one["Group"] == "fx"
    assert re.fullmatch(r"\d+G", one["MemoryMax"])
    assert re.fullmatch(r"\d+%", one["CPUQuota"])
    assert one["Restart"] == "on-failure" and int(one["RestartSec"]) > 0
    assert "StartLimitIntervalSec" in head and "StartLimitBurst" in head
    for key, value in (("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                       ("NoNewPrivileges", "yes"), ("PrivateTmp", "yes"),
                       ("DevicePolicy", "closed")):
        assert one[key] == value, key
    assert "PrivateDevices" not in service, "PrivateDevices would hide /dev/nvidia*"
    devices = [d.split()[0] for d in service["DeviceAllow"]]
    assert devices and all(d.startswith(("/dev/nvidia", "char-nvidia")) for d in devices)
    assert "/dev/nvidiactl" in devices and "/dev/nvidia-uvm" in devices
    assert "char-nvidia-frontend" in devices  # /dev/nvidia0, /dev/nvidia1, ...
    assert one["ReadWritePaths"] == "%S/ninelives-fx/executor-%i"
    assert one["StateDirectory"] == "ninelives-fx/executor-%i"
    env = dict(e.split("=", 1) for e in service["Environment"])
    assert env["FX_DATA_DIR"] == "%S/ninelives-fx/executor-%i"


def test_caches_in_cache_directories() -> None:
    """CuPy's kernel cache and ONNX Runtime's files go to directories systemd makes writable
    (their defaults under ~ are read-only with ProtectSystem=strict; a GPU node would fail the
    parity gate). tests/deploy/test_systemd.py writes them from inside the sandbox."""
    for name, keys in (("fx-executor@.service", ("CUPY_CACHE_DIR", "XDG_CACHE_HOME")),
                       ("fx-workload@.service", ("XDG_CACHE_HOME",))):
        service = _unit(name)["Service"]
        env = dict(e.split("=", 1) for e in service["Environment"])
        made = {f"%C/{d}" for line in service["CacheDirectory"] for d in line.split()}
        for key in keys:
            assert env[key] in made, (name, key, env.get(key), made)


def test_holder_not_restarted_on_a_workload_error() -> None:
    """Exit 2 (a workload error) would meet the same step again after a restart."""
    service = _unit("fx-workload@.service")["Service"]
    assert service["RestartPreventExitStatus"] == ["2"]
    from workload_sdk.cli import EXIT_WORKLOAD
    assert EXIT_WORKLOAD == 2


def test_holders_and_executors_apart() -> None:
    """Holders and executors in sibling slices under fx.slice: the executors' cap and the
    holders' floor keep a misbehaving executor from stalling a holder."""
    executor = _unit("fx-executor@.service")["Service"]
    holder = _unit("fx-workload@.service")["Service"]
    assert executor["Slice"] == ["fx-executors.slice"]
    assert holder["Slice"] == ["fx-workloads.slice"]
    executors = _unit("fx-executors.slice")["Slice"]
    workloads = _unit("fx-workloads.slice")["Slice"]
    assert "MemoryMax" in executors
    assert "MemoryLow" in workloads
    assert int(workloads["CPUWeight"][0]) > int(executors["CPUWeight"][0])
    assert int(holder["OOMScoreAdjust"][0]) < int(executor["OOMScoreAdjust"][0])
    assert holder["PrivateDevices"] == ["yes"] and "DeviceAllow" not in holder
    for name in ("fx-executor@.service", "fx-workload@.service", "fx-broker.service"):
        service = _unit(name)["Service"]
        assert service["Restart"] == ["on-failure"], name
        assert service["ProtectSystem"] == ["strict"], name
        assert service["NoNewPrivileges"] == ["yes"], name


def test_broker_unit() -> None:
    service = _unit("fx-broker.service")["Service"]
    assert service["Type"] == ["forking"]
    assert service["ExecStart"][0].split()[1:3] == ["broker", "start"]
    assert service["ExecStop"][0].split()[1:3] == ["broker", "stop"]
    assert (ROOT / "deploy" / "local-kafka" / "fetch.sh").is_file()


@pytest.mark.parametrize("name", ["fx-executor@.service", "fx-workload@.service",
                                  "fx-broker.service"])
def test_exec_commands_parse(name: str) -> None:
    """ExecStart/ExecStop are `fx` commands the parser accepts (specifiers and ${VARS} given
    sample values)."""
    service = _unit(name)["Service"]
    samples = {"%i": "demo-llm", "%H": "host1", "%S": "/var/lib", "%C": "/var/cache",
               "${FX_WORKLOAD_MODULE}": "workload_sdk.examples.ask_llm:AskLLM",
               "${FX_HOLDER_HTTP_HOST}": "127.0.0.1", "${FX_HOLDER_HTTP_PORT}": "9108"}
    for key in ("ExecStart", "ExecStop"):
        for line in service.get(key, []):
            for spec, value in samples.items():
                line = line.replace(spec, value)
            assert "%" not in line and "${" not in line, line
            argv = line.split()
            assert argv[0] == f"{INSTALL}/.venv/bin/fx", line
            assert_fx_command(argv[1:], f"{name} {key}")


def test_units_parse_as_ini() -> None:
    for name in FILES:
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.read_string((UNITS / name).read_text(encoding="utf-8"))
        assert parser.sections(), name
