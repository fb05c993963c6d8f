"""The executor service: the node's shell (:mod:`fx_node.shell`: consuming ``wl.*.out``, commits,
leases, facts, HTTP, the resilient producer) serving with the executor's runner
(:mod:`executor.runner`: admission, input reading in :mod:`executor.inputs`, the workers and the
answers in :mod:`executor.answering`, the engines in :mod:`executor.engine_pool`).

One live request, read to answered: :mod:`fx_node.shell` (read, checked, claims/spec caught up)
→ :mod:`fx_node.admission` (decided) → :mod:`executor.runner` (``accepted`` written, input fetch
started) → :mod:`executor.inputs` (input read) → :mod:`executor.answering` (model run, response
signed and written, offset settled).
"""

from __future__ import annotations

import logging

from executor.chunks import ChunkStore
from executor.config import ExecutorConfig
from executor.engines import Engine
from executor.metrics import ExecutorMetrics
from executor.models import ModelStore
from executor.runner import ModelRunner
from fx_node.admission import ExecutorState
from fx_node.identity import NodeIdentity
from fx_node.producer import PRODUCER_BATCH_BYTES
from fx_node.runner import NodeSettings, node_settings
from fx_node.service import NodeService
from fx_node.shell import NodeShell

__all__ = ["ExecutorService", "executor_settings"]

log = logging.getLogger(__name__)


def executor_settings(config: ExecutorConfig) -> NodeSettings:
    """What the node's shell reads of the executor's config."""
    return node_settings(config, name="executor", task_label="executor", max_records=500,
                         revoke_grace_s=config.revoke_grace_s,
                         http_title="ninelives-fx executor",
                         producer_batch_bytes=PRODUCER_BATCH_BYTES,
                         producer_close_s=max(1.0, config.shutdown_grace_s))


class ExecutorService(NodeService):
    """One executor node: a :class:`~fx_node.shell.NodeShell` (``node``) with a
    :class:`~executor.runner.ModelRunner` (``runner``). ``await run()`` until
    :meth:`request_stop` (or SIGTERM in the CLI)."""

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
        self.node = NodeShell(executor_settings(config), identity=self.identity,
                              metrics=self.metrics, log=log)
        self.runner = ModelRunner(config, self.node, metrics=self.metrics, store=self.store,
                                  engines=engines)
        self.node.attach(self.runner)

    @property
    def state(self) -> ExecutorState:
        """The admission state (claims, specs, requests in flight)."""
        return self.runner.state

    @property
    def chunks(self) -> ChunkStore:
        """The chunk store inputs are read from and large outputs written to."""
        return self.runner.inputs.chunks
