"""Where the executor's threads run: the engine's worker threads on ``engine_cpus``, the rest of
the process (event loop, Kafka clients, every other thread) on ``loop_cpus`` (docs/executor.md,
"The engine on its own cores").

The decisions are pure (:func:`parse_cpus`, :func:`cpus_problem`, :func:`child_engine_cpus`);
:func:`pin_thread`, :func:`pin_process` and :func:`thread_cpus` are the thin Linux calls. On
Linux ``os.sched_setaffinity(0, cpus)`` sets the affinity of the calling *thread* only (a thread
is a task with its own mask), and a thread starts with its creator's mask: so the engine's
worker threads pin themselves when they start, and the rest of the process is pinned task by
task (``/proc/self/task``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["allowed_cpus", "child_engine_cpus", "cpus_problem", "format_cpus", "parse_cpus",
           "pin_process", "pin_thread", "pinning_supported", "thread_cpus"]

log = logging.getLogger("executor.service")


#: The calling thread's CPUs when this module was first imported: before this process pinned
#: any of its threads (all pinning goes through here), so what it was started with (``taskset``,
#: a container's cpuset).
_STARTED_ON: frozenset[int] | None = (frozenset(os.sched_getaffinity(0))
                                      if hasattr(os, "sched_getaffinity") else None)


def allowed_cpus() -> set[int] | None:
    """The CPUs this process may run on: ``os.sched_getaffinity(0)`` as it was before the
    process pinned anything (a second executor in a process whose threads were pinned by the
    first still sees every CPU it was started with), with the calling thread's now; None where
    the system cannot say."""
    if _STARTED_ON is None:
        return None
    return set(_STARTED_ON) | set(os.sched_getaffinity(0))


def pinning_supported() -> bool:
    """Whether this system can pin threads to CPUs (Linux: ``os.sched_setaffinity``)."""
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def parse_cpus(value: Any) -> list[int]:
    """CPU ids from a list of ints or a string in ``taskset -c`` form (``"1"``, ``"0,2-3"``;
    empty: none), sorted without duplicates. Raises ``ValueError`` (one line) on anything
    else."""
    if value is None:
        return []
    items: list[Any]
    if isinstance(value, str):
        items = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            lo, dash, hi = part.partition("-")
            try:
                if dash:
                    a, b = int(lo), int(hi)
                    if a > b:
                        raise ValueError
                    items.extend(range(a, b + 1))
                else:
                    items.append(int(part))
            except ValueError:
                raise ValueError(f"not a CPU id or range: {part!r} (write e.g. 1 or 0,2-3)"
                                 ) from None
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        raise ValueError(f"CPU ids must be a list or a string like '0,2-3', not {value!r}")
    out: set[int] = set()
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ValueError(f"a CPU id must be a whole number >= 0, not {item!r}")
        out.add(item)
    return sorted(out)


def format_cpus(cpus: Iterable[int]) -> str:
    """``cpus`` in ``taskset -c`` form (``0,2-3``)."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def cpus_problem(engine_cpus: Sequence[int], loop_cpus: Sequence[int],
                 allowed: Iterable[int] | None, *, supported: bool = True) -> str | None:
    """Why ``engine_cpus`` / ``loop_cpus`` cannot be applied in a process that may run on
    ``allowed`` (its ``os.sched_getaffinity(0)``), or None. One line, for the user."""
    if not engine_cpus and not loop_cpus:
        return None
    if not supported or allowed is None:
        return ("engine_cpus / loop_cpus need a system that can pin threads to CPUs "
                "(Linux sched_setaffinity); leave them empty here")
    allowed_set = set(allowed)
    for name, cpus in (("engine_cpus", engine_cpus), ("loop_cpus", loop_cpus)):
        outside = sorted(set(cpus) - allowed_set)
        if outside:
            return (f"{name} {format_cpus(cpus)}: CPU {format_cpus(outside)} is not one this "
                    f"process may run on ({format_cpus(allowed_set)})")
    return None


def child_engine_cpus(engine_cpus: Sequence[int], index: int) -> list[int]:
    """The engine CPUs of child ``index`` of ``--processes N``: ``engine_cpus[index mod K]``
    alone (child i's engine on the i-th listed CPU; with fewer CPUs than children they are
    shared round robin); none when ``engine_cpus`` is empty."""
    if not engine_cpus:
        return []
    return [list(engine_cpus)[index % len(engine_cpus)]]


def thread_cpus(tid: int | None = None) -> set[int]:
    """The CPUs thread ``tid`` of this process may run on (default: the calling thread), read
    from ``/proc/self/task/<tid>/status`` (``Cpus_allowed_list``)."""
    tid = threading.get_native_id() if tid is None else tid
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return set(parse_cpus(line.split(":", 1)[1].strip()))
    raise OSError(f"no Cpus_allowed_list for task {tid}")


def pin_thread(cpus: Sequence[int]) -> None:
    """Pin the calling thread (only it: Linux affinity is per thread) to ``cpus``; nothing when
    ``cpus`` is empty."""
    if cpus:
        os.sched_setaffinity(0, set(cpus))


def pin_process(cpus: Sequence[int], *, pid: int | None = None) -> int:
    """Pin every thread of process ``pid`` (default this one) to ``cpus``; threads started
    later take their creator's mask. Returns how many threads were pinned (0 when ``cpus`` is
    empty). A thread that ends meanwhile is skipped."""
    if not cpus:
        return 0
    tasks = f"/proc/{'self' if pid is None else pid}/task"
    n = 0
    for name in os.listdir(tasks):
        try:
            os.sched_setaffinity(int(name), set(cpus))
            n += 1
        except (ProcessLookupError, FileNotFoundError):
            continue
    return n
