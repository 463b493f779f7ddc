"""The app side of a call: reaching the app (with its fallbacks) and the session it opens.

An app is dialled over its signed WebSocket, with refused attempts retried for 2.5 s
(docs/protocol-session-v1.md, "Connection and frames"); when it cannot be reached, its
``fallback`` applies: another app (at most :data:`MAX_FALLBACK_HOPS` in a row) or a message the
gateway speaks before hanging up (docs/configuration.md, `[[apps]]`). The session opens with
``session.start``, whose audio format is the app's (µ-law 8 kHz for the Twilio dialect).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

from appbridge.apps.dialects import INBOUND_TRACK, OUTBOUND_TRACK
from appbridge.apps.link import AppLink, AppUnreachable, dial
from appbridge.config import AppConfig, Config
from appbridge.media.codecs import PCMU_8K, AudioFormat
from appbridge.net.plaintext import redact_url
from appbridge.protocol import session_v1 as sv1

if TYPE_CHECKING:
    from appbridge.calls.call import Call
    from appbridge.calls.services import CallServices

log = logging.getLogger(__name__)

MAX_FALLBACK_HOPS: Final = 4


def session_format_for(app: AppConfig) -> AudioFormat:
    """The audio format of the app's session: its ``audio``, or µ-law 8 kHz in the Twilio
    dialect (docs/configuration.md, `[[apps]]`)."""
    if app.protocol == "twilio":
        return PCMU_8K
    return AudioFormat(app.audio.codec, app.audio.rate)


@dataclass
class DialResult:
    """What dialing an app (and its fallbacks) came to: a link, a message to speak, or nothing."""

    app: AppConfig | None = None
    link: AppLink | None = None
    message: str | None = None


async def dial_with_fallbacks(
    services: CallServices, config: Config, app: AppConfig | None, call_ref: str
) -> DialResult:
    """Dial ``app``, following its fallback rules (docs/protocol-session-v1.md, "Connection and
    frames")."""
    hops = 0
    while app is not None:
        try:
            link = await dial(
                app.url,
                secret=services.signing_secret(app),
                clock=services.clock,
                ssl_context=services.ssl_context,
            )
        except AppUnreachable as exc:
            log.warning(
                "call %s: app %s (%s) unreachable after %d attempt(s): %s",
                call_ref,
                app.ref,
                redact_url(app.url),
                exc.attempts,
                exc.last_error,
            )
            services.metrics.app_unreachable += 1
            fallback = app.fallback
            hops += 1
            if fallback is not None and fallback.message:
                return DialResult(app=app, message=fallback.message)
            if fallback is not None and fallback.app and hops < MAX_FALLBACK_HOPS:
                app = config.apps.get(fallback.app)
                continue
            return DialResult()
        return DialResult(app=app, link=link)
    return DialResult()


def session_start(
    session_ref: str,
    call_ref: str,
    app: AppConfig,
    fmt: AudioFormat,
    *,
    direction: sv1.Direction,
    from_: str,
    to: str,
    metadata: dict[str, Any],
    handoff: Any,
) -> sv1.SessionStart:
    """``session.start`` (docs/protocol-session-v1.md, "Session lifecycle"): both tracks in the
    session's format, the app's speech defaults, and a handoff's payload."""
    codec = cast(sv1.Codec, fmt.codec)
    rate = cast(sv1.RateHz, fmt.rate_hz)
    return sv1.SessionStart(
        session_ref=session_ref,
        call_ref=call_ref,
        app_ref=app.ref,
        direction=direction,
        from_=from_,
        to=to,
        metadata=metadata,
        handoff=handoff,
        audio=sv1.AudioFormat(codec=codec, rate=rate),
        tracks=[
            sv1.Track(id=INBOUND_TRACK, side="inbound", kind="audio", codec=codec),
            sv1.Track(id=OUTBOUND_TRACK, side="outbound", kind="audio", codec=codec),
        ],
        speech=sv1.SpeechDefaults(voice=app.speech.voice, language=app.speech.language),
    )


async def connect(call: Call) -> bool:
    """Dial the call's routed app. True when the call should be answered: an app or its
    fallback message is there."""
    result = await call.dial_app(call.app)
    if call.ending:
        if result.link is not None:
            result.link.close(1001, "call ended")
        return False
    if result.link is not None and result.app is not None:
        call.link = result.link
        call.use_app(result.app)
        return True
    if result.message is not None:
        call.fallback_message = result.message
        return True
    return False
