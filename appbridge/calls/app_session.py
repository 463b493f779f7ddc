"""The app side of a call: reaching the app (with its fallbacks) and the session it opens.

An app is dialled over its signed WebSocket, with refused attempts retried for 2.5 s
(docs/protocol-session-v1.md, "Connection and frames"); when it cannot be reached, its
``fallback`` applies: another app (at most :data:`MAX_FALLBACK_HOPS` in a row) or a message the
gateway speaks before hanging up (docs/configuration.md, `[[apps]]`). The session opens with
``session.start``, whose audio format is the app's (µ-law 8 kHz for the Twilio dialect).

An app that asked to reconnect (docs/protocol-session-v1.md, "Reconnecting") and lost its link
is redialled here (:func:`lose_link`): each attempt sends the session's ``session.start`` again
with ``reconnect``, and the app takes the session back with ``session.update``. When it does
not, the call goes to the app's fallback exactly as if the app could not be reached. The timing
is ``apps/timers.ReconnectSeries``; this is only its asyncio shell.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, cast

from appbridge.apps.dialects import INBOUND_TRACK, OUTBOUND_TRACK
from appbridge.apps.link import AppLink, AppUnreachable, dial
from appbridge.apps.timers import ReconnectSeries, TakeBack, TakeBackOutcome
from appbridge.calls.handoff import move_to
from appbridge.calls.state import CallState
from appbridge.config import AppConfig, Config
from appbridge.media.codecs import PCMU_8K, AudioFormat
from appbridge.net.plaintext import redact_url
from appbridge.protocol import session_v1 as sv1
from appbridge.protocol.session_v1_ext import with_reconnect

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
    services: CallServices, config: Config, app: AppConfig | None, call_ref: str, hops: int = 0
) -> DialResult:
    """Dial ``app``, following its fallback rules (docs/protocol-session-v1.md, "Connection and
    frames"); ``hops`` counts the fallbacks already taken."""
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


# -- reconnecting (docs/protocol-session-v1.md, "Reconnecting") --------------------------------

#: The random source of the backoff's factor; tests put their own in.
RANDOM: Callable[[], float] = random.random


def may_reconnect(call: Call) -> bool:
    """A live fonoster session with no handoff or transfer under way may be redialled."""
    control = call.control
    return (
        call.encoder.protocol == "fonoster"
        and not call.ending
        and call.lifecycle.state is CallState.ACTIVE
        and control.transfer_pending is None
        and not control.handoff_pending
        and call.transfer is None
    )


def lose_link(call: Call, reason: str) -> None:
    """The app's link is lost and the app asked to reconnect: the call goes on between links
    while it is redialled. A link that lived under 5 s continues the series it was taken in."""
    now = call.gw.clock.now()
    log.info("call %s: app link lost (%s); reconnecting", call.call_ref, reason)
    call.close_link(reason)
    series = call.reconnect_series
    if series is None or not series.lost(now, now - call.link_up_at):
        series = ReconnectSeries(now, RANDOM)
    call.reconnect_series = series
    call.between_links = True
    call.events_lost = 0
    call.spawn(_redial(call, series, now), "reconnect")


@dataclass(eq=False)
class _TakeBack:
    """The new link's listener until the app answers: its first frame, and what follows it
    before the call takes the link over."""

    future: asyncio.Future[bytes | None]
    later: list[tuple[bool, bytes]] = field(default_factory=list)

    def on_app_text(self, data: bytes) -> None:
        if self.future.done():
            self.later.append((True, data))
        else:
            self.future.set_result(data)

    def on_app_binary(self, data: bytes) -> None:
        if self.future.done():
            self.later.append((False, data))
        else:
            self.future.set_result(None)

    def on_app_gone(self, reason: str) -> None:
        if not self.future.done():
            self.future.set_result(None)


def _takes_back(answer: bytes | None) -> bool:
    command = sv1.decode_command(answer) if answer is not None else None
    return type(command) is sv1.SessionUpdate and command.reconnect


async def _redial(call: Call, series: ReconnectSeries, lost_at: float) -> None:
    """The attempts of one loss; on a take-back the session goes on, else the fallback."""
    clock, app = call.gw.clock, call.app
    while (at := series.next_attempt(clock.now())) is not None:
        await asyncio.sleep(max(0.0, at - clock.now()))
        try:
            link = await dial(
                app.url,
                secret=call.gw.signing_secret(app),
                clock=clock,
                ssl_context=call.gw.ssl_context,
                retry=False,
            )
        except AppUnreachable as exc:
            log.info(
                "call %s: reconnect attempt %d failed: %s", call.call_ref, series.attempts, exc
            )
            series.failed(clock.now())
            continue
        try:
            taken = await _offer(call, link, series.attempts, lost_at)
        except BaseException:
            link.close(1001, "call ended")
            raise
        if taken is None:
            link.close(1000, "no answer")
            series.failed(clock.now())
            continue
        if taken:
            return
        link.close(1000, "not taken back")
        break
    await _fall_back_after_loss(call)


async def _offer(call: Call, link: AppLink, attempt: int, lost_at: float) -> bool | None:
    """Send ``session.start`` with ``reconnect`` and wait 2 s for the take-back. True: taken
    back; False: the app answered otherwise or closed; None: no answer in time."""
    clock = call.gw.clock
    down_ms = int((clock.now() - lost_at) * 1000)
    info = sv1.Reconnect(attempt=attempt, down_ms=down_ms)
    link.send_control(with_reconnect(call.start_frame, info))
    rule = TakeBack(clock.now())
    waiter = _TakeBack(asyncio.get_running_loop().create_future())
    link.attach(waiter)
    try:
        wait_s = max(0.0, rule.deadline - clock.now())
        answer = await asyncio.wait_for(asyncio.shield(waiter.future), wait_s)
    except TimeoutError:
        return None
    outcome = rule.on_answer(clock.now(), _takes_back(answer))
    if outcome is not TakeBackOutcome.TAKEN:
        return None if outcome is TakeBackOutcome.NO_ANSWER else False
    call.between_links = False
    call.link = link
    call.link_up_at = clock.now()
    lost, call.events_lost = call.events_lost, 0
    link.send_control(sv1.encode_event(sv1.EventsLost(count=lost)))
    log.info("call %s: the app took the session back (%d event(s) lost)", call.call_ref, lost)
    link.attach(call)
    for is_text, data in waiter.later:
        if is_text:
            call.on_app_text(data)
        else:
            call.on_app_binary(data)
    return True


async def _fall_back_after_loss(call: Call) -> None:
    """Reconnecting failed: the app's fallback, as when it cannot be reached at the start
    (``dial_with_fallbacks``; docs/configuration.md, `[[apps]]`)."""
    call.between_links = False
    app = call.app
    log.warning("call %s: app %s did not take the session back", call.call_ref, app.ref)
    call.gw.metrics.app_unreachable += 1
    fallback = app.fallback
    result = DialResult()
    if fallback is not None and fallback.message:
        result = DialResult(app=app, message=fallback.message)
    elif fallback is not None and fallback.app:
        target = call.config.apps.get(fallback.app)
        result = await dial_with_fallbacks(call.gw, call.config, target, call.call_ref, hops=1)
    if call.ending:
        if result.link is not None:
            result.link.close(1001, "call ended")
        return
    if result.link is None and result.message is None:
        await call.end("error", app_gone=True)
        return
    # The listeners' session ends with error; the app is gone already.
    move_to(call, result, end_reason="error", command_id=None, payload=None)


def hear_unlinked(call: Call, payload: bytes) -> None:
    """Between links: the caller's audio reaches the ears and the listeners, not the app."""
    conv = call.in_conv
    assert conv is not None
    frames = conv.convert(payload)
    ears = call.ears
    if ears is not None:
        if call.ears_share_frames:
            ears.on_frames(frames)
        else:
            ears.on_carrier_frame(payload)
    listeners = call.listeners
    if listeners is not None:
        for frame in frames:
            listeners.send_audio(INBOUND_TRACK, frame, call.elapsed_ms())
