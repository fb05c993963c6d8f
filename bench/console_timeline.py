"""``fx console`` on a long log: a workload with ``--n`` (default 100,000) records on its ``.in``,
the console's timeline pages fetched through its ASGI app (in this process, no socket).

    .venv/bin/python bench/console_timeline.py [--bootstrap HOST:PORT] [--n 100000] [--json]

Measures: the first request (the console reads the log once and builds its index), then pages
anywhere in the log (first, middle, last, a filtered one, a shared link to one record), then a
request after more records were appended (only they are read). Without ``--bootstrap`` a local
broker is started for the run (fx_kafka.testing). Bounded: it stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from broker_schema import InlineBody, InputRecord, encode, topics
from console.app import create_app
from fx_kafka.client import make_producer
from fx_kafka.workload import ensure_workload_topics


async def _fill(bootstrap: str, wid: str, n: int, start: int = 0) -> float:
    producer = make_producer(bootstrap, max_batch_size=1 << 20, linger_ms=5)
    await producer.start()
    t0 = time.perf_counter()
    try:
        futures = []
        for i in range(start, start + n):
            rec = InputRecord(workload_id=wid, source=f"sensor-{i % 7}",
                              body=InlineBody(encoding="json", data={"i": i, "v": i * 3 % 101}))
            futures.append(await producer.send(topics.inputs(wid), encode(rec), partition=0))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.perf_counter() - t0


async def _get(client: httpx.AsyncClient, url: str) -> float:
    t0 = time.perf_counter()
    r = await client.get(url)
    took = time.perf_counter() - t0
    if r.status_code != 200:
        raise RuntimeError(f"GET {url}: {r.status_code} {r.text[-300:]}")
    return took


async def run(bootstrap: str, n: int) -> dict[str, Any]:
    wid = f"bench-console-{uuid.uuid4().hex[:8]}"
    await ensure_workload_topics(bootstrap, wid)
    fill_s = await _fill(bootstrap, wid, n)
    app = create_app(bootstrap, refresh_s=0.0)
    transport = httpx.ASGITransport(app=app)
    out: dict[str, Any] = {"records": n, "fill_s": round(fill_s, 2),
                           "load": os.getloadavg(), "cpus": os.cpu_count()}
    async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
        out["first_request_s"] = round(await _get(client, f"/w/{wid}?page=0"), 3)
        pages = {
            "first": f"/w/{wid}?page=0",
            "middle": f"/w/{wid}?page={n // 200}",
            "last": f"/w/{wid}",
            "offset range": f"/w/{wid}?stream=in&from={n // 2}&to={n // 2 + 99}",
            "shared link": f"/w/{wid}?stream=in&at={n - 17}",
            "filtered (kind=input)": f"/w/{wid}?kind=input&page=3",
            "record": f"/w/{wid}/r/in/{n // 3}",
        }
        timings: dict[str, float] = {}
        for name, url in pages.items():
            samples = [await _get(client, url) for _ in range(5)]
            timings[name] = round(statistics.median(samples) * 1000, 1)
        out["page_ms_median_of_5"] = timings
        await _fill(bootstrap, wid, 1000, start=n)
        out["after_1000_more_s"] = round(await _get(client, f"/w/{wid}"), 3)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.bootstrap:
        result = asyncio.run(run(args.bootstrap, args.n))
    else:
        from fx_kafka.testing import kafka_for_tests

        with kafka_for_tests() as bootstrap:
            result = asyncio.run(run(bootstrap, args.n))
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
