"""The executor's HTTP surface (FastAPI, served by uvicorn inside the service's event loop).

``/v2/health/live``: 200 while the process runs its loops. ``/v2/health/ready``: 200 when the
broker answers a metadata request and every preloaded model is loaded, else 503 with the reasons.
``/facts``: the node's current facts record. ``/metrics``: Prometheus text format.
"""

from __future__ import annotations

from typing import Any, Protocol

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse

__all__ = ["HealthView", "create_app"]


class HealthView(Protocol):
    """What the app reads from the service (implemented by ``ExecutorService``)."""

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


def create_app(view: HealthView) -> FastAPI:
    """The FastAPI app over ``view``."""
    app = FastAPI(title="ninelives-fx executor", docs_url=None, redoc_url=None)

    @app.get("/v2/health/live")
    async def live() -> Response:
        ok = view.is_live()
        return JSONResponse({"live": ok}, status_code=200 if ok else 503)

    @app.get("/v2/health/ready")
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
