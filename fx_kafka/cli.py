"""``fx broker start|stop|status``: a local Apache Kafka for the demo and for development.

``fx_cli.main`` calls :func:`register` with its subparsers; each handler is ``func(args) -> int``.
State lives in ``--data-dir`` (default ``.fx/broker`` in the current directory).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from fx_kafka.errors import BrokerAlreadyRunningError, BrokerError
from fx_kafka.local import DEFAULT_HEAP, DEFAULT_KAFKA_VERSION, LocalKafka

__all__ = ["DEFAULT_DATA_DIR", "cmd_start", "cmd_status", "cmd_stop", "register"]

DEFAULT_DATA_DIR = Path(".fx") / "broker"
#: status exit code when no broker runs (as LSB init scripts and systemctl do).
EXIT_STOPPED = 3


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``broker`` command (``start``, ``stop``, ``status``) to ``subparsers``."""
    broker = subparsers.add_parser(
        "broker",
        help="run a local Apache Kafka broker (no Docker)",
        description="A one-node Apache Kafka (KRaft) on 127.0.0.1, fetched from Maven Central.",
    )
    actions = broker.add_subparsers(dest="broker_command", metavar="{start,stop,status}")
    actions.required = True

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--data-dir",
            type=Path,
            default=DEFAULT_DATA_DIR,
            help=f"where the broker's state, logs and data live (default: {DEFAULT_DATA_DIR})",
        )

    start = actions.add_parser(
        "start", help="start in the background and print the bootstrap address"
    )
    common(start)
    start.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for ready")
    start.add_argument("--version", default=DEFAULT_KAFKA_VERSION, help="Kafka version")
    start.add_argument("--heap", default=DEFAULT_HEAP, help="JVM heap, e.g. 512m")
    start.set_defaults(func=cmd_start)

    stop = actions.add_parser("stop", help="stop the broker started from --data-dir")
    common(stop)
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds before SIGKILL")
    stop.set_defaults(func=cmd_stop)

    status = actions.add_parser(
        "status", help="print running/stopped, bootstrap and pid (exit 3 when stopped)"
    )
    common(status)
    status.set_defaults(func=cmd_status)


def _setup_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)


def cmd_start(args: argparse.Namespace) -> int:
    """Start the broker detached; print its bootstrap address alone on stdout."""
    _setup_logging()
    kafka = LocalKafka(
        data_dir=args.data_dir,
        version=getattr(args, "version", DEFAULT_KAFKA_VERSION),
        heap=getattr(args, "heap", DEFAULT_HEAP),
    )
    try:
        bootstrap = kafka.start(timeout=args.timeout)
    except BrokerAlreadyRunningError as exc:
        print(f"already running (pid {exc.pid})", file=sys.stderr)
        print(exc.bootstrap)
        return 0
    except BrokerError as exc:
        print(f"fx broker start: {exc}", file=sys.stderr)
        return 1
    print(
        f"started Kafka {kafka.version} (pid {kafka.status().pid}) in "
        f"{kafka.last_start_seconds or 0.0:.1f} s; logs in {kafka.broker_log}",
        file=sys.stderr,
    )
    print(bootstrap)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the broker by its pid; stopping one that is not running is not an error."""
    _setup_logging()
    kafka = LocalKafka(data_dir=args.data_dir)
    pid = kafka.status().pid
    if kafka.stop(timeout=args.timeout):
        print(f"stopped (pid {pid})")
    else:
        print("not running")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Print ``running <bootstrap> pid <pid>`` (exit 0) or ``stopped`` (exit 3)."""
    status = LocalKafka(data_dir=args.data_dir).status()
    if status.running:
        print(f"running {status.bootstrap} pid {status.pid}")
        return 0
    print("stopped")
    return EXIT_STOPPED
