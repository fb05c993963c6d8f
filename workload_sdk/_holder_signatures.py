"""The lease holder's signature watching: an observation of the shell, nothing merged, replayed
or simulated depends on it (``HolderConfig.check_signatures``).

:class:`SignatureWatcher` takes the responses each read of ``.resp`` brings (:meth:`queue`),
checks them in small chunks off the merge path with the rule of ``fx why``/``fx audit``
(:func:`workload_sdk._observe.check_signatures`), keeps the keys it checks against fresh
(``sys.facts``, or with fleet keys the history on ``sys.keys``, read every ``observe_every_s``
and at once when a response waits for a re-read), counts what it settled (``HolderStats``,
``fx_holder_signature*`` metrics) and logs failures at WARNING, at most one line per node and
reason every :attr:`SignatureWatcher.WARN_EVERY_S`. Its state outlives the holder's restarts
from the log: the holder makes one watcher and starts its two loops on every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from aiokafka.errors import KafkaError

from broker_schema import FactsRecord, topics
from fx_kafka.workload_log import read_facts_since
from workload_sdk._holder_config import HOLDER_LOG as log
from workload_sdk._holder_config import HolderConfig, HolderStats
from workload_sdk._signature_tally import (
    ReadResponse,
    SignatureFailure,
    SignatureTally,
    check_signatures,
    latest_keys,
)

if TYPE_CHECKING:  # the metrics are the process's (cli), never needed to run the fold
    from broker_schema.key_history import KeyHistory
    from workload_sdk._holder_metrics import HolderMetrics

__all__ = ["SignatureWatcher"]


class SignatureWatcher:
    """Checks the signatures of the responses a holder reads (see the module docstring)."""

    #: Responses checked in one go before the event loop runs something else (a few ms).
    CHUNK = 32
    #: Most responses waiting to be checked; past it new ones are left unchecked (logged).
    QUEUE_MAX = 50_000
    #: At most one WARNING a node and reason this often (the rest are counted in the next).
    WARN_EVERY_S = 10.0

    def __init__(self, config: HolderConfig, stats: HolderStats,
                 metrics: HolderMetrics | None) -> None:
        self.config = config
        self.stats = stats
        self.metrics = metrics
        #: the holder ids of the claims: whose ``timeout``/``unknown`` are unsigned by design
        self.holder_ids: set[str] = {config.holder_id}
        self._facts: list[FactsRecord] = []
        self._facts_next: int | None = None
        self._history: KeyHistory | None = None
        self._keys_read = False
        self._queue: deque[ReadResponse] = deque()
        self._queued = asyncio.Event()
        self._pending: list[ReadResponse] = []
        self._wake = asyncio.Event()
        self._said: dict[tuple[str, str], tuple[float, int]] = {}

    def note_holders(self, holder_ids: Iterable[str]) -> None:
        """Holder ids read from ``.claims`` (their ``timeout``/``unknown`` are not failures)."""
        self.holder_ids.update(holder_ids)

    def start(self, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        """Start the two loops (keys, checks) for one run of the holder; the caller cancels
        them when the run ends."""
        if self.metrics is not None:
            self.metrics.signatures_on(self.config.workload_id)
        return [asyncio.create_task(self._keys_loop(stop)),
                asyncio.create_task(self._check_loop(stop))]

    def queue(self, responses: list[ReadResponse]) -> None:
        """Queue what one read of ``.resp`` brought for the check loop: the merge never waits
        for a signature check."""
        room = self.QUEUE_MAX - len(self._queue)
        if room < len(responses):
            self.stats.signatures_unchecked += len(responses) - max(room, 0)
            log.warning("signature checks of %s behind by %d responses: %d left unchecked",
                        self.config.workload_id, len(self._queue),
                        len(responses) - max(room, 0))
            responses = responses[:max(room, 0)]
        self._queue.extend(responses)
        self._queued.set()

    async def _check_loop(self, stop: asyncio.Event) -> None:
        """Check the queued responses, :attr:`CHUNK` at a time, yielding between chunks; what
        does not verify waits for the keys to be read again (:meth:`_keys_loop`)."""
        queue = self._queue
        while not stop.is_set():
            await self._queued.wait()
            self._queued.clear()
            while queue:
                chunk = [queue.popleft() for _ in range(min(len(queue), self.CHUNK))]
                if not self._keys_read:
                    self._pending.extend(chunk)
                    self._wake.set()
                    continue
                tally = check_signatures(chunk, self._facts, self._history,
                                         holder_ids=self.holder_ids, final=False)
                self._count(tally)
                if tally.retry:
                    self._pending.extend(tally.retry)
                    self._wake.set()
                await asyncio.sleep(0)

    def _count(self, tally: SignatureTally) -> None:
        self.stats.signatures_checked += tally.checked
        self.stats.signature_failures += len(tally.failures)
        if self.metrics is not None:
            self.metrics.signatures(self.config.workload_id, tally.checked,
                                    Counter(f.reason for f in tally.failures))
        for failure in tally.failures:
            self._warn(failure)

    def _warn(self, f: SignatureFailure) -> None:
        key = (f.node_id, f.reason)
        now = time.monotonic()
        last, suppressed = self._said.get(key, (-float("inf"), 0))
        if now - last < self.WARN_EVERY_S:
            self._said[key] = (last, suppressed + 1)
            return
        self._said[key] = (now, 0)
        more = (f" ({suppressed} more {f.reason} signature(s) of node {f.node_id!r} since the "
                "last line)" if suppressed else "")
        log.warning("signature %s: response for %s at %s@%d, node %r: %s%s", f.reason,
                    f.effect_id, topics.resp(self.config.workload_id), f.offset, f.node_id,
                    f.detail, more)

    async def _read_keys(self) -> None:
        cfg = self.config
        if cfg.fleet_keys:
            from fx_kafka.keys import read_history

            self._history = await read_history(cfg.bootstrap, list(cfg.fleet_keys))
            return
        facts, self._facts_next = await read_facts_since(cfg.bootstrap, self._facts_next)
        if facts:
            self._facts = latest_keys([*self._facts, *facts])

    async def _keys_loop(self, stop: asyncio.Event) -> None:
        """Read the keys (``sys.facts``, or ``sys.keys`` with fleet keys) every
        ``observe_every_s``, and at once (at most once a second) when a response waits for a
        re-read; then settle those that waited since before the read began. A failed read is
        logged (WARNING the first time in a row) and tried again: signatures never stop the
        holder."""
        cfg = self.config
        failing = False
        while not stop.is_set():
            started = time.monotonic()
            todo, self._pending = self._pending, []
            self._wake.clear()
            try:
                await asyncio.wait_for(self._read_keys(), timeout=30.0)
                read = True
            except asyncio.CancelledError:  # stopping or restarting: keep them for the next run
                self._pending[:0] = todo
                raise
            except (KafkaError, OSError, TimeoutError) as exc:
                # the first failure of a run at WARNING (a denied sys.keys would else go
                # unseen), the rest at DEBUG
                (log.debug if failing else log.warning)(
                    "reading the keys for the signature checks of %s failed (tried again "
                    "every %.0f s): %r", cfg.workload_id, cfg.observe_every_s, exc)
                read = False
            failing = not read
            if read:
                self._keys_read = True
            if todo and (read or len(todo) + len(self._pending) > 10_000):
                # settled with the keys held now (a long outage: bounded memory)
                while todo:
                    chunk, todo = todo[:self.CHUNK], todo[self.CHUNK:]
                    self._count(check_signatures(chunk, self._facts, self._history,
                                                 holder_ids=self.holder_ids, final=True))
                    try:
                        await asyncio.sleep(0)
                    except asyncio.CancelledError:
                        self._pending[:0] = todo
                        raise
            elif todo:
                self._pending[:0] = todo
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=cfg.observe_every_s)
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
