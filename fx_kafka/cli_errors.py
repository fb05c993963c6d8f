"""The last guard of every ``fx`` command: a mistake reaches the user as one line, never as a
traceback.

Commands say their own errors (a typed error, a message, an exit code: docs/operations.md,
"Mistakes and what they print"). What slips past them still ends in one line on stderr:
a record the user's arguments made invalid (a pydantic ``ValidationError``: its first error),
a file or module that cannot be read (``OSError``, ``ImportError``), a broker that does not
answer (a ``KafkaError``), and, as :data:`EXIT_INTERNAL`, anything else, with the hint that
``fx -v`` shows the traceback (as it does for all of these).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

__all__ = ["EXIT_INTERNAL", "EXIT_USAGE", "one_line", "run_command"]

#: A mistake in what the command was given (arguments, files, modules, the broker address).
EXIT_USAGE = 2
#: Something the command did not expect: a bug to report (``fx -v`` shows the traceback).
EXIT_INTERNAL = 70


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: a ``ValidationError``'s first error (where and what), else the
    exception's type and its message's first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":
        try:
            first = errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            msg = str(first.get("msg", exc))
            head = f"invalid {getattr(exc, 'title', 'record')}"
            return f"{head}: {where + ': ' if where else ''}{msg}"
        except (IndexError, TypeError, KeyError):
            pass
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _name(args: argparse.Namespace) -> str:
    words = [str(getattr(args, "command", "") or "")]
    for attr in ("workload_cmd", "chunk_cmd", "models_cmd", "ledger_cmd"):
        sub = getattr(args, attr, None)
        if isinstance(sub, str):
            words.append(sub)
    return "fx " + " ".join(w for w in words if w)


def run_command(func: Callable[[argparse.Namespace], int], args: argparse.Namespace, *,
                verbose: bool = False) -> int:
    """``func(args)``'s exit code; ``130`` on Ctrl-C; a mistake that escaped the command said in
    one line (:func:`one_line`) with :data:`EXIT_USAGE` or :data:`EXIT_INTERNAL`. With
    ``verbose`` the exception propagates (its traceback is wanted)."""
    from aiokafka.errors import KafkaError
    from pydantic import ValidationError

    try:
        return int(func(args))
    except KeyboardInterrupt:
        return 130
    except (ValidationError, OSError, ImportError, KafkaError, TimeoutError) as exc:
        if verbose:
            raise
        print(f"{_name(args)}: {one_line(exc)}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Exception as exc:
        if verbose:
            raise
        print(f"{_name(args)}: {one_line(exc)} (an unexpected error: fx -v shows the "
              "traceback)", file=sys.stderr, flush=True)
        return EXIT_INTERNAL
