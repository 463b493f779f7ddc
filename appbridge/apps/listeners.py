"""Listen-only sockets (seed 004, "Listen-only sockets"; INTERFACES §6 "Listeners").

An app lists up to 4 listeners. Each is dialed when the session starts, signed with the app's
secret over the listener's own URL, and receives ``session.start``, every event the app receives
(errors and ``session.end`` included) and the tracks it chose, each as its own binary frames with
the track id byte; sides are never mixed. Anything a listener sends is answered ``error
read_only``.

A listener never affects the call: it is dialed in the background (with the same 2.5 s retry
window as apps), written to without waiting (a slow one loses audio, then is given up), and its
failure is logged and forgotten.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from appbridge.apps.link import AppLink, AppUnreachable, dial
from appbridge.clock import Clock
from appbridge.config import ListenerConfig
from appbridge.net.plaintext import redact_url
from appbridge.protocol import session_v1 as sv1

log = logging.getLogger(__name__)


class Listener:
    def __init__(self, cfg: ListenerConfig) -> None:
        self.cfg = cfg
        self.link: AppLink | None = None
        self.wants_inbound = cfg.tracks in ("inbound", "both")
        self.wants_outbound = cfg.tracks in ("outbound", "both")
        self.gone = False

    # LinkListener -------------------------------------------------------------------------
    def on_app_text(self, data: bytes) -> None:
        msg = sv1.decode_command(data)
        if isinstance(msg, sv1.BadMessage):
            relates_to = msg.relates_to
        elif isinstance(msg, sv1.Ignored):
            relates_to = msg.type
        else:
            relates_to = msg.id or str(msg.__struct_config__.tag)
        self._send(sv1.error_event("read_only", "this is a listen-only socket", relates_to))

    def on_app_binary(self, data: bytes) -> None:
        self._send(sv1.error_event("read_only", "this is a listen-only socket", "audio"))

    def on_app_gone(self, reason: str) -> None:
        self.gone = True
        log.info("listener %s gone (%s)", redact_url(self.cfg.url), reason)

    def _send(self, data: bytes) -> None:
        if self.link is not None and not self.gone:
            self.link.send_control(data)


class ListenerSet:
    """The listeners of one app session."""

    def __init__(
        self,
        configs: Sequence[ListenerConfig],
        *,
        secret: str | None,
        clock: Clock,
        ssl_context: object,
    ) -> None:
        self.listeners = [Listener(cfg) for cfg in configs]
        self._secret = secret
        self._clock = clock
        self._ssl_context = ssl_context
        self._start: bytes | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.wants_outbound = any(item.wants_outbound for item in self.listeners)

    def start(self, session_start: bytes) -> None:
        self._start = session_start
        loop = asyncio.get_running_loop()
        for listener in self.listeners:
            self._tasks.append(loop.create_task(self._connect(listener)))

    async def _connect(self, listener: Listener) -> None:
        try:
            link = await dial(
                listener.cfg.url,
                secret=self._secret,
                clock=self._clock,
                ssl_context=self._ssl_context,  # type: ignore[arg-type]
            )
        except AppUnreachable as exc:
            listener.gone = True
            log.warning("listener %s unreachable: %s", redact_url(listener.cfg.url), exc.last_error)
            return
        if self._closed:
            link.close(1000, "session ended")
            return
        listener.link = link
        link.attach(listener)
        if self._start is not None:
            link.send_control(self._start)

    def _live(self) -> list[Listener]:
        return [item for item in self.listeners if item.link is not None and not item.gone]

    def send_event(self, data: bytes) -> None:
        for listener in self._live():
            assert listener.link is not None
            listener.link.send_control(data)

    def send_inbound(self, frame: bytes) -> None:
        """A caller-track frame, track byte included."""
        for listener in self._live():
            if listener.wants_inbound:
                assert listener.link is not None
                listener.link.send_audio(frame)

    def send_outbound(self, frame: bytes) -> None:
        """An outbound-track frame (what the caller hears), track byte included."""
        for listener in self._live():
            if listener.wants_outbound:
                assert listener.link is not None
                listener.link.send_audio(frame)

    def close(self, session_end: bytes | None) -> None:
        self._closed = True
        for task in self._tasks:
            if not task.done():
                task.cancel()
        for listener in self._live():
            assert listener.link is not None
            if session_end is not None:
                listener.link.send_control(session_end)
            listener.link.close(1000, "session ended")
