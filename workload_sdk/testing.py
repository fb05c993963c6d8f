"""Test a workload the way the project does: a real broker, a lease holder process, an executor.

:class:`WorkloadHarness` creates the workload's topics on a given broker, writes its spec, starts
lease holders as real processes (``python -m workload_sdk workload run``), appends inputs, and
reads the log back. :meth:`WorkloadHarness.start_executor` starts the project's executor as a
process (``fx executor run ...``) when it is installed, :meth:`WorkloadHarness.start_gateway` an
actuator gateway (``fx actuator run ...``); :meth:`WorkloadHarness.answer` writes
``accepted`` and ``response`` records by hand, for tests that play the executor's part themselves
(real records on a real broker, but no model ran: say so in the test's name).

Get a broker from :func:`fx_kafka.testing.kafka_for_tests` (or ``FX_KAFKA_BOOTSTRAP``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from broker_schema import (
    AcceptedRecord,
    Body,
    ClaimRecord,
    EffectRequest,
    ErrorInfo,
    ExecutorInfo,
    InputRecord,
    ResponseRecord,
    SpecRecord,
    decode,
    encode,
    request_hash,
    topics,
)
from fx_kafka.client import make_producer
from fx_kafka.security import child_env
from fx_kafka.workload import ensure_workload_topics
from fx_kafka.workload_log import WorkloadLog
from workload_sdk._api import body_of, module_hash
from workload_sdk._kafka_io import default_unsigned_policy, read_workload_log
from workload_sdk._loader import load_workload

__all__ = ["WorkloadHarness", "executor_available", "fx_command"]

_ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    # the client security in force (fx_kafka.security.use_security) goes to the child too
    env = child_env(dict(os.environ))
    # the checkout first, so a process sees the same code as the test (editable or not)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
    return env


def fx_command() -> list[str]:
    """The ``fx`` command of this environment (the script beside the interpreter)."""
    script = Path(sys.executable).with_name("fx")
    if script.exists():
        return [str(script)]
    found = shutil.which("fx")
    return [found] if found else [sys.executable, "-m", "fx_cli.main"]


def executor_available(timeout: float = 60.0) -> bool:
    """True when ``fx executor run --help`` works here (the executor part is installed)."""
    try:
        proc = subprocess.run([*fx_command(), "executor", "run", "--help"], env=_env(),
                              capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


class WorkloadHarness:
    """One workload on a real broker, with its lease holders and executors as processes."""

    def __init__(self, bootstrap: str, workload_id: str, module: str, *,
                 effect_kinds: Sequence[str], models: Mapping[str, str] | None = None,
                 log_dir: Path | None = None, **spec_fields: Any) -> None:
        self.bootstrap = bootstrap
        self.workload_id = topics.check_workload_id(workload_id)
        self.module = module
        spec_fields.setdefault("unsigned", default_unsigned_policy())
        self.spec = SpecRecord(workload_id=workload_id,
                               module_hash=module_hash(load_workload(module)),
                               effect_kinds=tuple(effect_kinds), models=dict(models or {}),
                               **spec_fields)
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen[bytes]] = []
        self._producer: Any = None

    # -- set-up --------------------------------------------------------------------------------
    async def __aenter__(self) -> WorkloadHarness:
        await ensure_workload_topics(self.bootstrap, self.workload_id)
        self._producer = make_producer(self.bootstrap)
        await self._producer.start()
        await self.append(topics.spec(self.workload_id), encode(self.spec))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for proc in self.processes:
            self.stop(proc)
        if self._producer is not None:
            await self._producer.stop()

    async def append(self, topic: str, value: bytes) -> int:
        """Append one record value to ``topic``; return its offset."""
        meta = await self._producer.send_and_wait(topic, value=value, partition=0)
        return int(meta.offset)

    async def send_input(self, value: Body | bytes | str | Any, *, source: str | None = None,
                         media_type: str | None = None) -> int:
        """Append an input record (see :func:`workload_sdk._api.body_of`); return its offset."""
        record = InputRecord(workload_id=self.workload_id,
                             body=body_of(value, media_type=media_type), source=source)
        return await self.append(topics.inputs(self.workload_id), encode(record))

    # -- processes -----------------------------------------------------------------------------
    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out: Any = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
        else:
            out = subprocess.DEVNULL
        proc = subprocess.Popen(argv, env=_env(), cwd=str(_ROOT), stdout=out,
                                stderr=subprocess.STDOUT)
        if out is not subprocess.DEVNULL:
            out.close()
        self.processes.append(proc)
        return proc

    def start_holder(self, holder_id: str, *args: str, elect: bool = True,
                     force: bool = True) -> subprocess.Popen[bytes]:
        """Start a lease holder process for this workload (``fx workload run``): a candidate in
        the holder election, or with ``elect=False`` one that claims the lease at once.

        ``force`` (the default) claims with ``--force`` whatever ``sys.facts`` says, since a
        harness test usually plays the executor itself (:meth:`answer`): the claim records what
        no live node served. ``force=False``: the holder checks placement (docs/actuation.md)."""
        return self._spawn([sys.executable, "-m", "workload_sdk", "workload", "run", self.module,
                            "--id", self.workload_id, "--holder-id", holder_id,
                            "--bootstrap", self.bootstrap, *args,
                            *(() if elect else ("--no-elect",)),
                            *(("--force",) if force else ())], f"holder-{holder_id}")

    def start_executor(self, *args: str, name: str = "executor") -> subprocess.Popen[bytes]:
        """Start ``fx executor run ARGS...`` as a process (check :func:`executor_available`)."""
        return self._spawn([*fx_command(), "executor", "run", *args], name)

    def start_gateway(self, *args: str, name: str = "gateway") -> subprocess.Popen[bytes]:
        """Start ``fx actuator run ARGS...`` (an actuator gateway, docs/actuation.md) as a
        process; its output goes to ``<log_dir>/<name>.log``."""
        return self._spawn([*fx_command(), "actuator", "run", *args], name)

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; return the exit code."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        return proc.returncode

    # -- reading ------------------------------------------------------------------------------
    async def read_log(self) -> WorkloadLog:
        """The workload's committed log (and sys.facts)."""
        return await read_workload_log(self.bootstrap, self.workload_id)

    async def wait_for(self, predicate: Callable[[WorkloadLog], bool], *, timeout: float = 30.0,
                       what: str = "condition") -> WorkloadLog:
        """Read the log until ``predicate(log)`` holds; ``TimeoutError`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            log = await read_workload_log(self.bootstrap, self.workload_id, with_facts=False)
            if predicate(log):
                return log
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.workload_id}: no {what} after {timeout} s")
            await asyncio.sleep(0.2)

    @staticmethod
    def requests(log: WorkloadLog, effect_kind: str | None = None
                 ) -> list[tuple[int, EffectRequest]]:
        """The requests on ``.out`` (of one kind, if given) with their offsets."""
        found = []
        for rec in log["out"]:
            record = decode(rec.value)
            if isinstance(record, EffectRequest) and (effect_kind is None
                                                      or record.effect_kind == effect_kind):
                found.append((rec.offset, record))
        return found

    @staticmethod
    def epochs(log: WorkloadLog) -> list[int]:
        """The epochs claimed on ``.claims``, in order."""
        return [c.epoch for c in (decode(r.value) for r in log["claims"])
                if isinstance(c, ClaimRecord)]

    # -- playing the executor by hand -----------------------------------------------------------
    async def answer(self, offset: int, req: EffectRequest, *, outcome: str = "ok",
                     output: Any = None, node_id: str = "test-played-executor",
                     lease_ms: int = 30_000, error_code: str | None = None) -> int:
        """Write ``accepted`` then a response for the request at ``offset`` on ``.out``, as an
        executor would (no model runs: the output is what the test says). Returns the response's
        offset on ``.resp``."""
        resp_topic = topics.resp(self.workload_id)
        bound = request_hash(encode(req))
        accepted = AcceptedRecord(effect_id=req.effect_id, header=req.header,
                                  request_offset=offset, node_id=node_id, lease_ms=lease_ms,
                                  accepted_us=int(time.time() * 1e6), request_hash=bound)
        await self.append(resp_topic, encode(accepted))
        response = ResponseRecord(
            effect_id=req.effect_id, header=req.header, request_offset=offset,
            outcome=outcome,  # type: ignore[arg-type]
            output=body_of(output) if outcome == "ok" else None,
            error=ErrorInfo(code=error_code or "internal") if outcome == "error" else None,  # type: ignore[arg-type]
            model_hash=req.model,
            executor=ExecutorInfo(node_id=node_id, engine="played-by-test", engine_version="0",
                                  device_class="none"),
            written_by=node_id, request_hash=bound,
        )
        return await self.append(resp_topic, encode(response))
