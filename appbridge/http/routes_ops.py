"""The operator's routes: ``GET /healthz``, ``GET /readyz`` and ``GET /metrics``
(docs/operations.md, "Health and readiness" and "Metrics"). None needs a token: a load balancer
and a Prometheus scraper must reach them without the API's credentials.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from appbridge.http.metrics import CONTENT_TYPE_LATEST, render_metrics

if TYPE_CHECKING:
    from appbridge.gateway import Gateway

METRICS_MEDIA_TYPE = CONTENT_TYPE_LATEST


async def healthz(gw: Gateway, request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(gw: Gateway, request: Request) -> Response:
    """503 once draining (SIGTERM), so the load balancer stops sending calls."""
    if gw.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return JSONResponse({"status": "ready", "calls": len(gw.registry)})


async def metrics(gw: Gateway, request: Request) -> Response:
    return PlainTextResponse(render_metrics(gw), media_type=METRICS_MEDIA_TYPE)


def ops_routes(gw: Gateway) -> list[BaseRoute]:
    return [
        Route("/healthz", partial(healthz, gw), methods=["GET"], name="healthz"),
        Route("/readyz", partial(readyz, gw), methods=["GET"], name="readyz"),
        Route("/metrics", partial(metrics, gw), methods=["GET"], name="metrics"),
    ]
