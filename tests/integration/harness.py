"""The set-up the integration tests share: the config file of the project's executor
(``fx executor run --config FILE``), and a workload run by real processes on a real broker (an
executor and lease holders, started through :class:`workload_sdk.testing.WorkloadHarness`).

Tests get :class:`ExecutorHarness` through the ``executor_harness`` fixture
(tests/integration/conftest.py); module-scoped fixtures, which have no ``tmp_path``, build it
directly with a ``work`` folder of their own.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from broker_schema import INFERENCE_KIND, topics
from workload_sdk.examples.filetype_gate import GATE_KIND
from workload_sdk.testing import WorkloadHarness

#: the workload most integration tests run: magika decides a file's type, a gate is asked
FILETYPE_GATE = "workload_sdk.examples.filetype_gate:FiletypeGate"
FILETYPE_GATE_KINDS = (INFERENCE_KIND, GATE_KIND)
#: how much of a process's log an assertion message shows
TAIL_CHARS = 3000


def executor_config(bootstrap: str, workload_id: str, work: Path, model_dir: Path,
                    **overrides: Any) -> dict[str, Any]:
    """The settings of an executor that serves only ``workload_id``'s ``.out`` (and its shadow
    evaluations'), from ``model_dir``, with its key and chunks in ``work``; on the CPU, quick to
    notice topics and rebalances, no HTTP, facts only at start. ``overrides`` replace or add
    settings (executor/config.py names them)."""
    config: dict[str, Any] = {
        "node_id": f"exec-{workload_id[:12]}", "bootstrap": bootstrap,
        "topic_pattern": topics.out_pattern(workload_id), "group_prefix": f"fx-test-{workload_id}",
        "model_dir": str(model_dir), "key_file": str(work / "node.key"),
        "chunk_dir": str(work / "chunks"), "http_port": None,
        "metadata_max_age_ms": 500, "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 500, "facts_interval_s": 0, "device": "cpu",
        "processes": 1,  # this node id serves, in the one process (not one child per core)
    }
    config.update(overrides)
    return config


def write_executor_config(path: Path, bootstrap: str, workload_id: str, model_dir: Path,
                          **overrides: Any) -> Path:
    """:func:`executor_config` as the JSON file ``fx executor run --config`` reads, at ``path``
    (its key and chunks beside it); returns ``path``."""
    path.write_text(json.dumps(executor_config(bootstrap, workload_id, path.parent, model_dir,
                                               **overrides)))
    return path


class ExecutorHarness(WorkloadHarness):
    """A :class:`WorkloadHarness` whose workload the project's executor serves: the executor's
    config is written to ``<work>/executor.json`` on entering, the processes' logs go to
    ``<work>/<name>.log`` (kept after the test), and every process started is stopped on leaving
    (SIGTERM, then SIGKILL). When the block fails, the tail of each log is printed (pytest shows
    it with the failure).

    Defaults: the file-type gate (:data:`FILETYPE_GATE`); ``executor`` holds overrides of
    :func:`executor_config`, the other keywords are the spec's fields."""

    def __init__(self, bootstrap: str, workload_id: str, model_dir: Path, *, work: Path,
                 models: Mapping[str, str], module: str = FILETYPE_GATE,
                 effect_kinds: Sequence[str] = FILETYPE_GATE_KINDS,
                 executor: Mapping[str, Any] | None = None, **spec_fields: Any) -> None:
        super().__init__(bootstrap, workload_id, module, effect_kinds=effect_kinds,
                         models=models, log_dir=work, **spec_fields)
        self.work = work
        self.model_dir = model_dir
        self.executor_settings = dict(executor or {})
        self.config_path = work / "executor.json"

    async def __aenter__(self) -> ExecutorHarness:
        self.work.mkdir(parents=True, exist_ok=True)
        write_executor_config(self.config_path, self.bootstrap, self.workload_id,
                              self.model_dir, **self.executor_settings)
        await super().__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if exc and exc[0] is not None:
            for log in sorted(self.work.glob("*.log")):
                print(f"--- {log.name} (last {TAIL_CHARS} characters) ---\n{self.tail(log.stem)}")
        await super().__aexit__(*exc)

    def start_configured_executor(self, name: str = "executor") -> subprocess.Popen[bytes]:
        """``fx executor run --config <work>/executor.json``; its log is ``<work>/<name>.log``."""
        return self.start_executor("--config", str(self.config_path), name=name)

    def start_nodes(self, holder_id: str, *holder_args: str
                    ) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
        """The executor, then a lease holder ``holder_id`` (``holder_args`` passed on to
        :meth:`WorkloadHarness.start_holder`): ``(executor, holder)``."""
        executor = self.start_configured_executor()
        return executor, self.start_holder(holder_id, *holder_args)

    def tail(self, name: str = "executor", chars: int = TAIL_CHARS) -> str:
        """The end of ``<work>/<name>.log`` (holders' logs are ``holder-<id>``); empty while
        there is none."""
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


__all__ = ["FILETYPE_GATE", "FILETYPE_GATE_KINDS", "ExecutorHarness", "executor_config",
           "write_executor_config"]
