"""Which workloads a broker holds, from its topic metadata: the one home of "is there a workload
``X`` here?" for every command that takes a workload id.

A command that reads a topic which does not exist waits out the client's request timeout (40 s)
and then raises ``KafkaTimeoutError``; a typo in a workload id must answer at once instead, with
the ids that do exist. :func:`workload_problem` decides from a list of topic names (pure);
:func:`require_workload` reads the names (a metadata request: no topic is created) and raises
:class:`UnknownWorkload` with that one line. Commands register through :func:`needs_workload`
(``fx why: no workload 'qgat-1' on this broker; known: qgate-1`` and the command's exit code).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import sys
from collections.abc import Callable, Iterable, Sequence

from broker_schema import topics
from fx_kafka.client import bootstrap_of

__all__ = ["KNOWN_SHOWN", "BrokerUnreachable", "Command", "UnknownWorkload", "check_workload",
           "list_workloads", "needs_workload", "require_workload", "topic_names", "workload_ids",
           "workload_problem"]

#: How many known workload ids a message lists before it says how many more there are.
KNOWN_SHOWN = 20


class UnknownWorkload(LookupError):
    """The named workload is not on this broker (or not all of its topics are), or the broker
    cannot be asked (:class:`BrokerUnreachable`): the message is the one line to show."""


class BrokerUnreachable(UnknownWorkload):
    """The broker did not answer the metadata request."""


def workload_ids(names: Iterable[str]) -> list[str]:
    """The workload ids among topic ``names`` (``wl.<id>.<stream>``, :func:`broker_schema.
    topics.parse`), sorted, each once. Shadow and other topics are not workloads. Pure."""
    ids: set[str] = set()
    for name in names:
        try:
            workload_id, _ = topics.parse(name)
        except ValueError:
            continue
        ids.add(workload_id)
    return sorted(ids)


def _known(ids: Sequence[str]) -> str:
    if not ids:
        return "no workload exists on this broker yet (fx workload spec ID --module M:C " \
            "writes one)"
    shown = ", ".join(ids[:KNOWN_SHOWN])
    more = f" and {len(ids) - KNOWN_SHOWN} more" if len(ids) > KNOWN_SHOWN else ""
    return f"known: {shown}{more}"


def workload_problem(workload_id: str, names: Iterable[str],
                     streams: Sequence[str] = topics.STREAMS) -> str | None:
    """Why ``workload_id`` cannot be read on a broker whose topics are ``names`` (each of
    ``streams`` must exist), or None. Pure."""
    try:
        topics.check_workload_id(workload_id)
    except ValueError as exc:
        return str(exc)
    present = set(names)
    absent = [topics.stream(workload_id, s) for s in streams
              if topics.stream(workload_id, s) not in present]
    if not absent:
        return None
    ids = workload_ids(present)
    if workload_id not in ids:
        return f"no workload {workload_id!r} on this broker; {_known(ids)}"
    return (f"workload {workload_id!r} is incomplete on this broker: no topic "
            f"{', '.join(absent)} (or this client may not describe it)")


async def topic_names(bootstrap: str) -> set[str]:
    """Every topic name the broker lists to this client (a metadata request: nothing is
    created). :class:`BrokerUnreachable` when the broker cannot be reached."""
    from aiokafka.errors import KafkaError

    from fx_kafka.client import make_consumer

    consumer = make_consumer(bootstrap, request_timeout_ms=15_000)
    client_log = logging.getLogger("aiokafka")
    level = client_log.level
    # the failure is said once, below: not also as the client's own ERROR line
    client_log.setLevel(logging.CRITICAL)
    try:
        await consumer.start()
        return set(await consumer.topics())
    except (KafkaError, OSError, TimeoutError) as exc:
        detail = str(exc)
        if not detail.startswith(type(exc).__name__):
            detail = f"{type(exc).__name__}: {detail}"
        raise BrokerUnreachable(f"cannot list the workloads on {bootstrap}: {detail}") from None
    finally:
        await consumer.stop()
        client_log.setLevel(level)


async def list_workloads(bootstrap: str) -> list[str]:
    """The ids of the workloads on the broker at ``bootstrap``, sorted."""
    return workload_ids(await topic_names(bootstrap))


async def require_workload(bootstrap: str, workload_id: str,
                           streams: Sequence[str] = topics.STREAMS) -> None:
    """Return when each of ``streams`` of ``workload_id`` exists on the broker; otherwise raise
    :class:`UnknownWorkload` saying which, with the workloads that do exist."""
    problem = workload_problem(workload_id, await topic_names(bootstrap), streams)
    if problem is not None:
        raise UnknownWorkload(problem)


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
    """The one line saying why ``workload_id`` cannot be used on ``bootstrap``, or None (for
    a command, outside an event loop)."""
    try:
        asyncio.run(require_workload(bootstrap, workload_id, streams))
    except UnknownWorkload as exc:
        return str(exc)
    return None


def needs_workload(func: Command, *, exit_code: int, attr: str = "id",
                   bootstrap: Callable[[argparse.Namespace], str] | None = None,
                   streams: Sequence[str] = topics.STREAMS,
                   waits_for_broker: bool = False) -> Command:
    """``func`` run only when the workload ``args.<attr>`` names is on the broker; otherwise
    ``<command>: <why>`` on stderr and ``exit_code``. ``bootstrap`` reads the broker address
    from the arguments (default: ``--bootstrap``, ``$FX_KAFKA_BOOTSTRAP``, the local one); when
    it raises ``SystemExit`` (no broker named) ``func`` runs and says so itself. A service that
    waits for its broker (``waits_for_broker``: ``fx workload run``) runs when the broker does
    not answer; a one-shot command says so and ends."""

    @functools.wraps(func)
    def checked(args: argparse.Namespace) -> int:
        workload_id = getattr(args, attr, None)
        if workload_id is not None:
            try:
                address = (bootstrap or (lambda a: bootstrap_of(a.bootstrap)))(args)
            except SystemExit:
                return func(args)
            try:
                asyncio.run(require_workload(address, str(workload_id), streams))
            except UnknownWorkload as exc:
                if not (waits_for_broker and isinstance(exc, BrokerUnreachable)):
                    print(f"{_command_name(args)}: {exc}", file=sys.stderr, flush=True)
                    return exit_code
        return func(args)

    return checked
