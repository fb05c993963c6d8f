"""Running models and writing responses (:class:`Answerer`): the workers (batches from the
scheduler, an engine in the thread pool or, for a µs-scale model, on the event loop), the answer
of a request read with a µs-scale model right in the consumer loop, and the signed responses put
on the producer in bulk.

A request with an inline input for a loaded model that runs in microseconds (its last run cost
under :data:`executor.engine_pool.INLINE_RUN_S`) skips the queue: the model runs in the consumer
loop and the response is put on the producer right behind the ``accepted``, so both go in one
produce request (inference acts on nothing, so the model need not wait for the ``accepted`` ack;
the request is settled only once both are acknowledged). Every other job goes to the scheduler,
which hands batches of jobs for one model to a worker; the engine runs in a thread pool, so the
event loop (and the consumer's heartbeat) never waits on it.

The signed response is written (acks=all; the responses of a batch are put on the producer
together and their acks awaited together); only then is the request's offset settled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from broker_schema import topics
from broker_schema.codec import record_hash
from broker_schema.records import ExecutorInfo, InlineBody, ResponseRecord
from executor.config import ExecutorConfig
from executor.engine_pool import EnginePool
from executor.engines import Engine, EngineResult, KindHandler
from executor.inputs import InputReader
from executor.ledger import LedgerRefused, LedgerWriter
from executor.metrics import ExecutorMetrics
from executor.models import ModelManifest
from executor.scheduler import HANDLER_KEY, Job, Scheduler
from fx_node.admission import (
    ExecutorState,
    InFlight,
    OffsetTracker,
    error_response,
    ok_response,
)
from fx_node.errors import EngineError, OutcomeError
from fx_node.shell import NodeShell

__all__ = ["Answerer", "now_us"]

log = logging.getLogger("executor.service")

#: How many batches one worker has in the engine pool at once: the one running and the next,
#: queued behind it (see ``worker``).
_PIPELINE = 2

_Sent = tuple[Job, str, bytes, ResponseRecord, asyncio.Future[Any] | None, int]


def now_us() -> int:
    """Microseconds since the epoch."""
    return time.time_ns() // 1000


class Answerer:
    """Runs the jobs of ``scheduler`` on ``engines`` (in ``threads``, or on the event loop) and
    writes their responses through ``node``'s producer."""

    def __init__(self, config: ExecutorConfig, node: NodeShell, state: ExecutorState,
                 engines: EnginePool, inputs: InputReader, scheduler: Scheduler,
                 metrics: ExecutorMetrics) -> None:
        self.config = config
        self.node = node
        self.state = state
        self.producer = node.producer
        self.identity = node.identity
        self.engines = engines
        self.inputs = inputs
        self.scheduler = scheduler
        self.metrics = metrics
        self.threads = ThreadPoolExecutor(max_workers=config.workers,
                                          thread_name_prefix="fx-engine",
                                          initializer=engines.pin_engine_thread)
        #: the workers' engine batches being awaited (``_finish_run``)
        self.run_waits: set[asyncio.Task[Any]] = set()
        #: this node's receipt ledger (sys.ledger.<node>), made on the first receipt
        self._ledger: LedgerWriter | None = None
        self._facts_pending = False
        #: requests answered in the consumer loop, waiting for their acks (_settle_answered)
        self._settle_queue: deque[_Sent] = deque()
        self._settler: asyncio.Future[Any] | None = None

    async def accepted_written(self, j: Job) -> None:
        """Wait for ``j``'s ``accepted`` to be acknowledged (written again if the broker lost
        it)."""
        await self.producer.written(j.accepted_ack, j.accepted_gen, j.accepted)

    # ------------------------------------------------------------------------------ fast path
    async def answer_now(self, j: Job, ran: tuple[str, EngineResult | OutcomeError, int, int]
                         | None = None) -> bool:
        """Answer an admitted request here, in the consumer loop, when that is the shortest
        way: an inline (or no) input, a loaded model that runs in microseconds
        (:meth:`EnginePool.runs_inline`) and none of its jobs queued ahead. The model runs, and
        the response is put on the producer right behind the request's ``accepted``, before the
        producer sends: both go in one produce request, one broker round trip instead of two.
        (Inference acts on nothing, so the model need not wait for ``accepted`` to be
        acknowledged; the response is settled only after it.) False: not answerable here.
        ``ran``: the model's result for this very request, run when it was read uncommitted
        (:mod:`executor.speculation`), as ``(model hash, result, started_us, finished_us)``:
        then it is answered here whatever the model's cost."""
        request = j.job.request
        body = request.input
        if (request.model is None or j.kind in self.engines.handlers
                or not (body is None or isinstance(body, InlineBody))):
            return False
        try:
            # the store's file checks were made for this very request by request_status
            loaded = self.engines.already_loaded(j.model_hash, file_checked=True)
        except OutcomeError:
            return False
        if loaded is None or (ran is None
                              and not self.engines.runs_inline(loaded[0], j.model_hash)):
            return False
        engine, manifest = loaded
        j.data = b"" if body is None else body.raw()
        self.metrics.queue_seconds.labels(j.kind).observe(time.monotonic() - j.read_mono)
        result: EngineResult | OutcomeError
        if ran is not None and ran[0] == j.model_hash:  # run already, on its uncommitted read
            _, result, started_us, finished_us = ran
        else:
            started_us = now_us()
            run_t0 = time.perf_counter()
            try:
                result = engine.run_batch(j.model_hash, [(request.params, j.data)])[0]
            except Exception as exc:  # an engine bug: this request gets the error
                result = EngineError("engine_error", f"{type(exc).__name__}: {exc}")
            self.engines.note_run_cost(j.model_hash, time.perf_counter() - run_t0)
            finished_us = now_us()
        self.metrics.batch_size.labels(j.model_hash).observe(1)
        self.metrics.exec_count.labels(j.model_hash).inc()
        receipt_base: dict[str, Any] = {
            "batch_size": 1,
            "manifest_hash": self.engines.store.manifest_hash(j.model_hash, stat=False),
            "preprocessing_version": manifest.preprocessing_version}
        prepared = await self._prepare_answer(
            j.job, self.engines.executor_info(engine, j.model_hash), j.model_hash, result,
            started_us=started_us, finished_us=finished_us, receipt_base=receipt_base)
        if prepared is None:
            return True
        topic, value, response = prepared
        gen = self.producer.gen
        fut = await self.producer.enqueue(topic, value, j.job.effect_id.encode())
        self._settle_queue.append((j, topic, value, response, fut, gen))
        if self._settler is None or self._settler.done():
            self._settler = self.node.spawn(self._settle_answered())
        return True

    async def _settle_answered(self) -> None:
        """Settle the requests :meth:`answer_now` answered, in order: their ``accepted`` and
        response acknowledged (or written again), then their offsets. One task for a burst."""
        while self._settle_queue:
            j, topic, value, response, fut, gen = self._settle_queue.popleft()
            await self.accepted_written(j)
            await self.producer.settle("response", topic, value, j.job.effect_id.encode(), fut,
                                       gen)
            self._answered(j.job, response, kind=j.kind, tp=j.tp, tracker=j.tracker,
                           read_mono=j.read_mono)

    # ------------------------------------------------------------------------------ workers
    async def worker(self) -> None:
        """One worker: batches from the scheduler, run and answered, until cancelled."""
        loop = asyncio.get_running_loop()
        pipeline: deque[asyncio.Future[Any]] = deque()  # this worker's runs in the pool
        while True:
            model_hash, jobs = await self.scheduler.take(self.engines.batch_limit)
            for j in jobs:
                await self.accepted_written(j)  # acknowledged before the model runs
            # inputs were read before the job was queued (the runner's fetch): nothing here
            # waits on the broker for one request while others queue behind it
            ready: list[tuple[Job, bytes]] = [(j, j.data) for j in jobs]
            handler = self.engines.handlers.get(model_hash.removeprefix(HANDLER_KEY))
            engine: Engine | KindHandler
            manifest: ModelManifest | None = None
            if handler is not None:  # a kind without a model: no store, no load
                engine, target, answered_hash = handler, jobs[0].kind, None
            else:
                try:
                    loaded = self.engines.already_loaded(model_hash)
                    if loaded is None:  # a load reads and hashes the file: off the loop
                        loaded = await loop.run_in_executor(
                            self.threads, self.engines.ensure_loaded, model_hash)
                    engine, manifest = loaded
                except OutcomeError as exc:
                    for j, _ in ready:
                        self.answer_job(j, self.state.refusal_executor, None, exc)
                    # a refusal (parity gate) is a fact
                    self.node.spawn(self.node.publish_facts())
                    continue
                target, answered_hash = model_hash, model_hash
                self._facts_if_changed()
            info = self.engines.executor_info(engine, answered_hash)
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
            if self.engines.runs_inline(engine, answered_hash, len(items)):
                # a µs-scale model: a thread hop would cost more than the run
                run = loop.create_future()
                try:
                    run.set_result(_timed(run_batch, target, items))
                except Exception as exc:
                    run.set_exception(exc)
            else:
                run = loop.run_in_executor(self.threads, _timed, run_batch, target, items)
            # answered in its own task: while this batch runs the worker forms the next one and
            # queues it in the pool behind it, so the engine thread goes from one batch to the
            # next without waiting for the event loop (which is busy with the broker, decoding
            # and signing meanwhile); at most _PIPELINE batches of a worker are in the pool
            # (not a spawned task: the runner's drain cancels it with the workers, so a batch
            # still running at shutdown is answered ``shutdown``, as when the worker awaited it)
            waiting = asyncio.create_task(self._finish_run(
                run, ready, items, info, model_hash, answered_hash, manifest))
            self.run_waits.add(waiting)
            waiting.add_done_callback(self.run_waits.discard)
            pipeline.append(run)
            while len(pipeline) >= _PIPELINE or (pipeline and pipeline[0].done()):
                await asyncio.wait([pipeline[0]])
                pipeline.popleft()

    async def _finish_run(
        self,
        run: asyncio.Future[Any],
        ready: list[tuple[Job, bytes]],
        items: list[Any],
        info: ExecutorInfo,
        model_hash: str,
        answered_hash: str | None,
        manifest: ModelManifest | None,
    ) -> None:
        """Await one engine batch that :meth:`worker` started, then answer its requests (in a
        tracked task: once the results are there, a shutdown never drops them half-sent)."""
        try:
            results, run_s, started_us, finished_us = await run
            self.engines.note_run_cost(answered_hash, run_s / len(items))
        except Exception as exc:  # an engine bug: every request in the batch gets the error
            results = [EngineError("engine_error", f"{type(exc).__name__}: {exc}")] * len(items)
            run_s, started_us, finished_us = 0.0, now_us(), now_us()
        finally:
            self.metrics.inflight.dec(len(items))
        self.metrics.compute_seconds.labels(model_hash).observe(run_s)
        self.metrics.batch_size.labels(model_hash).observe(len(items))
        self.metrics.exec_count.labels(model_hash).inc()
        receipt_base: dict[str, Any] = {"batch_size": len(items)}
        if manifest is not None:
            receipt_base.update(
                manifest_hash=self.engines.store.manifest_hash(model_hash, stat=False),
                preprocessing_version=manifest.preprocessing_version)
        self.node.spawn(self._answer_batch(
            [(j, result) for (j, _), result in zip(ready, results, strict=True)],
            info, answered_hash, started_us=started_us, finished_us=finished_us,
            receipt_base=receipt_base))

    def _facts_if_changed(self) -> None:
        """Publish facts when the loaded models differ from the last published (a model was
        just loaded): not once per batch. What else changes (a file added to the store) is
        published by the facts ticker."""
        if self._facts_pending:
            return
        facts = self.node.facts
        if facts is not None and set(facts.models_loaded) == self.engines.loaded_models():
            return
        self._facts_pending = True

        async def publish() -> None:
            try:
                await self.node.publish_facts()
            finally:
                self._facts_pending = False

        self.node.spawn(publish())

    # ------------------------------------------------------------------------------ answers
    def answer_job(
        self,
        j: Job,
        info: ExecutorInfo,
        model_hash: str | None,
        result: EngineResult | OutcomeError,
        *,
        started_us: int | None = None,
        finished_us: int | None = None,
        receipt_base: dict[str, Any] | None = None,
    ) -> None:
        """Answer ``j`` with ``result`` in a tracked task."""
        # A tracked task, not awaited: the worker goes on to the next batch while the producer
        # waits for acks, and cancelling a worker at shutdown never drops a response half-sent
        # (stop() awaits every tracked task).
        self.node.spawn(self.answer(
            j.job, info, model_hash, result, kind=j.kind, tp=j.tp, tracker=j.tracker,
            read_mono=j.read_mono, started_us=started_us, finished_us=finished_us,
            receipt_base=receipt_base,
        ))

    async def answer(
        self,
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
        """Sign and write ``job``'s response (acks=all), then settle its offset."""
        prepared = await self._prepare_answer(
            job, info, model_hash, result, started_us=started_us, finished_us=finished_us,
            receipt_base=receipt_base)
        if prepared is None:
            return
        topic, value, response = prepared
        await self.producer.produce("response", topic, value, job.effect_id.encode())
        self._answered(job, response, kind=kind, tp=tp, tracker=tracker, read_mono=read_mono)

    async def _answer_batch(
        self,
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
        through :meth:`fx_node.producer.ResilientProducer.produce`."""
        sent: list[_Sent] = []
        for j, result in entries:
            prepared = await self._prepare_answer(
                j.job, info, model_hash, result, started_us=started_us,
                finished_us=finished_us, receipt_base=receipt_base)
            if prepared is None:
                continue
            topic, value, response = prepared
            gen = self.producer.gen
            fut = await self.producer.enqueue(topic, value, j.job.effect_id.encode())
            sent.append((j, topic, value, response, fut, gen))
        for j, topic, value, response, fut, gen in sent:
            await self.producer.settle("response", topic, value, j.job.effect_id.encode(), fut,
                                       gen)
            self._answered(j.job, response, kind=j.kind, tp=j.tp, tracker=j.tracker,
                           read_mono=j.read_mono)

    async def _prepare_answer(
        self,
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
            try:
                await self._log_receipt(signed_receipt)
            except LedgerRefused as exc:
                # never a receipt that is not on the node's ledger: the request gets an error
                # another node may answer (retriable), and the receipt is dropped
                result, receipt_base = OutcomeError("ledger_refused", str(exc)), None
        # Leaving the in-flight table first claims the right to answer: a job answered by
        # shutdown is not answered again when its engine call returns.
        state = self.state
        if state.finish(job.effect_id) is None:
            return None
        if isinstance(result, OutcomeError):
            response = error_response(
                state, job, code=result.code, message=result.message,
                model_hash=model_hash, executor=info, started_us=started_us,
                finished_us=finished_us,
            )
        else:
            try:
                body = await self.inputs.output_body(result, job.request.header.workload_id)
                receipt = {**(receipt_base or {}), **(result.receipt or {})}
                response = ok_response(
                    state, job, output=body, model_hash=model_hash, executor=info,
                    started_us=started_us or now_us(), finished_us=finished_us or now_us(),
                    receipt=receipt,
                )
            except (OutcomeError, ValidationError, OSError) as exc:
                code = exc.code if isinstance(exc, OutcomeError) else "output_too_large"
                response = error_response(
                    state, job, code=code, message=str(exc)[:4096],
                    model_hash=model_hash, executor=info, started_us=started_us,
                    finished_us=finished_us,
                )
        value = self.identity.sign_and_encode(response)
        topic = topics.resp_for(job.request.header.workload_id, job.request.header.shadow)
        return topic, value, response

    def _answered(self, job: InFlight, response: ResponseRecord, *, kind: str,
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

    async def _log_receipt(self, receipt: Mapping[str, Any]) -> None:
        """Append ``receipt`` to ``sys.ledger.<node>`` with a fresh signed checkpoint
        (:class:`executor.ledger.LedgerWriter`), through the node's producer;
        :class:`~executor.ledger.LedgerRefused` when the ledger holds a foreign leaf."""

        async def produce(topic: str, value: bytes, key: bytes) -> Any:
            return await self.producer.produce("ledger", topic, value, key)

        await self.ledger().append(receipt, produce)

    def ledger(self) -> LedgerWriter:
        """This node's ledger writer (made once; :meth:`check_ledger` loads it at start)."""
        ledger = self._ledger
        if ledger is None:
            from broker_schema.signatures import public_key_from_text

            def refused(found: Any) -> None:
                self.metrics.ledger_foreign_leaves.set(len(found.foreign))

            ledger = self._ledger = LedgerWriter(
                self.config.bootstrap, self.config.node_id, self.identity,
                keys_file=self.config.ledger_keys_file,
                previous_keys=[_raw_key(k, public_key_from_text)
                               for k in self.config.ledger_previous_keys],
                on_refused=refused)
        return ledger

    async def check_ledger(self) -> None:
        """At start, when the node signs receipts: read and check its ledger (a foreign leaf is
        said at once: error log, metric, alert; receipts are then refused)."""
        # said by the writer; every receipt is then answered ledger_refused
        with contextlib.suppress(LedgerRefused):
            await self.ledger().load()


def _raw_key(text: str, from_text: Any) -> bytes:
    """A configured public key: hex (as in receipts), else base64 (as on ``sys.facts``)."""
    try:
        return bytes.fromhex(text)
    except ValueError:
        return bytes(from_text(text))


def _timed(run_batch: Any, target: str, items: list[Any]) -> tuple[Any, float, int, int]:
    """``run_batch(target, items)``, its wall time and its start and end (µs since the epoch),
    taken where it runs (in the engine pool: without the hand-offs to and from the thread, nor
    the wait behind the batch queued ahead of it)."""
    started_us = now_us()
    t0 = time.perf_counter()
    results = run_batch(target, items)
    return results, time.perf_counter() - t0, started_us, now_us()


def _request_context(job: InFlight) -> dict[str, Any]:
    """What a signed receipt binds of the request it answers (``Engine.run_batch`` contexts)."""
    header = job.request.header
    return {"workload_id": header.workload_id, "effect_id": job.effect_id,
            "epoch": header.epoch, "request_hash": record_hash(job.request)}
