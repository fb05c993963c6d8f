"""``fx actuator run``, ``fx actuator device`` and ``fx alarms [ack]``.

Exit codes of ``fx alarms``: 0 no open alarm (or ``--all``), 1 open alarms listed, 2 a usage or
read error. ``fx alarms ack ID``: 0 acknowledged, 2 no such alarm (or a read error).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import signal
import socket
import sys
from datetime import UTC, datetime
from typing import Any

from broker_schema import SkipAlarmRecord
from fx_kafka.client import bootstrap_of
from fx_node.settings import ConfigError

__all__ = ["register"]

log = logging.getLogger(__name__)


def _run(args: argparse.Namespace) -> int:
    from actuator.config import load_gateway_config

    try:
        config = load_gateway_config(args.config)
    except ConfigError as exc:
        print(f"fx actuator run: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config)
        return 0
    from actuator.service import GatewayService
    from fx_node.service import run_node

    return run_node("fx actuator run", config, lambda: GatewayService(config))


def _device(args: argparse.Namespace) -> int:
    from actuator.sim import SimulatedDevice

    device = SimulatedDevice(host=args.host, port=args.port, registers=args.registers,
                             unit=args.unit, initial=args.initial)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        task = asyncio.create_task(device.serve(stop))
        while device.port == 0 and not task.done():
            await asyncio.sleep(0.01)
        print(f"simulated Modbus TCP device on {args.host}:{device.port} (unit {args.unit}, "
              f"{args.registers} holding registers)", flush=True)
        seen = 0
        while not task.done():
            await asyncio.sleep(0.1)
            writes = device.writes()
            for w in writes[seen:]:
                print(f"write register {w.address} = {list(w.values)}", flush=True)
            seen = len(writes)
        await task
        return 0

    return asyncio.run(main())


def _when(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _alarms(args: argparse.Namespace) -> int:
    from actuator.alarms import read_alarms

    try:
        states = asyncio.run(read_alarms(bootstrap_of(args.bootstrap)))
    except (OSError, TimeoutError) as exc:
        print(f"fx alarms: cannot read the alarms: {exc!r}", file=sys.stderr)
        return 2
    shown = [s for s in states if args.all or s.open]
    if args.json:
        rows: list[dict[str, Any]] = [
            {"offset": s.offset, "time_ms": s.time_ms, "alarm": s.alarm.model_dump(mode="json"),
             "ack": None if s.ack is None else s.ack.model_dump(mode="json")} for s in shown]
        print(json.dumps(rows, indent=2, sort_keys=True))
    else:
        for s in shown:
            a = s.alarm
            status = ("OPEN " if s.open else
                      f"acked by {s.ack.acked_by} {_when(s.ack.acked_us)}" if s.ack else "")
            if isinstance(a, SkipAlarmRecord):
                by = f" by {a.skip.principal}" if a.skip.principal else ""
                print(f"{a.alarm_id}  input skipped ({a.skip.cause}{by})  {status}")
                print(f"    raised by {a.raised_by} at {_when(a.raised_us)}; input at "
                      f"{a.workload_id} .in@{a.input_offset}, merge position {a.seq}")
                print(f"    {a.skip.detail}")
            else:
                cause = "" if a.cause == "unknown" else f" {a.cause}"
                print(f"{a.alarm_id}  {a.effect_kind} ({a.guarantee}){cause}  {status}")
                print(f"    raised by {a.raised_by} at {_when(a.raised_us)}; request at "
                      f"{a.workload_id} .out@{a.request_offset}"
                      + (f", a reissue of {a.reissue_of}" if a.reissue_of else ""))
                print(f"    {a.reason}")
                if a.read_back is not None:
                    rb = a.read_back
                    print(f"    read back: {rb.device} register {rb.address} = "
                          f"{'unreadable' if rb.value is None else rb.value} "
                          f"(wanted {rb.wanted})")
            if s.ack is not None and s.ack.note:
                print(f"    note: {s.ack.note}")
        if not shown:
            print("no open alarms" if not args.all else "no alarms")
    return 1 if any(s.open for s in shown) else 0


def _ack(args: argparse.Namespace) -> int:
    from actuator.alarms import acknowledge, read_alarms

    bootstrap = bootstrap_of(args.bootstrap)
    states = {s.alarm.alarm_id: s for s in asyncio.run(read_alarms(bootstrap))}
    if args.alarm_id not in states:
        print(f"fx alarms ack: no alarm {args.alarm_id} on the alarms topic", file=sys.stderr)
        return 2
    by = args.by or f"{getpass.getuser()}@{socket.gethostname()}"
    offset = asyncio.run(acknowledge(bootstrap, args.alarm_id, by=by, note=args.note))
    was = "" if states[args.alarm_id].open else " (it was acknowledged before)"
    print(f"acknowledged {args.alarm_id} as {by} (sys.alarms@{offset}){was}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx actuator`` and ``fx alarms``."""
    act = subparsers.add_parser("actuator", help="the actuator gateway (Modbus TCP devices)")
    act_sub = act.add_subparsers(dest="actuator_cmd", required=True)
    run = act_sub.add_parser(
        "run", help="run a gateway (config from FILE, then FX_ACTUATOR_* variables)")
    run.add_argument("--config", help="TOML or JSON config file")
    run.add_argument("--print-config", action="store_true", help="print the config and exit")
    run.set_defaults(func=_run)
    dev = act_sub.add_parser(
        "device", help="serve a simulated valve/gate: a pymodbus Modbus TCP server")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=5020)
    dev.add_argument("--unit", type=int, default=1)
    dev.add_argument("--registers", type=int, default=16)
    dev.add_argument("--initial", type=int, default=0)
    dev.set_defaults(func=_device)

    alarms = subparsers.add_parser(
        "alarms", help="list the alarms on sys.alarms (at-most-once actuations that ended "
                       "unknown); exit 1 while any is open")
    alarms.add_argument("--bootstrap", help="Kafka bootstrap (default: $FX_KAFKA_BOOTSTRAP)")
    alarms.add_argument("--all", action="store_true", help="acknowledged ones too")
    alarms.add_argument("--json", action="store_true")
    alarms.set_defaults(func=_alarms)
    alarms_sub = alarms.add_subparsers(dest="alarms_cmd")
    ack = alarms_sub.add_parser("ack", help="acknowledge an alarm (its id is the effect id)")
    ack.add_argument("alarm_id")
    ack.add_argument("--by", help="who acknowledges it (default: user@host)")
    ack.add_argument("--note", default="", help="what was found and done")
    ack.add_argument("--bootstrap", help="Kafka bootstrap (default: $FX_KAFKA_BOOTSTRAP)")
    ack.set_defaults(func=_ack)
