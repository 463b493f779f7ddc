"""The app link: one WebSocket from the gateway to an app (or a listener), dialed per session.

docs/protocol-session-v1.md, "Connection and frames": the gateway dials, signs the request, retries
a refusing URL for about 2.5 s, pings every 10 s and drops a socket silent for 30 s. The link is
transport only; what the frames mean belongs to the dialect (``calls/``).

Writes never wait, so a slow app never stalls the media clock: audio is dropped while the socket's
write buffer is above ``AUDIO_DROP_ABOVE_BYTES`` (counted, logged once); control messages are
always written, and a peer whose buffer passes ``DEAD_ABOVE_BYTES`` is given up as too slow.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Final, Protocol

from mypy_extensions import mypyc_attr

from appbridge import __version__
from appbridge.apps.timers import Keepalive, KeepaliveAction, RetryWindow
from appbridge.clock import Clock
from appbridge.net.plaintext import redact_url
from appbridge.net.ws_client import WsClient, WsConnectError, ws_connect
from appbridge.protocol.signing import fonoster_headers

log = logging.getLogger(__name__)

AUDIO_DROP_ABOVE_BYTES: Final = 256 * 1024
DEAD_ABOVE_BYTES: Final = 8 * 1024 * 1024
WS_MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024


#: Statuses by which an app refuses the gateway's signature: retrying cannot heal them.
SIGNATURE_REFUSED: Final = frozenset({401, 403})


class AppUnreachable(Exception):
    def __init__(self, url: str, attempts: int, last_error: str) -> None:
        # Only scheme://host:port is ever logged (app URLs may carry tokens in the path).
        super().__init__(
            f"{redact_url(url)}: unreachable after {attempts} attempt(s): {last_error}"
        )
        self.url = url
        self.attempts = attempts
        self.last_error = last_error


class LinkListener(Protocol):
    def on_app_text(self, data: bytes) -> None: ...

    def on_app_binary(self, data: bytes) -> None: ...

    def on_app_gone(self, reason: str) -> None:
        """``closed`` (the app closed), ``timeout`` (30 s silent) or ``slow`` (writes backed up)."""
        ...


class LinkTap(Protocol):
    """Sees every JSON message on the link (the call console, console/recorder.py)."""

    def text_in(self, data: bytes) -> None: ...

    def text_out(self, data: bytes) -> None: ...


@mypyc_attr(allow_interpreted_subclasses=True)  # tests stand a recording link in for it
class AppLink:
    """A connected link. Create with :func:`dial`."""

    def __init__(self, url: str, clock: Clock, loop: asyncio.AbstractEventLoop) -> None:
        self.url = url
        self._clock = clock
        self._loop = loop
        self._client: WsClient | None = None
        self._listener: LinkListener | None = None
        self._backlog: list[tuple[bool, bytes]] = []  # frames that arrived before attach()
        self._keepalive: Keepalive | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._gone = False
        self._open = False
        self.audio_dropped_frames = 0
        self._drop_logged = False
        # The console's view (docs/operations.md): messages go to the tap, audio is only counted.
        self.tap: LinkTap | None = None
        self.audio_in_frames = 0
        self.audio_in_bytes = 0
        self.audio_out_frames = 0
        self.audio_out_bytes = 0

    # -- wiring ----------------------------------------------------------------------------
    def _on_text(self, data: bytes) -> None:
        self._heard()
        tap = self.tap
        if tap is not None:
            tap.text_in(data)
        if self._listener is None:
            self._backlog.append((True, data))
        else:
            self._listener.on_app_text(data)

    def _on_binary(self, data: bytes) -> None:
        self._heard()
        self.audio_in_frames += 1
        self.audio_in_bytes += len(data)
        if self._listener is None:
            self._backlog.append((False, data))
        else:
            self._listener.on_app_binary(data)

    def _heard(self) -> None:
        if self._keepalive is not None:
            self._keepalive.on_activity(self._clock.now())

    def _on_closed(self, code: int | None, reason: str) -> None:
        if self._open:
            self._gone_with("closed")

    def _gone_with(self, reason: str) -> None:
        if self._gone:
            return
        self._gone = True
        self._open = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._listener is not None:
            self._listener.on_app_gone(reason)

    def _opened(self, client: WsClient) -> None:
        self._client = client
        self._open = True
        self._keepalive = Keepalive(self._clock.now())
        self._arm()

    def _arm(self) -> None:
        assert self._keepalive is not None
        delay = max(0.0, self._keepalive.next_deadline() - self._clock.now())
        self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._gone or self._keepalive is None or self._client is None:
            return
        action = self._keepalive.on_timer(self._clock.now())
        if action is KeepaliveAction.DEAD:
            log.warning("app link %s: nothing heard for 30 s; dropping it", redact_url(self.url))
            self._client.abort()
            self._gone_with("timeout")
            return
        if action is KeepaliveAction.PING:
            self._client.ping()
        self._arm()

    # -- public API ------------------------------------------------------------------------
    def attach(self, listener: LinkListener) -> None:
        """Start delivering frames (and the link's end) to ``listener``."""
        self._listener = listener
        backlog, self._backlog = self._backlog, []
        for is_text, data in backlog:
            if is_text:
                listener.on_app_text(data)
            else:
                listener.on_app_binary(data)
        if self._gone:
            listener.on_app_gone("closed")

    @property
    def is_open(self) -> bool:
        return self._open and not self._gone

    def send_control(self, data: bytes) -> None:
        """A JSON message: never dropped. A peer that lets these pile up is given up."""
        client = self._client
        if client is None or not self._open:
            return
        client.send_text(data)
        tap = self.tap
        if tap is not None:
            tap.text_out(data)
        if client.write_buffer_bytes > DEAD_ABOVE_BYTES:
            log.warning("app link %s: peer stopped reading; dropping it", redact_url(self.url))
            client.abort()
            self._gone_with("slow")

    def audio_room(self) -> bool:
        """Whether the next audio frame may be written: not while the peer is behind, when the
        frame is dropped (and counted) instead. Asked before the frame is made, so that a
        dropped frame takes no ``sequenceNumber`` or ``chunk`` of the Twilio dialect (they
        count the messages sent) and costs no encoding."""
        client = self._client
        if client is None or not self._open:
            return False
        if client.write_buffer_bytes > AUDIO_DROP_ABOVE_BYTES:
            self.audio_dropped_frames += 1
            if not self._drop_logged:
                self._drop_logged = True
                log.warning("app link %s is slow: dropping audio frames", redact_url(self.url))
            return False
        return True

    def send_audio(self, data: bytes, *, text: bool = False) -> None:
        """An audio frame (binary, or a JSON text frame in the Twilio dialect) that
        :meth:`audio_room` let through."""
        client = self._client
        if client is None:
            return
        self.audio_out_frames += 1
        self.audio_out_bytes += len(data)
        if text:
            client.send_text(data)
        else:
            client.send_binary(data)

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Close politely; the listener is not told (the caller decided this)."""
        self._listener = None
        self._gone = True
        self._open = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._client is not None:
            self._client.close(code, reason)
            # A peer that never answers the close handshake is cut after 1 s.
            client = self._client
            self._loop.call_later(1.0, client.abort)


async def dial(
    url: str,
    *,
    secret: str | None,
    clock: Clock,
    ssl_context: ssl.SSLContext | None,
    retry: bool = True,
    on_attempt_failed: Callable[[int, str], None] | None = None,
) -> AppLink:
    """Dial ``url``, signing each attempt (docs/protocol-session-v1.md, "Connection and frames").

    With ``retry`` the attempts go on for the 2.5 s retry window; raise AppUnreachable after.
    An app that refuses the signature (401 or 403) is not retried: that cannot heal in 2.5 s.
    """
    loop = asyncio.get_running_loop()
    link = AppLink(url, clock, loop)
    window = RetryWindow(started=clock.now())
    last_error = ""
    while True:
        headers = {"User-Agent": f"AppBridge/{__version__}"}
        if secret:
            headers.update(fonoster_headers(secret, url, int(clock.wall())))
        try:
            client = await ws_connect(
                url,
                headers,
                ssl_context=ssl_context,
                timeout_s=window.attempt_timeout(clock.now()),
                max_size=WS_MAX_MESSAGE_BYTES,
                on_text=link._on_text,
                on_binary=link._on_binary,
                on_pong=link._heard,
                on_closed=link._on_closed,
            )
        except WsConnectError as exc:
            last_error = str(exc)
            if exc.status in SIGNATURE_REFUSED:
                last_error = (
                    f"the app answered HTTP {exc.status}: it refused the gateway's signature "
                    "(check the app's signing_secret); not retried"
                )
            if on_attempt_failed is not None:
                on_attempt_failed(window.attempts + 1, last_error)
            if exc.status in SIGNATURE_REFUSED:
                raise AppUnreachable(url, window.attempts + 1, last_error) from None
            next_at = window.on_failure(clock.now()) if retry else None
            if next_at is None:
                raise AppUnreachable(url, window.attempts, last_error) from None
            await asyncio.sleep(max(0.0, next_at - clock.now()))
            continue
        link._opened(client)
        return link
