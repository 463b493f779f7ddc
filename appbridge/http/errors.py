"""Every error the gateway answers over HTTP is JSON, ``{"error": CODE, "message": TEXT}``
(docs/operations.md, "The `/v1` API"), unknown routes and wrong methods included, so a client
never has to parse an HTML page. The Twilio-compatible endpoint is the exception: it answers in
Twilio's own error format (http/twilio_rest.py).
"""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

log = logging.getLogger(__name__)


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals: 404 for an unknown route, 405 for a wrong method."""
    assert isinstance(exc, HTTPException)
    names = {404: "not_found", 405: "method_not_allowed"}
    return error(exc.status_code, names.get(exc.status_code, "http_error"), str(exc.detail))


async def server_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path, exc_info=exc)
    return error(500, "internal", "the gateway failed to answer this request")
