"""What a local Kafka's data dir records and where its files live: ``state.json``
(:class:`BrokerState`, :func:`read_state`, :func:`write_state`) and each node's files
(:class:`NodeFiles`). Used by :mod:`fx_kafka.local` and its parts."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["HOST", "BrokerState", "BrokerStatus", "NodeFiles", "NodeState", "bootstrap_of",
           "read_state", "write_state"]

HOST = "127.0.0.1"


@dataclass(frozen=True)
class NodeState:
    """One node of a local broker: its id, pid (None when not running) and ports."""

    node_id: int
    pid: int | None
    port: int
    controller_port: int


@dataclass(frozen=True)
class BrokerState:
    """What ``data_dir/state.json`` records about the broker started from that dir.

    ``pid`` is None once the broker was stopped (ports and cluster id stay, so a restart reuses
    the formatted storage). ``pid``, ``port`` and ``controller_port`` are node 1's; ``nodes`` lists
    every node of a cluster (empty in state files of a one-node broker written before clusters).
    ``bootstrap`` names every node's listener, comma-separated.
    """

    pid: int | None
    bootstrap: str
    port: int
    controller_port: int
    version: str
    cluster_id: str
    started_at: float
    start_seconds: float
    nodes: tuple[NodeState, ...] = ()
    #: SASL_SSL + ACLs (``fx broker start --secure``); credentials in ``data_dir/security``
    secure: bool = False

    def node_states(self) -> tuple[NodeState, ...]:
        """Every node (one, synthesised from the top-level fields, for an old one-node file)."""
        return self.nodes or (NodeState(1, self.pid, self.port, self.controller_port),)


def write_state(path: Path, state: BrokerState) -> None:
    """Write ``state`` as JSON, atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_state(path: Path) -> BrokerState | None:
    """The state in ``path``; None if there is none or it cannot be read."""
    try:
        raw = json.loads(path.read_text())
        raw["nodes"] = tuple(NodeState(**node) for node in raw.get("nodes", ()))
        return BrokerState(**raw)
    except (OSError, ValueError, TypeError, KeyError):
        return None


@dataclass(frozen=True)
class BrokerStatus:
    """The answer of :meth:`LocalKafka.status`: ``running`` when any node runs; ``alive`` and
    ``stopped`` name the node ids that run and that do not (a one-node broker is node 1)."""

    running: bool
    bootstrap: str | None
    pid: int | None
    data_dir: Path
    alive: tuple[int, ...] = ()
    stopped: tuple[int, ...] = ()


@dataclass(frozen=True)
class NodeFiles:
    """Where one node's files live (the data dir itself for a one-node broker)."""

    node_id: int
    root: Path

    @property
    def log_dir(self) -> Path:
        return self.root / "kraft"

    @property
    def properties(self) -> Path:
        return self.root / "server.properties"

    @property
    def broker_log(self) -> Path:
        return self.root / "broker.log"

    @property
    def stdout_log(self) -> Path:
        return self.root / "stdout.log"

    def formatted(self) -> bool:
        return (self.log_dir / "meta.properties").exists()

    def holds_files(self) -> bool:
        return self.log_dir.is_dir() and any(self.log_dir.iterdir())


def bootstrap_of(nodes: list[NodeState] | tuple[NodeState, ...]) -> str:
    """``127.0.0.1:PORT,...``: every node's listener."""
    return ",".join(f"{HOST}:{n.port}" for n in nodes)
