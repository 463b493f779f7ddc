"""Bounds on what a slow or idle HTTP client may hold (docs/operations.md, "HTTP connections").

uvicorn closes a kept-alive connection that stays idle, but not one that trickles a request head a
byte at a time: such clients stay forever, each holding a file descriptor and a protocol object,
and a few thousand of them starve the process (the slowloris attack). Two rules, applied to
every connection until its request head is complete (RFC 9112 §2: the head ends at the empty
line), again for each later request on a kept-alive connection:

- the head must arrive within :data:`HEAD_TIMEOUT_S`; otherwise the gateway answers
  ``408 Request Timeout`` (RFC 9110 §15.5.9) and closes the connection;
- at most :data:`MAX_PENDING_HEADS` connections per server may be waiting for a head at once; a
  new one beyond that evicts the longest-waiting one the same way. A real client (Twilio, an
  operator's curl) sends its head in one segment and is never the longest-waiting.

A WebSocket connection is past its head once upgraded, so media streams are never touched.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Final

log = logging.getLogger(__name__)

HEAD_TIMEOUT_S: Final = 10.0
MAX_PENDING_HEADS: Final = 256
TIMEOUT_RESPONSE: Final = (
    b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
)

# Per uvicorn server state: the connections waiting for a head, oldest first.
_waiting: weakref.WeakKeyDictionary[Any, dict[HeadDeadline, None]] = weakref.WeakKeyDictionary()


class HeadDeadline:
    """Mixed into uvicorn's httptools protocol (``http/uvicorn_server.py``)."""

    loop: asyncio.AbstractEventLoop
    server_state: Any
    transport: asyncio.Transport
    _head_timer: asyncio.TimerHandle | None = None
    evicted = 0
    timed_out = 0

    def _await_head(self) -> None:
        if self._head_timer is not None:
            return
        waiting = _waiting.setdefault(self.server_state, {})
        waiting[self] = None
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_late)
        if len(waiting) > MAX_PENDING_HEADS:
            oldest = next(iter(waiting))
            HeadDeadline.evicted += 1
            if HeadDeadline.evicted in (1, 10, 100) or HeadDeadline.evicted % 1000 == 0:
                log.warning(
                    "http: more than %d connections are sending a request head; closing the "
                    "longest-waiting (%d so far)",
                    MAX_PENDING_HEADS,
                    HeadDeadline.evicted,
                )
            oldest._refuse()

    def _head_done(self) -> None:
        timer, self._head_timer = self._head_timer, None
        if timer is None:
            return
        timer.cancel()
        waiting = _waiting.get(self.server_state)
        if waiting is not None:
            waiting.pop(self, None)

    def _head_late(self) -> None:
        HeadDeadline.timed_out += 1
        log.debug("http: no complete request head within %.0f s; closing", HEAD_TIMEOUT_S)
        self._refuse()

    def _refuse(self) -> None:
        self._head_done()
        transport = self.transport
        if not transport.is_closing():
            transport.write(TIMEOUT_RESPONSE)
            transport.close()
