"""``fx executor run --processes 2`` on the real broker with magika: two child nodes
(``<node>-p0``, ``<node>-p1``) in the same consumer groups share four workloads' partitions, each
signs with its own key; a child killed with SIGKILL is restarted by the parent and no request is
lost; SIGTERM to the parent stops every child cleanly. With two CPUs or more, ``engine_cpus``
lists two: child ``i``'s engine thread runs on the ``i``-th alone (read from ``/proc``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from broker_schema.records import ResponseRecord
from executor.models import ModelStore
from fx_node.identity import NodeIdentity, verify_response
from tests.integration.executor.harness import REPO, Workload, executor_config, workload
from tests.unit.executor.helpers import request, tone_wav

pytestmark = pytest.mark.integration

WORKLOADS = 4  # one .out partition each: two members get two each (round robin)


CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _task_cpus(pid: int) -> list[str]:
    """Each thread's ``Cpus_allowed_list`` of process ``pid``."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    out.append(line.split(":", 1)[1].strip())
    return out


def _children(parent: int) -> dict[str, int]:
    """The parent's live children, by node id (read from their command lines)."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{parent}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if b"--config" in argv:
                config = Path(argv[argv.index(b"--config") + 1].decode())
                out[config.parent.name] = int(pid)
    return out


async def _until(cond, what: str, timeout: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.2)


async def test_two_processes_share_the_groups_survive_sigkill_and_stop_on_sigterm(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str
) -> None:
    prefix = f"procs{uuid.uuid4().hex[:8]}"
    async with contextlib.AsyncExitStack() as stack:
        wls = [await stack.enter_async_context(workload(kafka_bootstrap, prefix))
               for _ in range(WORKLOADS)]
        for wl in wls:
            await wl.setup({"m": magika_hash})
        node = f"exec-{prefix}"
        cfg = executor_config(kafka_bootstrap, wls[0].workload_id, tmp_path, store.root,
                              node_id=node, group_prefix=f"fx-test-{prefix}",
                              topic_pattern=rf"^wl\.{prefix}-[0-9a-f]+\.out$",
                              **({"engine_cpus": CPUS[:2], "loop_cpus": CPUS}
                                 if len(CPUS) >= 2 else {}))
        config_path = tmp_path / "executor.json"
        config_path.write_text(json.dumps(cfg.model_dump(mode="json")))
        log_path = tmp_path / "parent.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FX_EXECUTOR_")}
        with log_path.open("ab") as log:
            parent = subprocess.Popen(
                [sys.executable, "-m", "fx_cli.main", "executor", "run", "--config",
                 str(config_path), "--processes", "2"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        ids = [f"{node}-p0", f"{node}-p1"]
        seq = itertools.count()
        sent: dict[str, Workload] = {}
        answered: dict[str, ResponseRecord] = {}

        async def send_wave(n: int) -> None:
            for _ in range(n):
                k = next(seq)
                wl = wls[k % WORKLOADS]
                req = request(wl.workload_id, magika_hash, tone_wav(0.05), input_offset=k)
                await wl.send(req)
                sent[req.effect_id] = wl

        async def collect(timeout: float = 90.0) -> None:
            for wl in wls:
                mine = [e for e, w in sent.items() if w is wl and e not in answered]
                if mine:
                    for r in await wl.responses(mine, timeout=timeout):
                        if isinstance(r, ResponseRecord):
                            answered[r.effect_id] = r

        def by(node_id: str) -> int:
            return sum(r.written_by == node_id for r in answered.values())

        def log() -> str:
            return log_path.read_text(errors="replace")

        try:
            await _until(lambda: len(_children(parent.pid)) == 2 or parent.poll() is not None,
                         "two children")
            assert set(_children(parent.pid)) == set(ids), log()[-3000:]
            # both members answer, once the group has spread the four partitions over them
            for _ in range(30):
                await send_wave(8)
                await collect()
                if by(ids[0]) and by(ids[1]):
                    break
            assert by(ids[0]) and by(ids[1]), {i: by(i) for i in ids}
            if len(CPUS) >= 2:  # child i's engine thread on CPUS[i] alone, the rest on all
                for i, child in enumerate(ids):
                    masks = _task_cpus(_children(parent.pid)[child])
                    assert str(CPUS[i]) in masks, (child, masks)
                    assert f"[{child}] executor.service: {child}: engine worker threads on " \
                           f"CPUs {CPUS[i]}" in log()

            # SIGKILL one child while requests keep coming: restarted, nothing lost
            old = _children(parent.pid)[ids[1]]
            os.kill(old, signal.SIGKILL)
            await send_wave(16)
            await _until(lambda: _children(parent.pid).get(ids[1], old) != old,
                         f"{ids[1]} restarted:\n{log()[-3000:]}")
            await collect(timeout=120)
            before = by(ids[1])
            for _ in range(30):  # the restarted child serves again under its own id
                await send_wave(8)
                await collect(timeout=120)
                if by(ids[1]) > before:
                    break
            assert by(ids[1]) > before, {i: by(i) for i in ids}
            assert f"process {ids[1]} exited with signal 9" in log()
            assert f"process {ids[1]} restarted (1 restarts, 1 in all)" in log()
            for i in ids:  # each child's lines name it
                assert f"[{i}] executor.service: ninelives:inference/run@0.1.0: partitions " \
                       "assigned" in log()

            children = _children(parent.pid)
            parent.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(parent.wait, 60) == 0, log()[-3000:]
        finally:
            if parent.poll() is None:
                parent.kill()
        for pid in children.values():  # every child gone with the parent
            assert not Path(f"/proc/{pid}").exists(), f"child {pid} still there"
        assert "all processes stopped (1 restarts in all)" in log()

    keys = {i: NodeIdentity.load_or_create(tmp_path / i / "node.key") for i in ids}
    assert set(answered) == set(sent)  # nothing lost
    assert {r.outcome for r in answered.values()} == {"ok"}, [
        (r.written_by, r.error) for r in answered.values() if r.outcome != "ok"]
    for r in answered.values():  # each child signs with its own key
        assert r.written_by in ids
        assert verify_response(r, keys[r.written_by].public_key)
    assert keys[ids[0]].key_id != keys[ids[1]].key_id

