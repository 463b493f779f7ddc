"""The call core (appbridge/calls/core.py) driven directly: each input, the effects it returns.

No sockets, no loop, no clock: the test plays the shell, feeding the core app messages, TTS
chunks, fetch results and media-clock ticks, and reads its decisions off the effect lists.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from appbridge.calls import effects as fx
from appbridge.calls.control import MAX_HANDOFFS
from appbridge.calls.core import MAX_AUDIO_FRAME_BYTES, CallCore
from appbridge.calls.state import CallState
from appbridge.media.codecs import PCMU_8K
from appbridge.protocol import session_v1 as sv1
from appbridge.speech.base import InvalidCatalogId

FRAME = PCMU_8K.frame_bytes(20)  # 160 bytes of µ-law: 20 ms


class Services:
    """The world as the core sees it: one voice, one language, a leg with ``unplayed`` frames."""

    def __init__(self) -> None:
        self.unplayed = 0
        self.provider: Any = object()
        self.voice: Any = object()

    def voice_for(self, voice: str | None, language: str | None) -> tuple[Any, Any, str]:
        if voice not in (None, "local/en-US"):
            raise InvalidCatalogId("voice", voice or "")
        return self.provider, self.voice, "en-US"

    def check_language(self, tag: str) -> str:
        if tag != "en-US":
            raise InvalidCatalogId("language", tag)
        return tag

    def unplayed_frames(self) -> int:
        return self.unplayed


def new_core(services: Services | None = None) -> tuple[CallCore, Services]:
    services = services or Services()
    core = CallCore(
        "CA1",
        services,
        session_format=PCMU_8K,
        app_refs=frozenset({"app", "other"}),
        trunk_hosts=frozenset({"trunk.example"}),
    )
    core.attach(PCMU_8K)
    core.life.move(CallState.ACTIVE)
    return core, services


def send(core: CallCore, **msg: Any) -> list[fx.Effect]:
    return core.on_text(json.dumps(msg).encode())


def errors(effects: list[fx.Effect]) -> list[tuple[str, str]]:
    return [(e.code, e.relates_to) for e in effects if isinstance(e, fx.SendError)]


def events(effects: list[fx.Effect]) -> list[Any]:
    return [e.event for e in effects if isinstance(e, fx.SendEvent)]


def play_out(core: CallCore, frames: int, tick0: int = 0) -> list[Any]:
    """Pull ``frames`` frames as the media clock would; the events the app is sent."""
    queue = core.queue
    assert queue is not None
    out: list[Any] = []
    for n in range(frames):
        out += events(core.on_tick(tick0 + n + 1))
        _, evs = queue.pull_frame()
        if evs:
            out += events(core.on_output_events(evs))
    return out


def speak(core: CallCore, item_id: str, seconds: float = 0.1) -> fx.Utterance:
    """A whole ``speak`` whose synthesis delivers ``seconds`` of audio and completes."""
    effects = send(core, type="speak", id=item_id, text="Hello.")
    start = next(e for e in effects if isinstance(e, fx.StartTts))
    utt = start.utterance
    assert core.tts_audio(utt, b"\xff" * int(FRAME * seconds * 50), []) == []
    assert core.tts_finished(utt) == []
    core.tts_over(utt)
    return utt


# -- dispatch and hold gating ----------------------------------------------------------------


def test_every_command_is_refused_on_hold_except_the_four() -> None:
    core, _ = new_core()
    assert send(core, type="hold", id="h") == [fx.StartHold(None, "h")]
    assert errors(send(core, type="hold")) == [("on_hold", "hold")]  # already on hold
    assert errors(send(core, type="speak", id="s", text="x")) == [("on_hold", "s")]
    assert errors(send(core, type="mark", name="m")) == [("on_hold", "mark")]
    assert errors(send(core, type="clear")) == [("on_hold", "clear")]
    assert send(core, type="hangup", id="bye") == [fx.EndCall("app_hangup", "bye")]
    assert send(core, type="resume") == [fx.StopHold()]
    assert send(core, type="resume") == []  # not on hold: nothing to do


def test_app_audio_on_hold_is_dropped_with_one_error_until_resume() -> None:
    core, _ = new_core()
    send(core, type="hold")
    assert errors(core.on_audio(b"\xff" * FRAME)) == [("on_hold", "audio")]
    assert core.on_audio(b"\xff" * FRAME) == []
    assert core.queue is not None and core.queue.is_empty
    send(core, type="resume")
    assert core.on_audio(b"\xff" * FRAME) == []
    assert not core.queue.is_empty
    send(core, type="hold")
    assert errors(core.on_audio(b"\xff" * FRAME)) == [("on_hold", "audio")]  # reported anew


def test_resume_during_a_warm_transfer_cancels_it() -> None:
    core, _ = new_core()
    core.control.transfer_pending = "warm"
    assert send(core, type="resume") == [fx.CancelTransfer()]


def test_bad_and_unknown_messages() -> None:
    core, _ = new_core()
    assert errors(core.on_text(b"{")) == [("bad_message", "unknown")]
    assert core.on_text(b'{"type": "future.thing"}') == []
    too_big = core.on_audio(b"\x00" * (MAX_AUDIO_FRAME_BYTES + 1))
    assert errors(too_big) == [("bad_message", "audio")]


# -- speech, marks, clear and preempt -------------------------------------------------------------


def test_a_speak_starts_synthesis_and_its_events_follow_the_audio() -> None:
    core, _ = new_core()
    effects = send(core, type="speak", id="s1", text="Hello there.")
    assert [type(e) for e in effects] == [fx.StartTts, fx.SpeakText]
    utt = effects[0].utterance  # type: ignore[union-attr]
    assert (utt.item_id, utt.relates_to, utt.language) == ("s1", "s1", "en-US")
    assert effects[1] == fx.SpeakText(utt, "Hello there.", True)
    assert events(send(core, type="mark", name="after", id="m1")) == []
    assert core.tts_audio(utt, b"\xff" * FRAME * 3, []) == []
    assert core.tts_finished(utt) == []
    heard = play_out(core, 5)
    assert heard == [
        sv1.OutputStarted(id="s1"),
        sv1.OutputDone(id="s1", heard_ms=60),
        sv1.MarkEvent(name="after", cleared=False, id="m1"),
    ]


def test_a_leg_with_a_lead_holds_the_events_until_heard() -> None:
    core, services = new_core()
    services.unplayed = 2  # the far end is two frames behind what was sent
    utt = send(core, type="speak", id="s1", text="Hi.")[0].utterance  # type: ignore[union-attr]
    core.tts_audio(utt, b"\xff" * FRAME, [])
    core.tts_finished(utt)
    queue = core.queue
    assert queue is not None
    _, evs = queue.pull_frame()
    assert events(core.on_output_events(evs)) == []  # started, but not heard yet
    assert events(core.on_tick(1)) == []
    assert events(core.on_tick(2)) == [sv1.OutputStarted(id="s1")]


def test_clear_empties_the_queue_stops_synthesis_and_drops_the_stream_rest() -> None:
    core, _ = new_core()
    start = send(core, type="speak", id="s1", text="Part one, ", last=False)
    utt = start[0].utterance  # type: ignore[union-attr]
    core.tts_audio(utt, b"\xff" * FRAME * 10, [])
    send(core, type="mark", name="m")
    play_out(core, 2)
    effects = send(core, type="clear")
    assert effects[0] == fx.ClearLeg()
    assert fx.StopTts(utt) in effects
    assert events(effects) == [
        sv1.OutputInterrupted(id="s1", heard_text="", heard_ms=40),
        sv1.MarkEvent(name="m", cleared=True, id=None),
    ]
    # The rest of the cleared utterance never plays, and its id is free once it is over.
    assert send(core, type="speak", id="s1", text="part two.", last=False) == []
    assert send(core, type="speak", id="s1", text="end.") == []
    assert [type(e) for e in send(core, type="speak", id="s1", text="New.")] == [
        fx.StartTts,
        fx.SpeakText,
    ]


def test_preempt_plays_first_and_ends_a_streamed_speak_like_clear() -> None:
    core, _ = new_core()
    first = send(core, type="speak", id="a", text="Streaming ", last=False)
    utt = first[0].utterance  # type: ignore[union-attr]
    core.tts_audio(utt, b"\xff" * FRAME * 10, [])
    play_out(core, 1)
    effects = send(core, type="play", id="p", url="https://x/y.wav", preempt=True)
    assert fx.StopTts(utt) in effects
    assert fx.FetchAudio("p", "https://x/y.wav", "p") in effects
    assert events(effects)[0] == sv1.OutputInterrupted(id="a", heard_text="", heard_ms=20)
    assert send(core, type="speak", id="a", text="more.") == []  # the rest is dropped


def test_speak_and_play_ids_in_use_and_unknown_voices() -> None:
    core, _ = new_core()
    speak(core, "s1")
    assert errors(send(core, type="speak", id="s1", text="again")) == [("bad_message", "s1")]
    send(core, type="play", id="p1", url="https://x/a.wav")
    assert errors(send(core, type="play", id="p1", url="https://x/b.wav")) == [
        ("bad_message", "p1")
    ]
    assert errors(send(core, type="speak", text="x", voice="nope/voice")) == [
        ("invalid_catalog_id", "speak")
    ]


def test_a_play_that_cannot_be_fetched_is_interrupted_with_one_error() -> None:
    core, _ = new_core()
    send(core, type="play", id="p1", url="https://x/a.wav")
    effects = core.fetch_failed("p1", "play https://x/a.wav: 404", "p1")
    assert errors(effects) == [("play_fetch_failed", "p1")]
    assert core.queue is not None and not core.queue.has_item("p1")


def test_queue_full_for_app_audio_is_reported_once_until_it_fits_again() -> None:
    core, _ = new_core()
    second = b"\xff" * FRAME * 50
    for _ in range(120):
        assert core.on_audio(second) == []
    assert errors(core.on_audio(second)) == [("queue_full", "audio")]
    assert core.on_audio(second) == []
    play_out(core, 100)
    assert core.on_audio(second) == []
    assert errors(core.on_audio(second * 3)) == [("queue_full", "audio")]


def test_queue_full_during_synthesis_fails_the_item_and_stops_it() -> None:
    core, _ = new_core()
    utt = send(core, type="speak", id="s1", text="long")[0].utterance  # type: ignore[union-attr]
    effects = core.tts_audio(utt, b"\xff" * FRAME * 50 * 121, [])
    assert errors(effects) == [("queue_full", "s1")]
    assert effects[-1] == fx.StopTts(utt)


def test_dtmf_goes_out_of_band_or_as_tones_in_the_queue() -> None:
    core, _ = new_core()
    assert send(core, type="dtmf.send", digits="12") == [fx.SendDtmf("12", "dtmf.send")]
    assert core.queue_tones("12", "dtmf.send") == []
    assert core.queue is not None and not core.queue.is_empty
    assert play_out(core, 40) == []  # internal items report nothing to the app


# -- handoff and transfer -----------------------------------------------------------------------


def test_handoff_limits_one_at_a_time_and_at_most_five() -> None:
    core, _ = new_core()
    assert errors(send(core, type="handoff", app="nope")) == [("bad_message", "handoff")]
    for n in range(MAX_HANDOFFS):
        effects = send(core, type="handoff", app="other", id=f"h{n}")
        assert effects == [fx.StartHandoff("other", None, f"h{n}")]
        assert errors(send(core, type="handoff", app="other", id="x")) == [("bad_message", "x")]
        assert errors(send(core, type="transfer", to="+15550001111")) == [
            ("bad_message", "transfer")
        ]
        core.handoff_over(succeeded=n != 0)  # the first one failed: not counted
    assert send(core, type="handoff", app="other", id="h5") == [
        fx.StartHandoff("other", None, "h5")
    ]
    core.handoff_over(True)
    assert errors(send(core, type="handoff", app="other", id="h6")) == [("bad_message", "h6")]


def test_transfer_targets_ids_and_complete() -> None:
    core, _ = new_core()
    assert errors(send(core, type="transfer", to="+15550001111", mode="warm")) == [
        ("bad_message", "transfer")
    ]
    assert errors(send(core, type="transfer", to="555", id="t")) == [("transfer_failed", "t")]
    assert errors(send(core, type="transfer", to="sip:bob@evil.example", id="t")) == [
        ("transfer_failed", "t")
    ]
    effects = send(core, type="transfer", to="sip:bob@trunk.example:5060", id="t")
    assert [type(e) for e in effects] == [fx.StartTransfer]
    assert errors(send(core, type="transfer.complete", id="t")) == [("bad_message", "t")]
    core.control.transfer_pending = "warm"
    assert send(core, type="transfer.complete", id="t") == [fx.CompleteTransfer("t")]


# -- listening and the Twilio dialect ----------------------------------------------------------


def test_listen_update_and_subscribe() -> None:
    core, _ = new_core()
    assert send(core, type="subscribe", events=["transcript.partial"]) == []
    assert core.subscriptions == {"transcript.partial"}
    assert errors(send(core, type="listen.update", language="xx-XX", id="l")) == [
        ("invalid_catalog_id", "l")
    ]
    effects = send(core, type="listen.update", language="en-US", hints=["AppBridge"])
    assert effects == [fx.UpdateEars(language="en-US", hints=["AppBridge"], patience=None)]
    core.reset_listening()
    assert core.subscriptions == set() and core.listen_language is None


def test_twilio_dialect_media_mark_clear_and_bad_input() -> None:
    core, _ = new_core()
    media = {"event": "media", "streamSid": "MZ1", "media": {"payload": "//8="}}
    assert core.on_twilio_text(json.dumps(media).encode()) == []
    mark = {"event": "mark", "streamSid": "MZ1", "mark": {"name": "m1"}}
    assert core.on_twilio_text(json.dumps(mark).encode()) == []
    clear = core.on_twilio_text(b'{"event": "clear", "streamSid": "MZ1"}')
    assert clear[0] == fx.ClearLeg()
    assert events(clear) == [sv1.MarkEvent(name="m1", cleared=True, id=None)]
    bad = core.on_twilio_text(b"{")
    assert [type(e) for e in bad] == [fx.ReportBadMessage]


# -- fallback -----------------------------------------------------------------------------------


def test_a_fallback_message_ends_the_call_once_heard() -> None:
    core, _ = new_core()
    core.life = type(core.life)("CA1", CallState.FALLBACK)
    effects = core.speak_fallback("Sorry, we cannot take your call.")
    utt = effects[0].utterance  # type: ignore[union-attr]
    assert effects[1] == fx.SpeakText(utt, "Sorry, we cannot take your call.", True)
    core.tts_audio(utt, b"\xff" * FRAME * 2, [])
    core.tts_finished(utt)
    queue = core.queue
    assert queue is not None
    ended: list[fx.Effect] = []
    for _ in range(4):
        _, evs = queue.pull_frame()
        ended += core.on_output_events(evs)
    assert ended == [fx.EndCall("error")]


@pytest.mark.parametrize("failure", ["tts", "queue_full"])
def test_a_fallback_message_that_fails_ends_the_call(failure: str) -> None:
    core, _ = new_core()
    core.life = type(core.life)("CA1", CallState.FALLBACK)
    utt = core.speak_fallback("Sorry.")[0].utterance  # type: ignore[union-attr]
    if failure == "tts":
        effects = core.tts_failed(utt, "tts_failed", "the voice failed")
    else:
        effects = core.tts_audio(utt, b"\xff" * FRAME * 50 * 121, [])
    assert fx.EndCall("error") in effects
    assert errors(effects) == []  # the app is not there to hear it


def test_shutdown_stops_every_utterance_and_drops_held_events() -> None:
    core, services = new_core()
    services.unplayed = 5
    a = send(core, type="speak", id="a", text="x", last=False)[0].utterance  # type: ignore[union-attr]
    b = send(core, type="speak", id="b", text="y", last=False)[0].utterance  # type: ignore[union-attr]
    assert core.shutdown() == [fx.StopTts(a), fx.StopTts(b)]
    assert core.heard.holding is False


# -- the carrier --------------------------------------------------------------------------------


def test_keypresses_reach_the_app_while_a_session_is_open_on_hold_too() -> None:
    core, _ = new_core()
    assert core.on_carrier_dtmf("5") == [fx.SendEvent(sv1.DtmfEvent(digit="5"))]
    send(core, type="hold")
    assert core.on_carrier_dtmf("#") == [fx.SendEvent(sv1.DtmfEvent(digit="#"))]
    core.life.move(CallState.ENDING)
    assert core.on_carrier_dtmf("1") == []


def test_the_carrier_gone_is_the_callers_hangup_or_a_transfers_end() -> None:
    core, _ = new_core()
    assert core.on_carrier_hangup(handed_over=False) == [
        fx.EndCall("caller_hangup", carrier_gone=True)
    ]
    core.control.transfer_id = "t1"
    assert core.on_carrier_hangup(handed_over=True) == [
        fx.EndCall("transfer", "t1", carrier_gone=True)
    ]


def test_when_the_media_is_here_the_session_opens_or_the_fallback_speaks_or_the_call_ends() -> None:
    core, _ = new_core()
    assert core.on_media_ready(app_reached=True, fallback_message=None) == [fx.OpenSession()]
    assert core.on_media_ready(app_reached=False, fallback_message=None) == [fx.EndCall("error")]
    fallback = CallCore(
        "CA2",
        Services(),
        session_format=PCMU_8K,
        app_refs=frozenset(),
        trunk_hosts=frozenset(),
    )
    fallback.attach(PCMU_8K)
    effects = fallback.on_media_ready(app_reached=False, fallback_message="Sorry.")
    assert fallback.life.state is CallState.FALLBACK
    assert [type(e) for e in effects] == [fx.StartTts, fx.SpeakText]
