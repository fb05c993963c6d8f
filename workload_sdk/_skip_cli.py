"""``fx workload skip ID --input N --reason TEXT``: an operator skips one input by hand.

The command writes a :class:`~broker_schema.SkipOrderRecord` to ``wl.<id>.spec`` (the operator's
topic; the holder reads it: :mod:`workload_sdk._holder_skips`) naming the input, the reason and
who ordered it: the SASL user on a secured broker (the principal the broker authenticated), else
``--by`` or ``user@host``. The lease holder records the skip when it reaches the input (a
``quarantined`` merge entry with ``skip.cause = "operator"``, and a ``skip_alarm``), also while it
is waiting for a reference that input names, and a holder started later reads the order on
resume. Refused at once: an input not on ``.in`` yet, and one the merge log shows merged already.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import socket
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from aiokafka import TopicPartition

from broker_schema import DecodeError, MergeEntry, SkipOrderRecord, decode, encode, topics
from fx_kafka.client import make_consumer, make_producer
from fx_kafka.security import ClientSecurity
from fx_kafka.workloads import needs_workload

__all__ = ["register"]

#: How far back from the end of ``.merge`` the command looks for the last input merged.
MERGE_TAIL = 1_000


def principal_of(by: str | None) -> str:
    """Who orders: the SASL user on a secured broker, else ``by``, else ``user@host``."""
    security = ClientSecurity.from_env()
    if security.sasl and security.username:
        return security.username
    return by or f"{getpass.getuser()}@{socket.gethostname()}"


async def _last_merged_input(consumer: Any, workload_id: str) -> int | None:
    """The ``.in`` offset of the latest input in the last :data:`MERGE_TAIL` records of
    ``.merge`` (inputs are merged in order), or None when there is none there."""
    tp = TopicPartition(topics.merge(workload_id), 0)
    consumer.assign([tp])
    begin = (await consumer.beginning_offsets([tp]))[tp]
    end = (await consumer.end_offsets([tp]))[tp]
    if end <= begin:
        return None
    consumer.seek(tp, max(begin, end - MERGE_TAIL))
    last: int | None = None
    position = max(begin, end - MERGE_TAIL)
    while position < end:
        batch = await consumer.getmany(tp, timeout_ms=2000)
        msgs = batch.get(tp, [])
        if not msgs:
            break
        for msg in msgs:
            position = msg.offset + 1
            try:
                record = decode(msg.value)
            except DecodeError:
                continue
            if isinstance(record, MergeEntry) and record.source == "in":
                last = max(last or 0, record.source_offset)
    return last


async def write_order(bootstrap: str, workload_id: str, input_offset: int, reason: str,
                      principal: str) -> tuple[int | None, str]:
    """Write the order; ``(offset on .spec, message)``, the offset None when it was refused."""
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        tp_in = TopicPartition(topics.inputs(workload_id), 0)
        end = (await consumer.end_offsets([tp_in]))[tp_in]
        if input_offset >= end:
            return None, (f"no input {input_offset} on {topics.inputs(workload_id)} (its next "
                          f"offset is {end})")
        last = await _last_merged_input(consumer, workload_id)
    finally:
        await consumer.stop()
    if last is not None and input_offset <= last:
        return None, (f"input {input_offset} was merged already ({topics.merge(workload_id)} "
                      f"has inputs up to {last}): a skip changes nothing after the fact")
    order = SkipOrderRecord(workload_id=workload_id, input_offset=input_offset, reason=reason,
                            principal=principal, ordered_us=time.time_ns() // 1000)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topics.spec(workload_id), value=encode(order),
                                            partition=0)
    finally:
        await producer.stop()
    return int(meta.offset), (
        f"skip order written to {topics.spec(workload_id)}@{meta.offset}: the holder skips "
        f"input {input_offset} on the record when it reaches it (ordered by {principal}); "
        "the skip raises an alarm: fx alarms")


def _skip(args: argparse.Namespace, *, bootstrap: Callable[[argparse.Namespace], str],
          refused: int) -> int:
    reason = args.reason.strip()
    if args.input < 0:
        print("fx workload skip: --input is an offset on wl.<id>.in (0 or more)",
              file=sys.stderr)
        return refused
    if not reason:
        print("fx workload skip: --reason must say why (it is recorded)", file=sys.stderr)
        return refused
    offset, message = asyncio.run(write_order(bootstrap(args), args.id, args.input,
                                              reason[:4096], principal_of(args.by)))
    if offset is None:
        print(f"fx workload skip: {message}", file=sys.stderr)
        return refused
    print(message)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             bootstrap_arg: Callable[[argparse.ArgumentParser], None],
             bootstrap: Callable[[argparse.Namespace], str], refused: int) -> None:
    """Add ``fx workload skip`` to the ``fx workload`` subcommands: ``bootstrap_arg`` adds the
    broker option, ``bootstrap`` reads it, ``refused`` is the exit code of a refusal."""

    skip = sub.add_parser("skip", help="skip one input on the record (an operator's order: "
                          "the holder records it, with who and why, and raises an alarm)")
    skip.add_argument("id", help="workload id")
    skip.add_argument("--input", type=int, required=True, metavar="N",
                      help="the input's offset on wl.<id>.in")
    skip.add_argument("--reason", required=True, help="why (recorded with the skip)")
    skip.add_argument("--by", metavar="NAME",
                      help="who orders it (default user@host; on a secured broker always the "
                      "SASL user)")
    bootstrap_arg(skip)
    skip.set_defaults(func=needs_workload(partial(_skip, bootstrap=bootstrap, refused=refused),
                                          exit_code=refused, bootstrap=bootstrap))
