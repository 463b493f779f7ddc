"""``GET /v1/trunks``: the configured SIP trunks and their registrations (docs/operations.md,
"The `/v1` API"; docs/sip.md, "Registering with a trunk").

The same ``Authorization: Bearer`` check as ``/v1/calls`` (``routes_calls.py``). Each trunk shows
its name, host, port, transport, srtp mode, ``register`` and a ``registration`` object with its
``state`` (``unregistered``, ``registering``, ``registered``, ``failed``, ``disabled``) and,
when known, ``expiresAt``, ``lastError``, ``nextAttemptAt`` and ``contact``. Credentials never
appear. A node answers for itself only: registrations are per node.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from appbridge.carriers.sip.register_client import describe_without_service
from appbridge.http.routes_calls import _bearer_ok, _unauthorized

if TYPE_CHECKING:
    from appbridge.gateway import Gateway


async def list_trunks(gw: Gateway, request: Request) -> Response:
    if not _bearer_ok(gw, request):
        return _unauthorized()
    if gw.sip is not None:
        trunks = gw.sip.registrations.describe()
    elif gw.config.sip is not None:
        trunks = describe_without_service(gw.config.sip)
    else:
        trunks = []
    return JSONResponse({"trunks": trunks})


def trunks_routes(gw: Gateway) -> list[BaseRoute]:
    return [Route("/v1/trunks", partial(list_trunks, gw), methods=["GET"], name="list_trunks")]
