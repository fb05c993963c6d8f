"""``fx shadow``: evaluate another model on a workload's recorded or live requests.

::

    fx shadow ID --module M:C --model NAME=HASH [--from SEQ] [--to SEQ]   # over history
    fx shadow ID --module M:C --model NAME=HASH --live --window 10m      # over live traffic
    fx shadow ID --module NEW.py:C [--model NAME=HASH] [--from SEQ]       # a module change
    fx shadow show EVAL_ID --module M:C [--workload ID]                  # the report again
    fx shadow show EVAL_ID [--workload ID]                               # the recorded summary

Exit codes: 0 the evaluation ran (or was shown) and no decision differs; 1 it ran and decisions
differ (or requests diverged); 2 it cannot run as asked (the message says why); 3 a record it
needs is trimmed, missing or undecodable; 4 (``show``) the report recomputed from the records
does not match the recorded ``report_hash``; 5 it stopped at a redacted input (``Redacted``:
``fx redact``), as ``fx replay`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

from fx_kafka.client import bootstrap_of
from fx_kafka.workload_log import LogGap, Redacted
from fx_kafka.workloads import check_workload
from workload_sdk._code import ModuleUnavailable
from workload_sdk._commands import MODULE_PLACEHOLDER, show_command
from workload_sdk._loader import load_workload

__all__ = ["parse_duration", "register"]

EXIT_DIFFER = 1
EXIT_USAGE = 2
EXIT_GAP = 3
EXIT_NOT_REPRODUCED = 4
EXIT_REDACTED = 5

_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``90``, ``90s``, ``500ms``, ``10m``, ``1.5h``. ``ValueError``
    otherwise."""
    match = _DURATION_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a duration: {text!r} (say 90s, 10m, 1h or 500ms)")
    value = float(match[1])
    return value * {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0}[match[2]]


