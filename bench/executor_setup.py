"""The executor the benchmarks run, set up in one place: its settings, for an executor in the
script's process (``load_config(environ={}, **executor_settings(...))``) or as
``fx executor run --config FILE`` (:func:`write_executor_config`); and the file-type gate served
by an executor and a lease holder as processes (:func:`gate_processes`).

Imported by the scripts beside it (a script's folder is first on ``sys.path`` when it runs; a
script loaded some other way puts ``bench/`` there itself, as bench/faults.py does).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from broker_schema import INFERENCE_KIND, topics
from workload_sdk.examples.filetype_gate import GATE_KIND
from workload_sdk.testing import WorkloadHarness

#: the file-type gate (magika decides a file's type, the gate is asked; nobody serves the gate)
FILETYPE_GATE = "workload_sdk.examples.filetype_gate:FiletypeGate"


def executor_settings(bootstrap: str, workload_id: str, work: Path, model_dir: Path, *,
                      node_id: str, group_prefix: str, **overrides: Any) -> dict[str, Any]:
    """An executor ``node_id`` in consumer groups ``<group_prefix>.<kind>`` that serves only
    ``workload_id``'s ``.out`` (and its shadow evaluations'), from ``model_dir``, its key and
    chunks in ``work``; quick to notice new topics, no HTTP, facts only at start. ``overrides``
    replace or add settings (executor/config.py names them). Values are JSON's (paths as
    strings), which ``load_config`` reads as well."""
    settings: dict[str, Any] = {
        "node_id": node_id, "bootstrap": bootstrap,
        "topic_pattern": topics.out_pattern(workload_id), "group_prefix": group_prefix,
        "model_dir": str(model_dir), "key_file": str(work / "node.key"),
        "chunk_dir": str(work / "chunks"), "http_port": None, "metadata_max_age_ms": 500,
        "facts_interval_s": 0,
        "processes": 1,  # this node id serves, in the one process (not one child per core)
    }
    settings.update(overrides)
    return settings


def write_executor_config(path: Path, bootstrap: str, workload_id: str, model_dir: Path, *,
                          node_id: str, group_prefix: str, **overrides: Any) -> Path:
    """:func:`executor_settings` as the JSON file ``fx executor run --config`` reads, at
    ``path``, its key and chunks beside it (unless ``overrides`` place them); returns
    ``path``."""
    path.write_text(json.dumps(executor_settings(bootstrap, workload_id, path.parent, model_dir,
                                                 node_id=node_id, group_prefix=group_prefix,
                                                 **overrides)))
    return path


@contextlib.asynccontextmanager
async def gate_processes(bootstrap: str, workload_id: str, model_dir: Path, model_hash: str,
                         work: Path, *, node_id: str, group_prefix: str, holder_id: str,
                         **spec_fields: Any
                         ) -> AsyncIterator[tuple[WorkloadHarness, subprocess.Popen[bytes],
                                                  subprocess.Popen[bytes]]]:
    """:data:`FILETYPE_GATE` on ``workload_id`` with ``model_hash`` as its ``filetype`` model:
    an executor on the CPU (config ``work/executor.json``, :func:`write_executor_config`) and
    then the lease holder ``holder_id``, both processes with their logs in ``work``; yields
    ``(harness, executor, holder)`` and stops both after. ``spec_fields``: the spec's other
    fields."""
    config = write_executor_config(work / "executor.json", bootstrap, workload_id, model_dir,
                                   node_id=node_id, group_prefix=group_prefix, device="cpu")
    async with WorkloadHarness(bootstrap, workload_id, FILETYPE_GATE,
                               effect_kinds=(INFERENCE_KIND, GATE_KIND),
                               models={"filetype": model_hash}, log_dir=work,
                               **spec_fields) as h:
        executor = h.start_executor("--config", str(config))
        yield h, executor, h.start_holder(holder_id)
