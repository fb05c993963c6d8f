"""What a node's shell (:class:`fx_node.shell.NodeShell`) is handed: its settings, its metrics
and the :class:`Runner` that does what the node is for (run models:
:class:`executor.runner.ModelRunner`; drive devices: :class:`actuator.runner.DeviceRunner`), and
the :class:`Read` it passes the runner for every request it admits to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from broker_schema.records import EffectRequest, FactsRecord, RejectCode
from fx_node.admission import ExecutorState, OffsetTracker

__all__ = ["NodeMetrics", "NodeSettings", "PreparedRead", "Read", "Runner", "ServiceConfig",
           "Skip", "node_settings"]

#: Why the shell passed over a record read on ``.out`` before any runner saw it as a request:
#: a site's request mirrored here, a record that does not decode (or does not belong on
#: ``.out``), a record that is no request, a request of another kind, one for another workload
#: than its topic's, one its epoch's holder did not sign.
Skip = Literal["mirrored_copy", "undecodable", "not_a_request", "other_kind", "wrong_workload",
               "not_holder"]


@dataclass(frozen=True)
class NodeSettings:
    """What the shell reads of a service's config (each service builds it from its own)."""

    #: how the node names itself in its log lines ("executor", "actuator gateway")
    name: str
    #: how a failed task of the node is logged ("executor", "gateway")
    task_label: str
    node_id: str
    bootstrap: str
    #: the effect kinds served: one consumer group each
    kinds: tuple[str, ...]
    group_ids: dict[str, str]
    topic_pattern: str
    metadata_max_age_ms: int
    session_timeout_ms: int
    heartbeat_interval_ms: int
    #: records per poll
    max_records: int
    shutdown_grace_s: float
    revoke_grace_s: float
    facts_interval_s: float
    http_host: str
    http_port: int | None
    http_title: str
    #: the producer's batch (None: aiokafka's default)
    producer_batch_bytes: int | None
    #: how long the producer may take to flush at shutdown
    producer_close_s: float


class ServiceConfig(Protocol):
    """What a service's config has that the shell reads (the executor's and the gateway's, both a
    :class:`fx_node.settings.NodeConfig` with their node id, kinds and HTTP port)."""

    @property
    def node_id(self) -> str: ...
    @property
    def bootstrap(self) -> str: ...
    @property
    def kinds(self) -> Mapping[str, Any]: ...
    @property
    def topic_pattern(self) -> str: ...
    @property
    def metadata_max_age_ms(self) -> int: ...
    @property
    def session_timeout_ms(self) -> int: ...
    @property
    def heartbeat_interval_ms(self) -> int: ...
    @property
    def shutdown_grace_s(self) -> float: ...
    @property
    def facts_interval_s(self) -> float: ...
    @property
    def http_host(self) -> str: ...
    @property
    def http_port(self) -> int | None: ...

    def group_id(self, kind: str) -> str:
        """The consumer group serving ``kind``."""
        ...


def node_settings(config: ServiceConfig, *, name: str, task_label: str, max_records: int,
                  revoke_grace_s: float, http_title: str, producer_batch_bytes: int | None,
                  producer_close_s: float) -> NodeSettings:
    """The shell's settings: what ``config`` says, and what its service adds."""
    return NodeSettings(
        name=name, task_label=task_label, node_id=config.node_id, bootstrap=config.bootstrap,
        kinds=tuple(config.kinds),
        group_ids={kind: config.group_id(kind) for kind in config.kinds},
        topic_pattern=config.topic_pattern, metadata_max_age_ms=config.metadata_max_age_ms,
        session_timeout_ms=config.session_timeout_ms,
        heartbeat_interval_ms=config.heartbeat_interval_ms, max_records=max_records,
        shutdown_grace_s=config.shutdown_grace_s, revoke_grace_s=revoke_grace_s,
        facts_interval_s=config.facts_interval_s, http_host=config.http_host,
        http_port=config.http_port, http_title=http_title,
        producer_batch_bytes=producer_batch_bytes, producer_close_s=producer_close_s)


