"""Edge footprint: memory, disk and CPU of a site's broker, executor (with magika) and holder.

Starts a one-node Apache Kafka broker of its own (``--heap``, loopback) for the site, the
project's executor (``fx executor run``, magika on the CPU) and a lease holder (processes), runs
the file-type gate over a fixed corpus of small files (:mod:`workload_sdk.examples.filetype_corpus`:
one inference and one gate request per file) and reads from ``/proc``:

- **memory**: RSS (now and peak, ``VmHWM``) and PSS (``smaps_rollup``: shared pages split
  between the processes that map them) of each process and its children;
- **CPU**: user + system seconds of each process (children included), idle and over the run;
- **disk**: the broker's log dir (allocated blocks and apparent size: Kafka preallocates its
  10 MiB index files sparse) and the model store.

With ``--mirror`` it also starts a fleet broker and ``fx mirror`` (MirrorMaker 2) from the site
and measures the mirror's JVM, for a site that runs the mirror itself. Mode A (a model inside
the deterministic step) does not exist yet and is not measured.

    .venv/bin/python bench/edge_footprint.py --files 200 [--heap 256m] [--mirror] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from executor_setup import gate_processes

from broker_schema import OutputRecord, decode
from fx_kafka.local import LocalKafka
from fx_kafka.mirror import Mirror
from workload_sdk.examples.filetype_corpus import corpus
from workload_sdk.testing import fx_command

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# ----------------------------------------------------------------------------- /proc
def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            out += [int(c) for c in text]
    except OSError:
        return out
    return out


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo += _children(p)
    return pids


def _status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime stime cutime cstime (fields 14-17 of stat; here after the command's ")")
    return sum(int(f) for f in fields[11:15]) / TICK


def sample(pid: int) -> dict[str, float]:
    """One process and its children: RSS, peak RSS, PSS (MiB) and CPU seconds."""
    pids = _tree(pid)
    return {
        "rss_mib": sum(_status_kb(p, "VmRSS") for p in pids) / 1024,
        "peak_rss_mib": sum(_status_kb(p, "VmHWM") for p in pids) / 1024,
        "pss_mib": sum(_pss_kb(p) for p in pids) / 1024,
        "cpu_s": sum(_cpu_s(p) for p in pids),
        "processes": len(pids),
    }


def disk(path: Path) -> dict[str, float]:
    """Allocated and apparent bytes under ``path`` (MiB)."""
    allocated = apparent = 0
    for p in path.rglob("*"):
        try:
            st = p.lstat()
        except OSError:
            continue
        if p.is_file():
            allocated += st.st_blocks * 512
            apparent += st.st_size
    return {"allocated_mib": allocated / 2**20, "apparent_mib": apparent / 2**20}


def machine() -> dict[str, Any]:
    mem = {line.split(":")[0]: int(line.split()[1]) for line in
           Path("/proc/meminfo").read_text().splitlines() if ":" in line}
    return {"cpus": os.cpu_count(), "mem_total_gib": round(mem["MemTotal"] / 2**20, 1),
            "loadavg": os.getloadavg(), "kernel": platform.release(),
            "java": subprocess.run(["java", "-version"], capture_output=True, text=True,
                                   check=False).stderr.splitlines()[0]}


class Peak:
    """Samples processes every ``every`` s in the background, keeping each one's highest PSS
    and RSS (VmHWM already keeps the peak RSS of a live process)."""

    def __init__(self, pids: dict[str, int], every: float = 0.5) -> None:
        self.pids = pids
        self.every = every
        self.peak: dict[str, dict[str, float]] = {}
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            for name, pid in self.pids.items():
                s = sample(pid)
                top = self.peak.setdefault(name, {"rss_mib": 0.0, "pss_mib": 0.0})
                top["rss_mib"] = max(top["rss_mib"], s["rss_mib"])
                top["pss_mib"] = max(top["pss_mib"], s["pss_mib"])
            await asyncio.sleep(self.every)

    def __enter__(self) -> Peak:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


# ------------------------------------------------------------------------------ run
def _fx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*fx_command(), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, check=False)


def _count(log: Any, key: str) -> int:
    return sum(1 for o in (decode(r.value) for r in log["out"])
               if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
               and key in o.body.data)


async def main(files: int, heap: str, seed: int, with_mirror: bool) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="fx-edge-"))
    store = work / "models"
    proc = _fx("models", "import", "magika", "--store", str(store))
    if proc.returncode:
        raise SystemExit(proc.stderr)
    model_hash = next(m["hash"] for m in json.loads(
        _fx("models", "list", "--store", str(store), "--json").stdout)
        if m["interface"] == "magika")
    result: dict[str, Any] = {"files": files, "broker_heap": heap, "machine_before": machine(),
                              "command": " ".join(["bench/edge_footprint.py", "--files",
                                                   str(files), "--heap", heap]
                                                  + (["--mirror"] if with_mirror else []))}
    site = LocalKafka(data_dir=work / "site", heap=heap, die_with_parent=True)
    fleet = LocalKafka(data_dir=work / "fleet", die_with_parent=True) if with_mirror else None
    mirror: Mirror | None = None
    await site.astart(timeout=180)
    try:
        broker_pid = site.status().pid
        assert broker_pid is not None
        await asyncio.sleep(5)
        result["idle_broker"] = sample(broker_pid)
        result["idle_broker_disk"] = disk(site.log_dir)
        wid = f"edge-{int(time.time()) % 10**6}"
        data = corpus(files, seed=seed)
        result["input_bytes"] = sum(len(d) for d in data)
        async with gate_processes(site.bootstrap, wid, store, model_hash, work,
                                  node_id="edge-node-1", group_prefix=f"fx-edge-{wid}",
                                  holder_id="edge-holder", snapshot_every=50
                                  ) as (h, executor, holder):
            # warm: one file through the whole loop (magika loaded, holder claimed)
            await h.send_input(data[0], source="upload")
            while _count(await h.read_log(), "gate") < 1:
                if executor.poll() is not None:
                    raise SystemExit((work / "executor.log").read_text()[-3000:])
                await asyncio.sleep(0.5)
            pids = {"broker": broker_pid, "executor": executor.pid, "holder": holder.pid}
            if with_mirror:
                assert fleet is not None
                await fleet.astart(timeout=180)
                mirror = Mirror(site.bootstrap, fleet.bootstrap, state_dir=work / "mirror",
                                workloads=[wid], die_with_parent=True)
                await mirror.astart(timeout=300)
                mpid = mirror.pid()
                assert mpid is not None
                pids["mirror"] = mpid
            result["warm"] = {name: sample(pid) for name, pid in pids.items()}
            t0 = time.monotonic()
            with Peak(pids) as peak:
                for d in data[1:]:
                    await h.send_input(d, source="upload")
                while True:
                    log = await h.read_log()
                    if _count(log, "gate") >= files:
                        break
                    if executor.poll() is not None or time.monotonic() - t0 > 1200:
                        raise SystemExit((work / "executor.log").read_text()[-3000:])
                    await asyncio.sleep(1)
                took = time.monotonic() - t0
                if mirror is not None:
                    await mirror.wait_caught_up(timeout=300)
                await asyncio.sleep(2)
                end = {name: sample(pid) for name, pid in pids.items()}
            result["run_s"] = round(took, 1)
            result["decisions"] = _count(log, "decision")
            result["end"] = end
            result["peak_sampled"] = peak.peak
            result["cpu_s_during_run"] = {n: round(end[n]["cpu_s"] - result["warm"][n]["cpu_s"],
                                                   2) for n in pids}
            result["records"] = {s: len(log[s]) for s in ("in", "out", "resp", "merge")}
            h.stop(holder)
            h.stop(executor)
        result["broker_disk"] = disk(site.log_dir)
        result["model_store"] = disk(store)
        result["machine_after"] = machine()
    finally:
        if mirror is not None:
            await mirror.astop()
        await site.astop()
        if fleet is not None:
            await fleet.astop()
    return result


def table(r: dict[str, Any]) -> str:
    rows = ["| process | RSS warm | RSS end | peak RSS | peak PSS | CPU s over the run |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, end in r["end"].items():
        rows.append(f"| {name} | {r['warm'][name]['rss_mib']:.0f} MiB | {end['rss_mib']:.0f} MiB"
                    f" | {end['peak_rss_mib']:.0f} MiB | {r['peak_sampled'][name]['pss_mib']:.0f}"
                    f" MiB | {r['cpu_s_during_run'][name]:.1f} |")
    d = r["broker_disk"]
    rows.append(f"\nidle broker: RSS {r['idle_broker']['rss_mib']:.0f} MiB, "
                f"CPU {r['idle_broker']['cpu_s']:.1f} s to start; log dir "
                f"{r['idle_broker_disk']['allocated_mib']:.1f} MiB")
    rows.append(f"after {r['files']} files ({r['input_bytes'] / 1024:.0f} KiB in, "
                f"{r['run_s']} s): log dir {d['allocated_mib']:.1f} MiB allocated "
                f"({d['apparent_mib']:.1f} MiB apparent); model store "
                f"{r['model_store']['allocated_mib']:.1f} MiB; records {r['records']}")
    return "\n".join(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--heap", default="512m", help="the site broker's JVM heap")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mirror", action="store_true",
                        help="also run fx mirror from the site to a fleet broker")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    out = asyncio.run(main(args.files, args.heap, args.seed, args.mirror))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(json.dumps(out, indent=2, sort_keys=True))
    print(table(out))
