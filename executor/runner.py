"""The executor's runner (:class:`ModelRunner`): what the node's shell (:mod:`fx_node.shell`) hands
every request it read, and what the executor decides and does with it.

For every request the shell hands over:

1. records the shell passed over are counted (``fx_executor_ignored_total{reason}``) or, when
   undecodable, of a kind that does not belong on ``.out`` (``wrong_stream``), of another workload
   than their topic's, or not signed by their epoch's holder, counted
   (``fx_executor_rejected_records_total{code}``), logged with topic/partition/offset, written to
   ``sys.rejects`` and passed;
2. when the kind's queue is full, the read waits (up to ``backpressure_wait_s``); then the model
   store is checked and :func:`fx_node.admission.decide` asked;
3. refusals and backpressure: one signed ``response``; admitted: ``accepted`` (acks=all), then
   the job's input is read in a task of its own (:mod:`executor.inputs`, at most
   ``input_fetchers`` at once), and only then does the job go to the scheduler, which hands
   batches of jobs for one model to a worker (:mod:`executor.answering`): no worker waits on one
   request's input while others queue. A request for a µs-scale model with an inline input is
   answered right here (:meth:`executor.answering.Answerer.answer_now`);
4. the signed response is written; only then is the request's offset settled.

Restart semantics: a request answered but not committed past is answered again under the same
effect id (the lease holder merges the first answer and passes over the rest). The executor does
not look for its own earlier response on ``.resp``: inference has no side effects, so answering
twice is harmless and the check would cost a read of ``.resp`` per request.

Shutdown (SIGTERM): the shell stops reading; in-flight requests get ``shutdown_grace_s`` to
finish, then every request still in flight is answered with ``error``/``shutdown`` (retriable)
and the shell commits. Only a crash (SIGKILL, power loss) leaves an accepted request without a
response; the lease holder then writes ``unknown`` when the executor lease lapses, or the
restarted executor answers it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import os
import time
from typing import Any

from aiokafka.errors import KafkaError

from broker_schema import topics
from broker_schema.canonical import sha256_hex
from broker_schema.codec import encode, request_hash
from broker_schema.records import (
    EffectRequest,
    ExecutorInfo,
    FactsRecord,
    InlineBody,
    RejectCode,
    RejectedRecord,
    ResponseRecord,
)
from executor.accelerators import node_devices
from executor.answering import Answerer, now_us
from executor.config import ExecutorConfig
from executor.engine_pool import EnginePool
from executor.engines import Engine
from executor.inputs import InputReader
from executor.metrics import ExecutorMetrics
from executor.models import ModelStore
from executor.scheduler import HANDLER_KEY, Job, Scheduler
from executor.speculation import Prepared, SpeculativeReader
from fx_node.admission import Admit, ExecutorState, Ignore, Refuse, decide
from fx_node.errors import EngineError, OutcomeError
from fx_node.facts import build_facts
from fx_node.runner import Read, Skip
from fx_node.shell import NodeShell, finish

__all__ = ["ModelRunner", "executor_version"]

log = logging.getLogger("executor.service")


def executor_version() -> str:
    """The installed ``ninelives-fx`` version."""
    try:
        return importlib.metadata.version("ninelives-fx")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


class ModelRunner:
    """The executor's :class:`fx_node.runner.Runner`: models (``engines``) run on the requests
    ``node`` reads."""

    def __init__(self, config: ExecutorConfig, node: NodeShell, *, metrics: ExecutorMetrics,
                 store: ModelStore, engines: dict[str, Engine] | None = None) -> None:
        self.config = config
        self.node = node
        self.metrics = metrics
        self.engines = EnginePool(config, store, metrics, node.identity, engines,
                                  on_corrupt=lambda: node.spawn(node.publish_facts()))
        device = ("cuda" if any(e.device_class == "cuda" for e in self.engines.engine_list())
                  else "cpu")
        self._state = ExecutorState(
            node_id=config.node_id,
            kinds=config.kinds,
            engine_info=ExecutorInfo(
                node_id=config.node_id,
                engine="fx-executor",
                engine_version=executor_version(),
                device_class=device,
            ),
            private_paths=(os.path.abspath(config.model_dir), os.path.abspath(config.chunk_dir),
                           os.path.dirname(os.path.abspath(config.key_file))),
        )
        for kind, limit in config.kinds.items():
            metrics.queue_limit.labels(kind).set(limit)
        self.inputs = InputReader(config, self._state, wait=node.wait,
                                  stopping=lambda: node.stopping)
        self.scheduler = Scheduler()
        self.answerer = Answerer(config, node, self._state, self.engines, self.inputs,
                                 self.scheduler, metrics)
        self._worker_tasks: list[asyncio.Task[Any]] = []
        # Referenced inputs are read apart from the workers (see ``_fetch_input``).
        self._fetches: set[asyncio.Task[Any]] = set()
        self._reject_kind = sorted(config.kinds)[0]
        #: kinds whose requests name models: their groups route by model (fx_node.routing)
        self.model_kinds = (frozenset(config.kinds) - frozenset(config.handlers)
                            if config.route_by_model else frozenset())
        #: speculative reads of the model kinds (never a kind handler), when on
        self.speculation: SpeculativeReader | None = None
        if config.speculative_reads:
            self.speculation = SpeculativeReader(
                node, self._state, self.engines, metrics,
                frozenset(config.kinds) - frozenset(config.handlers),
                threads=self.answerer.threads)
            node.prepared = self.speculation.take

    @property
    def state(self) -> ExecutorState:
        """The admission state."""
        return self._state

    # ------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """The input reader's clients, the preloaded models, the workers."""
        assert self.node.probe is not None
        await self.inputs.start(self.node.probe, self.node.producer)
        preload = (self.engines.store.hashes() if self.config.preload == "all"
                   else list(self.config.preload))
        for model_hash in preload:
            try:
                await asyncio.to_thread(self.engines.ensure_loaded, model_hash)
            except OutcomeError as exc:
                log.error("preloading %s failed: %s", model_hash, exc)
        if self._signs_receipts():
            await self.answerer.check_ledger()
        self._worker_tasks = [asyncio.create_task(self.answerer.worker())
                              for _ in range(self.config.workers)]
        if self.speculation is not None:
            await self.speculation.start()
            self._worker_tasks.append(asyncio.create_task(self.speculation.run()))

    def _signs_receipts(self) -> bool:
        """Whether the store holds a model whose engine signs receipts (an integer artifact):
        then the node's ledger is checked at start, not at its first receipt."""
        from executor.engines.integer import ENGINE

        store = self.engines.store
        for model_hash in store.hashes():
            try:
                if store.manifest(model_hash, stat=False).engine == ENGINE:
                    return True
            except (OSError, ValueError):
                continue
        return False

    def tasks(self) -> list[asyncio.Task[Any]]:
        """The workers."""
        return self._worker_tasks

    def started(self) -> None:
        """Log the start line."""
        cfg = self.config
        log.info(
            "executor %s serving %s on %s (pattern %s), key %s, http port %s",
            cfg.node_id, dict(cfg.kinds), cfg.bootstrap, cfg.topic_pattern,
            self.node.identity.key_id, self.node.http_port,
        )

    async def drain(self) -> None:
        """Give in-flight requests ``shutdown_grace_s`` to finish, then answer the rest with
        ``error``/``shutdown``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_grace_s
        while self.state.in_flight and loop.time() < deadline and self.node.fatal is None:
            await asyncio.sleep(0.05)
        await finish([*self._worker_tasks, *self.answerer.run_waits], timeout=0.0)
        # inputs still being read: their requests are answered ``shutdown`` below
        await finish(list(self._fetches), timeout=0.0)
        await self.node.await_background()
        queued = {j.job.effect_id: j for j in self.scheduler.drain()}
        leftover = list(self.state.in_flight.values())
        if leftover and self.node.producer.current is not None and self.node.fatal is None:
            log.warning("answering %d in-flight requests with error/shutdown", len(leftover))
            for job in leftover:
                tracked = queued.get(job.effect_id)
                kind = job.request.effect_kind
                with contextlib.suppress(KafkaError):
                    await self.answerer.answer(
                        job,
                        self.state.refusal_executor,
                        None,
                        EngineError("shutdown", "the executor stopped before finishing it"),
                        kind=kind,
                        tp=(job.topic, job.partition),
                        tracker=self.node.trackers.get(kind),
                        read_mono=tracked.read_mono if tracked else None,
                    )
        for job in self.state.abandon():  # only left when the producer failed
            log.error("abandoned accepted request %s (the lease holder will see unknown)",
                      job.effect_id)

    async def close(self) -> None:
        """Stop the input reader's clients and the engine threads."""
        await self.inputs.close()
        if self.speculation is not None:
            await self.speculation.close()
        self.answerer.threads.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------------ requests
    async def skipped(self, kind: str, msg: Any, why: Skip, detail: str, *,
                      code: RejectCode | None = None,
                      request: EffectRequest | None = None) -> None:
        """Count a record the shell passed over, and record the ones that are somebody's
        mistake on ``sys.rejects`` (once per node: by the consumer of its first kind)."""
        if why in ("mirrored_copy", "not_a_request", "not_holder"):
            self.metrics.ignored.labels(why).inc()
        if why == "undecodable" and kind == self._reject_kind:
            assert code is not None
            await self._reject(msg, code, detail)
        elif why == "other_kind":
            if detail not in self.config.kinds and kind == self._reject_kind:
                self.metrics.ignored.labels("kind_not_served").inc()
        elif why in ("wrong_workload", "not_holder"):
            await self._reject(msg, why, detail)

    async def handle(self, read: Read) -> None:
        """Decide on a request (steps 2 and 3 of the module docstring)."""
        kind, msg, record = read.kind, read.msg, read.request
        if self.speculation is not None and kind in self.speculation.kinds:
            self.metrics.speculative.labels("miss" if read.prepared is None else "hit").inc()
        await self._wait_for_room(kind, record)
        status = await self.engines.request_status(kind, record)
        now_ns = time.time_ns()
        self.metrics.read_lag_seconds.labels(kind).observe(
            max(0.0, now_ns / 1e9 - msg.timestamp / 1e3)
        )
        decision = decide(
            self.state,
            record,
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            append_ms=msg.timestamp,
            now_ms=now_ns // 1_000_000,
            now_us=now_ns // 1000,
            model_status=status,
            request_hash=request_hash(msg.value),
        )
        read_mono = time.monotonic()
        if isinstance(decision, Ignore):
            self.metrics.ignored.labels("in_flight").inc()
            read.done_unless_in_flight(self.state)
        elif isinstance(decision, Refuse):
            self.node.spawn(self._write_refusal(decision.response, read, read_mono))
        elif isinstance(decision, Admit):
            ack, gen, accepted = await self.node.accept(decision.accepted)
            queue_key = record.model or HANDLER_KEY + kind  # a kind without a model: its handler
            j = Job(decision.job, kind, queue_key, ack, read_mono, read.key, read.tracker,
                    accepted, gen)
            pre = read.prepared if isinstance(read.prepared, Prepared) else None
            ran = SpeculativeReader.finished(pre) if pre is not None else None
            if (ran is None and pre is not None and pre.running is not None
                    and self.speculation is not None):
                # its model runs in the engine pool since its uncommitted read
                self.node.spawn(self.speculation.answer_running(j, pre.running, self.answerer))
            elif not await self.answerer.answer_now(j, ran):
                self._start_fetch(j)

    async def _write_refusal(self, response: ResponseRecord, read: Read,
                             read_mono: float) -> None:
        value = self.node.identity.sign_and_encode(response)
        topic = topics.resp_for(response.header.workload_id, response.header.shadow)
        await self.node.producer.produce("response", topic, value, response.effect_id.encode())
        code = response.error.code if response.error else ""
        self.metrics.requests.labels(read.kind, response.outcome, code).inc()
        self.metrics.request_seconds.labels(read.kind, response.outcome).observe(
            time.monotonic() - read_mono
        )
        log.info("%s %s %s", response.effect_id, response.outcome, code)
        read.done()

    async def _wait_for_room(self, kind: str, record: EffectRequest) -> None:
        """Hold the read of ``record`` while ``kind``'s queue is full, up to
        ``backpressure_wait_s`` (and never past the request's own in-flight duplicate, its
        stop, or the service's): then :func:`fx_node.admission.decide` judges it as it is, which
        answers ``backpressure`` only if the queue is still full. Requests behind it on the log
        wait unread, which is the log's own flow control."""
        limit = self.state.queue_limits.get(kind)
        wait = self.config.backpressure_wait_s
        if limit is None or wait <= 0 or record.effect_id in self.state.in_flight:
            return
        if self.state.queue_depth(kind) < limit:
            return
        self.metrics.queue_full_waits.labels(kind).inc()
        give_up = time.monotonic() + wait
        while (self.state.queue_depth(kind) >= limit and not self.node.stopping
               and time.monotonic() < give_up):
            await asyncio.sleep(0.01)

    def claim_undecodable(self, code: str) -> None:
        """Count an undecodable record on ``.claims``/``.spec``."""
        self.metrics.rejected.labels(code).inc()

    def claim_refused(self, msg: Any, code: RejectCode, detail: str) -> None:
        """A claim refused by the claims reader (``epoch_jump``): to ``sys.rejects``."""
        self.node.spawn(self._reject(msg, code, detail))

    async def _reject(self, msg: Any, code: RejectCode, detail: str) -> None:
        self.metrics.rejected.labels(code).inc()
        value = msg.value or b""
        log.warning(
            "rejected record at %s/%d offset %d (%d bytes): %s: %s",
            msg.topic, msg.partition, msg.offset, len(value), code, detail[:300],
        )
        record = RejectedRecord(
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            code=code,
            detail=detail[:4096],
            size=len(value),
            value_hash=sha256_hex(value),
            seen_by=self.config.node_id,
        )
        await self.node.producer.produce("reject", topics.REJECTS, encode(record),
                                         msg.topic.encode())

    # ------------------------------------------------------------------------------ inputs
    async def _fetch_input(self, j: Job) -> None:
        """Read ``j``'s input, then queue ``j`` for a worker (or answer it with the error).

        Runs as its own task, holding one of ``input_fetchers`` slots while it reads a reference:
        a slow or missing input delays only its own request, never a worker or a request behind
        it. It gives up when the request's executor lease lapses (the holder has written
        ``unknown`` by then, and an answer would only be passed over)."""
        body = j.job.request.input
        reader = j.job.request.header.workload_id
        try:
            if body is None or isinstance(body, InlineBody):
                j.data = await self.inputs.resolve(body, reader=reader)
            else:
                spec = self.state.workload(reader).spec
                lease_ms = spec.executor_lease_ms if spec is not None else 30_000
                give_up_at = j.read_mono + lease_ms / 1000
                async with self.inputs.slots:
                    j.data = await self.inputs.resolve(body, reader=reader,
                                                       give_up_at=give_up_at)
        except OutcomeError as exc:
            # the error answer follows its accepted on .resp
            await self.answerer.accepted_written(j)
            self.answerer.answer_job(j, self.state.refusal_executor, None, exc)
            return
        await self.scheduler.put(j)

    def _start_fetch(self, j: Job) -> None:
        task = self.node.spawn(self._fetch_input(j))
        assert isinstance(task, asyncio.Task)
        self._fetches.add(task)
        task.add_done_callback(self._fetches.discard)

    # ------------------------------------------------------------------------------ facts, HTTP
    def facts(self) -> FactsRecord:
        """This node's facts (the loaded-models gauge set on the way)."""
        engines = self.engines.engine_list()
        facts = build_facts(
            node_id=self.config.node_id,
            queue_limits=self.config.kinds,
            models_present=self.engines.store.hashes(),
            models_loaded=self.engines.loaded_models(),
            engines={e.name: e.version for e in engines},
            accelerators=(["cuda"] if any(e.device_class == "cuda" for e in engines) else []),
            public_key_b64=self.node.identity.public_key_b64,
            key_id=self.node.identity.key_id,
            now_us=now_us(),
            accelerator_devices=node_devices(self.config.device),
            parity_gates=[g for e in engines for g in getattr(e, "parity_gates", tuple)()],
            chunk_store=self.config.chunk_backend,
            onnx_provider=next((e.provider_fact() for e in engines
                                if hasattr(e, "provider_fact")), None),
        )
        self.metrics.models_loaded.set(len(facts.models_loaded))
        return facts

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when every preloaded model is loaded."""
        wanted = set(
            self.engines.store.hashes() if self.config.preload == "all" else self.config.preload
        )
        missing = sorted(wanted - self.engines.loaded_models())
        return not missing, {"models_missing": missing}

    def refresh_gauges(self) -> None:
        """The queue gauges, per kind and per workload."""
        for kind in self.config.kinds:
            self.metrics.queue_depth.labels(kind).set(self.state.queue_depth(kind))
        depth = self.state.depth_by_workload()
        for wid in list(self.state.workloads):
            self.metrics.workload_queue_depth.labels(wid).set(depth.get(wid, 0))