def _models(values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        name, sep, h = item.partition("=")
        if not sep or not name or not h:
            raise ValueError(f"--model takes NAME=sha256:HEX or NAME=MODEL@VERSION|ALIAS, got "
                             f"{item!r}")
        if name in out:
            raise ValueError(f"--model {name} given twice")
        out[name] = h
    return out


def _progress(msg: str) -> None:
    print(f"shadow: {msg}", file=sys.stderr, flush=True)


def _emit(args: argparse.Namespace, report: dict[str, Any], extra: dict[str, Any]) -> None:
    from workload_sdk._shadow_report import render_html, render_text

    if args.html:
        Path(args.html).write_text(render_html(report))
        _progress(f"wrote {args.html}")
    if args.report_json:
        Path(args.report_json).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        _progress(f"wrote {args.report_json}")
    if args.json:
        print(json.dumps({**extra, "report": report}, indent=2, sort_keys=True))
    else:
        print(render_text(report, rows=args.rows))
        for k, v in extra.items():
            print(f"{k}: {v}")


def _shadow(args: argparse.Namespace) -> int:
    from workload_sdk._shadow_io import ShadowError, run_history, run_live, show

    targets: list[str] = args.target
    is_show = len(targets) == 2 and targets[0] == "show"
    if len(targets) != 1 and not is_show:
        print("fx shadow: give a workload id (or: fx shadow show EVAL_ID)", file=sys.stderr)
        return EXIT_USAGE
    bootstrap = bootstrap_of(args.bootstrap)
    named = targets[0] if not is_show else args.workload
    if named is not None:
        problem = check_workload(bootstrap, named)
        if problem is not None:
            print(f"fx shadow: {problem}", file=sys.stderr)
            return EXIT_USAGE
    if is_show and not args.module:
        return _show_recorded(bootstrap, targets[1], args.workload, as_json=args.json)
    if not args.module:
        print("fx shadow: --module MODULE:Class is required (the workload's code, to fold "
              "with)", file=sys.stderr)
        return EXIT_USAGE
    try:
        workload = load_workload(args.module)
        if is_show:
            report, recorded, same = asyncio.run(show(bootstrap, workload, targets[1],
                                                      args.workload))
            _emit(args, report, {"reproduced": same,
                                 "recorded_report_hash": recorded.report_hash})
            if not same:
                print(f"fx shadow show: the report recomputed from the records hashes to "
                      f"{report['report_hash']}, the recorded one is {recorded.report_hash}",
                      file=sys.stderr)
                return EXIT_NOT_REPRODUCED
            return 0
        from fx_kafka.model_registry import resolve_refs

        rebind, names = asyncio.run(resolve_refs(bootstrap, _models(args.model)))
        if args.live:
            if args.window is None:
                raise ValueError("--live needs --window DURATION")
            if args.from_seq is not None or args.to_seq is not None:
                raise ValueError("--from/--to are for history; --live shadows what comes next")
            report, record = asyncio.run(run_live(
                bootstrap, workload, targets[0], rebind, names=names,
                window_s=parse_duration(args.window),
                eval_id=args.eval_id, deadline_ms=args.deadline_ms,
                outstanding=args.outstanding, timeout_s=args.timeout_s, progress=_progress))
        else:
            if args.window is not None:
                raise ValueError("--window is for --live")
            report, record = asyncio.run(run_history(
                bootstrap, workload, targets[0], rebind, names=names, from_seq=args.from_seq,
                to_seq=args.to_seq, eval_id=args.eval_id, deadline_ms=args.deadline_ms,
                outstanding=args.outstanding, timeout_s=args.timeout_s, progress=_progress))
    except (ShadowError, ModuleUnavailable, ValueError, ImportError, AttributeError,
            TypeError) as exc:
        print(f"fx shadow: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Redacted as exc:
        print(f"fx shadow: stopped at a redacted input: {exc}", file=sys.stderr)
        return EXIT_REDACTED
    except LogGap as exc:
        print(f"fx shadow: stopped: {exc}", file=sys.stderr)
        return EXIT_GAP
    _emit(args, report, {"eval_id": record.eval_id,
                         "show_again": show_command(targets[0], record.eval_id, args.module)})
    differ = report["decisions_differ"] > 0 or report["requests_diverged_at"] is not None
    return EXIT_DIFFER if differ else 0


def _show_recorded(bootstrap: str, eval_id: str, workload_id: str | None, *,
                   as_json: bool) -> int:
    """``fx shadow show EVAL_ID`` without ``--module``: the recorded summary, as written."""
    from workload_sdk._shadow_io import ShadowError, find_workload
    from workload_sdk._shadow_io import _read_eval as read_eval

    try:
        wid = workload_id or asyncio.run(find_workload(bootstrap, eval_id))
        definition, recorded = asyncio.run(read_eval(bootstrap, wid, eval_id))
    except (ShadowError, ValueError) as exc:
        print(f"fx shadow show: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if definition is None or recorded is None:
        print(f"fx shadow show: evaluation {eval_id} of {wid} has no "
              f"{'definition' if definition is None else 'report'} yet", file=sys.stderr)
        return EXIT_USAGE
    summary = recorded.model_dump(mode="json", exclude={"kind", "v"})
    if as_json:
        print(json.dumps({"recorded": summary, "recomputed": False}, indent=2, sort_keys=True))
    else:
        for key, value in sorted(summary.items()):
            print(f"{key}: {value}")
    print(f"(the recorded summary; {show_command(wid, eval_id, MODULE_PLACEHOLDER)} recomputes the "
          "full report from the records with the workload's code and checks its hash)",
          file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx shadow``."""
    p = subparsers.add_parser(
        "shadow", help="evaluate another model on a workload's recorded (or live) requests, "
        "in streams of its own; fx shadow show EVAL_ID prints a report again",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="+", metavar="ID", help="workload id, or: show EVAL_ID")
    p.add_argument("--module", help="MODULE:Class: the workload's code. Code other than "
                   "the evaluated steps ran shadows a module change (with or without "
                   "--model); the steps before run the code recorded for them (the module "
                   "store). show without it prints the recorded summary")
    p.add_argument("--model", action="append", metavar="NAME=HASH",
                   help="rebind a model name for the evaluation (repeatable); HASH may be "
                   "MODEL@VERSION or MODEL@ALIAS from the registry (resolved now, recorded "
                   "with its name)")
    p.add_argument("--from", dest="from_seq", type=int, metavar="SEQ",
                   help="first step (default 0)")
    p.add_argument("--to", dest="to_seq", type=int, metavar="SEQ",
                   help="last step (default: the last one recorded)")
    p.add_argument("--live", action="store_true", help="shadow live requests instead")
    p.add_argument("--window", metavar="DURATION", help="with --live: how long (90s, 10m, 1h)")
    p.add_argument("--eval-id", help="the evaluation's id (default: NAME-HASH8-FROM-TO, or "
                   "NAME-HASH8-live-MS); the same id with the same definition resumes")
    p.add_argument("--workload", help="show: the workload (default: found by the id)")
    p.add_argument("--deadline-ms", type=int, default=300_000,
                   help="each shadow request's deadline (default 300000)")
    p.add_argument("--outstanding", type=int, default=32,
                   help="shadow requests waiting for an answer at most (default 32)")
    p.add_argument("--timeout-s", type=float, default=3600.0,
                   help="give up collecting answers after this long (default 3600)")
    p.add_argument("--html", metavar="FILE", help="also write the report as HTML with its plot")
    p.add_argument("--report-json", metavar="FILE", help="also write the full report as JSON")
    p.add_argument("--rows", type=int, default=20, help="table rows to print (default 20)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--bootstrap", help="HOST:PORT (default: $FX_KAFKA_BOOTSTRAP)")
    p.set_defaults(func=_shadow)
