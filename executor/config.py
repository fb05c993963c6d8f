"""The executor's configuration: one typed, printable object.

Sources, later ones winning: the field defaults, a TOML or JSON file (``fx executor run --config
FILE``), then environment variables ``FX_EXECUTOR_<FIELD>`` (upper case; dict and list fields as
JSON, e.g. ``FX_EXECUTOR_KINDS='{"ninelives:inference/run@0.1.0": 8}'``). ``bootstrap`` also falls
back to ``FX_KAFKA_BOOTSTRAP``.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from broker_schema import topics
from broker_schema.records import INFERENCE_KIND, EffectKind
from executor.affinity import parse_cpus
from fx_node.settings import NodeConfig, default_data_dir, load_settings

__all__ = ["ENV_PREFIX", "MAX_PROCESSES", "ExecutorConfig", "load_config"]

ENV_PREFIX = "FX_EXECUTOR_"
#: The most executor processes one ``fx executor run`` starts (``processes``, ``--processes``).
MAX_PROCESSES = 256


def _default_node_id() -> str:
    return f"exec-{socket.gethostname()}"


class ExecutorConfig(NodeConfig):
    """Everything ``fx executor run`` needs: the node shell's settings
    (:class:`fx_node.settings.NodeConfig`) and the model runner's. ``print(config)`` shows it
    (``str`` is TOML-like)."""

    #: This node's id: ``written_by`` of its responses, key of its facts on ``sys.facts``.
    node_id: Annotated[str, Field(min_length=1, max_length=200)] = Field(
        default_factory=_default_node_id
    )
    #: Effect kinds served, each with its queue limit (requests waiting plus running).
    kinds: dict[EffectKind, Annotated[int, Field(ge=1, le=1_000_000)]] = Field(
        default_factory=lambda: {INFERENCE_KIND: 16}
    )
    #: Consumer group per kind: ``<group_prefix>.<kind>``.
    group_prefix: str = "fx-executor"
    #: Model store directory (see :mod:`executor.models`).
    model_dir: Path = Field(default_factory=lambda: default_data_dir() / "models")
    #: The node key (created on first start, mode 0600; an existing file is used whatever its
    #: type).
    key_file: Path = Field(default_factory=lambda: default_data_dir() / "node.key")
    #: The type of a key created at ``key_file``: ``ed25519`` or ``secp256k1`` (ECDSA, for
    #: notarising receipts on chains that use that curve). docs/security.md, "Node keys".
    #: Public keys (base64 as on ``sys.facts``, or hex) this node signed its receipt ledger with
    #: before, when ``ledger_keys_file`` does not list them (a node moved to another machine):
    #: the ledger's leaves signed by them are its own, not foreign (docs/ledger.md).
    ledger_previous_keys: list[str] = Field(default_factory=list, max_length=64)
    #: Chunk store: ``kafka`` (compacted ``sys.chunks``, across machines, with ``chunk_dir``
    #: as its local cache: the default of every service, docs/operations.md "One chunk
    #: store") or ``fs`` (a directory every service shares). Published in the node's facts.
    chunk_backend: Literal["fs", "kafka"] = "kafka"
    chunk_dir: Path = Field(default_factory=lambda: default_data_dir() / "chunks")
    #: Models loaded at start (hashes), or ``"all"`` for every model in the store.
    preload: list[str] | Literal["all"] = "all"
    #: Concurrent engine calls (each a thread); each call may run a batch.
    workers: Annotated[int, Field(ge=1, le=256)] = 1
    #: CPUs the engine's worker threads run on (ids, or ``taskset -c`` form ``"0,2-3"``;
    #: ``FX_EXECUTOR_ENGINE_CPUS=1``); empty: not pinned. Each worker thread pins itself when
    #: it starts (with ``intra_op_threads = 1`` ONNX Runtime runs the model on that thread;
    #: its own pool threads, with more, take the mask of the thread that loads the model, also
    #: pinned). Every id must be one this process may run on (else the node does not start).
    #: With ``processes`` N > 1, child ``i`` takes ``engine_cpus[i mod len]`` alone
    #: (docs/executor.md, "The engine on its own cores").
    engine_cpus: list[int] = Field(default_factory=list, max_length=4096)
    #: CPUs for the rest of the process (event loop, Kafka clients, every other thread), so
    #: the engine's cores are its own; empty: left as they are. Same form as ``engine_cpus``.
    loop_cpus: list[int] = Field(default_factory=list, max_length=4096)
    #: Referenced inputs (stream records, chunks) read at once, apart from the engine workers:
    #: a slow or missing input holds one of these, never a worker or another request.
    input_fetchers: Annotated[int, Field(ge=1, le=256)] = 4
    #: The longest one attempt at reading a referenced stream record may take (metadata, offsets,
    #: fetch); an attempt that runs over counts as the broker unreachable and is retried with
    #: backoff, until the request's executor lease lapses (then ``input_missing``).
    input_attempt_s: Annotated[float, Field(gt=0, le=600)] = 10.0
    #: A request that finds its kind's queue full waits this long for room before it is
    #: answered ``backpressure`` (it stays unread on the log behind it meanwhile): a burst, such
    #: as the backlog a restarted executor meets, is absorbed instead of refused. 0: refuse at
    #: once.
    backpressure_wait_s: Annotated[float, Field(ge=0, le=600)] = 5.0
    #: Largest batch of concurrent requests for one model handed to the engine at once.
    max_batch: Annotated[int, Field(ge=1, le=4096)] = 8
    #: ONNX Runtime intra-op threads per session (0: ONNX Runtime's default).
    intra_op_threads: Annotated[int, Field(ge=0, le=256)] = 1
    #: ``auto``: CUDA execution provider when present, else CPU; ``cpu``: CPU only.
    device: Literal["auto", "cpu"] = "auto"
    #: The ONNX Runtime execution provider of ONNX models: ``auto`` (CUDA when ONNX Runtime has it
    #: and ``device`` is not ``cpu``, else CPU), ``cuda`` (CUDA asked: when ONNX Runtime lacks it
    #: or it cannot start, the CPU provider runs, with the reason logged and in the node's facts)
    #: or ``cpu``. What ran is in every response's ``executor.provider``.
    onnx_provider: Literal["auto", "cuda", "cpu"] = "auto"
    #: Route by model (docs/operations.md, "Routing by model"): this node's kind groups assign
    #: workloads with the model assignor (each workload to a member holding every model its
    #: spec binds), round robin as the fallback protocol. On by default; off (``false``,
    #: ``FX_EXECUTOR_ROUTE_BY_MODEL=false``, ``fx executor run --no-route-by-model``) the node
    #: offers round robin alone, and a group with such a member assigns round robin.
    route_by_model: bool = True
    #: Speculative reads (docs/executor.md, "Speculative reads"): a second consumer reads this
    #: node's request partitions ``read_uncommitted`` and prepares each inference request
    #: (decoded, claims/spec caught up, holder checked, a µs-scale model run) while the
    #: holder's transaction is open; nothing is written before the request is read committed.
    #: Never for a kind served without a model (``handlers``). Off by default: it did not bring
    #: the round trip under 1.5x a ping-pong (docs/benchmarks.md, issue 29, "The round trip").
    speculative_reads: bool = False
    #: Extra engines: manifest engine name -> ``module:factory`` (see :mod:`executor.engines`).
    engines: dict[str, str] = Field(default_factory=dict)
    #: Kinds served without a model: effect kind -> ``module:factory`` of a
    #: :class:`executor.engines.KindHandler`. Each must be one of ``kinds``; its requests name
    #: no model (one that does is ``model_unknown``) and are admitted by the same rules as
    #: inference (docs/executor.md, "Kinds without a model").
    handlers: dict[EffectKind, str] = Field(default_factory=dict)
    #: The integer engine's backend: ``auto`` (``cupy`` on a CUDA device unless ``device`` is
    #: ``cpu``, else ``oracle``), ``oracle`` (numpy, the canonical verifier), ``oracle-native``
    #: (the oracle's matmuls and RMSNorm in exact-integer C, built with g++), ``cpu-kernel`` (the
    #: CUDA sources built with g++) or ``cupy``. Every backend is byte-identical to the oracle.
    integer_backend: Literal["auto", "oracle", "oracle-native", "cpu-kernel", "cupy"] = "auto"
    #: When a backend other than the oracle fails its parity gate (docs/integer-engine.md, "The
    #: parity gate"): ``fallback`` serves the model on the numpy oracle, ``refuse`` serves it not
    #: at all (its requests are answered ``parity_gate_refused``).
    parity_failure: Literal["fallback", "refuse"] = "fallback"
    #: Executor processes on this machine (``fx executor run --processes`` overrides it):
    #: ``auto`` one per core (at most 256), 1 this process serves (as before), N > 1 that many
    #: child processes, node ``<node_id>-p<i>`` each with its own key, state and ledger
    #: (:mod:`executor.processes`; docs/executor.md, "Several processes").
    processes: int | Literal["auto"] = "auto"
    #: HTTP (health, metrics, facts). 0 picks a free port; None disables HTTP. With several
    #: processes, process ``i`` listens on ``http_port + i`` (0: a free port each).
    http_port: Annotated[int, Field(ge=0, le=65535)] | None = 8088
    #: On a rebalance: how long to wait for in-flight requests of revoked partitions.
    revoke_grace_s: Annotated[float, Field(ge=0)] = 10.0

    @model_validator(mode="after")
    def _handlers_served(self) -> ExecutorConfig:
        unserved = sorted(set(self.handlers) - set(self.kinds))
        if unserved:
            raise ValueError(f"handlers names kinds that are not in kinds: {unserved}")
        return self

    @property
    def ledger_keys_file(self) -> Path:
        """Where the node remembers every key it signed its receipt ledger with (so a rotated
        node still knows its earlier leaves as its own): beside the node key."""
        return self.key_file.with_name(f"ledger-keys.{self.node_id}.json")

    @property
    def receipt_chain_file(self) -> Path:
        """Where receipt-signing engines keep the node's chain head: beside the node key."""
        return self.key_file.with_name(self.key_file.name + ".receipt-chain.json")



    @field_validator("processes", mode="before")
    @classmethod
    def _check_processes(cls, value: Any) -> int | str:
        if value == "auto":
            return "auto"
        try:
            n = int(value)
        except (TypeError, ValueError):
            n = 0
        if isinstance(value, bool) or not 1 <= n <= MAX_PROCESSES or str(n) != str(value).strip():
            raise ValueError(f"processes must be 'auto' or a whole number 1..{MAX_PROCESSES}, "
                             f"not {value!r}")
        return n

    @field_validator("engine_cpus", "loop_cpus", mode="before")
    @classmethod
    def _check_cpus(cls, value: Any) -> list[int]:
        # the shape only: whether this machine has them is checked at start
        # (executor.affinity.cpus_problem), so a config stays readable on another machine
        return parse_cpus(value)

    @field_validator("node_id")
    @classmethod
    def _check_node_id(cls, value: str) -> str:
        # the node's receipt ledger is a topic named after it: refuse at start, not at the
        # first receipt
        topics.ledger(value)
        return value



def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> ExecutorConfig:
    """Build the config from ``path`` (``.toml`` or ``.json``), then ``FX_EXECUTOR_*`` variables
    of ``environ`` (default ``os.environ``), then ``overrides``. Raises
    :class:`fx_node.settings.ConfigError`."""
    return load_settings(ExecutorConfig, path, table="executor", prefix=ENV_PREFIX,
                         environ=environ, overrides=overrides)
