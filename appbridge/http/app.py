"""The gateway's HTTP and WebSocket routes, as one Starlette application.

Each group of routes is built by its own module from the gateway: http/routes_ops.py (health,
readiness, metrics; docs/operations.md), http/routes_calls.py (the ``/v1`` API) and
http/routes_twilio.py (Twilio's webhooks, the Twilio-compatible hang-up and the Media Stream;
docs/protocol-twilio.md); with ``[cluster]`` the last two add the owner's half of what the
other nodes forward, under ``/internal`` (docs/scaling.md). ``WS /twilio/stream`` is normally
served before this application sees it, on the WebSocket fast path (http/uvicorn_server.py).
``GET /v1/trunks`` is http/routes_trunks.py (docs/sip.md, "Registering with a trunk"). The
browser pages, their login and the call console are http/routes_web.py, http/web_auth.py and
http/routes_console.py (docs/operations.md, "The console and the softphone").
Every error answer is JSON (http/errors.py), including unknown routes and wrong methods.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, WebSocketRoute

from appbridge.demo.app import DemoAppEndpoint
from appbridge.gateway import Gateway
from appbridge.http.errors import http_error, server_error
from appbridge.http.routes_calls import calls_routes, internal_calls_routes
from appbridge.http.routes_console import console_routes
from appbridge.http.routes_ops import ops_routes
from appbridge.http.routes_trunks import trunks_routes
from appbridge.http.routes_twilio import internal_twilio_routes, twilio_routes
from appbridge.http.routes_web import web_routes
from appbridge.http.routes_webrtc import webrtc_routes
from appbridge.http.web_auth import auth_routes


def build_app(gw: Gateway) -> Starlette:
    routes: list[BaseRoute] = [
        *ops_routes(gw),
        *calls_routes(gw),
        *trunks_routes(gw),
        *twilio_routes(gw),
        *webrtc_routes(gw),
        *internal_calls_routes(gw),
        *internal_twilio_routes(gw),
        *auth_routes(gw),
        *web_routes(gw),
        *console_routes(gw),
        WebSocketRoute("/demo/session", DemoAppEndpoint(gw)),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
    app.state.gateway = gw
    return app