class NodeMetrics(Protocol):
    """The counters the shell keeps in the service's metrics (Prometheus, labelled as named)."""

    #: by ``op``
    broker_retries: Any
    #: by ``reason``
    ignored: Any
    sync_failures: Any
    lease_renewals: Any

    def render(self) -> bytes:
        """Prometheus text format."""
        ...


@dataclass
class PreparedRead:
    """What a runner prepared for a record before the shell read it committed (the executor's
    speculative reads, :mod:`executor.speculation`): the decoded request, whether its
    workload's claims and spec were caught up after the request was appended (then the shell
    does not catch up again for it), and the holder check's answer then (None: the holder's)."""

    record: EffectRequest
    synced: bool
    holder_problem: str | None


@dataclass
class Read:
    """A request the shell read, checked and caught up on (claims, spec), for the runner to
    decide on: its offset is settled (``done``) once the runner has answered it."""

    kind: str
    msg: Any
    request: EffectRequest
    workload_id: str
    shadow: str | None
    tracker: OffsetTracker
    #: what the runner prepared for it before it was read committed, if anything
    prepared: PreparedRead | None = None

    @property
    def key(self) -> tuple[str, int]:
        """The request's partition."""
        return (self.msg.topic, self.msg.partition)

    def done(self) -> None:
        """Settle this request's offset."""
        self.tracker.done(self.key, self.msg.offset)

    def done_unless_in_flight(self, state: ExecutorState) -> None:
        """Settle an ignored duplicate's offset, unless it is the very record still in flight
        here (read again after a rebalance gave the partition back): its response, once
        acknowledged, settles the offset; settling it now would commit past a request whose
        answer is not written yet."""
        job = state.in_flight.get(self.request.effect_id)
        if job is None or (job.topic, job.partition, job.request_offset) != (
                self.msg.topic, self.msg.partition, self.msg.offset):
            self.done()


class Runner(Protocol):
    """What the shell calls: on start and stop, per record, and for facts and readiness."""

    @property
    def state(self) -> ExecutorState:
        """The admission state (claims, specs, the in-flight table whose leases the shell
        renews)."""
        ...

    async def start(self) -> None:
        """Before the first facts and the consumers: load models, read memory back..."""
        ...

    def tasks(self) -> list[asyncio.Task[Any]]:
        """The runner's own loops (workers, telemetry): a failure of one stops the node."""
        ...

    def started(self) -> None:
        """The node serves (log its start line)."""
        ...

    async def skipped(self, kind: str, msg: Any, why: Skip, detail: str, *,
                      code: RejectCode | None = None,
                      request: EffectRequest | None = None) -> None:
        """A record the shell passed over (count it, record it on ``sys.rejects``...): ``code``
        of an undecodable one, ``request`` of a request; its offset is settled by the shell."""
        ...

    async def handle(self, read: Read) -> None:
        """Decide on ``read`` and act: answer, or admit and run (settling its offset once
        answered)."""
        ...

    def claim_undecodable(self, code: str) -> None:
        """A record on ``.claims``/``.spec`` did not decode."""
        ...

    def claim_refused(self, msg: Any, code: RejectCode, detail: str) -> None:
        """A claim too far ahead was refused (``epoch_jump``)."""
        ...

    async def drain(self) -> None:
        """The consumers stopped reading: finish (or answer) what is in flight, within the
        shutdown grace, and end the runner's tasks."""
        ...

    async def close(self) -> None:
        """The consumers are closed: release the runner's clients, devices, threads."""
        ...

    def facts(self) -> FactsRecord:
        """The node's facts record now."""
        ...

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Whether the runner is ready, and what it reports beside ``ready`` and ``broker``."""
        ...

    def refresh_gauges(self) -> None:
        """Set the gauges read on ``/metrics``."""
        ...
