"""A node process as one object: a :class:`~fx_node.shell.NodeShell` and the runner it was
handed, with the lifecycle and the HTTP answers delegated to the shell.

:class:`executor.service.ExecutorService` and :class:`actuator.service.GatewayService` are this
with their own runner; what they add is only what their runner owns.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

from fx_kafka.security import use_security
from fx_node.settings import ConfigError, NodeConfig
from fx_node.shell import NodeShell

__all__ = ["NodeService", "run_node"]

log = logging.getLogger("fx_node.service")


class NodeService:
    """The lifecycle of one node (``node``, a :class:`NodeShell` with its runner attached).
    ``await run()`` until :meth:`request_stop` (or SIGTERM in the CLIs)."""

    node: NodeShell

    @property
    def http_port(self) -> int | None:
        """The bound HTTP port (after start), or None without HTTP."""
        return self.node.http_port

    async def start(self) -> None:
        """Connect, create the system topics, start the runner (models, memory), publish facts,
        start consuming."""
        await self.node.start()

    def request_stop(self) -> None:
        """Ask :meth:`run` to shut down gracefully (safe from a signal handler)."""
        self.node.request_stop()

    async def run(self) -> None:
        """Start, serve until :meth:`request_stop` or a fatal error, then shut down."""
        await self.node.run()

    async def stop(self) -> None:
        """Stop reading, give work in flight ``shutdown_grace_s``, answer the rest, close.
        Idempotent."""
        await self.node.stop()

    def is_live(self) -> bool:
        """The loops run and nothing fatal happened."""
        return self.node.is_live()

    async def readiness(self) -> dict[str, Any]:
        """Ready: the broker answers a metadata request, plus what the runner reports (models
        loaded, devices connected)."""
        return await self.node.readiness()

    def current_facts(self) -> dict[str, Any] | None:
        """The last published facts as JSON."""
        return self.node.current_facts()

    def metrics_text(self) -> bytes:
        """Prometheus text (queue gauges refreshed first)."""
        return self.node.metrics_text()


def run_node(command: str, config: NodeConfig, make: Callable[[], NodeService]) -> int:
    """Run the service ``make()`` builds until SIGTERM or SIGINT (the CLI's ``run`` commands):
    the first signal stops it with ``config.shutdown_grace_s`` for work in flight, a second one
    exits at once (status 1). The broker security of ``config`` wraps every client the service
    makes; a security setting that does not fit is one line on stderr and status 2."""
    try:
        security = config.client_security()
    except ConfigError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        service = make()
        loop = asyncio.get_running_loop()
        stops = 0

        def on_signal() -> None:
            nonlocal stops
            stops += 1
            if stops > 1:  # a second signal: no more grace
                log.warning("second signal: exiting now")
                sys.exit(1)
            log.info("stopping (grace %.1f s)", config.shutdown_grace_s)
            service.request_stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        await service.run()
        return 0

    log.info("%s config:\n%s", command, config)
    if security is None:
        return asyncio.run(main())
    with use_security(security):  # every client the service makes uses it (fx_kafka.security)
        return asyncio.run(main())

