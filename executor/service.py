"""The executor service: a thin aiokafka shell around :mod:`fx_node.admission`.

Per effect kind served, one consumer in group ``<group_prefix>.<kind>`` subscribed by pattern to
``wl.*.out`` (narrowed by ``topic_pattern``). For every record read:

1. decode it; an undecodable record, or one of a kind that does not belong on ``.out``
   (``wrong_stream``: a claim, a response...), is counted
   (``fx_executor_rejected_records_total{code}``), logged with topic/partition/offset, written to
   ``sys.rejects`` and passed;
2. catch up on the workload's ``.claims`` and ``.spec`` (a side consumer reads both up to their end
   offsets at reading time), check the model store, and ask :func:`fx_node.admission.decide`;
3. refusals and backpressure: one signed ``response``; admitted: ``accepted`` (acks=all), then the
   job's input is read in a task of its own (at most ``input_fetchers`` at once; a stream reference
   is checked against the cluster metadata first, so a missing topic is a prompt ``input_missing``
   and is never created), and only then does the job go to the scheduler, which hands batches of
   jobs for one model to a worker: no worker waits on one request's input while others queue; the
   engine runs in a thread pool, so the event loop (and the consumer's heartbeat) never waits on it;
   A request with an inline input for a loaded model that runs in microseconds (its last run
   cost under ``executor.answering._INLINE_RUN_S``) skips the queue: the model runs in the
   consumer loop and the response is put on the producer right behind the ``accepted``, so
   both go in one produce request (inference acts on nothing, so the model need not wait for
   the ``accepted`` ack; the request is settled only once both are acknowledged);
4. the signed response is written (acks=all; the responses of a batch are put on the producer
   together and their acks awaited together); only then is the request's offset settled, and
   the consumer commits the lowest unsettled offset of each partition it still owns.

The service is split by job: this module holds the lifecycle, the consume loop, admission and
the model store's answers; :mod:`executor.scheduler` the admission queue;
:mod:`executor.inputs` input reading; :mod:`executor.answering` the workers and the response
writer; :mod:`executor.producing` the producer (sends that ride out a broker restart).

Restart semantics: a request whose response was not committed past is read again by whichever
member owns the partition next and answered again under the same effect id (the lease holder
merges the first answer and passes over the rest). The executor does not look for its own earlier
response on ``.resp``: inference has no side effects, so answering twice is harmless and the
check would cost a read of ``.resp`` per request.

Broker restarts: the service rides them out in the same process and loses nothing. aiokafka
reconnects by itself (the idempotent producer never expires a batch, fetches and commits retry,
the group consumer re-joins when its session expired meanwhile); what still fails while the broker
is away (:func:`fx_kafka.retry.broker_unavailable`: a send that timed out waiting for metadata, a
lost ``accepted`` ack, a commit, a poll, a stream read) is retried with backoff, counted in
``fx_executor_broker_retries_total{op}`` and logged as ``broker unavailable``. A retried send may
put a record on the log twice; for ``response`` and ``accepted`` that is the "answered twice"
case above. A commit that fails is left to the next poll: the offset is settled, only its commit
waits, and a request whose commit was lost is answered again. A stream input that cannot be
read while the broker is down is waited for, in its own fetch task, and answered ``input_missing``
only once the request's executor lease has lapsed (the holder has written ``unknown`` by then).

Shutdown (SIGTERM): stop reading, give in-flight requests ``shutdown_grace_s`` to finish, then
answer every request still in flight with ``error``/``shutdown`` (retriable) and commit. Only a
crash (SIGKILL, power loss) leaves an accepted request without a response; the lease holder then
writes ``unknown`` when the executor lease lapses, or the restarted executor answers it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaError,
)

from broker_schema import DecodeError, topics
from broker_schema.canonical import sha256_hex
from broker_schema.codec import decode, encode, request_hash
from broker_schema.records import (
    AcceptedRecord,
    EffectRequest,
    ExecutorInfo,
    InlineBody,
    RejectCode,
    RejectedRecord,
    ResponseRecord,
)
from broker_schema.signatures import HOLDER_SIG_HEADER
from executor.accelerators import node_devices
from executor.answering import AnswerMixin, _now_us
from executor.chunks import ChunkStore, FsChunkStore, KafkaChunkStore
from executor.config import ExecutorConfig
from executor.engines import (
    BUILTIN_ENGINES,
    Engine,
    EngineOptions,
    KindHandler,
    build_engine,
    build_handler,
)
from executor.inputs import InputsMixin
from executor.ledger import LedgerWriter
from executor.metrics import ExecutorMetrics
from executor.models import ModelManifest, ModelStore
from executor.producing import PRODUCER_BATCH_BYTES, ProducerMixin, _close_quietly
from executor.scheduler import HANDLER_KEY, Job, Scheduler
from fx_kafka.client import (
    MIRROR_OFFSET_HEADER,
    header_value,
    make_consumer,
    make_producer,
    mirror_header,
    wait_ready,
)
from fx_kafka.retry import broker_unavailable
from fx_kafka.workload import ensure_system_topics
from fx_node.admission import (
    Admit,
    ExecutorState,
    Ignore,
    ModelStatus,
    OffsetTracker,
    Refuse,
    decide,
    holder_problem,
    renewal_due,
    renewed,
)
from fx_node.errors import EngineError, ModelError, OutcomeError
from fx_node.facts import build_facts, facts_changed
from fx_node.identity import NodeIdentity
from fx_node.sync import ClaimsSpecReader, catch_up

__all__ = ["ExecutorService", "executor_version"]

log = logging.getLogger(__name__)


def executor_version() -> str:
    """The installed ``ninelives-fx`` version."""
    try:
        return importlib.metadata.version("ninelives-fx")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


class ExecutorService(ProducerMixin, InputsMixin, AnswerMixin):
    """One executor node. ``await run()`` until :meth:`request_stop` (or SIGTERM in the CLI)."""

    def __init__(
        self,
        config: ExecutorConfig,
        *,
        identity: NodeIdentity | None = None,
        engines: dict[str, Engine] | None = None,
    ) -> None:
        self.config = config
        self.identity = identity or NodeIdentity.load_or_create(config.key_file,
                                                                config.key_type)
        self.store = ModelStore(config.model_dir)
        self.metrics = ExecutorMetrics()
        self._engine_targets = {**BUILTIN_ENGINES, **config.engines}
        self._engine_options = EngineOptions(
            intra_op_threads=config.intra_op_threads,
            device=config.device,
            node_id=config.node_id,
            identity=self.identity,
            receipt_chain_file=config.receipt_chain_file,
            integer_backend=config.integer_backend,
            parity_failure=config.parity_failure,
            on_parity_gate=self.metrics.observe_parity_gate,
        )
        self._engines_lock = threading.Lock()
        self._engines: dict[str, Engine] = dict(engines or {})
        if "onnxruntime" not in self._engines:
            self._engines["onnxruntime"] = build_engine(
                self._engine_targets["onnxruntime"], self._engine_options
            )
        #: kinds served without a model (``handlers``): their jobs queue under HANDLER_KEY+kind
        self._handlers: dict[str, KindHandler] = {
            kind: build_handler(target, self._engine_options)
            for kind, target in config.handlers.items()}
        device = "cuda" if any(e.device_class == "cuda" for e in self._engines.values()) else "cpu"
        self.state = ExecutorState(
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
            self.metrics.queue_limit.labels(kind).set(limit)
        self._trackers = {kind: OffsetTracker() for kind in config.kinds}
        self._consumers: dict[str, AIOKafkaConsumer] = {}
        self._producer: AIOKafkaProducer | None = None
        self._producer_gen = 0
        self._renew_lock = asyncio.Lock()
        self._retired: set[asyncio.Task[Any]] = set()
        self._side: AIOKafkaConsumer | None = None
        self._sync: ClaimsSpecReader | None = None
        # Referenced inputs are read apart from the workers, at most ``input_fetchers`` at once
        # (one idle stream consumer each, made on first use): see ``_fetch_input``.
        self._fetch_slots = asyncio.Semaphore(config.input_fetchers)
        self._fetches: set[asyncio.Task[Any]] = set()
        self._streams: list[AIOKafkaConsumer] = []
        self._all_streams: set[AIOKafkaConsumer] = set()
        # Offset look-ups go through a consumer that fetches nothing: on a consumer with an
        # assignment, a ListOffsets request queues behind the in-flight long-poll fetch on the
        # same connection and waits up to fetch_max_wait_ms (500 ms) for it.
        self._probe: AIOKafkaConsumer | None = None
        self.chunks: ChunkStore = FsChunkStore(config.chunk_dir)
        self._scheduler = Scheduler()
        self._pool = ThreadPoolExecutor(
            max_workers=config.workers, thread_name_prefix="fx-engine"
        )
        self._consume_tasks: list[asyncio.Task[Any]] = []
        self._worker_tasks: list[asyncio.Task[Any]] = []
        #: the workers' engine batches being awaited (``AnswerMixin._finish_run``)
        self._run_waits: set[asyncio.Task[Any]] = set()
        self._misc_tasks: list[asyncio.Task[Any]] = []
        #: the latest ``accepted`` of each request in flight (renewed by _lease_renewer)
        self._leases: dict[str, AcceptedRecord] = {}
        #: how often the renewer looks: often enough for the shortest lease in sight
        self._renew_check_s = 0.2
        self._http_task: asyncio.Task[Any] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self._stopping = False
        self._fatal: BaseException | None = None
        self._facts: Any = None
        self._http: Any = None  # fx_node.http.UvicornServer, imported with HTTP only
        self._started = False
        self._reject_kind = sorted(config.kinds)[0]
        #: this node's receipt ledger (sys.ledger.<node>), made on the first receipt
        self._ledger: LedgerWriter | None = None
        #: model hash -> seconds per request of its last engine run (see _runs_inline)
        self._run_cost: dict[str, deque[float]] = {}
        self._infos: dict[tuple[str, str, str], ExecutorInfo] = {}
        self._facts_pending = False
        #: requests answered in the consumer loop, waiting for their acks (_settle_answered)
        self._settle_queue: deque[
            tuple[Job, str, bytes, ResponseRecord, asyncio.Future[Any] | None, int]] = deque()
        self._settler: asyncio.Future[Any] | None = None

    # ------------------------------------------------------------------------------ lifecycle
    @property
    def http_port(self) -> int | None:
        """The bound HTTP port (after start), or None without HTTP."""
        return self._http.port if self._http else None

    async def start(self) -> None:
        """Connect, create system topics, load models, publish facts, start consuming."""
        cfg = self.config
        await wait_ready(cfg.bootstrap, 30.0)
        await ensure_system_topics(cfg.bootstrap)
        self._producer = make_producer(cfg.bootstrap, max_batch_size=PRODUCER_BATCH_BYTES)
        await self._producer.start()
        self._probe = make_consumer(cfg.bootstrap, isolation_level="read_uncommitted")
        await self._probe.start()
        if cfg.chunk_backend == "kafka":
            kstore = KafkaChunkStore(cfg.bootstrap, self._producer, FsChunkStore(cfg.chunk_dir))
            await kstore.start()
            self.chunks = kstore
        self._side = make_consumer(cfg.bootstrap, isolation_level="read_uncommitted")
        await self._side.start()
        self._sync = ClaimsSpecReader(
            self.state, self._side, self._probe,
            on_undecodable=lambda code: self.metrics.rejected.labels(code).inc(),
            on_rejected=self._reject_claim)
        preload = self.store.hashes() if cfg.preload == "all" else list(cfg.preload)
        for model_hash in preload:
            try:
                await asyncio.to_thread(self._ensure_loaded, model_hash)
            except OutcomeError as exc:
                log.error("preloading %s failed: %s", model_hash, exc)
        await self._publish_facts(force=True)
        for kind in cfg.kinds:
            consumer = make_consumer(
                cfg.bootstrap,
                group_id=cfg.group_id(kind),
                metadata_max_age_ms=cfg.metadata_max_age_ms,
                session_timeout_ms=cfg.session_timeout_ms,
                heartbeat_interval_ms=cfg.heartbeat_interval_ms,
                max_poll_interval_ms=300_000,
                client_id=f"{cfg.node_id}.{kind}",
                # One partition per workload topic: the default range assignor would give every
                # topic's partition 0 to the same member. Round robin spreads workloads.
                partition_assignment_strategy=(RoundRobinPartitionAssignor,),
            )
            await consumer.start()
            consumer.subscribe(pattern=cfg.topic_pattern, listener=_Listener(self, kind, consumer))
            self._consumers[kind] = consumer
            self._consume_tasks.append(asyncio.create_task(self._consume(kind, consumer)))
        for _ in range(cfg.workers):
            self._worker_tasks.append(asyncio.create_task(self._worker()))
        if cfg.facts_interval_s > 0:
            self._misc_tasks.append(asyncio.create_task(self._facts_ticker()))
        self._misc_tasks.append(asyncio.create_task(self._lease_renewer()))
        if cfg.http_port is not None:
            from fx_node.http import UvicornServer, create_app

            self._http = UvicornServer(create_app(self), cfg.http_host, cfg.http_port)
            self._http_task = asyncio.create_task(self._http.server.serve())
            for _ in range(100):
                if self._http.server.started:
                    break
                await asyncio.sleep(0.02)
        self._started = True
        log.info(
            "executor %s serving %s on %s (pattern %s), key %s, http port %s",
            cfg.node_id, dict(cfg.kinds), cfg.bootstrap, cfg.topic_pattern,
            self.identity.key_id, self.http_port,
        )

    def request_stop(self) -> None:
        """Ask :meth:`run` to shut down gracefully (safe from a signal handler)."""
        self._stop.set()

    async def run(self) -> None:
        """Start, serve until :meth:`request_stop` or a fatal error, then shut down."""
        try:
            await self.start()
            watch = asyncio.create_task(self._stop.wait())
            tasks = [*self._consume_tasks, *self._worker_tasks, *self._misc_tasks]
            await asyncio.wait([watch, *tasks], return_when=asyncio.FIRST_COMPLETED)
            watch.cancel()
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    self._fatal = self._fatal or task.exception()
        finally:
            await self.stop()
        if self._fatal is not None:
            raise self._fatal

    async def stop(self) -> None:
        """Graceful shutdown (see the module docstring). Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        loop = asyncio.get_running_loop()
        await _finish(self._consume_tasks, timeout=5.0)
        deadline = loop.time() + self.config.shutdown_grace_s
        while self.state.in_flight and loop.time() < deadline and self._fatal is None:
            await asyncio.sleep(0.05)
        await _finish([*self._worker_tasks, *self._run_waits], timeout=0.0)
        # inputs still being read: their requests are answered ``shutdown`` below
        await _finish(list(self._fetches), timeout=0.0)
        await self._await_background()
        queued = {j.job.effect_id: j for j in self._scheduler.drain()}
        leftover = list(self.state.in_flight.values())
        if leftover and self._producer is not None and self._fatal is None:
            log.warning("answering %d in-flight requests with error/shutdown", len(leftover))
            for job in leftover:
                tracked = queued.get(job.effect_id)
                kind = job.request.effect_kind
                with contextlib.suppress(KafkaError):
                    await self._answer(
                        job,
                        self.state.refusal_executor,
                        None,
                        EngineError("shutdown", "the executor stopped before finishing it"),
                        kind=kind,
                        tp=(job.topic, job.partition),
                        tracker=self._trackers.get(kind),
                        read_mono=tracked.read_mono if tracked else None,
                    )
        for job in self.state.abandon():  # only left when the producer failed
            log.error("abandoned accepted request %s (the lease holder will see unknown)",
                      job.effect_id)
        await _finish(self._misc_tasks, timeout=0.0)
        for kind, consumer in self._consumers.items():
            with contextlib.suppress(KafkaError, IllegalStateError, CommitFailedError):
                await self._commit(kind, consumer)
            await consumer.stop()
        for c in (self._side, self._probe, *self._all_streams):
            if c is not None:
                with contextlib.suppress(KafkaError):
                    await c.stop()
        if isinstance(self.chunks, KafkaChunkStore):
            await self.chunks.stop()
        if self._retired:
            await asyncio.gather(*self._retired, return_exceptions=True)
        if self._producer is not None:
            await _close_quietly(self._producer, max(1.0, self.config.shutdown_grace_s))
        if self._http is not None and self._http_task is not None:
            self._http.server.should_exit = True
            await _finish([self._http_task], timeout=5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        log.info("executor %s stopped", self.config.node_id)

    async def _await_background(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)

        def _done(t: asyncio.Task[Any]) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("executor task failed: %r", t.exception())
                self._fatal = self._fatal or t.exception()
                self._stop.set()

        task.add_done_callback(_done)
        return task

    # ------------------------------------------------------------------------------ models
    def _engine_for(self, manifest: ModelManifest) -> Engine:
        """The engine named by ``manifest``, built on first use (from the event loop or a worker
        thread: the lock keeps it to one instance)."""
        with self._engines_lock:
            engine = self._engines.get(manifest.engine)
            if engine is None:
                target = self._engine_targets.get(manifest.engine)
                if target is None:
                    raise ModelError(
                        "model_unknown", f"model {manifest.hash} needs engine "
                        f"{manifest.engine!r}, which this executor does not have"
                    )
                try:
                    engine = build_engine(target, self._engine_options)
                except (ImportError, OSError, ValueError, TypeError) as exc:
                    raise ModelError(
                        "model_unknown", f"engine {manifest.engine!r} ({target}) cannot be "
                        f"built here: {type(exc).__name__}: {exc}"
                    ) from exc
                self._engines[manifest.engine] = engine
            return engine

    def _ensure_loaded(self, model_hash: str) -> tuple[Engine, ModelManifest]:
        """Load ``model_hash`` into its engine from hash-checked bytes (runs in a thread)."""
        manifest = self.store.manifest(model_hash)
        engine = self._engine_for(manifest)
        if model_hash in engine.loaded() and self.store.status(model_hash) == "ready":
            return engine, manifest
        try:
            data = self.store.read_verified(model_hash)
        except ModelError as exc:
            engine.unload(model_hash)
            self.metrics.model_load_failures.labels(exc.code).inc()
            raise
        try:
            engine.load(manifest, data)
        except Exception as exc:
            # An engine that cannot load a (hash-checked) file answers those requests with an
            # error; it must never take the worker, and with it the service, down.
            err = exc if isinstance(exc, OutcomeError) else EngineError(
                "engine_error", f"{manifest.engine} cannot load {model_hash}: "
                f"{type(exc).__name__}: {exc}")
            self.metrics.model_load_failures.labels(err.code).inc()
            log.error("loading %s failed: %s", model_hash, err)
            raise err from exc
        return engine, manifest

    async def _request_status(self, kind: str, record: EffectRequest) -> ModelStatus:
        """What :func:`fx_node.admission.decide` is told of the request's model: the store's answer
        for the hash it names; ``ready`` for a kind served without a model (``handlers``) that
        names none, ``absent`` for one that names a model anyway (and for any other kind that
        names none: inference needs one)."""
        if kind in self._handlers:
            return "absent" if record.model else "ready"
        return await self._model_status(record.model) if record.model else "absent"

    async def _model_status(self, model_hash: str | None) -> ModelStatus:
        if model_hash is None:
            return "absent"
        try:
            manifest = self.store.manifest(model_hash)
            self._engine_for(manifest)
        except ModelError:
            return "absent"
        if self.store.needs_hashing(model_hash):
            status = await asyncio.to_thread(self.store.status, model_hash)
        else:
            status = self.store.status(model_hash)
        if status == "corrupt":
            for engine in self._engine_list():
                engine.unload(model_hash)
            self.metrics.model_load_failures.labels("model_hash_mismatch").inc()
            log.error("model %s fails its hash check in %s", model_hash, self.store.root)
            self._spawn(self._publish_facts())
        return status

    def _loaded_models(self) -> set[str]:
        return {h for e in self._engine_list() for h in e.loaded()}

    def _engine_list(self) -> list[Engine]:
        """The engines built so far (a worker thread may be building one right now)."""
        with self._engines_lock:
            return list(self._engines.values())

    # ------------------------------------------------------------------------------ facts
    def _build_facts(self) -> Any:
        return build_facts(
            node_id=self.config.node_id,
            queue_limits=self.config.kinds,
            models_present=self.store.hashes(),
            models_loaded=self._loaded_models(),
            engines={e.name: e.version for e in self._engine_list()},
            accelerators=(
                ["cuda"] if any(e.device_class == "cuda" for e in self._engine_list()) else []
            ),
            public_key_b64=self.identity.public_key_b64,
            key_id=self.identity.key_id,
            now_us=_now_us(),
            accelerator_devices=node_devices(self.config.device),
            parity_gates=[g for e in self._engine_list()
                          for g in getattr(e, "parity_gates", tuple)()],
        )

    def _facts_if_changed(self) -> None:
        """Publish facts when the loaded models differ from the last published (a model was
        just loaded): not once per batch. What else changes (a file added to the store) is
        published by the facts ticker."""
        if self._facts_pending:
            return
        if self._facts is not None and set(self._facts.models_loaded) == self._loaded_models():
            return
        self._facts_pending = True

        async def publish() -> None:
            try:
                await self._publish_facts()
            finally:
                self._facts_pending = False

        self._spawn(publish())

    async def _publish_facts(self, *, force: bool = False) -> None:
        facts = self._build_facts()
        self.metrics.models_loaded.set(len(facts.models_loaded))
        if not force and not facts_changed(self._facts, facts):
            return
        self._facts = facts
        await self._produce("facts", topics.FACTS, encode(facts), self.config.node_id.encode())

    async def _lease_renewer(self) -> None:
        """Keep the requests in flight alive: while one is accepted and not yet answered, its
        ``accepted`` is written again each third of its lease
        (:func:`fx_node.admission.renewal_due`),
        so a long request (an LLM generation on a busy node) is not written ``unknown`` by the
        holder while it still runs. A renewal the broker refuses is retried on the next round."""
        while True:
            await asyncio.sleep(self._renew_check_s)
            now_us = time.time_ns() // 1000
            for effect_id, accepted in list(self._leases.items()):
                if effect_id not in self.state.in_flight:
                    self._leases.pop(effect_id, None)
                    continue
                if not renewal_due(accepted, now_us):
                    continue
                fresh = renewed(accepted, now_us)
                try:
                    topic = topics.resp_for(fresh.header.workload_id, fresh.header.shadow)
                    await self._produce("accepted", topic, encode(fresh), effect_id.encode())
                except KafkaError as exc:
                    log.warning("lease renewal of %s not written: %r", effect_id, exc)
                    continue
                if effect_id in self.state.in_flight:
                    self._leases[effect_id] = fresh
                self.metrics.lease_renewals.inc()
                log.debug("%s lease renewed", effect_id)

    async def _facts_ticker(self) -> None:
        while True:
            await asyncio.sleep(self.config.facts_interval_s)
            await self._publish_facts(force=True)

    # ------------------------------------------------------------------------------ HTTP view
    def is_live(self) -> bool:
        """The loops run and nothing fatal happened."""
        return self._started and not self._stopping and self._fatal is None

    async def readiness(self) -> dict[str, Any]:
        """Ready: the broker answers a metadata request and every preloaded model is loaded."""
        broker_ok = False
        if self._producer is not None and not self._stopping:
            try:
                await asyncio.wait_for(self._producer.client.fetch_all_metadata(), 3.0)
                broker_ok = True
            except (KafkaError, OSError, TimeoutError):
                broker_ok = False
        wanted = set(
            self.store.hashes() if self.config.preload == "all" else self.config.preload
        )
        missing = sorted(wanted - self._loaded_models())
        return {
            "ready": self._started and broker_ok and not missing,
            "broker": broker_ok,
            "models_missing": missing,
        }

    def current_facts(self) -> dict[str, Any] | None:
        """The last published facts as JSON."""
        return None if self._facts is None else self._facts.model_dump(mode="json")

    def metrics_text(self) -> bytes:
        """Prometheus text (queue gauges refreshed first)."""
        self._refresh_gauges()
        return self.metrics.render()

    def _refresh_gauges(self) -> None:
        for kind in self.config.kinds:
            self.metrics.queue_depth.labels(kind).set(self.state.queue_depth(kind))
        depth = self.state.depth_by_workload()
        for wid in list(self.state.workloads):
            self.metrics.workload_queue_depth.labels(wid).set(depth.get(wid, 0))

    # ------------------------------------------------------------------------------ consuming
    async def _consume(self, kind: str, consumer: AIOKafkaConsumer) -> None:
        tracker = self._trackers[kind]
        failures = 0
        while not self._stopping:
            try:
                batch = await consumer.getmany(timeout_ms=200, max_records=500)
                failures = 0
            except KafkaError as exc:
                if not broker_unavailable(exc):
                    raise
                failures += 1
                await self._broker_wait("poll", kind, exc, failures)
                continue
            synced: set[str] = set()
            for tp, msgs in batch.items():
                for msg in msgs:
                    if self._stopping:
                        break
                    await self._handle(kind, tracker, tp, msg, synced)
            await self._commit(kind, consumer)

    async def _commit(self, kind: str, consumer: AIOKafkaConsumer) -> None:
        tracker = self._trackers[kind]
        owned = {(tp.topic, tp.partition): tp for tp in consumer.assignment()}
        todo = {k: v for k, v in tracker.committable().items() if k in owned}
        if not todo:
            return
        try:
            await consumer.commit({owned[k]: v for k, v in todo.items()})
        except (CommitFailedError, IllegalStateError) as exc:
            log.warning("commit of %s failed (rebalance?): %s", todo, exc)
            return
        except KafkaError as exc:
            if not broker_unavailable(exc):
                raise
            # the offsets stay unsettled-but-answered; the next poll commits them (or, after a
            # crash, their requests are read and answered again: harmless)
            self.metrics.broker_retries.labels("commit").inc()
            log.warning("broker unavailable committing %s: %r; the next poll retries", todo, exc)
            return
        tracker.mark_committed(todo)

    async def _handle(
        self, kind: str, tracker: OffsetTracker, tp: TopicPartition, msg: Any, synced: set[str]
    ) -> None:
        key = (tp.topic, tp.partition)
        tracker.track(key, msg.offset)
        if mirror_header(getattr(msg, "headers", None), MIRROR_OFFSET_HEADER) is not None:
            # a site's request copied to this cluster by `fx mirror`: the site answered it (or
            # will); an answer here would be written into the read-only copy
            self.metrics.ignored.labels("mirrored_copy").inc()
            tracker.done(key, msg.offset)
            return
        try:
            # topic: a record of a kind that does not belong on .out (a claim, a response...) is
            # refused as ``wrong_stream``, recorded and counted like an undecodable one
            record = decode(msg.value, topic=msg.topic)
        except DecodeError as exc:
            if kind == self._reject_kind:
                await self._reject(msg, exc.code, exc.detail)
            tracker.done(key, msg.offset)
            return
        if not isinstance(record, EffectRequest):
            self.metrics.ignored.labels("not_a_request").inc()
            tracker.done(key, msg.offset)
            return
        if record.effect_kind != kind:
            if record.effect_kind not in self.config.kinds and kind == self._reject_kind:
                self.metrics.ignored.labels("kind_not_served").inc()
            tracker.done(key, msg.offset)
            return
        workload_id, shadow = topics.request_topic(msg.topic)
        if record.header.workload_id != workload_id or record.header.shadow != shadow:
            what = (f"shadow evaluation {record.header.shadow} of " if record.header.shadow
                    else "")
            await self._reject(
                msg, "wrong_workload",
                f"request for {what}workload {record.header.workload_id} on {msg.topic}",
            )
            tracker.done(key, msg.offset)
            return
        sync_key = workload_id if shadow is None else f"{workload_id}/{shadow}"
        if sync_key not in synced:
            await self._sync_workload(workload_id, shadow=shadow)
            synced.add(sync_key)
        not_holders = holder_problem(self.state, record, msg.value,
                                     header_value(getattr(msg, "headers", None),
                                                  HOLDER_SIG_HEADER))
        if not_holders is not None:
            # a request its epoch's holder did not sign (front-running): never run, recorded
            self.metrics.ignored.labels("not_holder").inc()
            await self._reject(msg, "not_holder", not_holders)
            tracker.done(key, msg.offset)
            return
        await self._wait_for_room(kind, record)
        status = await self._request_status(kind, record)
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
            job = self.state.in_flight.get(record.effect_id)
            if job is None or (job.topic, job.partition, job.request_offset) != (
                    msg.topic, msg.partition, msg.offset):
                tracker.done(key, msg.offset)
            # else: the very record still in flight here, read again after a rebalance gave
            # the partition back; its response, once acknowledged, settles this offset. Settling
            # it now would commit past a request whose answer is not written yet.
        elif isinstance(decision, Refuse):
            self._spawn(self._write_refusal(decision.response, kind, key, msg.offset, read_mono))
        elif isinstance(decision, Admit):
            accepted = (topics.resp_for(workload_id, shadow), encode(decision.accepted),
                        decision.job.effect_id.encode())
            gen = self._producer_gen
            ack = await self._send_accepted(*accepted)
            queue_key = record.model or HANDLER_KEY + kind  # a kind without a model: its handler
            self._leases[decision.job.effect_id] = decision.accepted
            j = Job(decision.job, kind, queue_key, ack, read_mono, key, tracker, accepted, gen)
            if not await self._answer_now(j):
                self._start_fetch(j)

    async def _write_refusal(
        self, response: ResponseRecord, kind: str, key: tuple[str, int], offset: int,
        read_mono: float,
    ) -> None:
        value = self.identity.sign_and_encode(response)
        topic = topics.resp_for(response.header.workload_id, response.header.shadow)
        await self._produce("response", topic, value, response.effect_id.encode())
        code = response.error.code if response.error else ""
        self.metrics.requests.labels(kind, response.outcome, code).inc()
        self.metrics.request_seconds.labels(kind, response.outcome).observe(
            time.monotonic() - read_mono
        )
        log.info("%s %s %s", response.effect_id, response.outcome, code)
        self._trackers[kind].done(key, offset)

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
        while (self.state.queue_depth(kind) >= limit and not self._stopping
               and time.monotonic() < give_up):
            await asyncio.sleep(0.01)

    def _reject_claim(self, msg: Any, code: RejectCode, detail: str) -> None:
        """A claim refused by the claims reader (``epoch_jump``): to ``sys.rejects``."""
        self._spawn(self._reject(msg, code, detail))

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
        await self._produce("reject", topics.REJECTS, encode(record), msg.topic.encode())

    # ------------------------------------------------------------------------------ claims, spec
    async def _sync_workload(self, workload_id: str, *, shadow: str | None = None,
                             attempt_s: float = 15.0, max_backoff_s: float = 10.0) -> None:
        """Read ``.claims`` and ``.spec`` of ``workload_id`` (and the ``.eval`` of its shadow
        evaluation ``shadow``) up to their end offsets now, retried until it succeeds
        (:func:`fx_node.sync.catch_up`): while it retries, this partition's request stays
        unsettled (never committed), so a restart reads it again."""
        await catch_up(self._sync_workload_inner, workload_id, shadow,
                       on_failure=self.metrics.sync_failures.inc, attempt_s=attempt_s,
                       max_backoff_s=max_backoff_s)

    async def _sync_workload_inner(self, workload_id: str, shadow: str | None = None) -> None:
        assert self._sync is not None
        await self._sync.read(workload_id, shadow)

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
                j.data = await self._resolve(body, reader=reader)
            else:
                spec = self.state.workload(reader).spec
                lease_ms = spec.executor_lease_ms if spec is not None else 30_000
                give_up_at = j.read_mono + lease_ms / 1000
                async with self._fetch_slots:
                    j.data = await self._resolve(body, reader=reader, give_up_at=give_up_at)
        except OutcomeError as exc:
            await self._accepted_written(j)  # the error answer follows its accepted on .resp
            self._answer_job(j, self.state.refusal_executor, None, exc)
            return
        await self._scheduler.put(j)

    def _start_fetch(self, j: Job) -> None:
        task = self._spawn(self._fetch_input(j))
        assert isinstance(task, asyncio.Task)
        self._fetches.add(task)
        task.add_done_callback(self._fetches.discard)

async def _finish(tasks: list[asyncio.Task[Any]], *, timeout: float) -> None:
    """Let ``tasks`` end by themselves for ``timeout`` seconds, then cancel what is left."""
    if not tasks:
        return
    if timeout > 0:
        await asyncio.wait(tasks, timeout=timeout)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """On revoke: wait (bounded) for in-flight requests of the revoked partitions, commit them,
    then forget them, so the next owner starts after what this member answered."""

    def __init__(self, service: ExecutorService, kind: str, consumer: AIOKafkaConsumer) -> None:
        self.service, self.kind, self.consumer = service, kind, consumer

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in revoked]
        if not keys:
            return
        tracker = self.service._trackers[self.kind]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.service.config.revoke_grace_s
        while tracker.pending_in(keys) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        todo = {k: v for k, v in tracker.committable().items() if k in set(keys)}
        if todo:
            try:
                await self.consumer.commit(
                    {TopicPartition(t, p): off for (t, p), off in todo.items()}
                )
                tracker.mark_committed(todo)
            except (CommitFailedError, IllegalStateError, KafkaError) as exc:
                log.warning("commit on revoke failed: %s", exc)
        tracker.forget(keys)
        log.info("%s: partitions revoked: %s", self.kind, sorted(keys))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        log.info("%s: partitions assigned: %s", self.kind, sorted(
            (tp.topic, tp.partition) for tp in assigned))

