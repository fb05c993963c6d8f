"""Test helpers for the actuator gateway: the gateway as a real process (``fx actuator run``) next
to a real Modbus TCP device (:class:`actuator.sim.SimulatedDevice`, a pymodbus server on
loopback) and a real broker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from broker_schema import topics

REPO = Path(__file__).resolve().parents[3]
VALVE_KIND = "acme:valve/set@1.0.0"
#: the holding register the tests' valve is set by
VALVE_REGISTER = 3


def gateway_config(bootstrap: str, workload_id: str, tmp: Path, device_port: int, *,
                   guarantee: str, node_id: str | None = None, kind: str = VALVE_KIND,
                   telemetry: bool = True, **kw: Any) -> dict[str, Any]:
    """A gateway config (JSON) that reads only ``workload_id``'s ``.out``, serves ``kind`` with
    ``guarantee`` on one valve (``valve-1``: register :data:`VALVE_REGISTER` of the device on
    ``device_port``), and appends the valve's telemetry to the workload's ``.in``."""
    config: dict[str, Any] = {
        "node_id": node_id or f"gw-{uuid.uuid4().hex[:8]}",
        "bootstrap": bootstrap,
        "topic_pattern": topics.out_pattern(workload_id),
        "group_prefix": f"fx-test-gw-{workload_id}",
        "key_file": str(tmp / "gateway.key"),
        "http_port": None,
        "metadata_max_age_ms": 500,
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 500,
        "facts_interval_s": 0,
        "shutdown_grace_s": 3.0,
        "devices": {"valve-1": {"port": device_port, "address": VALVE_REGISTER, "minimum": 0,
                                "maximum": 100, "timeout_s": 1.0}},
        "kinds": {kind: {"guarantee": guarantee, "devices": ["valve-1"]}},
        "telemetry": ([{"device": "valve-1", "workload_id": workload_id, "interval_s": 0.5}]
                      if telemetry else []),
    }
    config.update(kw)
    return config


class Gateway:
    """``python -m fx_cli.main -v actuator run --config FILE``, its log kept in ``tmp``."""

    def __init__(self, config: dict[str, Any], tmp: Path, name: str = "gateway") -> None:
        self.config = dict(config)
        self.tmp, self.name = tmp, name
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    @property
    def log_path(self) -> Path:
        return self.tmp / f"{self.name}.{self.runs}.log"

    def start(self, **changes: Any) -> None:
        """Start (again), with ``changes`` to the config (``crash_at=None`` to drop one)."""
        self.config.update(changes)
        self.runs += 1
        path = self.tmp / f"{self.name}.{self.runs}.json"
        path.write_text(json.dumps(self.config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("FX_ACTUATOR_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fx_cli.main", "-v", "actuator", "run", "--config",
                 str(path)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return "\n".join((self.tmp / f"{self.name}.{i}.log").read_text(errors="replace")
                         for i in range(1, self.runs + 1)
                         if (self.tmp / f"{self.name}.{i}.log").exists())

    async def wait_log(self, needle: str, timeout: float = 60.0) -> None:
        """Until ``needle`` is in this run's log (the process must stay up)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while needle not in self.log_path.read_text(errors="replace"):
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}:\n{self.log()[-4000:]}")
            if loop.time() > deadline:
                raise TimeoutError(f"{needle!r} not in the gateway log:\n{self.log()[-4000:]}")
            await asyncio.sleep(0.1)

    async def wait_exit(self, timeout: float = 60.0) -> int:
        """Until the process exits; its return code (-9: killed by SIGKILL)."""
        assert self.proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.proc.poll() is None:
            if loop.time() > deadline:
                raise TimeoutError(f"gateway still running:\n{self.log()[-4000:]}")
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
