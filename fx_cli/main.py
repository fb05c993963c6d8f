"""Entry point of the ``fx`` command.

Each package contributes its subcommands through a ``register(subparsers)`` function; a package
whose optional dependencies are missing simply contributes nothing, and says so under ``fx -v``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from fx_kafka.cli_errors import run_command
from fx_kafka.logs import quiet_client_logs

#: Modules with a ``register(subparsers)`` function, in help order.
_COMMAND_MODULES = (
    "fx_cli.schema",
    "fx_kafka.cli",
    "fx_kafka.mirror",
    "fx_kafka.acl",
    "fx_kafka.keys",
    "executor.cli",
    "actuator.cli",
    "workload_sdk.cli",
    "console.cli",
)


def build_parser() -> argparse.ArgumentParser:
    """The full ``fx`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="fx", description="ninelives-fx: replayable, verifiable inference over a Kafka log"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that part of the project is not there (yet)
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``fx`` with ``argv`` (default: ``sys.argv[1:]``) and return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:  # the Kafka client's INFO lines are not for a user (fx -v shows them)
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
    quiet_client_logs()  # a broker outage: one line per kind per 10 s, not thousands
    return run_command(args.func, args, verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
