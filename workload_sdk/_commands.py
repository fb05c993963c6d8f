"""The follow-up commands the tools print (``fx why``'s replay hint, a trimmed log's hint,
``fx shadow``'s ``show_again``, the console's shadow reports, ``fx log``'s ``fx why`` per row and
the console's timeline filters as ``fx log``), spelled once, so each prints a
command that runs. Pure.

A command that folds needs the workload's code (``--module MODULE:Class``); where the printer
does not know the import path (it knows only the spec's module hash) it prints
:data:`MODULE_PLACEHOLDER` for the user to fill in with the code that hashes to it.
tests/integration/workload_sdk/test_mistakes.py runs every one of them (``fx log``'s and its rows'
``fx why``: tests/integration/workload_sdk/test_log.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

__all__ = ["MODULE_PLACEHOLDER", "log_command", "replay_command", "show_command", "skip_command",
           "why_command"]

#: Stands for the workload's code in a printed command: ``pkg.module:Class`` or
#: ``file.py:Class`` (whatever hashes to the spec's ``module_hash``).
MODULE_PLACEHOLDER = "MODULE:Class"


def replay_command(workload_id: str, to_seq: int, module: str | None = None) -> str:
    """``fx replay`` of ``workload_id`` up to step ``to_seq``, with the code to fold with."""
    return f"fx replay {workload_id} --to {to_seq} --module {module or MODULE_PLACEHOLDER}"


def show_command(workload_id: str, eval_id: str, module: str | None = None) -> str:
    """``fx shadow show`` of evaluation ``eval_id``: with ``module``, the report recomputed
    from the records (and checked against the recorded hash); without, the recorded summary."""
    tail = f" --module {module}" if module else ""
    return f"fx shadow show {eval_id} --workload {workload_id}{tail}"


def why_command(workload_id: str, out_offset: int) -> str:
    """``fx why`` of the record at ``out_offset`` on ``.out`` (an output or a request)."""
    return f"fx why {workload_id} --output {out_offset}"


def log_command(workload_id: str, *, streams: Iterable[str] = (), kinds: Iterable[str] = (),
                outcomes: Iterable[str] = (), models: Iterable[str] = (),
                effects: Iterable[str] = (), fields: Iterable[str] = (),
                lo: int | None = None, hi: int | None = None, follow: bool = False,
                json: bool = False) -> str:
    """``fx log`` of ``workload_id`` with these filters (each repeatable option once per value,
    sorted; ``fields`` as ``--where FIELD=VALUE``; ``lo``/``hi`` the offset range): the console's
    timeline filters as a command."""
    words = ["fx", "log", workload_id]
    for option, values in (("--stream", streams), ("--kind", kinds), ("--outcome", outcomes),
                           ("--model", models), ("--effect", effects)):
        for value in sorted(values):
            words += [option, value]
    for test in sorted(fields):
        words += ["--where", test]
    if lo is not None:
        words += ["--from", str(lo)]
    if hi is not None:
        words += ["--to", str(hi)]
    if follow:
        words.append("--follow")
    if json:
        words.append("--json")
    return shlex.join(words)


def skip_command(workload_id: str, input_offset: int) -> str:
    """``fx workload skip`` of input ``input_offset``, the reason for the operator to write."""
    return f"fx workload skip {workload_id} --input {input_offset} --reason 'REASON'"
