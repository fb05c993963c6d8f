"""``fx executor run --processes N`` (executor/processes.py): the pure decisions (how many, the
children's ids, ports, state directories and configs, restart delays), the command's answers to
bad input, and the supervisor with real child processes (restart after SIGKILL, SIGTERM
forwarded, a refused config not restarted)."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from executor import processes
from executor.config import load_config
from executor.processes import (
    MAX_PROCESSES,
    Child,
    ProcessesError,
    Supervisor,
    child_config,
    child_environ,
    child_http_port,
    child_node_id,
    child_state_dir,
    plan_children,
    prepare_child,
    resolve_processes,
    restart_delay,
)
from fx_cli.main import main as fx_main
from fx_node.identity import NodeIdentity
from fx_node.settings import ConfigError


def _config(tmp_path: Path, **kw: object):  # type: ignore[no-untyped-def]
    settings: dict[str, object] = {"node_id": "gpu-7", "key_file": str(tmp_path / "node.key"),
                                   "model_dir": str(tmp_path / "models"),
                                   "chunk_dir": str(tmp_path / "chunks"), "http_port": 8088}
    settings.update(kw)
    return load_config(environ={}, **settings)


def test_resolve_processes() -> None:
    assert resolve_processes("auto", 12) == 12
    assert resolve_processes(None, 3) == 3
    assert resolve_processes("auto", 10_000) == MAX_PROCESSES
    assert resolve_processes("4", 2) == 4 and resolve_processes(1, 64) == 1
    for bad, said in ((0, "at least 1, not 0"), ("-3", "at least 1, not -3"),
                      (MAX_PROCESSES + 1, f"at most {MAX_PROCESSES}, not {MAX_PROCESSES + 1}"),
                      ("two", "whole number or 'auto', not 'two'")):
        with pytest.raises(ProcessesError, match=said):
            resolve_processes(bad, 8)


def test_the_config_setting(tmp_path: Path) -> None:
    assert _config(tmp_path).processes == "auto"
    assert load_config(environ={"FX_EXECUTOR_PROCESSES": "4"}).processes == 4
    for bad in ("0", "257", "x", "1.5", "true"):
        with pytest.raises(ConfigError, match="processes must be 'auto' or a whole number"):
            load_config(environ={"FX_EXECUTOR_PROCESSES": bad})


def test_cores_is_what_this_process_may_use() -> None:
    assert 1 <= processes.cores() <= (os.cpu_count() or 1)


def test_child_ids_ports_and_state() -> None:
    assert [child_node_id("gpu-7", i) for i in range(3)] == ["gpu-7-p0", "gpu-7-p1", "gpu-7-p2"]
    with pytest.raises(ProcessesError, match="too long"):
        child_node_id("n" * 198, 0)
    assert child_http_port(None, 3) is None
    assert child_http_port(0, 3) == 0
    assert child_http_port(8088, 0) == 8088 and child_http_port(8088, 5) == 8093
    with pytest.raises(ProcessesError, match="past 65535"):
        child_http_port(65535, 1)
    assert child_state_dir(Path("/var/lib/fx/node.key"), "gpu-7-p1") == Path(
        "/var/lib/fx/gpu-7-p1")


def test_child_configs_own_identity_and_share_the_store(tmp_path: Path) -> None:
    config = _config(tmp_path, processes="auto", workers=3)
    children = plan_children(config, 3)
    assert [c.node_id for c in children] == ["gpu-7-p0", "gpu-7-p1", "gpu-7-p2"]
    assert [c.http_port for c in children] == [8088, 8089, 8090]
    assert {c.processes for c in children} == {1}
    for c in children:  # own key, chain and ledger-key list; the store and chunks shared
        assert c.key_file == tmp_path / c.node_id / "node.key"
        assert c.receipt_chain_file.parent == c.ledger_keys_file.parent == tmp_path / c.node_id
        assert c.model_dir == config.model_dir and c.chunk_dir == config.chunk_dir
        assert c.workers == 3 and c.group_prefix == config.group_prefix
    assert len({c.ledger_keys_file for c in children}) == 3
    assert child_config(_config(tmp_path, http_port=None), 1).http_port is None


def test_restart_delay_backs_off() -> None:
    assert [restart_delay(k) for k in (1, 2, 3, 4, 5, 6, 7, 50)] == [1, 2, 4, 8, 16, 30, 30, 30]


def test_child_environ_drops_executor_settings() -> None:
    env = child_environ({"FX_EXECUTOR_NODE_ID": "x", "FX_KAFKA_BOOTSTRAP": "b:1", "HOME": "/h"})
    assert env == {"FX_KAFKA_BOOTSTRAP": "b:1", "HOME": "/h"}


def test_a_child_names_itself_in_its_log_lines() -> None:
    import logging

    handler = logging.StreamHandler()
    root = logging.getLogger()
    root.addHandler(handler)
    saved = {h: h.formatter for h in root.handlers}
    try:
        processes.name_log_lines({})  # not a child: nothing changes
        assert handler.formatter is None
        processes.name_log_lines({processes.PROCESS_NAME_ENV: "gpu-7-p3"})
        record = logging.LogRecord("executor.service", logging.INFO, __file__, 1, "hello", None,
                                   None)
        assert "INFO [gpu-7-p3] executor.service: hello" in handler.format(record)
    finally:
        for h, f in saved.items():
            h.setFormatter(f)
        root.removeHandler(handler)


def test_prepare_child_makes_key_and_config(tmp_path: Path) -> None:
    child = child_config(_config(tmp_path), 1)
    path = prepare_child(child)
    state = tmp_path / "gpu-7-p1"
    assert path == state / "executor.json"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_config(path, environ={}) == child  # what the child reads is what was planned
    key = NodeIdentity.load_or_create(child.key_file)
    assert prepare_child(child) == path  # again: the same key, kept
    assert NodeIdentity.load_or_create(child.key_file).key_id == key.key_id


def test_prepare_child_refuses_a_state_dir_it_cannot_make(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    child = child_config(_config(tmp_path, key_file=str(blocker / "node.key")), 0)
    with pytest.raises(ProcessesError, match="cannot prepare the state directory"):
        prepare_child(child)


@pytest.mark.parametrize(("argv", "said"), [
    (["--processes", "0"], "--processes must be at least 1, not 0"),
    (["--processes", "100000"], f"--processes must be at most {MAX_PROCESSES}"),
    (["--processes", "many"], "--processes must be a whole number or 'auto'"),
])
def test_cli_refuses_bad_counts_in_one_line(argv: list[str], said: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert fx_main(["executor", "run", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fx executor run: {said}") and "\n" not in err


def test_cli_refuses_a_state_dir_that_cannot_be_split(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = tmp_path / "executor.json"
    cfg.write_text(json.dumps({"node_id": "n1", "key_file": str(blocker / "node.key"),
                               "http_port": None}))
    assert fx_main(["executor", "run", "--config", str(cfg), "--processes", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot prepare the state directory" in err and "\n" not in err


def test_cli_print_config_names_the_processes(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "executor.json"
    cfg.write_text(json.dumps({"node_id": "n1", "key_file": str(tmp_path / "node.key"),
                               "http_port": 9000}))
    assert fx_main(["executor", "run", "--config", str(cfg), "--processes", "2",
                    "--print-config"]) == 0
    out = capsys.readouterr().out
    assert 'processes = 2' in out
    assert f'# process n1-p1: key_file = "{tmp_path / "n1-p1" / "node.key"}", ' \
           'http_port = 9001' in out
    assert not (tmp_path / "n1-p0").exists()  # printing creates nothing


# A stand-in child: records its pid, serves until SIGTERM, then exits with the status the
# config names (0 by default).
CHILD = """
import json, os, signal, sys, time
path = sys.argv[sys.argv.index("--config") + 1]
status = json.load(open(path)).get("exit_now")
open(path + ".pids", "a").write(f"{os.getpid()}\\n")
if status is not None:
    sys.exit(status)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(0.05)
