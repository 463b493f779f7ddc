"""The Twilio Media Streams wire codec, for both roles (docs/protocol-twilio.md).

Theory of operation
-------------------
The gateway meets this format twice: on the *carrier side* Twilio is the
peer and the gateway plays the app; on the *app side* the gateway plays Twilio toward an app
built for Media Streams (Pipecat's ``TwilioFrameSerializer``, for example). The messages are the
same; only the roles swap. So one set of Structs, tagged by ``event``, serves both:

* :func:`decode_twilio` decodes a frame from either peer. ``sender="twilio"`` accepts what Twilio
  sends (``connected``, ``start``, ``media``, ``dtmf``, ``mark``, ``stop``); ``sender="app"``
  accepts what an app sends (``media``, ``mark``, ``clear``) and ignores everything else, as
  docs/protocol-twilio.md says. It never raises: a frame that is not JSON, lacks ``event``, misses a
  field, has a wrong type or a bad base64 payload is a :class:`TwilioBadMessage`; a well-formed
  message of another event is :class:`TwilioIgnored`.
* :class:`TwilioStreamWriter` plays Twilio: it writes ``connected``, then ``start``, then the
  stream, and owns the counters, which are decimal *strings* on the wire. ``sequenceNumber``
  counts every message from ``start`` = "1"; ``chunk`` counts ``media`` messages from "1";
  ``timestamp`` is milliseconds of stream time, by default the audio already sent (µ-law 8 kHz
  is 8 bytes per ms, so 20 ms chunks give ``(chunk - 1) * 20``).
* :class:`TwilioAppSideWriter` plays the app toward Twilio: ``media``, ``mark`` and ``clear``.

Payloads are base64 on the wire and ``bytes`` here; msgspec converts in C both ways, which
measured faster than building media messages by hand. Sans-I/O: no sockets, no clock.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

import msgspec
from msgspec import Struct, field

from appbridge.protocol.json_bounds import TOO_DEEP
from appbridge.protocol.limits import utf8_size_over

__all__ = [
    "DTMF_TRACK",
    "MAX_TWILIO_FRAME_BYTES",
    "MULAW_BYTES_PER_MS",
    "Connected",
    "LocalProtocolError",
    "MediaFormat",
    "MediaPayload",
    "TwilioAppMessage",
    "TwilioAppSideWriter",
    "TwilioBadMessage",
    "TwilioClear",
    "TwilioDtmf",
    "TwilioDtmfInfo",
    "TwilioIgnored",
    "TwilioMark",
    "TwilioMarkInfo",
    "TwilioMedia",
    "TwilioMessage",
    "TwilioStart",
    "TwilioStartInfo",
    "TwilioStop",
    "TwilioStopInfo",
    "TwilioStreamWriter",
    "decode_twilio",
]

MAX_TWILIO_FRAME_BYTES: Final = 1 << 20
"""Largest text frame accepted from either peer. Apps may send a long ``media`` payload in one
message (Twilio accepts any length); 1 MiB of base64 is about 98 s of µ-law, under the 120 s
output queue limit (docs/protocol-session-v1.md, ``play``)."""

MULAW_BYTES_PER_MS: Final = 8
"""Media Streams audio is µ-law, 8 kHz, mono: one byte per sample, 8 per millisecond."""

DTMF_TRACK: Final = "inbound_track"
"""The ``track`` Twilio writes in ``dtmf`` messages (not ``inbound``, unlike ``media``)."""

Counter: TypeAlias = str
"""``sequenceNumber``, ``chunk`` and ``timestamp`` are decimal strings on the wire. Only their
type is checked: nothing the gateway does depends on their value, and a regex per counter
tripled the cost of decoding Twilio's ``media`` (about 50 a second per call)."""


class LocalProtocolError(RuntimeError):
    """The gateway itself broke the message order of a stream (a bug on our side, not the
    peer's): for instance ``media`` before ``start``."""


# --------------------------------------------------------------------------------------------
# Messages


class MediaFormat(Struct, kw_only=True, rename="camel"):
    """Always µ-law 8 kHz mono on a Media Stream."""

    encoding: str = "audio/x-mulaw"
    sample_rate: int = 8000
    channels: int = 1


