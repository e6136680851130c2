"""The operator's routes of a server: liveness, readiness, Prometheus metrics, and the route table.

``/health/live`` answers 200 while the process serves HTTP (a supervisor restarts it when this stops answering);
``/health/ready`` answers 200 only when every served name's stable and candidate versions are loaded and the
server is not draining for shutdown, 503 otherwise (a load balancer sends traffic elsewhere). ``/health`` is
the liveness check under its older name. ``/`` and ``/v1`` list the routes, so the base URL the server prints
(…/v1) answers a browser or ``curl`` with something useful instead of a 404. ``POST /v1/responses`` is added
here too (meshlm/serve/responses.py), beside the chat and completions routes the server defines itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from meshlm.serve.admin import error_response
from meshlm.serve.metrics import INSTALL_HINT
from meshlm.serve.protocol import ApiError
from meshlm.serve.responses import add_responses_route

if TYPE_CHECKING:
    from meshlm.serve.server import Server


def readiness(server: Server) -> tuple[bool, str]:
    """(ready, why): every served name's stable and candidate version loaded, and not draining."""
    if server.draining:
        return False, "draining for shutdown"
    deployments = server.router.deployments
    if not deployments:
        return False, "no model is served"
    wanted = [f"{name}:v{v}" for name, dep in deployments.items() for v in (dep.stable, dep.candidate)
              if v is not None]
    missing = [ref for ref in wanted if ref not in server.router.backends]
    return (False, f"not loaded: {', '.join(missing)}") if missing else (True, "ok")


def route_table(app: FastAPI) -> list[str]:
    """"METHOD /path" of every route, sorted by path."""
    pairs = {(path, method) for route in app.routes if (path := getattr(route, "path", None))
             for method in getattr(route, "methods", None) or () if method != "HEAD"}
    return [f"{method} {path}" for path, method in sorted(pairs)]


def add_operations_routes(app: FastAPI, server: Server) -> None:
    add_responses_route(app, server)  # POST /v1/responses (meshlm/serve/responses.py)

    @app.get("/health")
    @app.get("/health/live")
    async def live() -> dict[str, str]:
        return {"status": "ok"}  # the process answers HTTP: alive, draining or not

    @app.get("/health/ready")
    async def ready() -> JSONResponse:
        ok, why = readiness(server)
        return JSONResponse({"status": "ready" if ok else "not ready", "detail": why},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        if not server.metrics.available:
            return error_response(ApiError(404, INSTALL_HINT, code="metrics_unavailable"))
        body, content_type = server.metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/")
    @app.get("/v1")
    async def index(request: Request) -> dict[str, Any]:
        root = str(request.base_url).rstrip("/")
        return {"object": "meshlm.server", "url": root, "base_url": root + "/v1",
                "models": sorted(server.router.deployments), "routes": route_table(app)}
