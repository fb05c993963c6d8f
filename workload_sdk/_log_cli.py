"""``fx log ID``: list, filter and follow a workload's decisions and records (the thin shell).

It reads the workload's streams (committed records), makes and joins their rows
(:mod:`workload_sdk.log_rows`), keeps those the query keeps (:mod:`workload_sdk._log_query`,
pure) and prints them as a table or JSON lines. ``--follow`` then waits for new records on every
stream and prints each batch's rows as they commit, until Ctrl-C or SIGTERM (exit 0).

Exit codes: 0 done (or stopped); 2 a filter it does not know; 4 no such workload (answered at
once, :func:`fx_kafka.workloads.needs_workload`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterable

from aiokafka import TopicPartition

from broker_schema import SpecRecord, topics
from fx_kafka.client import make_consumer
from fx_kafka.workload_log import LogGap, LogRecord, WorkloadLog, read_topic
from fx_kafka.workloads import needs_workload
from workload_sdk._log_query import (
    LogQuery,
    QueryError,
    bound_models,
    log_records,
    parse_query,
    record_fields,
    render_row,
    row_json,
    rows_of,
    table_header,
    with_model_names,
)
from workload_sdk.log_rows import KINDS, OUTCOMES, STREAM_ORDER, LogIndex

__all__ = ["register"]

EXIT_USAGE = 2
EXIT_NO_WORKLOAD = 4
#: How long one ``--follow`` poll waits for new records (ms).
FOLLOW_POLL_MS = 500


def _bootstrap(args: argparse.Namespace) -> str:
    value = args.bootstrap or os.environ.get("FX_KAFKA_BOOTSTRAP")
    if not value:
        raise SystemExit("no broker: pass --bootstrap HOST:PORT or set FX_KAFKA_BOOTSTRAP")
    return str(value)


class _Printer:
    """Prints the rows a query keeps, as a table (header once) or JSON lines."""

    def __init__(self, workload_id: str, query: LogQuery, as_json: bool) -> None:
        self.workload_id = workload_id
        self.query = query
        self.as_json = as_json
        self.headed = False
        self.printed = 0

    def keep(self, records: Iterable[tuple[str, LogRecord]], index: LogIndex) -> list[str]:
        """The lines of the rows of ``records`` that the query keeps, in timeline order."""
        records = list(records)
        values = {(stream, rec.offset): rec.value for stream, rec in records}
        lines = []
        for row in rows_of(records, index):
            record = (record_fields(values[(row.stream, row.offset)])
                      if self.query.reads_records else None)
            if not self.query.matches(row, record):
                continue
            if self.as_json:
                lines.append(json.dumps(row_json(self.workload_id, row), sort_keys=True))
            else:
                lines.append(render_row(row, self.workload_id))
        return lines

    def emit(self, lines: list[str]) -> None:
        if not self.as_json and not self.headed:
            print(table_header())
            self.headed = True
        for line in lines:
            print(line)
        self.printed += len(lines)
        sys.stdout.flush()


async def _read(bootstrap: str, workload_id: str) -> WorkloadLog:
    log = WorkloadLog.empty(workload_id)
    views = await asyncio.gather(*(read_topic(bootstrap, topics.stream(workload_id, s))
                                   for s in topics.STREAMS))
    log.views = dict(zip(topics.STREAMS, views, strict=True))
    return log


async def _follow(bootstrap: str, log: WorkloadLog, printer: _Printer, index: LogIndex,
                  stop: asyncio.Event) -> None:
    """Print the rows of records committed after ``log`` was read, until ``stop``."""
    by_topic = {topics.stream(log.workload_id, s): s for s in topics.STREAMS}
    consumer = make_consumer(bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(t, 0) for t in by_topic]
        consumer.assign(parts)
        for tp in parts:
            consumer.seek(tp, log[by_topic[tp.topic]].end)
        while not stop.is_set():
            fetch = asyncio.ensure_future(consumer.getmany(timeout_ms=FOLLOW_POLL_MS))
            halt = asyncio.ensure_future(stop.wait())
            await asyncio.wait({fetch, halt}, return_when=asyncio.FIRST_COMPLETED)
            if not fetch.done():
                fetch.cancel()
                halt.cancel()
                break
            halt.cancel()
            batch = fetch.result()
            records = [(by_topic[tp.topic], LogRecord(m.offset, m.timestamp, m.value or b""))
                       for tp, messages in batch.items() for m in messages]
            if records:
                printer.emit(printer.keep(records, index))
    finally:
        await consumer.stop()


def _log(args: argparse.Namespace) -> int:
    try:
        query = parse_query(streams=args.stream or (), kinds=args.kind or (),
                            outcomes=args.outcome or (), models=args.model or (),
                            effects=args.effect or (), fields=args.where or (),
                            lo=args.lo, hi=args.hi, decisions=args.decisions)
    except QueryError as exc:
        print(f"fx log: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    if args.last is not None and args.last < 1:
        print(f"fx log: --last takes a count of rows (1 or more), not {args.last}",
              file=sys.stderr, flush=True)
        return EXIT_USAGE
    bootstrap = _bootstrap(args)
    printer = _Printer(args.id, query, args.json)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log = await _read(bootstrap, args.id)
        specs = [r for r in (rec.decode(log["spec"].topic) for rec in log["spec"]
                             if _decodes(rec)) if isinstance(r, SpecRecord)]
        printer.query = with_model_names(query, bound_models(specs))
        index = LogIndex()
        lines = printer.keep(log_records(log), index)
        printer.emit(lines if args.last is None else lines[-args.last:])
        if args.follow and not stop.is_set():
            await _follow(bootstrap, log, printer, index, stop)
        return 0

    try:
        return asyncio.run(main())
    except QueryError as exc:
        print(f"fx log: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE


def _decodes(rec: LogRecord) -> bool:
    try:
        rec.decode()
    except LogGap:
        return False
    return True


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx log``."""
    lg = subparsers.add_parser(
        "log", help="list, filter and follow a workload's decisions and records (each row with "
        "the offset fx why takes)",
        description="List a workload's records in timeline order (broker append time), one row "
        "each, with the .out offset `fx why ID --output N` takes to explain it (column why). "
        "Filters combine (AND); a repeated option is any of its values (OR).")
    lg.add_argument("id", help="workload id")
    lg.add_argument("--where", action="append", metavar="FIELD=VALUE",
                    help="keep rows whose column (kind, outcome, seq, epoch, who, why...) or "
                    "record field (a dotted path: params.set_point, header.epoch, source, "
                    "reason) equals VALUE (read as JSON, else as text; repeatable)")
    lg.add_argument("--stream", action="append", metavar="STREAM",
                    help=f"only this stream (repeatable): {', '.join(STREAM_ORDER)}")
    lg.add_argument("--kind", action="append", metavar="KIND",
                    help=f"only this record kind (repeatable): {', '.join(KINDS)}")
    lg.add_argument("--decisions", action="store_true",
                    help="only what the holder decided: requests and outputs on .out, the "
                    "merge order's deliveries and pass-overs")
    lg.add_argument("--outcome", action="append", metavar="OUTCOME",
                    help=f"only this outcome (repeatable): {', '.join(OUTCOMES)}")
    lg.add_argument("--model", action="append", metavar="MODEL",
                    help="only effects of this model: a sha256: hash (as the request named it "
                    "or the response answered), or a name the workload's specs bind (every "
                    "hash bound to it) (repeatable)")
    lg.add_argument("--effect", action="append", metavar="EFFECT_ID",
                    help="only the records of this effect (repeatable)")
    lg.add_argument("--from", dest="lo", type=int, metavar="OFFSET",
                    help="only offsets at or above this (on each stream listed)")
    lg.add_argument("--to", dest="hi", type=int, metavar="OFFSET",
                    help="only offsets at or below this")
    lg.add_argument("--last", type=int, metavar="N", help="only the last N rows listed (before "
                    "--follow)")
    lg.add_argument("--follow", "-f", action="store_true",
                    help="then print new rows as they commit, until Ctrl-C or SIGTERM")
    lg.add_argument("--json", action="store_true",
                    help="JSON lines (one object per row, with why_command) instead of a table")
    lg.add_argument("--bootstrap", help="HOST:PORT (default: $FX_KAFKA_BOOTSTRAP)")
    lg.set_defaults(func=needs_workload(_log, exit_code=EXIT_NO_WORKLOAD, bootstrap=_bootstrap))