"""


def _pids(path: Path) -> list[int]:
    f = Path(f"{path}.pids")
    return [int(x) for x in f.read_text().split()] if f.exists() else []


def _until(cond, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)


@pytest.fixture
def restore_signals():  # type: ignore[no-untyped-def]
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_supervisor_restarts_a_killed_child_and_forwards_sigterm(
        tmp_path: Path, restore_signals: None) -> None:
    paths = [tmp_path / f"c{i}.json" for i in range(2)]
    for p in paths:
        p.write_text("{}")
    sup = Supervisor([Child(i, f"n-p{i}", p) for i, p in enumerate(paths)], grace_s=1.0,
                     command=[sys.executable, "-c", CHILD])

    def drive() -> None:
        _until(lambda: all(len(_pids(p)) == 1 for p in paths))
        os.kill(_pids(paths[1])[0], signal.SIGKILL)
        _until(lambda: len(_pids(paths[1])) == 2)  # restarted after the first delay
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=drive)
    t.start()
    status = sup.run(poll_s=0.05)
    t.join()
    assert status == 0
    assert sup.restarts_total == 1 and [c.restarts for c in sup.children] == [0, 1]
    assert sup.children[1].exits == [-signal.SIGKILL]
    assert all(c.proc is not None and c.proc.returncode == 0 for c in sup.children)


def test_supervisor_stops_when_a_child_config_is_refused(
        tmp_path: Path, restore_signals: None) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text("{}")
    bad.write_text(json.dumps({"exit_now": 2}))
    sup = Supervisor([Child(0, "n-p0", good), Child(1, "n-p1", bad)], grace_s=1.0,
                     command=[sys.executable, "-c", CHILD])
    assert sup.run(poll_s=0.05) == 2
    assert sup.restarts_total == 0 and len(_pids(bad)) == 1
    assert sup.children[0].proc is not None and sup.children[0].proc.returncode is not None
