"""The executor's engines and the models they hold: engines built on first use, models loaded
from hash-checked bytes, the store's answers for admission (:func:`fx_node.admission.decide` is
told a model's status), and what a batch costs (whether it runs on the event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator

from broker_schema.records import EffectRequest, ExecutorInfo
from executor import affinity
from executor.config import ExecutorConfig
from executor.engines import (
    BUILTIN_ENGINES,
    Engine,
    EngineOptions,
    KindHandler,
    build_engine,
    build_handler,
)
from executor.metrics import ExecutorMetrics
from executor.models import ModelManifest, ModelStore
from executor.scheduler import HANDLER_KEY
from fx_node.admission import ModelStatus
from fx_node.errors import EngineError, ModelError, OutcomeError
from fx_node.identity import NodeIdentity
from fx_node.settings import ConfigError

__all__ = ["INLINE_RUN_S", "EnginePool"]

log = logging.getLogger("executor.service")

#: A model batch whose last run cost less than this runs on the event loop (no thread hop);
#: the hop alone costs about 100 µs of CPU.
INLINE_RUN_S = 0.0005

#: How many recent runs of a model its cost is judged on (see ``runs_inline``).
_COST_RUNS = 8


class EnginePool:
    """The engines of one executor (``engines`` given, the others built on first use), its kind
    handlers, and its model store. ``on_corrupt`` is called when a model fails its hash check
    (its facts changed)."""

    def __init__(self, config: ExecutorConfig, store: ModelStore, metrics: ExecutorMetrics,
                 identity: NodeIdentity, engines: dict[str, Engine] | None,
                 on_corrupt: Callable[[], object]) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self._on_corrupt = on_corrupt
        self._targets = {**BUILTIN_ENGINES, **config.engines}
        self._options = EngineOptions(
            intra_op_threads=config.intra_op_threads,
            device=config.device,
            onnx_provider=config.onnx_provider,
            node_id=config.node_id,
            identity=identity,
            receipt_chain_file=config.receipt_chain_file,
            integer_backend=config.integer_backend,
            parity_failure=config.parity_failure,
            on_parity_gate=metrics.observe_parity_gate,
        )
        self._lock = threading.Lock()
        self._engines: dict[str, Engine] = dict(engines or {})
        if "onnxruntime" not in self._engines:
            self._engines["onnxruntime"] = build_engine(self._targets["onnxruntime"],
                                                        self._options)
        #: kinds served without a model (``handlers``): their jobs queue under HANDLER_KEY+kind
        self.handlers: dict[str, KindHandler] = {
            kind: build_handler(target, self._options)
            for kind, target in config.handlers.items()}
        #: model hash -> seconds per request of its last engine runs (see runs_inline)
        self._run_cost: dict[str, deque[float]] = {}
        self._infos: dict[tuple[str, str, str, str | None], ExecutorInfo] = {}
        self._place_threads()

    # ------------------------------------------------------------------------- CPU placement
    def _place_threads(self) -> None:
        """Apply ``loop_cpus`` to every thread of this process now (the engine's worker threads
        pin themselves to ``engine_cpus`` when they start: :meth:`pin_engine_thread`). Raises
        :class:`ConfigError` when a CPU is not one this process may run on."""
        cfg = self.config
        problem = affinity.cpus_problem(cfg.engine_cpus, cfg.loop_cpus, affinity.allowed_cpus(),
                                        supported=affinity.pinning_supported())
        if problem is not None:
            raise ConfigError(problem)
        if cfg.loop_cpus:
            n = affinity.pin_process(cfg.loop_cpus)
            log.info("%s: the rest of the process (%d threads now, and those it starts) on "
                     "CPUs %s", cfg.node_id, n, affinity.format_cpus(cfg.loop_cpus))
        if cfg.engine_cpus:
            log.info("%s: engine worker threads on CPUs %s", cfg.node_id,
                     affinity.format_cpus(cfg.engine_cpus))

    def pin_engine_thread(self) -> None:
        """The engine thread pool's initializer: pin the calling (new worker) thread to
        ``engine_cpus`` (nothing when empty)."""
        if self.config.engine_cpus:
            affinity.pin_thread(self.config.engine_cpus)
            log.debug("engine thread %s (tid %d) on CPUs %s", threading.current_thread().name,
                      threading.get_native_id(), affinity.format_cpus(self.config.engine_cpus))

    @contextlib.contextmanager
    def _on_engine_cpus(self) -> Iterator[None]:
        """While a model loads: the calling thread on ``engine_cpus`` (its mask restored
        after), so threads the engine starts for the model (ONNX Runtime's intra-op pool) take
        the engine's CPUs, whichever thread loads it."""
        cpus = self.config.engine_cpus
        if not cpus:
            yield
            return
        before = os.sched_getaffinity(0)
        affinity.pin_thread(cpus)
        try:
            yield
        finally:
            os.sched_setaffinity(0, before)

    def engine_for(self, manifest: ModelManifest) -> Engine:
        """The engine named by ``manifest``, built on first use (from the event loop or a worker
        thread: the lock keeps it to one instance)."""
        with self._lock:
            engine = self._engines.get(manifest.engine)
            if engine is None:
                target = self._targets.get(manifest.engine)
                if target is None:
                    raise ModelError(
                        "model_unknown", f"model {manifest.hash} needs engine "
                        f"{manifest.engine!r}, which this executor does not have"
                    )
                try:
                    engine = build_engine(target, self._options)
                except (ImportError, OSError, ValueError, TypeError) as exc:
                    raise ModelError(
                        "model_unknown", f"engine {manifest.engine!r} ({target}) cannot be "
                        f"built here: {type(exc).__name__}: {exc}"
                    ) from exc
                self._engines[manifest.engine] = engine
            return engine

    def ensure_loaded(self, model_hash: str) -> tuple[Engine, ModelManifest]:
        """Load ``model_hash`` into its engine from hash-checked bytes (runs in a thread)."""
        manifest = self.store.manifest(model_hash)
        engine = self.engine_for(manifest)
        if model_hash in engine.loaded() and self.store.status(model_hash) == "ready":
            return engine, manifest
        try:
            data = self.store.read_verified(model_hash)
        except ModelError as exc:
            engine.unload(model_hash)
            self.metrics.model_load_failures.labels(exc.code).inc()
            raise
        try:
            with self._on_engine_cpus():
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

    def already_loaded(self, model_hash: str, *,
                       file_checked: bool = False) -> tuple[Engine, ModelManifest] | None:
        """What :meth:`ensure_loaded` returns, when that needs no I/O beyond a stat (the
        model is loaded and its file is unchanged since it was hashed); else None. Runs on
        the event loop, so a loaded model costs no thread hand-off per batch.
        ``file_checked``: the store's checks were made for this request a moment ago (in the
        same step of the event loop), so the cached manifest is used without a stat."""
        manifest = self.store.manifest(model_hash, stat=not file_checked)
        with self._lock:
            engine = self._engines.get(manifest.engine)
        if engine is None or model_hash not in engine.loaded():
            return None
        if not file_checked and (self.store.needs_hashing(model_hash)
                                 or self.store.status(model_hash) != "ready"):
            return None
        return engine, manifest

    async def request_status(self, kind: str, record: EffectRequest) -> ModelStatus:
        """What :func:`fx_node.admission.decide` is told of the request's model: the store's
        answer for the hash it names; ``ready`` for a kind served without a model (``handlers``)
        that names none, ``absent`` for one that names a model anyway (and for any other kind
        that names none: inference needs one)."""
        if kind in self.handlers:
            return "absent" if record.model else "ready"
        return await self.model_status(record.model) if record.model else "absent"

    async def model_status(self, model_hash: str | None) -> ModelStatus:
        """The store's answer for ``model_hash`` (a corrupt file is unloaded and reported)."""
        if model_hash is None:
            return "absent"
        try:
            manifest = self.store.manifest(model_hash)
            self.engine_for(manifest)
        except ModelError:
            return "absent"
        if self.store.needs_hashing(model_hash):
            status = await asyncio.to_thread(self.store.status, model_hash)
        else:
            status = self.store.status(model_hash)
        if status == "corrupt":
            for engine in self.engine_list():
                engine.unload(model_hash)
            self.metrics.model_load_failures.labels("model_hash_mismatch").inc()
            log.error("model %s fails its hash check in %s", model_hash, self.store.root)
            self._on_corrupt()
        return status

    def loaded_models(self) -> set[str]:
        """The models loaded in any engine."""
        return {h for e in self.engine_list() for h in e.loaded()}

    def engine_list(self) -> list[Engine]:
        """The engines built so far (a worker thread may be building one right now)."""
        with self._lock:
            return list(self._engines.values())

    def executor_info(self, engine: Engine | KindHandler,
                      model_hash: str | None = None) -> ExecutorInfo:
        """The ``executor`` field of the responses ``engine`` answers for ``model_hash`` (built
        once per engine and device class). An engine may serve one model on another device than
        its own (the integer engine after a parity gate fallback serves on the CPU oracle): it
        says so through ``device_class_of``."""
        device = engine.device_class
        device_of = getattr(engine, "device_class_of", None)
        if device_of is not None and model_hash is not None:
            device = device_of(model_hash)
        provider_of = getattr(engine, "provider_of", None)
        provider = provider_of(model_hash) if provider_of is not None else None
        key = (engine.name, engine.version, device, provider)
        info = self._infos.get(key)
        if info is None:
            info = self._infos[key] = ExecutorInfo(
                node_id=self.config.node_id, engine=engine.name, engine_version=engine.version,
                device_class=device, provider=provider)
        return info

    def runs_inline(self, engine: Engine | KindHandler, model_hash: str | None,
                    n: int = 1) -> bool:
        """Whether a batch of ``n`` for ``model_hash`` runs on the event loop rather than in
        the engine pool: a model (never a kind handler, never an engine that binds request
        context) whose recent runs cost under ``INLINE_RUN_S`` per batch. The cost is the
        least of the last ``_COST_RUNS`` runs' wall time per request (a run in the pool is
        timed with its waits for the GIL and the CPU, which the least of several filters out).
        The first run of a model always goes to the pool (its cost is unknown)."""
        if model_hash is None or getattr(engine, "binds_request_context", False):
            return False
        costs = self._run_cost.get(model_hash)
        return costs is not None and len(costs) > 0 and min(costs) * n < INLINE_RUN_S

    def note_run_cost(self, model_hash: str | None, per_item_s: float) -> None:
        """Keep what one request of ``model_hash`` cost in its last run."""
        if model_hash is not None:
            self._run_cost.setdefault(model_hash, deque(maxlen=_COST_RUNS)).append(per_item_s)

    def batch_limit(self, model_hash: str) -> int:
        """How many jobs of ``model_hash`` (or of a handler's kind) one batch takes."""
        handler = self.handlers.get(model_hash.removeprefix(HANDLER_KEY))
        if handler is not None:
            return max(1, min(self.config.max_batch, handler.max_batch))
        try:
            engine = self.engine_for(self.store.manifest(model_hash))
        except ModelError:
            return 1
        return max(1, min(self.config.max_batch, engine.max_batch))
