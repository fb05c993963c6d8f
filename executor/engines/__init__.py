"""The engine interface and the registry of engines by name.

An engine runs models of one kind (ONNX Runtime, the integer engine...). The executor gives it a
model's verified bytes and manifest once (:meth:`Engine.load`), then calls :meth:`Engine.run_batch`
from a worker thread, with one or more concurrent requests for the same model. An engine:

- is named by ``name`` (the manifest's ``engine`` field selects it), reports ``version`` and
  ``device_class`` (``cpu`` or ``cuda``), which go into every response's ``executor`` field;
- says how many requests it wants per call (``max_batch``; 1 means no batching);
- raises :class:`fx_node.errors.EngineError` with a code (``input_invalid``, ``params_invalid``,
  ``engine_error``) for one request's failure, and returns that error in that request's slot
  of a batch so the other requests still get their results;
- applies the manifest's documented parameter defaults itself (a missing parameter means the
  interface's documented default, never the engine library's);
- must be safe to call from several threads at once;
- may set ``binds_request_context = True`` (the integer engine does): then the executor calls
  ``run_batch(model_hash, items, contexts=[...])`` with, per item, the request it answers
  (``workload_id``, ``effect_id``, ``epoch``, ``request_hash`` = ``broker_schema.record_hash``
  of the EffectRequest), for the engine's signed receipt to bind.

Registering an engine: ``ExecutorConfig.engines`` maps a manifest engine name to
``"module:factory"``; the factory is called with an :class:`EngineOptions` and returns an
:class:`Engine`. Built in: ``onnxruntime`` (:mod:`executor.engines.onnx`) and ``integer``
(:mod:`executor.engines.integer`, the integer fixed-point LLM with signed, chained receipts).

This module imports nothing heavy: engines load their libraries when they are built.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import JsonValue

from fx_node.errors import EngineError

if TYPE_CHECKING:
    from executor.models import ModelManifest
    from fx_node.identity import NodeIdentity

__all__ = [
    "BUILTIN_ENGINES",
    "Engine",
    "EngineFactory",
    "EngineOptions",
    "EngineResult",
    "IntegerBackend",
    "KindHandler",
    "build_engine",
    "build_handler",
]


@dataclass(frozen=True)
class EngineResult:
    """One request's result.

    ``output`` is a JSON value, or raw bytes (stored as base64 inline, or as a chunk when large).
    ``receipt`` is engine-specific proof (the integer engine's hash-chained receipt), copied into
    the response's ``receipt``.
    """

    output: JsonValue | bytes
    media_type: str | None = None
    receipt: dict[str, JsonValue] | None = None


IntegerBackend = Literal["auto", "oracle", "oracle-native", "cpu-kernel", "cupy"]


@dataclass(frozen=True)
class EngineOptions:
    """What the executor's config says to every engine.

    ``node_id``, ``identity`` and ``receipt_chain_file`` are for engines that sign receipts (the
    integer engine): they sign with the node's own key, so receipts verify against the public key
    the node publishes on ``sys.facts``, and keep their chain head in ``receipt_chain_file``
    (beside the node key) so the chain survives a restart. Engines that sign nothing ignore them.
    """

    intra_op_threads: int = 1
    device: Literal["auto", "cpu"] = "auto"
    #: ONNX Runtime's execution provider (``ExecutorConfig.onnx_provider``).
    onnx_provider: Literal["auto", "cuda", "cpu"] = "auto"
    node_id: str = "engine"
    identity: NodeIdentity | None = None
    receipt_chain_file: Path | None = None
    #: The integer engine's backend: ``auto`` = ``cupy`` when a CUDA device is there and
    #: ``device`` is not ``cpu``, else the numpy ``oracle``.
    integer_backend: IntegerBackend = "auto"
    #: What the integer engine does with a backend that fails its parity gate: serve the model
    #: on the oracle (``fallback``) or not at all (``refuse``).
    parity_failure: Literal["fallback", "refuse"] = "fallback"
    #: Called (from a worker thread) with each parity gate's fact (a
    #: :class:`broker_schema.records.ParityGateFact`): the service's metrics.
    on_parity_gate: Callable[[Any], None] | None = None


@runtime_checkable
class Engine(Protocol):
    """The interface every engine implements (see the module docstring)."""

    name: str
    version: str
    device_class: str
    max_batch: int

    def load(self, manifest: ModelManifest, model_bytes: bytes) -> None:
        """Make the model ready (idempotent). ``model_bytes`` already hash to ``manifest.hash``.
        Raises :class:`EngineError` (``engine_error``) if the engine cannot load it."""
        ...

    def loaded(self) -> frozenset[str]:
        """Hashes of the models held warm."""
        ...

    def unload(self, model_hash: str) -> None:
        """Drop a warm model (after its file failed a hash check)."""
        ...

    def run_batch(
        self, model_hash: str, items: Sequence[tuple[Mapping[str, JsonValue], bytes]]
    ) -> list[EngineResult | EngineError]:
        """Run ``items`` (params, input bytes) on a loaded model; one result or error per item."""
        ...


@runtime_checkable
class KindHandler(Protocol):
    """Runs the requests of an effect kind that names no model (``ExecutorConfig.handlers``).

    The same accepted/response/fencing rules as inference apply (:func:`fx_node.admission.decide`
    with ``model_status="ready"``); only what runs differs: no model store, no load, and the
    response's ``model_hash`` is null. ``run_batch`` is called from a worker thread with the
    request's kind and, per request, its params and input bytes; it returns one result or error
    per item, as :meth:`Engine.run_batch` does."""

    name: str
    version: str
    device_class: str
    max_batch: int

    def run_batch(
        self, kind: str, items: Sequence[tuple[Mapping[str, JsonValue], bytes]]
    ) -> list[EngineResult | EngineError]:
        """Run ``items`` (params, input bytes) of ``kind``; one result or error per item."""
        ...


EngineFactory = Callable[[EngineOptions], Engine]

#: Engines that ship with the executor: manifest engine name -> ``module:factory``.
#: Each is built only when a stored model names it (the integer engine imports numpy only then).
BUILTIN_ENGINES: dict[str, str] = {
    "onnxruntime": "executor.engines.onnx:OnnxEngine",
    "integer": "executor.engines.integer:IntegerEngineAdapter",
}


def build_engine(target: str, options: EngineOptions) -> Engine:
    """Import ``module:factory`` and call the factory with ``options``."""
    module_name, _, attr = target.partition(":")
    if not attr:
        raise ValueError(f"engine target {target!r} is not 'module:factory'")
    factory = getattr(importlib.import_module(module_name), attr)
    engine = factory(options)
    if not isinstance(engine, Engine):
        raise TypeError(f"{target} did not return an Engine (got {type(engine).__name__})")
    return engine


def build_handler(target: str, options: EngineOptions) -> KindHandler:
    """Import ``module:factory`` and call the factory with ``options``: a :class:`KindHandler`."""
    module_name, _, attr = target.partition(":")
    if not attr:
        raise ValueError(f"handler target {target!r} is not 'module:factory'")
    handler = getattr(importlib.import_module(module_name), attr)(options)
    if not isinstance(handler, KindHandler):
        raise TypeError(f"{target} did not return a KindHandler (got {type(handler).__name__})")
    return handler