class TwilioStartInfo(Struct, kw_only=True, rename="camel"):
    """The body of ``start``: who the stream belongs to and what it carries."""

    account_sid: str
    stream_sid: str
    call_sid: str
    tracks: list[str] = field(default_factory=lambda: ["inbound"])
    media_format: MediaFormat = field(default_factory=MediaFormat)
    custom_parameters: dict[str, str] = field(default_factory=dict)


class MediaPayload(Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """The body of ``media``. Twilio sends track, chunk and timestamp; apps send the payload
    alone. ``payload`` is the raw µ-law (base64 on the wire)."""

    track: str | None = None
    chunk: Counter | None = None
    timestamp: Counter | None = None
    payload: bytes


class TwilioDtmfInfo(Struct, kw_only=True, omit_defaults=True):
    """The body of ``dtmf``."""

    track: str | None = None
    digit: str


class TwilioMarkInfo(Struct, kw_only=True):
    """The body of ``mark``."""

    name: str


class TwilioStopInfo(Struct, kw_only=True, rename="camel"):
    """The body of ``stop``."""

    account_sid: str
    call_sid: str


class _Message(Struct, tag_field="event", kw_only=True, omit_defaults=True, rename="camel"):
    """Base of every message: tagged by ``event``, unknown fields ignored."""


class Connected(_Message, tag="connected", kw_only=True, omit_defaults=False, rename="camel"):
    """Twilio's first message on a stream; it carries no ``streamSid``."""

    protocol: str = "Call"
    version: str = "1.0.0"


class TwilioStart(_Message, tag="start", kw_only=True, rename="camel"):
    """Twilio's second message, sent once."""

    sequence_number: Counter | None = None
    start: TwilioStartInfo
    stream_sid: str | None = None


class TwilioMedia(_Message, tag="media", kw_only=True, rename="camel"):
    """Audio, in either direction."""

    sequence_number: Counter | None = None
    media: MediaPayload
    stream_sid: str | None = None


class TwilioDtmf(_Message, tag="dtmf", kw_only=True, rename="camel"):
    """A keypress of the caller."""

    stream_sid: str | None = None
    sequence_number: Counter | None = None
    dtmf: TwilioDtmfInfo


class TwilioMark(_Message, tag="mark", kw_only=True, rename="camel"):
    """From an app: a position in the output. From Twilio: that position was played, or
    ``clear`` dropped it."""

    sequence_number: Counter | None = None
    stream_sid: str | None = None
    mark: TwilioMarkInfo


class TwilioStop(_Message, tag="stop", kw_only=True, rename="camel"):
    """Twilio's last message; it then closes the socket."""

    sequence_number: Counter | None = None
    stream_sid: str | None = None
    stop: TwilioStopInfo


class TwilioClear(_Message, tag="clear", kw_only=True, rename="camel"):
    """From an app: empty the buffered output and echo every pending mark."""

    stream_sid: str | None = None


TwilioMessage: TypeAlias = (
    Connected | TwilioStart | TwilioMedia | TwilioDtmf | TwilioMark | TwilioStop
)
"""What Twilio sends to an app (the gateway reads these on the carrier side)."""

TwilioAppMessage: TypeAlias = TwilioMedia | TwilioMark | TwilioClear
"""What an app sends to Twilio (the gateway reads these on the app side)."""


class TwilioIgnored(Struct, frozen=True):
    """A well-formed message of an event this side does not handle; dropped."""

    event: str


class TwilioBadMessage(Struct, frozen=True):
    """A malformed frame. The text is for logs; Twilio and Twilio-dialect apps have no error
    message to carry it."""

    message: str


# --------------------------------------------------------------------------------------------
# Decoding

_from_twilio_decoder: Final = msgspec.json.Decoder(TwilioMessage)
_from_app_decoder: Final = msgspec.json.Decoder(TwilioAppMessage)
_any_decoder: Final = msgspec.json.Decoder()
_encoder: Final = msgspec.json.Encoder()

_TWILIO_EVENTS: Final = frozenset({"connected", "start", "media", "dtmf", "mark", "stop"})
_APP_EVENTS: Final = frozenset({"media", "mark", "clear"})


def _too_large(frame: bytes | str) -> bool:
    return utf8_size_over(frame, MAX_TWILIO_FRAME_BYTES)


def _classify_failure(
    frame: bytes | str, error: Exception, known: frozenset[str]
) -> TwilioIgnored | TwilioBadMessage:
    """The slow path, taken only when the one-pass decode failed. A message nested too deeply
    to decode is bad like any other (``protocol/json_bounds.py``)."""
    if isinstance(error, RecursionError):
        return TwilioBadMessage(TOO_DEEP)
    if isinstance(error, msgspec.DecodeError) and not isinstance(error, msgspec.ValidationError):
        return TwilioBadMessage(f"not valid JSON: {error}")
    try:
        obj = _any_decoder.decode(frame)
    except RecursionError:
        return TwilioBadMessage(TOO_DEEP)
    except msgspec.MsgspecError as exc:
        # The typed pass stops at the first invalid value, before any later syntax error.
        return TwilioBadMessage(f"not valid JSON: {exc}")
    if not isinstance(obj, dict):
        return TwilioBadMessage(f"expected a JSON object, got {type(obj).__name__}")
    event = obj.get("event")
    if not isinstance(event, str):
        what = "missing" if "event" not in obj else "not a string"
        return TwilioBadMessage(f"`event` is {what}")
    if event not in known:
        return TwilioIgnored(event)
    return TwilioBadMessage(f"{event}: {error}")


def decode_twilio(
    frame: bytes | str, *, sender: Literal["twilio", "app"] = "twilio"
) -> TwilioMessage | TwilioAppMessage | TwilioIgnored | TwilioBadMessage:
    """Decodes one text frame of a Media Stream; never raises.

    ``sender="twilio"`` on the carrier side (frames Twilio wrote), ``sender="app"`` on the app
    side (frames a Twilio-dialect app wrote; everything but ``media``, ``mark`` and
    ``clear`` is ignored there).
    """
    if _too_large(frame):
        return TwilioBadMessage(f"text frame is over {MAX_TWILIO_FRAME_BYTES} bytes")
    if sender == "twilio":
        try:
            return _from_twilio_decoder.decode(frame)
        except (msgspec.MsgspecError, RecursionError) as exc:
            return _classify_failure(frame, exc, _TWILIO_EVENTS)
    try:
        return _from_app_decoder.decode(frame)
    except (msgspec.MsgspecError, RecursionError) as exc:
        return _classify_failure(frame, exc, _APP_EVENTS)


# --------------------------------------------------------------------------------------------
# Writing


class TwilioStreamWriter:
    """Writes Twilio's side of one Media Stream, toward an app (docs/protocol-twilio.md).

    Order is fixed: :meth:`connected`, :meth:`start`, then any of :meth:`media`, :meth:`dtmf`
    and :meth:`mark`, and :meth:`stop` last. Breaking it raises :class:`LocalProtocolError`.
    """

    def __init__(self) -> None:
        self._state: Literal["new", "connected", "streaming", "stopped"] = "new"
        self._stream_sid = ""
        self._account_sid = ""
        self._call_sid = ""
        self._sequence = 0
        self._chunk = 0
        self._audio_bytes = 0

    @property
    def stream_sid(self) -> str:
        return self._stream_sid

    @property
    def sequence_number(self) -> int:
        """The ``sequenceNumber`` of the last message written (0 before ``start``)."""
        return self._sequence

    @property
    def chunk(self) -> int:
        """The ``chunk`` of the last ``media`` message written (0 before the first)."""
        return self._chunk

    @property
    def elapsed_ms(self) -> int:
        """Milliseconds of audio written so far: the next default ``timestamp``."""
        return self._audio_bytes // MULAW_BYTES_PER_MS

    def _next(self, what: str) -> str:
        if self._state != "streaming":
            raise LocalProtocolError(f"{what} written while the stream is {self._state}")
        self._sequence += 1
        return str(self._sequence)

    def connected(self) -> bytes:
        """The first message of every stream."""
        if self._state != "new":
            raise LocalProtocolError("connected written twice")
        self._state = "connected"
        return _encoder.encode(Connected())

    def start(
        self,
        account_sid: str,
        stream_sid: str,
        call_sid: str,
        custom_parameters: dict[str, str] | None = None,
    ) -> bytes:
        """The second message, once; it fixes the ids every later message carries."""
        if self._state != "connected":
            raise LocalProtocolError(f"start written while the stream is {self._state}")
        self._state = "streaming"
        self._stream_sid = stream_sid
        self._account_sid = account_sid
        self._call_sid = call_sid
        info = TwilioStartInfo(
            account_sid=account_sid,
            stream_sid=stream_sid,
            call_sid=call_sid,
            custom_parameters=dict(custom_parameters or {}),
        )
        sequence = self._next("start")
        return _encoder.encode(
            TwilioStart(sequence_number=sequence, start=info, stream_sid=stream_sid)
        )

    def media(
        self, ulaw: bytes, *, timestamp_ms: int | None = None, track: str = "inbound"
    ) -> bytes:
        """One ``media`` message, of the inbound track unless told otherwise (a read-only
        listener may also take the ``outbound`` track, as Twilio's one-way streams do).

        ``timestamp_ms`` defaults to the audio already written; pass the stream's own clock
        (milliseconds since ``start``) when audio was skipped, as during a hold.
        """
        sequence = self._next("media")
        self._chunk += 1
        if timestamp_ms is None:
            timestamp_ms = self._audio_bytes // MULAW_BYTES_PER_MS
        self._audio_bytes += len(ulaw)
        payload = MediaPayload(
            track=track, chunk=str(self._chunk), timestamp=str(timestamp_ms), payload=ulaw
        )
        return _encoder.encode(
            TwilioMedia(sequence_number=sequence, media=payload, stream_sid=self._stream_sid)
        )

    def dtmf(self, digit: str) -> bytes:
        """A keypress of the caller."""
        sequence = self._next("dtmf")
        return _encoder.encode(
            TwilioDtmf(
                stream_sid=self._stream_sid,
                sequence_number=sequence,
                dtmf=TwilioDtmfInfo(track=DTMF_TRACK, digit=digit),
            )
        )

    def mark(self, name: str) -> bytes:
        """Echoes an app's mark once the audio queued before it played (or was cleared)."""
        sequence = self._next("mark")
        return _encoder.encode(
            TwilioMark(
                sequence_number=sequence,
                stream_sid=self._stream_sid,
                mark=TwilioMarkInfo(name=name),
            )
        )

    def stop(self, account_sid: str | None = None, call_sid: str | None = None) -> bytes:
        """The last message; the ids default to those of ``start``. Close the socket next."""
        sequence = self._next("stop")
        self._state = "stopped"
        info = TwilioStopInfo(
            account_sid=self._account_sid if account_sid is None else account_sid,
            call_sid=self._call_sid if call_sid is None else call_sid,
        )
        return _encoder.encode(
            TwilioStop(sequence_number=sequence, stream_sid=self._stream_sid, stop=info)
        )


class TwilioAppSideWriter:
    """Writes the app's side of a Media Stream, toward Twilio (the gateway's carrier side).

    Stateless: Twilio wants no counters from the app, only its ``streamSid``.
    """

    @staticmethod
    def media(stream_sid: str, ulaw: bytes) -> bytes:
        """Audio to play: µ-law 8 kHz, any length, no file header."""
        return _encoder.encode(TwilioMedia(media=MediaPayload(payload=ulaw), stream_sid=stream_sid))

    @staticmethod
    def mark(stream_sid: str, name: str) -> bytes:
        """Asks Twilio to echo ``name`` once the audio sent before it has played."""
        return _encoder.encode(TwilioMark(stream_sid=stream_sid, mark=TwilioMarkInfo(name=name)))

    @staticmethod
    def clear(stream_sid: str) -> bytes:
        """Empties Twilio's buffered audio (docs/protocol-session-v1.md, ``clear``: part of its 40
        ms)."""
        return _encoder.encode(TwilioClear(stream_sid=stream_sid))
