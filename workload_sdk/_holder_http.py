"""The lease holder process's HTTP surface (``fx workload run --http-port``): FastAPI, served by
uvicorn inside the holder's event loop, as the executor's (``fx_node/http.py``; the two never
import each other, so the few lines of the server are repeated here).

``/healthz``: 200 while the holder's (or candidate's) task runs. ``/readyz``: 200 while this
process does its job: the leader has claimed, resumed and merges, or a stand-by is in the
election group; 503 while it claims, resumes or restarts from the log after a broker outage; the
body says which (``role``: ``leader``, ``standby``, ``starting``). ``/metrics``: Prometheus text
format (:class:`~workload_sdk._holder_metrics.HolderMetrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Generator
from typing import Any

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse

__all__ = ["HolderServer", "create_app"]


def create_app(*, live: Callable[[], bool], status: Callable[[], dict[str, Any]],
               metrics: Callable[[], bytes]) -> FastAPI:
    """The app: ``live()`` for ``/healthz``, ``status()`` (a dict with ``ready``) for
    ``/readyz``, ``metrics()`` for ``/metrics``."""
    app = FastAPI(title="ninelives-fx lease holder", docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.get("/healthz")
    async def healthz() -> Response:
        ok = live()
        return JSONResponse({"live": ok}, status_code=200 if ok else 503)

    @app.get("/readyz")
    async def readyz() -> Response:
        body = status()
        return JSONResponse(body, status_code=200 if body.get("ready") else 503)

    @app.get("/metrics")
    async def metrics_() -> Response:
        return Response(metrics(), media_type="text/plain; version=0.0.4")

    return app


class HolderServer:
    """uvicorn's server without its signal handlers (the holder owns SIGTERM), to serve inside
    the holder's event loop. :meth:`bind` takes the socket first, so that a port in use is an
    ``OSError`` for the caller (uvicorn itself would ``sys.exit`` from inside its task); then
    ``asyncio.create_task(server.serve())``."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Generator[None, None, None]:
                yield

        self.host, self.requested_port = host, port
        self.server = Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        )
        self._sock: socket.socket | None = None
        #: the task serving it (set by whoever starts it)
        self.serving: asyncio.Task[None] | None = None

    def bind(self) -> None:
        """Bind and listen on ``host:port``; ``OSError`` (in use, not an address of this host)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.requested_port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock

    async def serve(self) -> None:
        """Serve on the bound socket until ``server.should_exit``."""
        assert self._sock is not None, "bind() first"
        await self.server.serve(sockets=[self._sock])

    @property
    def port(self) -> int | None:
        """The bound port."""
        if self._sock is None:
            return None
        port: int = self._sock.getsockname()[1]
        return port
