"""Running models and writing responses: the workers (batches from the scheduler, an engine
in the pool or, for a µs-scale model, on the event loop), the answer of a request read
with a µs-scale model right in the consumer loop, and the signed responses put on the
producer in bulk."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from broker_schema import topics
from broker_schema.codec import record_hash
from broker_schema.records import (
    ExecutorInfo,
    InlineBody,
    ResponseRecord,
)
from executor.engines import Engine, EngineResult, KindHandler
from executor.ledger import LedgerWriter
from executor.models import ModelManifest
from executor.scheduler import HANDLER_KEY, Job
from fx_node.admission import (
    InFlight,
    OffsetTracker,
    error_response,
    ok_response,
)
from fx_node.errors import EngineError, ModelError, OutcomeError

if TYPE_CHECKING:
    from executor.service import ExecutorService

log = logging.getLogger("executor.service")


#: A model batch whose last run cost less than this runs on the event loop (no thread hop);
#: the hop alone costs about 100 µs of CPU.
_INLINE_RUN_S = 0.0005

#: How many batches one worker has in the engine pool at once: the one running and the next,
#: queued behind it (see ``_worker``).
_PIPELINE = 2

#: How many recent runs of a model its cost is judged on (see ``_runs_inline``).
_COST_RUNS = 8


def _now_us() -> int:
    return time.time_ns() // 1000


class AnswerMixin:
    """The model-running and answering methods of :class:`executor.service.ExecutorService`."""

    def _already_loaded(self: ExecutorService, model_hash: str, *,
                        file_checked: bool = False) -> tuple[Engine, ModelManifest] | None:
        """What :meth:`_ensure_loaded` returns, when that needs no I/O beyond a stat (the
        model is loaded and its file is unchanged since it was hashed); else None. Runs on
        the event loop, so a loaded model costs no thread hand-off per batch.
        ``file_checked``: the store's checks were made for this request a moment ago (in the
        same step of the event loop), so the cached manifest is used without a stat."""
        manifest = self.store.manifest(model_hash, stat=not file_checked)
        with self._engines_lock:
            engine = self._engines.get(manifest.engine)
        if engine is None or model_hash not in engine.loaded():
            return None
        if not file_checked and (self.store.needs_hashing(model_hash)
                                 or self.store.status(model_hash) != "ready"):
            return None
        return engine, manifest

    def _executor_info(self: ExecutorService, engine: Engine | KindHandler,
                       model_hash: str | None = None) -> ExecutorInfo:
        """The ``executor`` field of the responses ``engine`` answers for ``model_hash`` (built
        once per engine and device class). An engine may serve one model on another device than
        its own (the integer engine after a parity gate fallback serves on the CPU oracle): it
        says so through ``device_class_of``."""
        device = engine.device_class
        device_of = getattr(engine, "device_class_of", None)
        if device_of is not None and model_hash is not None:
            device = device_of(model_hash)
        key = (engine.name, engine.version, device)
        info = self._infos.get(key)
        if info is None:
            info = self._infos[key] = ExecutorInfo(
                node_id=self.config.node_id, engine=engine.name, engine_version=engine.version,
                device_class=device)
        return info

    def _runs_inline(self: ExecutorService, engine: Engine | KindHandler, model_hash: str | None,
                     n: int = 1) -> bool:
        """Whether a batch of ``n`` for ``model_hash`` runs on the event loop rather than in
        the engine pool: a model (never a kind handler, never an engine that binds request
        context) whose recent runs cost under ``_INLINE_RUN_S`` per batch. The cost is the
        least of the last ``_COST_RUNS`` runs' wall time per request (a run in the pool is
        timed with its waits for the GIL and the CPU, which the least of several filters out).
        The first run of a model always goes to the pool (its cost is unknown)."""
        if model_hash is None or getattr(engine, "binds_request_context", False):
            return False
        costs = self._run_cost.get(model_hash)
        return costs is not None and len(costs) > 0 and min(costs) * n < _INLINE_RUN_S

    def _note_run_cost(self: ExecutorService, model_hash: str | None, per_item_s: float) -> None:
        if model_hash is not None:
            self._run_cost.setdefault(model_hash, deque(maxlen=_COST_RUNS)).append(per_item_s)

    async def _answer_now(self: ExecutorService, j: Job) -> bool:
        """Answer an admitted request here, in the consumer loop, when that is the shortest
        way: an inline (or no) input, a loaded model that runs in microseconds
        (:meth:`_runs_inline`) and none of its jobs queued ahead. The model runs, and the
        response is put on the producer right behind the request's ``accepted``, before the
        producer sends: both go in one produce request, one broker round trip instead of two.
        (Inference acts on nothing, so the model need not wait for ``accepted`` to be
        acknowledged; the response is settled only after it.) False: not answerable here."""
        request = j.job.request
        body = request.input
        if (request.model is None or j.kind in self._handlers
                or not (body is None or isinstance(body, InlineBody))):
            return False
        try:
            # the store's file checks were made for this very request by _request_status
            loaded = self._already_loaded(j.model_hash, file_checked=True)
        except OutcomeError:
            return False
        if loaded is None or not self._runs_inline(loaded[0], j.model_hash):
            return False
        engine, manifest = loaded
        j.data = b"" if body is None else body.raw()
        self.metrics.queue_seconds.labels(j.kind).observe(time.monotonic() - j.read_mono)
        started_us = _now_us()
        run_t0 = time.perf_counter()
        result: EngineResult | OutcomeError
        try:
            result = engine.run_batch(j.model_hash, [(request.params, j.data)])[0]
        except Exception as exc:  # an engine bug: this request gets the error
            result = EngineError("engine_error", f"{type(exc).__name__}: {exc}")
        self._note_run_cost(j.model_hash, time.perf_counter() - run_t0)
        finished_us = _now_us()
        self.metrics.batch_size.labels(j.model_hash).observe(1)
        self.metrics.exec_count.labels(j.model_hash).inc()
        receipt_base: dict[str, Any] = {
            "batch_size": 1, "manifest_hash": self.store.manifest_hash(j.model_hash, stat=False),
            "preprocessing_version": manifest.preprocessing_version}
        prepared = await self._prepare_answer(
            j.job, self._executor_info(engine, j.model_hash), j.model_hash, result,
            started_us=started_us, finished_us=finished_us, receipt_base=receipt_base)
        if prepared is None:
            return True
        topic, value, response = prepared
        gen = self._producer_gen
        fut = await self._enqueue(topic, value, j.job.effect_id.encode())
        self._settle_queue.append((j, topic, value, response, fut, gen))
        if self._settler is None or self._settler.done():
            self._settler = self._spawn(self._settle_answered())
        return True

    async def _settle_answered(self: ExecutorService) -> None:
        """Settle the requests :meth:`_answer_now` answered, in order: their ``accepted`` and
        response acknowledged (or written again), then their offsets. One task for a burst."""
        while self._settle_queue:
            j, topic, value, response, fut, gen = self._settle_queue.popleft()
            await self._accepted_written(j)
            await self._settle("response", topic, value, j.job.effect_id.encode(), fut, gen)
            self._answered(j.job, response, kind=j.kind, tp=j.tp, tracker=j.tracker,
                           read_mono=j.read_mono)

    def _batch_limit(self: ExecutorService, model_hash: str) -> int:
        handler = self._handlers.get(model_hash.removeprefix(HANDLER_KEY))
        if handler is not None:
            return max(1, min(self.config.max_batch, handler.max_batch))
        try:
            engine = self._engine_for(self.store.manifest(model_hash))
        except ModelError:
            return 1
        return max(1, min(self.config.max_batch, engine.max_batch))

    async def _worker(self: ExecutorService) -> None:
        loop = asyncio.get_running_loop()
        pipeline: deque[asyncio.Future[Any]] = deque()  # this worker's runs in the pool
        while True:
            model_hash, jobs = await self._scheduler.take(self._batch_limit)
            for j in jobs:
                await self._accepted_written(j)  # acknowledged before the model runs
            # inputs were read before the job was queued (``_fetch_input``): nothing here waits
            # on the broker for one request while others queue behind it
            ready: list[tuple[Job, bytes]] = [(j, j.data) for j in jobs]
            handler = self._handlers.get(model_hash.removeprefix(HANDLER_KEY))
            engine: Engine | KindHandler
            manifest: ModelManifest | None = None
            if handler is not None:  # a kind without a model: no store, no load
                engine, target, answered_hash = handler, jobs[0].kind, None
            else:
                try:
                    loaded = self._already_loaded(model_hash)
                    if loaded is None:  # a load reads and hashes the file: off the loop
                        loaded = await loop.run_in_executor(
                            self._pool, self._ensure_loaded, model_hash)
                    engine, manifest = loaded
                except OutcomeError as exc:
                    for j, _ in ready:
                        self._answer_job(j, self.state.refusal_executor, None, exc)
                    self._spawn(self._publish_facts())  # a refusal (parity gate) is a fact
                    continue
                target, answered_hash = model_hash, model_hash
                self._facts_if_changed()
            info = self._executor_info(engine, answered_hash)
            items = [(j.job.request.params, data) for j, data in ready]
            now = time.monotonic()
            for j, _ in ready:
                self.metrics.queue_seconds.labels(j.kind).observe(now - j.read_mono)
            self.metrics.inflight.inc(len(items))
            run_batch: Any = engine.run_batch
            if getattr(engine, "binds_request_context", False):  # receipts name the request
                run_batch = functools.partial(run_batch, contexts=[
                    _request_context(j.job) for j, _ in ready])
            run: asyncio.Future[Any]
            if self._runs_inline(engine, answered_hash, len(items)):
                # a µs-scale model: a thread hop would cost more than the run
                run = loop.create_future()
                try:
                    run.set_result(_timed(run_batch, target, items))
                except Exception as exc:
                    run.set_exception(exc)
            else:
                run = loop.run_in_executor(self._pool, _timed, run_batch, target, items)
            # answered in its own task: while this batch runs the worker forms the next one and
            # queues it in the pool behind it, so the engine thread goes from one batch to the
            # next without waiting for the event loop (which is busy with the broker, decoding
            # and signing meanwhile); at most _PIPELINE batches of a worker are in the pool
            # (not a _spawn'ed task: stop() cancels it with the workers, so a batch still
            # running at shutdown is answered ``shutdown``, as when the worker awaited it)
            waiting = asyncio.create_task(self._finish_run(
                run, ready, items, info, model_hash, answered_hash, manifest))
            self._run_waits.add(waiting)
            waiting.add_done_callback(self._run_waits.discard)
            pipeline.append(run)
            while len(pipeline) >= _PIPELINE or (pipeline and pipeline[0].done()):
                await asyncio.wait([pipeline[0]])
                pipeline.popleft()

    async def _finish_run(
        self: ExecutorService,
        run: asyncio.Future[Any],
        ready: list[tuple[Job, bytes]],
        items: list[Any],
        info: ExecutorInfo,
        model_hash: str,
        answered_hash: str | None,
        manifest: ModelManifest | None,
    ) -> None:
        """Await one engine batch that :meth:`_worker` started, then answer its requests (in a
        tracked task: once the results are there, a shutdown never drops them half-sent)."""
        try:
            results, run_s, started_us, finished_us = await run
            self._note_run_cost(answered_hash, run_s / len(items))
        except Exception as exc:  # an engine bug: every request in the batch gets the error
            results = [EngineError("engine_error", f"{type(exc).__name__}: {exc}")] * len(items)
            run_s, started_us, finished_us = 0.0, _now_us(), _now_us()
        finally:
            self.metrics.inflight.dec(len(items))
        self.metrics.compute_seconds.labels(model_hash).observe(run_s)
        self.metrics.batch_size.labels(model_hash).observe(len(items))
        self.metrics.exec_count.labels(model_hash).inc()
        receipt_base: dict[str, Any] = {"batch_size": len(items)}
        if manifest is not None:
            receipt_base.update(manifest_hash=self.store.manifest_hash(model_hash, stat=False),
                                preprocessing_version=manifest.preprocessing_version)
        self._spawn(self._answer_batch(
            [(j, result) for (j, _), result in zip(ready, results, strict=True)],
            info, answered_hash, started_us=started_us, finished_us=finished_us,
            receipt_base=receipt_base))

    def _answer_job(
        self: ExecutorService,
        j: Job,
        info: ExecutorInfo,
        model_hash: str | None,
        result: EngineResult | OutcomeError,
        *,
        started_us: int | None = None,
        finished_us: int | None = None,
        receipt_base: dict[str, Any] | None = None,
    ) -> None:
        # A tracked task, not awaited: the worker goes on to the next batch while the producer
        # waits for acks, and cancelling a worker at shutdown never drops a response half-sent
        # (stop() awaits every tracked task).
        self._spawn(self._answer(
            j.job, info, model_hash, result, kind=j.kind, tp=j.tp, tracker=j.tracker,
            read_mono=j.read_mono, started_us=started_us, finished_us=finished_us,
            receipt_base=receipt_base,
        ))

    async def _answer(
        self: ExecutorService,
        job: InFlight,
        info: ExecutorInfo,
        model_hash: str | None,
        result: EngineResult | OutcomeError,
        *,
        kind: str,
        tp: tuple[str, int],
        tracker: OffsetTracker | None,
        read_mono: float | None,
        started_us: int | None = None,
        finished_us: int | None = None,
        receipt_base: dict[str, Any] | None = None,
    ) -> None:
        prepared = await self._prepare_answer(
            job, info, model_hash, result, started_us=started_us, finished_us=finished_us,
            receipt_base=receipt_base)
        if prepared is None:
            return
        topic, value, response = prepared
        await self._produce("response", topic, value, job.effect_id.encode())
        self._answered(job, response, kind=kind, tp=tp, tracker=tracker, read_mono=read_mono)

    async def _answer_batch(
        self: ExecutorService,
        entries: list[tuple[Job, EngineResult | OutcomeError]],
        info: ExecutorInfo,
        model_hash: str | None,
        *,
        started_us: int,
        finished_us: int,
        receipt_base: dict[str, Any],
    ) -> None:
        """Answer one engine batch: every response is put on the producer first, then their
        acknowledgements are awaited, so one produce request carries them all (not one awaited
        send per record). A response whose send fails for want of a broker is sent again
        through :meth:`_produce`."""
        sent: list[tuple[Job, str, bytes, ResponseRecord, asyncio.Future[Any] | None, int]] = []
        for j, result in entries:
            prepared = await self._prepare_answer(
                j.job, info, model_hash, result, started_us=started_us,
                finished_us=finished_us, receipt_base=receipt_base)
            if prepared is None:
                continue
            topic, value, response = prepared
            gen = self._producer_gen
            fut = await self._enqueue(topic, value, j.job.effect_id.encode())
            sent.append((j, topic, value, response, fut, gen))
        for j, topic, value, response, fut, gen in sent:
            await self._settle("response", topic, value, j.job.effect_id.encode(), fut, gen)
            self._answered(j.job, response, kind=j.kind, tp=j.tp, tracker=j.tracker,
                           read_mono=j.read_mono)

    async def _prepare_answer(
        self: ExecutorService,
        job: InFlight,
        info: ExecutorInfo,
        model_hash: str | None,
        result: EngineResult | OutcomeError,
        *,
        started_us: int | None = None,
        finished_us: int | None = None,
        receipt_base: dict[str, Any] | None = None,
    ) -> tuple[str, bytes, ResponseRecord] | None:
        """The signed response for ``job`` as ``(topic, value, record)``; None when it was
        answered already (by shutdown). Suspends only to log an integer receipt or to store a
        body too large to go inline."""
        # Every receipt signed goes on the node's ledger, before the response that carries it
        # (and even when that response is never written: answered by shutdown meanwhile).
        signed_receipt = (result.receipt or {}).get("integer") if isinstance(
            result, EngineResult) else None
        if isinstance(signed_receipt, dict):
            await self._log_receipt(signed_receipt)
        # Leaving the in-flight table first claims the right to answer: a job answered by
        # shutdown is not answered again when its engine call returns.
        if self.state.finish(job.effect_id) is None:
            return None
        if isinstance(result, OutcomeError):
            response = error_response(
                self.state, job, code=result.code, message=result.message,
                model_hash=model_hash, executor=info, started_us=started_us,
                finished_us=finished_us,
            )
        else:
            try:
                body = await self._output_body(result, job.request.header.workload_id)
                receipt = {**(receipt_base or {}), **(result.receipt or {})}
                response = ok_response(
                    self.state, job, output=body, model_hash=model_hash, executor=info,
                    started_us=started_us or _now_us(), finished_us=finished_us or _now_us(),
                    receipt=receipt,
                )
            except (OutcomeError, ValidationError, OSError) as exc:
                code = exc.code if isinstance(exc, OutcomeError) else "output_too_large"
                response = error_response(
                    self.state, job, code=code, message=str(exc)[:4096],
                    model_hash=model_hash, executor=info, started_us=started_us,
                    finished_us=finished_us,
                )
        value = self.identity.sign_and_encode(response)
        topic = topics.resp_for(job.request.header.workload_id, job.request.header.shadow)
        return topic, value, response

    def _answered(self: ExecutorService, job: InFlight, response: ResponseRecord, *, kind: str,
                  tp: tuple[str, int], tracker: OffsetTracker | None,
                  read_mono: float | None) -> None:
        """``job``'s response is acknowledged: count it and settle its offset."""
        label: str = response.error.code if response.error else ""
        self.metrics.requests.labels(kind, response.outcome, label).inc()
        if read_mono is not None:
            self.metrics.request_seconds.labels(kind, response.outcome).observe(
                time.monotonic() - read_mono
            )
        if tracker is not None:
            tracker.done(tp, job.request_offset)

    async def _log_receipt(self: ExecutorService, receipt: Mapping[str, Any]) -> None:
        """Append ``receipt`` to ``sys.ledger.<node>`` with a fresh signed checkpoint
        (:class:`executor.ledger.LedgerWriter`), through :meth:`_produce`."""
        ledger = self._ledger
        if ledger is None:
            ledger = self._ledger = LedgerWriter(self.config.bootstrap, self.config.node_id,
                                                 self.identity)

        async def produce(topic: str, value: bytes, key: bytes) -> Any:
            return await self._produce("ledger", topic, value, key)

        await ledger.append(receipt, produce)


def _timed(run_batch: Any, target: str, items: list[Any]) -> tuple[Any, float, int, int]:
    """``run_batch(target, items)``, its wall time and its start and end (µs since the epoch),
    taken where it runs (in the engine pool: without the hand-offs to and from the thread, nor
    the wait behind the batch queued ahead of it)."""
    started_us = _now_us()
    t0 = time.perf_counter()
    results = run_batch(target, items)
    return results, time.perf_counter() - t0, started_us, _now_us()


def _request_context(job: InFlight) -> dict[str, Any]:
    """What a signed receipt binds of the request it answers (``Engine.run_batch`` contexts)."""
    header = job.request.header
    return {"workload_id": header.workload_id, "effect_id": job.effect_id,
            "epoch": header.epoch, "request_hash": record_hash(job.request)}
