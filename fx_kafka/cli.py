"""``fx broker start|stop|status|reset``: a local Apache Kafka for the demo and for development.

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

__all__ = ["DEFAULT_DATA_DIR", "cmd_reset", "cmd_start", "cmd_status", "cmd_stop", "register"]

DEFAULT_DATA_DIR = Path(".fx") / "broker"
#: status exit code when no broker runs (as LSB init scripts and systemctl do).
EXIT_STOPPED = 3


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``broker`` command (``start``, ``stop``, ``status``, ``reset``) to ``subparsers``."""
    broker = subparsers.add_parser(
        "broker",
        help="run a local Apache Kafka broker or cluster (no Docker)",
        description="A local Apache Kafka (KRaft) on 127.0.0.1, fetched from Maven Central: one "
        "node, or a cluster of --nodes N. A start on an existing data dir reuses its data and "
        "ports; only `reset` deletes data.",
    )
    actions = broker.add_subparsers(dest="broker_command", metavar="{start,stop,status,reset}")
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
    start.add_argument("--heap", default=DEFAULT_HEAP, help="JVM heap per node, e.g. 512m")
    start.add_argument(
        "--nodes", type=int, default=1,
        help="KRaft nodes (controller+broker each), e.g. 3 for a replicated cluster (default 1)",
    )
    start.add_argument(
        "--secure", action="store_true",
        help="SASL/SCRAM-SHA-512 over TLS and ACLs (standard authorizer, nothing allowed "
        "without an ACL): credentials and certificates in DATA_DIR/security; a data dir "
        "formatted secured always starts secured",
    )
    start.add_argument(
        "--user", action="append", default=[], metavar="NAME",
        help="a SCRAM user to create besides admin, executor, operator, holder and producer "
        "(repeatable; e.g. one holder user per workload)",
    )
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

    reset = actions.add_parser(
        "reset", help="delete the broker's data (every topic and offset) in --data-dir"
    )
    common(reset)
    reset.add_argument("--yes", action="store_true",
                       help="do not ask (required when stdin is not a terminal)")
    reset.set_defaults(func=cmd_reset)


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
        nodes=getattr(args, "nodes", 1),
        secure=getattr(args, "secure", False),
        users=getattr(args, "user", []),
    )
    try:
        bootstrap = kafka.start(timeout=args.timeout)
    except BrokerAlreadyRunningError as exc:
        print(f"already running (pid {exc.pid})", file=sys.stderr)
        if kafka.secrets.exists():
            _print_security(kafka)
        print(exc.bootstrap)
        return 0
    except (BrokerError, ValueError) as exc:
        print(f"fx broker start: {exc}", file=sys.stderr)
        return 1
    status = kafka.status()
    where = kafka.broker_log if kafka.nodes == 1 else kafka.data_dir / "node-*" / "broker.log"
    print(
        f"started Kafka {kafka.version} ({kafka.nodes} node{'s' if kafka.nodes > 1 else ''}, "
        f"pid {status.pid}) in {kafka.last_start_seconds or 0.0:.1f} s; logs in {where}",
        file=sys.stderr,
    )
    if kafka.secure:
        _print_security(kafka)
    print(bootstrap)
    return 0


def _print_security(kafka: LocalKafka) -> None:
    """Where the credentials are, and the exports that make a shell the broker's admin."""
    sec = kafka.secrets
    env = sec.env_file("admin")
    print(f"secured: SASL_SSL + SCRAM-SHA-512, CA {sec.ca_cert}; one env file per user in "
          f"{sec.root} ({', '.join(sec.users())}). As the admin (super user):", file=sys.stderr)
    try:
        print(env.read_text().rstrip(), file=sys.stderr)
    except OSError:
        print(f"  . {env}", file=sys.stderr)
    print(f"then `fx acl apply --workload ID` writes the roles' ACLs; a service runs as its "
          f"user with e.g. `. {sec.env_file('executor')}`", file=sys.stderr)


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
        line = f"running {status.bootstrap} pid {status.pid}"
        if status.stopped:
            line += f" (nodes {','.join(map(str, status.stopped))} down)"
        print(line)
        return 0
    print("stopped")
    return EXIT_STOPPED


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def cmd_reset(args: argparse.Namespace) -> int:
    """Delete the data in ``--data-dir`` after saying what goes (asks unless ``--yes``)."""
    _setup_logging()
    kafka = LocalKafka(data_dir=args.data_dir)
    if kafka.status().running:
        print(f"fx broker reset: a broker from {kafka.data_dir} is running; "
              f"`fx broker stop --data-dir {args.data_dir}` first", file=sys.stderr)
        return 1
    state_dirs = sorted(p for p in kafka.data_dir.glob("**/kraft") if p.is_dir())
    if not state_dirs and not kafka.state_file.exists():
        print(f"nothing to reset in {kafka.data_dir}")
        return 0
    for d in state_dirs:
        topics = sorted(p.name for p in d.iterdir() if p.is_dir() and "-" in p.name)
        print(f"will delete {d} ({_size(d):,} bytes, {len(topics)} partition dirs: every topic, "
              "committed offset and transaction state), and the cluster id", file=sys.stderr)
    if not args.yes:
        if not sys.stdin.isatty():
            print("fx broker reset: pass --yes to delete without asking", file=sys.stderr)
            return 2
        if input("type 'reset' to delete: ").strip() != "reset":
            print("nothing deleted", file=sys.stderr)
            return 1
    try:
        removed = kafka.reset()
    except BrokerError as exc:
        print(f"fx broker reset: {exc}", file=sys.stderr)
        return 1
    for path in removed:
        print(f"removed {path}")
    return 0
