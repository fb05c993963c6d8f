"""The real case of docs/model-changes.md: shadow magika standard_v3_3 behind a gate on v3_2.

Starts its own Apache Kafka broker (loopback), imports two real magika models into a model store
(``standard_v3_3`` from the installed magika 1.0.3, ``standard_v3_2`` from the magika 0.6.1 wheel
that ``make install`` downloads), runs the file-type gate example on ``standard_v3_2`` with the
project's executor and a lease holder (processes) over a corpus of small files
(:mod:`workload_sdk.examples.filetype_corpus`), then runs ``fx shadow`` with ``standard_v3_3`` over
the recorded range and ``fx shadow show`` on the result. Writes the terminal report, the HTML
page, its PNG and the full report JSON to ``--out``.

    .venv/bin/python bench/shadow_case.py --files 200 --out docs/model-changes
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from executor_setup import gate_processes

from broker_schema import OutputRecord, decode
from fx_kafka.local import LocalKafka
from workload_sdk.examples.filetype_corpus import corpus
from workload_sdk.testing import fx_command

ROOT = Path(__file__).resolve().parents[1]
MODULE = "workload_sdk.examples.filetype_gate:FiletypeGate"


def _fx(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*fx_command(), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, check=False)


def _import_models(store: Path) -> tuple[str, str]:
    wheels = sorted((Path(sys.prefix) / "model-wheels").glob("magika-0.6.1-*.whl"))
    if not wheels:
        raise SystemExit("no magika-0.6.1 wheel under .venv/model-wheels (make install)")
    for source in ("magika", str(wheels[0])):
        proc = _fx("models", "import", source, "--store", str(store))
        if proc.returncode:
            raise SystemExit(proc.stderr)
    listed = json.loads(_fx("models", "list", "--store", str(store), "--json").stdout)
    names = {m["name"]: m["hash"] for m in listed}
    return names["magika-standard_v3_2"], names["magika-standard_v3_3"]


async def main(files: int, out: Path, seed: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fx-shadow-case-"))
    store = work / "models"
    v32, v33 = _import_models(store)
    kafka = LocalKafka(data_dir=work / "kafka", die_with_parent=True)
    await kafka.astart(timeout=180)
    try:
        wid = f"gate-{int(time.time()) % 10**6}"
        data = corpus(files, seed=seed)
        async with gate_processes(kafka.bootstrap, wid, store, v32, work, node_id="gpu-node-1",
                                  group_prefix=f"fx-case-{wid}", holder_id="case-holder",
                                  snapshot_every=50) as (h, executor, holder):
            for d in data:
                await h.send_input(d, source="upload")
            t0 = time.monotonic()
            while True:
                log = await h.read_log()
                gates = sum(1 for o in (decode(r.value) for r in log["out"])
                            if isinstance(o, OutputRecord) and isinstance(o.body.data, dict)
                            and "gate" in o.body.data)
                if gates >= files:
                    break
                if executor.poll() is not None or time.monotonic() - t0 > 900:
                    raise SystemExit((work / "executor.log").read_text()[-3000:])
                await asyncio.sleep(1)
            h.stop(holder)
            print(f"workload {wid}: {files} files decided on standard_v3_2 in "
                  f"{time.monotonic() - t0:.0f} s", file=sys.stderr)
            cmd = ["shadow", wid, "--module", MODULE, "--model", f"filetype={v33}",
                   "--eval-id", "v33-vs-v32", "--html", str(out / "report.html"),
                   "--report-json", str(work / "report.json"), "--rows", "15",
                   "--bootstrap", kafka.bootstrap]
            t1 = time.monotonic()
            proc = _fx(*cmd)
            took = time.monotonic() - t1
            print(proc.stderr[-2000:], file=sys.stderr)
            if proc.returncode not in (0, 1):
                raise SystemExit(proc.stderr)
            shown = _fx("shadow", "show", "v33-vs-v32", "--module", MODULE, "--json",
                        "--bootstrap", kafka.bootstrap)
            again = json.loads(shown.stdout)
            h.stop(executor)
        text = ("$ fx shadow " + " ".join(cmd[1:]).replace(kafka.bootstrap, "127.0.0.1:9092")
                .replace(str(out), "docs/model-changes").replace(str(work), "/tmp/case")
                + f"\n(exit {proc.returncode}, {took:.0f} s)\n" + proc.stdout
                + f"\n$ fx shadow show v33-vs-v32 --module {MODULE} --json\n"
                + f"reproduced: {again['reproduced']}, report_hash "
                f"{again['report']['report_hash']}\n")
        (out / "report.txt").write_text(text)
        page = (out / "report.html").read_text()
        png = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
        assert png is not None
        (out / "report.png").write_bytes(base64.b64decode(png[1]))
        print(text)
        return 0 if again["reproduced"] else 1
    finally:
        await kafka.astop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "model-changes")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.files, args.out, args.seed)))
