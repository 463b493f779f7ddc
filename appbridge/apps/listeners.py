"""Listen-only sockets (docs/protocol-session-v1.md, "Listen-only sockets").

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
from typing import Any

from appbridge.apps.dialects import INBOUND_TRACK, Encoder, encoder_for
from appbridge.apps.link import AppLink, AppUnreachable, dial
from appbridge.clock import Clock
from appbridge.config import ListenerConfig
from appbridge.net.plaintext import redact_url
from appbridge.protocol import session_v1 as sv1

log = logging.getLogger(__name__)


class Listener:
    def __init__(self, cfg: ListenerConfig, encoder: Encoder) -> None:
        self.cfg = cfg
        self.encoder = encoder
        self.link: AppLink | None = None
        self.wants_inbound = cfg.tracks in ("inbound", "both")
        self.wants_outbound = cfg.tracks in ("outbound", "both")
        self.gone = False

    # LinkListener -------------------------------------------------------------------------
    def on_app_text(self, data: bytes) -> None:
        if self.encoder.protocol == "twilio":
            # The Twilio dialect has no error message to carry read_only.
            log.warning("listener %s sent a message; ignored (read-only)", redact_url(self.cfg.url))
            return
        msg = sv1.decode_command(data)
        if isinstance(msg, sv1.BadMessage):
            relates_to = msg.relates_to
        elif isinstance(msg, sv1.Ignored):
            relates_to = msg.type
        else:
            relates_to = msg.id or str(msg.__struct_config__.tag)
        self._send(sv1.error_event("read_only", "this is a listen-only socket", relates_to))

    def on_app_binary(self, data: bytes) -> None:
        if self.encoder.protocol == "twilio":
            log.warning("listener %s sent audio; ignored (read-only)", redact_url(self.cfg.url))
            return
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
        protocol: str,
        workspace_ref: str | None,
        secret: str | None,
        clock: Clock,
        ssl_context: object,
    ) -> None:
        self.listeners = [Listener(cfg, encoder_for(protocol, workspace_ref)) for cfg in configs]
        self._secret = secret
        self._clock = clock
        self._ssl_context = ssl_context
        self._start: tuple[sv1.SessionStart, bytes] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.wants_outbound = any(item.wants_outbound for item in self.listeners)

    def start(self, session_start: sv1.SessionStart, encoded: bytes) -> None:
        self._start = (session_start, encoded)
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
            for message in listener.encoder.start(*self._start):
                link.send_control(message)

    def _live(self) -> list[Listener]:
        return [item for item in self.listeners if item.link is not None and not item.gone]

    def send_event(self, event: Any, encoded: bytes) -> None:
        for listener in self._live():
            assert listener.link is not None
            data = listener.encoder.event(event, encoded)
            if data is not None:
                listener.link.send_control(data)

    def send_audio(self, track_id: int, frame: bytes, elapsed_ms: int) -> None:
        """A frame of one track (in the session format), to the listeners that chose it."""
        for listener in self._live():
            wanted = (
                listener.wants_inbound if track_id == INBOUND_TRACK else listener.wants_outbound
            )
            link = listener.link
            if wanted and link is not None and link.audio_room():
                encoder = listener.encoder
                link.send_audio(
                    encoder.audio(track_id, frame, elapsed_ms), text=encoder.audio_is_text
                )

    def close(self, session_end: sv1.SessionEnd | None) -> None:
        self._closed = True
        for task in self._tasks:
            if not task.done():
                task.cancel()
        for listener in self._live():
            assert listener.link is not None
            if session_end is not None:
                data = listener.encoder.event(session_end, sv1.encode_event(session_end))
                if data is not None:
                    listener.link.send_control(data)
            listener.link.close(1000, "session ended")
