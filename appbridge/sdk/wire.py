"""The socket under a session: one protocol, two adapters.

A :class:`~appbridge.sdk.Session` reads and writes frames through a :class:`Wire`, so the same
session code runs on a connection of the standalone ``websockets`` server and on an ASGI
(Starlette/FastAPI) WebSocket. The adapters turn each library's way of saying "closed" into the
two the session knows: ``recv()`` answering ``None``, and ``send()`` raising ``ConnectionError``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

__all__ = ["AsgiWire", "WebsocketsWire", "Wire"]


class Wire(Protocol):
    """The socket under a session: the server adapts websockets and ASGI connections to it."""

    async def recv(self) -> str | bytes | None:
        """The next frame, or ``None`` once the connection is closed."""
        ...

    async def send(self, frame: str | bytes) -> None:
        """Sends a text (``str``) or binary frame; raises ``ConnectionError`` once closed."""
        ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...


class WebsocketsWire:
    """A ``websockets`` server connection as a session's :class:`Wire`."""

    def __init__(self, ws: ServerConnection) -> None:
        self._ws = ws

    async def recv(self) -> str | bytes | None:
        try:
            return await self._ws.recv()
        except ConnectionClosed:
            return None

    async def send(self, frame: str | bytes) -> None:
        try:
            await self._ws.send(frame)
        except ConnectionClosed as exc:
            raise ConnectionError("the connection is closed") from exc

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self._ws.close(code, reason)


class AsgiWire:
    """A Starlette WebSocket (accepted) as a session's :class:`Wire`."""

    def __init__(self, websocket: WebSocket) -> None:
        self._ws = websocket
        self._gone = False

    async def recv(self) -> str | bytes | None:
        if self._gone:
            return None
        message = await self._ws.receive()
        if message["type"] == "websocket.disconnect":
            self._gone = True
            return None
        text = message.get("text")
        if text is not None:
            return str(text)
        data = message.get("bytes")
        return bytes(data) if data is not None else b""

    async def send(self, frame: str | bytes) -> None:
        if self._gone:
            raise ConnectionError("the connection is closed")
        message: dict[str, Any] = {"type": "websocket.send"}
        message["text" if isinstance(frame, str) else "bytes"] = frame
        try:
            await self._ws.send(message)
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            self._gone = True
            raise ConnectionError("the connection is closed") from exc

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self._gone or self._ws.application_state != WebSocketState.CONNECTED:
            return
        self._gone = True
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self._ws.close(code, reason)
