"""The node's facts on ``sys.facts`` (compacted, keyed by node id): what it serves and holds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from broker_schema.records import (
    AcceleratorDevice,
    ChunkStoreKind,
    FactsRecord,
    Guarantee,
    KindServed,
    OnnxProviderFact,
    ParityGateFact,
)

__all__ = ["build_facts", "facts_changed"]


def build_facts(
    *,
    node_id: str,
    queue_limits: Mapping[str, int],
    models_present: Iterable[str],
    models_loaded: Iterable[str],
    engines: Mapping[str, str],
    accelerators: Iterable[str],
    public_key_b64: str,
    key_id: str,
    now_us: int,
    guarantees: Mapping[str, Guarantee] | None = None,
    accelerator_devices: Iterable[AcceleratorDevice] = (),
    parity_gates: Iterable[ParityGateFact] = (),
    chunk_store: ChunkStoreKind = "kafka",
    onnx_provider: OnnxProviderFact | None = None,
) -> FactsRecord:
    """The facts record for this node (pure: the time is passed in). ``guarantees``: the
    guarantee each actuation kind is served with (an actuator gateway's);
    ``accelerator_devices``: what the probe found (:mod:`executor.accelerators`);
    ``parity_gates``: the integer engine's gate runs (one per model and backend, sorted);
    ``chunk_store``: where the node keeps chunks (an executor's ``chunk_backend``);
    ``onnx_provider``: the ONNX Runtime provider its ONNX models run on."""
    served = guarantees or {}
    return FactsRecord(
        node_id=node_id,
        kinds=tuple(
            KindServed(kind=k, queue_limit=v, guarantee=served.get(k))
            for k, v in sorted(queue_limits.items())
        ),
        models_present=tuple(sorted(set(models_present))),
        models_loaded=tuple(sorted(set(models_loaded))),
        engines=dict(sorted(engines.items())),
        accelerators=tuple(sorted(set(accelerators))),
        accelerator_devices=tuple(sorted(accelerator_devices, key=lambda a: (a.kind, a.index))),
        parity_gates=tuple(sorted(parity_gates, key=lambda g: (g.model, g.backend))),
        public_key=public_key_b64,
        key_id=key_id,
        updated_us=now_us,
        chunk_store=chunk_store,
        onnx_provider=onnx_provider,
    )


def facts_changed(old: FactsRecord | None, new: FactsRecord) -> bool:
    """Whether ``new`` says something ``old`` did not (ignoring ``updated_us``)."""
    if old is None:
        return True
    return old.model_copy(update={"updated_us": 0}) != new.model_copy(update={"updated_us": 0})
