"""The executor's configuration: one typed, printable object.

Sources, later ones winning: the field defaults, a TOML or JSON file (``fx executor run --config
FILE``), then environment variables ``FX_EXECUTOR_<FIELD>`` (upper case; dict and list fields as
JSON, e.g. ``FX_EXECUTOR_KINDS='{"ninelives:inference/run@0.1.0": 8}'``). ``bootstrap`` also falls
back to ``FX_KAFKA_BOOTSTRAP``.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from broker_schema import topics
from broker_schema.records import INFERENCE_KIND, EffectKind
from fx_kafka.security import ClientSecurity
from fx_node.settings import check_security_keys, default_data_dir, load_settings, security_of

__all__ = ["ENV_PREFIX", "ExecutorConfig", "load_config"]

ENV_PREFIX = "FX_EXECUTOR_"


def _default_node_id() -> str:
    return f"exec-{socket.gethostname()}"


class ExecutorConfig(BaseModel):
    """Everything ``fx executor run`` needs. ``print(config)`` shows it (``str`` is TOML-like)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: This node's id: ``written_by`` of its responses, key of its facts on ``sys.facts``.
    node_id: Annotated[str, Field(min_length=1, max_length=200)] = Field(
        default_factory=_default_node_id
    )
    bootstrap: str = Field(
        default_factory=lambda: os.environ.get("FX_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    #: Effect kinds served, each with its queue limit (requests waiting plus running).
    kinds: dict[EffectKind, Annotated[int, Field(ge=1, le=1_000_000)]] = Field(
        default_factory=lambda: {INFERENCE_KIND: 16}
    )
    #: Which ``.out`` topics to read (a regex over topic names). Narrow it to share a broker.
    topic_pattern: str = topics.OUT_PATTERN
    #: Consumer group per kind: ``<group_prefix>.<kind>``.
    group_prefix: str = "fx-executor"
    #: Model store directory (see :mod:`executor.models`).
    model_dir: Path = Field(default_factory=lambda: default_data_dir() / "models")
    #: The node key (created on first start, mode 0600; an existing file is used whatever its
    #: type).
    key_file: Path = Field(default_factory=lambda: default_data_dir() / "node.key")
    #: The type of a key created at ``key_file``: ``ed25519`` or ``secp256k1`` (ECDSA, for
    #: notarising receipts on chains that use that curve). docs/security.md, "Node keys".
    key_type: Literal["ed25519", "secp256k1"] = "ed25519"
    #: Chunk store: ``fs`` (a directory, one machine) or ``kafka`` (compacted ``sys.chunks``,
    #: across machines, with ``chunk_dir`` as its local cache).
    chunk_backend: Literal["fs", "kafka"] = "fs"
    chunk_dir: Path = Field(default_factory=lambda: default_data_dir() / "chunks")
    #: Models loaded at start (hashes), or ``"all"`` for every model in the store.
    preload: list[str] | Literal["all"] = "all"
    #: Concurrent engine calls (each a thread); each call may run a batch.
    workers: Annotated[int, Field(ge=1, le=256)] = 1
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
    #: HTTP (health, metrics, facts). ``http_port`` 0 picks a free port; None disables HTTP.
    http_host: str = "127.0.0.1"
    http_port: Annotated[int, Field(ge=0, le=65535)] | None = 8088
    #: How often pattern subscription looks for new ``wl.*.out`` topics.
    metadata_max_age_ms: Annotated[int, Field(ge=100)] = 3000
    session_timeout_ms: Annotated[int, Field(ge=1000)] = 10_000
    heartbeat_interval_ms: Annotated[int, Field(ge=100)] = 1000
    #: On SIGTERM: how long in-flight requests may take to finish before they are abandoned
    #: (abandoned accepted requests become ``unknown`` at the lease holder, by design).
    shutdown_grace_s: Annotated[float, Field(ge=0)] = 10.0
    #: On a rebalance: how long to wait for in-flight requests of revoked partitions.
    revoke_grace_s: Annotated[float, Field(ge=0)] = 10.0
    #: How often facts are republished even without a change (0: only at start and on change).
    facts_interval_s: Annotated[float, Field(ge=0)] = 60.0
    #: Broker security, as the ``FX_KAFKA_*`` variables of :mod:`fx_kafka.security` without
    #: the ``FX_KAFKA_`` prefix, in lower case: ``security_protocol``, ``sasl_mechanism``,
    #: ``sasl_username``, ``sasl_password_file``, ``ca_file``, ``ssl_check_hostname``. A
    #: password is named by file only (the config is printed). Empty: the environment decides.
    kafka_security: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _handlers_served(self) -> ExecutorConfig:
        unserved = sorted(set(self.handlers) - set(self.kinds))
        if unserved:
            raise ValueError(f"handlers names kinds that are not in kinds: {unserved}")
        return self

    @field_validator("topic_pattern")
    @classmethod
    def _regex(cls, value: str) -> str:
        import re

        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"topic_pattern is not a regex: {exc}") from exc
        return value

    @property
    def receipt_chain_file(self) -> Path:
        """Where receipt-signing engines keep the node's chain head: beside the node key."""
        return self.key_file.with_name(self.key_file.name + ".receipt-chain.json")

    def group_id(self, kind: str) -> str:
        """The consumer group serving ``kind``."""
        return f"{self.group_prefix}.{kind}"

    def __str__(self) -> str:
        lines = []
        for name, value in self.model_dump(mode="json").items():
            lines.append(f"{name} = {json.dumps(value)}")
        return "\n".join(lines)


    @field_validator("node_id")
    @classmethod
    def _check_node_id(cls, value: str) -> str:
        # the node's receipt ledger is a topic named after it: refuse at start, not at the
        # first receipt
        topics.ledger(value)
        return value

    @field_validator("kafka_security")
    @classmethod
    def _check_security_keys(cls, value: dict[str, str]) -> dict[str, str]:
        return check_security_keys(value)

    def client_security(self) -> ClientSecurity | None:
        """The broker security of ``kafka_security`` (None when it is empty: the ``FX_KAFKA_*``
        environment applies). Raises :class:`fx_node.settings.ConfigError` for settings that do not
        fit."""
        return security_of(self.kafka_security)


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
