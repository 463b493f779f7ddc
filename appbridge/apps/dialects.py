"""What goes on the wire toward an app or a listener, per protocol (docs/protocol-session-v1.md,
docs/protocol-twilio.md).

The call engine speaks in events (the Structs of ``protocol/session_v1``) and audio frames; an
encoder turns them into the frames of the socket's protocol:

* ``fonoster`` (fonoster.session.v1): JSON text events; audio as binary frames whose first byte
  is the track id.
* ``twilio`` (Twilio Media Streams, played from Twilio's side): ``connected`` then ``start``
  (``streamSid`` = sessionRef, ``callSid`` = callRef, ``accountSid`` = the app's
  workspace_ref), ``media`` as base64 µ-law JSON with Twilio's string counters, ``dtmf``,
  ``mark`` echoes and ``stop``. Nothing else exists in that dialect: output and turn events and
  errors have no message there, so they are not sent (never a frame an app could choke on).
"""

from __future__ import annotations

from typing import Any, Final

from appbridge.protocol import session_v1 as sv1
from appbridge.protocol.twilio_streams import TwilioStreamWriter

INBOUND_TRACK: Final = 1
OUTBOUND_TRACK: Final = 2


class FonosterEncoder:
    protocol = "fonoster"
    audio_is_text = False

    def __init__(self) -> None:
        self._prefix = {
            INBOUND_TRACK: bytes([INBOUND_TRACK]),
            OUTBOUND_TRACK: bytes([OUTBOUND_TRACK]),
        }

    def start(self, start: sv1.SessionStart, encoded: bytes) -> list[bytes]:
        return [encoded]

    def audio(self, track_id: int, frame: bytes, elapsed_ms: int) -> bytes:
        return self._prefix[track_id] + frame

    def event(self, event: Any, encoded: bytes) -> bytes | None:
        return encoded


class TwilioEncoder:
    protocol = "twilio"
    audio_is_text = True

    def __init__(self, account_sid: str) -> None:
        self._writer = TwilioStreamWriter()
        self._account_sid = account_sid

    def start(self, start: sv1.SessionStart, encoded: bytes) -> list[bytes]:
        params = {"from": start.from_, "to": start.to}
        for key, value in (start.metadata or {}).items():
            params[str(key)] = value if isinstance(value, str) else sv1.encode_json(value).decode()
        return [
            self._writer.connected(),
            self._writer.start(self._account_sid, start.session_ref, start.call_ref, params),
        ]

    def audio(self, track_id: int, frame: bytes, elapsed_ms: int) -> bytes:
        track = "inbound" if track_id == INBOUND_TRACK else "outbound"
        return self._writer.media(frame, timestamp_ms=elapsed_ms, track=track)

    def event(self, event: Any, encoded: bytes) -> bytes | None:
        if isinstance(event, sv1.MarkEvent):
            return self._writer.mark(event.name)
        if isinstance(event, sv1.DtmfEvent):
            return self._writer.dtmf(event.digit)
        if isinstance(event, sv1.SessionEnd):
            return self._writer.stop()
        return None


Encoder = FonosterEncoder | TwilioEncoder


def encoder_for(protocol: str, workspace_ref: str | None) -> Encoder:
    if protocol == "twilio":
        return TwilioEncoder(workspace_ref or "")
    return FonosterEncoder()
