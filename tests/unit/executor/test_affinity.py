"""``engine_cpus`` / ``loop_cpus`` (executor/affinity.py, executor/engine_pool.py): the pure
decisions (the CPU list's forms, whether this process may use them, each child's engine CPU),
the setting from a file and the environment, the command's one-line refusal, and real threads
pinned, read back from ``/proc/self/task/<tid>/status`` (Linux affinity is per thread: pinning
the engine's worker thread leaves the others as they were)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executor import affinity
from executor.affinity import (
    child_engine_cpus,
    cpus_problem,
    format_cpus,
    parse_cpus,
    pin_thread,
    thread_cpus,
)
from executor.config import load_config
from executor.models import ModelStore
from executor.processes import child_config, describe
from executor.service import ExecutorService
from fx_cli.main import main as fx_main
from fx_node.identity import NodeIdentity
from fx_node.settings import ConfigError

ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2 or not os.path.isdir("/proc/self/task"),
                              reason="pinning is seen only with two CPUs to choose from (Linux)")


@pytest.fixture
def restore_affinity() -> Iterator[None]:
    """Every thread of this process back on the CPUs it had (a test pins the process)."""
    yield
    affinity.pin_process(ALLOWED)


def test_parse_cpus_forms() -> None:
    assert parse_cpus([3, 1, 1]) == [1, 3]
    assert parse_cpus("0,2-4, 7") == [0, 2, 3, 4, 7]
    assert parse_cpus("") == [] and parse_cpus(None) == [] and parse_cpus([]) == []
    for bad, said in (("a", "not a CPU id or range: 'a'"), ("3-1", "not a CPU id or range"),
                      ([-1], "whole number >= 0, not -1"), ([True], "not True"),
                      ([1.5], "not 1.5"), (7, "must be a list or a string")):
        with pytest.raises(ValueError, match=said):
            parse_cpus(bad)
    assert format_cpus([0, 2, 3, 4, 7]) == "0,2-4,7" and format_cpus([]) == ""


def test_cpus_problem() -> None:
    assert cpus_problem([], [], None, supported=False) is None  # nothing asked: nothing needed
    assert cpus_problem([1], [0], {0, 1}) is None
    said = cpus_problem([1, 5, 6], [], {0, 1})
    assert said == ("engine_cpus 1,5-6: CPU 5-6 is not one this process may run on (0-1)")
    assert "loop_cpus 2" in (cpus_problem([0], [2], {0, 1}) or "")
    assert "Linux" in (cpus_problem([0], [], None, supported=False) or "")


def test_child_engine_cpus() -> None:
    assert [child_engine_cpus([4, 5], i) for i in range(3)] == [[4], [5], [4]]
    assert child_engine_cpus([], 3) == []


def _config(tmp_path: Path, environ: dict[str, str] | None = None, **kw: Any) -> Any:
    settings: dict[str, Any] = {"node_id": "n1", "key_file": str(tmp_path / "node.key"),
                                "model_dir": str(tmp_path / "models"),
                                "chunk_dir": str(tmp_path / "chunks"), "http_port": None,
                                "bootstrap": "127.0.0.1:1"}
    settings.update(kw)
    return load_config(environ=environ or {}, **settings)


def test_the_settings_from_the_environment(tmp_path: Path) -> None:
    assert _config(tmp_path).engine_cpus == [] and _config(tmp_path).loop_cpus == []
    cfg = _config(tmp_path, {"FX_EXECUTOR_ENGINE_CPUS": "1", "FX_EXECUTOR_LOOP_CPUS": "[0, 2]"})
    assert cfg.engine_cpus == [1] and cfg.loop_cpus == [0, 2]
    assert _config(tmp_path, {"FX_EXECUTOR_ENGINE_CPUS": "2-3"}).engine_cpus == [2, 3]
    with pytest.raises(ConfigError, match="not a CPU id or range: 'x'"):
        _config(tmp_path, {"FX_EXECUTOR_ENGINE_CPUS": "x"})


def test_children_take_one_engine_cpu_each(tmp_path: Path) -> None:
    cfg = _config(tmp_path, engine_cpus=[2, 3], loop_cpus=[0, 1])
    kids = [child_config(cfg, i) for i in range(3)]
    assert [k.engine_cpus for k in kids] == [[2], [3], [2]]
    assert all(k.loop_cpus == [0, 1] for k in kids)
    assert describe(cfg, 2)["n1-p1"]["engine_cpus"] == [3]


def test_cli_refuses_a_cpu_this_process_cannot_use_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    outside = max([*ALLOWED, os.cpu_count() or 0]) + 1000
    monkeypatch.setenv("FX_EXECUTOR_ENGINE_CPUS", str(outside))
    monkeypatch.setenv("FX_EXECUTOR_KEY_FILE", str(tmp_path / "node.key"))
    assert fx_main(["executor", "run", "--print-config", "--processes", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fx executor run: engine_cpus {outside}: CPU {outside} is not one "
                          "this process may run on") and "\n" not in err


@two_cpus
def test_pin_thread_pins_only_the_calling_thread() -> None:
    """A real thread pins itself; /proc says it runs on that CPU alone, and the main thread
    keeps its mask."""
    target = ALLOWED[-1]
    seen: dict[str, Any] = {}

    def run() -> None:
        pin_thread([target])
        seen["tid"] = threading.get_native_id()
        seen["own"] = thread_cpus()
        seen["ready"].set()
        seen["go"].wait(5)

    seen["ready"], seen["go"] = threading.Event(), threading.Event()
    t = threading.Thread(target=run)
    t.start()
    try:
        assert seen["ready"].wait(5)
        assert seen["own"] == {target}
        with open(f"/proc/self/task/{seen['tid']}/status") as f:
            line = next(x for x in f if x.startswith("Cpus_allowed_list:"))
        assert line.split(":", 1)[1].strip() == str(target)
        assert thread_cpus() == set(ALLOWED)  # this (the main) thread is untouched
        assert os.sched_getaffinity(0) == set(ALLOWED)
    finally:
        seen["go"].set()
        t.join()


class RecordingEngine:
    """An engine that notes the CPUs of the thread that loads and runs its models."""

    name = "rec"
    version = "0"
    device_class = "cpu"
    max_batch = 8

    def __init__(self) -> None:
        self.models: set[str] = set()
        self.load_cpus: set[int] = set()

    def load(self, manifest: Any, model_bytes: bytes) -> None:
        self.load_cpus = thread_cpus()
        self.models.add(manifest.hash)

    def loaded(self) -> frozenset[str]:
        return frozenset(self.models)

    def unload(self, model_hash: str) -> None:
        self.models.discard(model_hash)

    def run_batch(self, model_hash: str, items: Any) -> list[Any]:
        raise AssertionError("not run here")


@two_cpus
async def test_engine_threads_on_engine_cpus_the_rest_on_loop_cpus(
        tmp_path: Path, restore_affinity: None) -> None:
    """An executor with ``engine_cpus`` = the last CPU and ``loop_cpus`` = the others: the
    engine pool's worker thread runs on the engine CPU alone, a model loads on it whatever
    thread loads it (that thread's mask restored after), and every other thread of the process
    (the main one included, and threads it starts later) runs on the loop CPUs."""
    engine_cpu, loop = ALLOWED[-1], ALLOWED[:-1]
    store = ModelStore(tmp_path / "models")
    src = tmp_path / "weights.bin"
    src.write_bytes(b"weights")
    manifest = store.add(src, {"name": "w", "engine": "rec", "interface": "onnx-tensors",
                               "preprocessing_version": "onnx-tensors/1"})
    cfg = _config(tmp_path, engine_cpus=[engine_cpu], loop_cpus=loop, preload=[])
    rec = RecordingEngine()
    svc = ExecutorService(cfg, identity=NodeIdentity.generate(), engines={"rec": rec})
    assert thread_cpus() == set(loop)  # the process, main thread included
    pool = svc.runner.answerer.threads
    loop_ = asyncio.get_running_loop()
    assert await loop_.run_in_executor(pool, thread_cpus) == {engine_cpu}
    # a load from another thread (as the preload does, in asyncio's default pool)
    later: set[int] = set()

    def load_elsewhere() -> None:
        svc.runner.engines.ensure_loaded(manifest.hash)
        later.update(thread_cpus())

    await asyncio.to_thread(load_elsewhere)
    assert rec.load_cpus == {engine_cpu} and later == set(loop)
    t = threading.Thread(target=lambda: later.update({-1} if thread_cpus() != set(loop) else ()))
    t.start()
    t.join()
    assert -1 not in later  # a thread started later takes the loop CPUs
    pool.shutdown(wait=True)


def test_a_config_built_in_code_with_foreign_cpus_is_refused(tmp_path: Path) -> None:
    outside = max([*ALLOWED, os.cpu_count() or 0]) + 1000
    cfg = _config(tmp_path, engine_cpus=[outside])
    with pytest.raises(ConfigError, match=f"engine_cpus {outside}: CPU {outside} is not one"):
        ExecutorService(cfg, identity=NodeIdentity.generate())


@two_cpus
def test_what_the_process_may_use_is_what_it_started_with(restore_affinity: None) -> None:
    """A second executor in a process the first pinned (the bench runs several) may still
    take the engine CPU the first left to its engine."""
    affinity.pin_process(ALLOWED[:1])
    assert os.sched_getaffinity(0) == {ALLOWED[0]}
    assert affinity.allowed_cpus() == set(ALLOWED)
    assert cpus_problem([ALLOWED[-1]], ALLOWED[:1], affinity.allowed_cpus()) is None
