"""A command's workload id checked before it reads anything: one clear line, at once.

Every ``fx`` command that takes a workload id is registered through :func:`needs_workload`,
which asks the broker's topic metadata (:func:`fx_kafka.workloads.require_workload`) whether
the workload is there. A typo answers ``fx why: no workload 'qgat-1' on this broker; known:
qgate-1`` and the command's exit code, instead of waiting out a read of a topic that does not
exist (40 s, then ``KafkaTimeoutError``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from collections.abc import Callable, Sequence

from broker_schema import topics
from fx_kafka.client import bootstrap_of
from fx_kafka.workloads import UnknownWorkload, require_workload

__all__ = ["Command", "check_workload", "needs_workload"]

Command = Callable[[argparse.Namespace], int]


def _command_name(args: argparse.Namespace) -> str:
    words = [str(args.command)]
    for attr in ("workload_cmd", "chunk_cmd"):
        sub = getattr(args, attr, None)
        if sub:
            words.append(str(sub))
    return "fx " + " ".join(words)


def check_workload(bootstrap: str, workload_id: str, *,
                   streams: Sequence[str] = topics.STREAMS) -> str | None:
    """The one line saying why ``workload_id`` cannot be used on ``bootstrap``, or None."""
    try:
        asyncio.run(require_workload(bootstrap, workload_id, streams))
    except UnknownWorkload as exc:
        return str(exc)
    return None


def needs_workload(func: Command, *, exit_code: int, attr: str = "id",
                   bootstrap: Callable[[argparse.Namespace], str] | None = None,
                   streams: Sequence[str] = topics.STREAMS) -> Command:
    """``func`` run only when the workload ``args.<attr>`` names is on the broker; otherwise
    ``<command>: <why>`` on stderr and ``exit_code``. ``bootstrap`` reads the broker address
    from the arguments (default: ``--bootstrap``, ``$FX_KAFKA_BOOTSTRAP``, the local one)."""

    @functools.wraps(func)
    def checked(args: argparse.Namespace) -> int:
        workload_id = getattr(args, attr, None)
        if workload_id is not None:
            try:
                address = (bootstrap or (lambda a: bootstrap_of(a.bootstrap)))(args)
            except SystemExit:  # no broker named: the command says so itself
                return func(args)
            problem = check_workload(address, str(workload_id), streams=streams)
            if problem is not None:
                print(f"{_command_name(args)}: {problem}", file=sys.stderr, flush=True)
                return exit_code
        return func(args)

    return checked
