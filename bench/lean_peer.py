"""The socket half that the lean WebSocket peers share (bench/README.md, "Lean peers").

:class:`bench.lean_app.LeanSession` (the app's end of a session) and
:class:`bench.lean_twilio.LeanTwilioCall` (the caller's Media Stream) are both plain
``asyncio.Protocol`` objects on a :mod:`bench.stamped` transport. What they do with a read
differs; how they hold the transport, write to it and give it up does not, and lives here.
"""

from __future__ import annotations

import asyncio
from typing import cast

from bench.stamped import StampedTransport

__all__ = ["LeanPeer"]


class LeanPeer(asyncio.Protocol):
    """A protocol that keeps its transport, and the stamped view of it when there is one (the
    kernel's arrival stamps, bench/README.md "Receive stamps"). Subclasses say what being
    closed means (:meth:`_set_closed`)."""

    _transport: asyncio.Transport | None = None
    _stamps: StampedTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._stamps = transport if isinstance(transport, StampedTransport) else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._set_closed()

    def _write(self, data: bytes) -> None:
        """Write at once; nothing once the transport is closing (the peer is ending anyway)."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _abort(self) -> None:
        """Close the transport and mark the peer closed without waiting for the other end."""
        if self._transport is not None:
            self._transport.close()
        self._set_closed()

    def _set_closed(self) -> None:
        raise NotImplementedError
