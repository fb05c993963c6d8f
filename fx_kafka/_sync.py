"""Run a coroutine from sync code without touching the caller's event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


def run_sync(factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run a coroutine to completion on a private loop in a worker thread, so a sync caller never
    touches (or replaces) the caller's own event loop."""
    result: list[_T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(factory()))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="fx-kafka-ready", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
