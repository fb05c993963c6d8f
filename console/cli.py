"""``fx console``: serve the read-only web console for one cluster."""

from __future__ import annotations

import argparse
from pathlib import Path


def _console(args: argparse.Namespace) -> int:
    import uvicorn

    from console.app import create_app
    from fx_kafka.client import bootstrap_of

    bootstrap = bootstrap_of(args.bootstrap)
    extra = list(args.allowed_host or [])
    if args.host not in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::"):
        extra.append(args.host)  # the address it listens on is a name it answers to
    app = create_app(bootstrap, store=args.store, artifact=args.artifact,
                     refresh_s=args.refresh, allowed_hosts=extra)
    print(f"fx console for {bootstrap}: http://{args.host}:{args.port}/", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx console``."""
    p = subparsers.add_parser(
        "console", help="a read-only web console: workloads, timelines, why, receipts, facts",
        description="Serve server-rendered pages over the cluster's records (read-only): every "
                    "workload, a workload's timeline, the why walk as a graph, integer-engine "
                    "receipts with a verify-on-this-machine action, executors and gateways.")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default $FX_KAFKA_BOOTSTRAP, else "
                   "127.0.0.1:9092)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                   "127.0.0.1: the console has no login; put it behind one to share it)")
    p.add_argument("--port", type=int, default=8470, help="port (default 8470)")
    p.add_argument("--allowed-host", action="append", metavar="NAME",
                   help="a host name the console answers to besides 127.0.0.1, localhost and "
                   "::1 (repeatable; a request naming any other Host is refused)")
    p.add_argument("--store", type=Path, help="model store where the verify action finds "
                   "integer artifacts by modelHash (as fx verify --store)")
    p.add_argument("--artifact", type=Path, help="an integer artifact to verify receipts with "
                   "(as fx verify --artifact)")
    p.add_argument("--refresh", type=float, default=1.0, help="read what was appended at most "
                   "this often, in seconds (default 1)")
    p.set_defaults(func=_console)
