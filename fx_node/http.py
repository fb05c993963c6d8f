"""A node's HTTP surface (FastAPI, served by uvicorn inside the service's event loop): the
executor's and the actuator gateway's.

``/v2/health/live`` (also ``/healthz``): 200 while the process runs its loops.
``/v2/health/ready`` (also ``/readyz``): 200 when the broker answers a metadata request (within
3 s, asked at each call) and the runner is ready (the executor: every preloaded model is loaded;
the gateway: every configured device answers), else 503 with the reasons.
``/facts``: the node's current facts record. ``/metrics``: Prometheus text format.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any, Protocol

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse

__all__ = ["HealthView", "UvicornServer", "create_app"]


class HealthView(Protocol):
    """What the app reads from the service (implemented by :class:`fx_node.shell.NodeShell`)."""

    def is_live(self) -> bool:
        """The service's loops are running."""
        ...

    async def readiness(self) -> dict[str, Any]:
        """``{"ready": bool, ...reasons}``."""
        ...

    def current_facts(self) -> dict[str, Any] | None:
        """The facts record as JSON, or None before the first one is built."""
        ...

    def metrics_text(self) -> bytes:
        """Prometheus exposition text."""
        ...


def create_app(view: HealthView, *, title: str = "ninelives-fx executor") -> FastAPI:
    """The FastAPI app over ``view`` (the executor's, or the actuator gateway's)."""
    # no /openapi.json, /docs or /redoc: a service answers its health, readiness and metrics
    # paths only (issue 30)
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/v2/health/live")
    @app.get("/healthz")
    async def live() -> Response:
        ok = view.is_live()
        return JSONResponse({"live": ok}, status_code=200 if ok else 503)

    @app.get("/v2/health/ready")
    @app.get("/readyz")
    async def ready() -> Response:
        body = await view.readiness()
        return JSONResponse(body, status_code=200 if body.get("ready") else 503)

    @app.get("/facts")
    async def facts() -> Response:
        doc = view.current_facts()
        if doc is None:
            return JSONResponse({"error": "no facts yet"}, status_code=503)
        return JSONResponse(doc)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(view.metrics_text(), media_type="text/plain; version=0.0.4")

    return app


class UvicornServer:
    """uvicorn's server without its signal handlers (the service owns SIGTERM), served inside
    the service's event loop: ``asyncio.create_task(server.server.serve())``."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Generator[None, None, None]:
                yield

        self.server = Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        )

    @property
    def port(self) -> int | None:
        """The bound port, once serving."""
        servers = getattr(self.server, "servers", None)
        if not servers:
            return None
        port: int = servers[0].sockets[0].getsockname()[1]
        return port
