"""The follow-up commands the tools print (``fx why``'s replay hint, a trimmed log's hint,
``fx shadow``'s ``show_again``, the console's shadow reports), spelled once, so each prints a
command that runs. Pure.

A command that folds needs the workload's code (``--module MODULE:Class``); where the printer
does not know the import path (it knows only the spec's module hash) it prints
:data:`MODULE_PLACEHOLDER` for the user to fill in with the code that hashes to it.
tests/integration/workload_sdk/test_mistakes.py runs every one of them.
"""

from __future__ import annotations

__all__ = ["MODULE_PLACEHOLDER", "replay_command", "show_command", "skip_command"]

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


def skip_command(workload_id: str, input_offset: int) -> str:
    """``fx workload skip`` of input ``input_offset``, the reason for the operator to write."""
    return f"fx workload skip {workload_id} --input {input_offset} --reason 'REASON'"
