"""The call engine's transfers (calls/transfer.py, calls/bridge.py) in virtual time.

A real ``Call`` on a real ``Gateway`` (not started: no sockets, no media clock task) with fake
carrier legs and a fake app link; the test drives the media clock's ticks and the injected clock
itself, so the 30 s answer timeout (docs/protocol-session-v1.md) is checked without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from appbridge.apps.link import AppLink
from appbridge.calls.call import Call
from appbridge.calls.carrier_leg import CarrierEvents, CarrierLeg, TransferError
from appbridge.calls.transfer import ANSWER_TIMEOUT_S, ringback_pcm16
from appbridge.clock import VirtualClock
from appbridge.config import parse_config
from appbridge.gateway import Gateway
from appbridge.media.codecs import PCMU_8K, AudioFormat
from appbridge.protocol import session_v1 as sv1

PCMA_8K = AudioFormat("pcma", 8000)


class FakeLeg:
    """A carrier leg that records what the engine does to it."""

    carrier = "fake"

    def __init__(self, fmt: AudioFormat = PCMU_8K, *, native_cold: bool = False) -> None:
        self.audio_format = fmt
        self.native_cold_transfer = native_cold
        self.events: CarrierEvents | None = None
        self.sent: list[bytes] = []
        self.dtmf: list[str] = []
        self.hung_up = False
        self.closed = False
        self.dials: list[tuple[str, str, dict[str, str] | None]] = []
        self.answer: asyncio.Future[CarrierLeg] | None = None
        self.dial_cancelled = False
        self.refer_result: BaseException | None = None
        self.refers: list[str] = []

    def attach(self, events: CarrierEvents) -> None:
        self.events = events

    def send_frame(self, frame: bytes) -> None:
        self.sent.append(frame)

    def frames_wanted(self, playing: bool) -> int:
        return 1

    lead_frames = 0
    audio_dropped = 0

    def unplayed_frames(self) -> int:
        return 0

    def clear_output(self) -> None:
        pass

    def send_dtmf(self, digits: str) -> bool:
        self.dtmf.append(digits)
        return True

    async def transfer(
        self, target: str, mode: str, headers: dict[str, str] | None, music: str | None
    ) -> None:
        self.dials.append((target, "native", headers))

    async def dial_party(
        self, target: str, *, caller_id: str, headers: dict[str, str] | None, timeout_s: float
    ) -> CarrierLeg:
        self.dials.append((target, caller_id, headers))
        self.answer = asyncio.get_running_loop().create_future()
        try:
            return await self.answer
        except asyncio.CancelledError:
            self.dial_cancelled = True
            raise

    async def refer(self, target: str, headers: dict[str, str] | None) -> None:
        self.refers.append(target)
        if self.refer_result is not None:
            raise self.refer_result

    async def hangup(self) -> None:
        self.hung_up = True

    async def close(self) -> None:
        self.closed = True


class FakeLink(AppLink):
    """The app's socket, seen from the engine."""

    def __init__(self) -> None:  # none of AppLink's state: every method used is replaced
        self.messages: list[dict[str, Any]] = []
        self.audio: list[bytes] = []
        self.closed = False
        self.audio_dropped_frames = 0

    def send_control(self, data: bytes) -> None:
        self.messages.append(json.loads(data))

    def audio_room(self) -> bool:
        return True

    def send_audio(self, data: bytes, text: bool = False) -> None:
        self.audio.append(data)

    def attach(self, call: Any) -> None:
        pass

    def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = True

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == kind]


class Rig:
    def __init__(self, gw: Gateway, clock: VirtualClock, call: Call, leg: FakeLeg) -> None:
        self.gw, self.clock, self.call, self.leg = gw, clock, call, leg
        assert isinstance(call.link, FakeLink)
        self.link: FakeLink = call.link
        self._tick = 0

    async def ticks(self, n: int) -> None:
        """``n`` media-clock ticks, 20 ms of virtual time each, letting tasks run between."""
        for _ in range(n):
            self.clock.advance(0.02)
            self._tick += 1
            for fn in list(self.gw.media_clock._subscribers.values()):
                fn(self._tick, self.clock.now())
            await settle()

    async def command(self, msg: dict[str, Any]) -> None:
        self.call.on_app_text(json.dumps(msg).encode())
        await settle()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with open_rig(FakeLeg()) as r:
        yield r


@contextlib.asynccontextmanager
async def open_rig(leg: FakeLeg) -> AsyncIterator[Rig]:
    """A call on a gateway that is not started, its carrier ``leg``, a fake app link."""
    clock = VirtualClock()
    config = parse_config(
        {
            "server": {"host": "127.0.0.1", "port": 8080},
            "sip": {
                "listen": ["udp:127.0.0.1:5060"],
                "trunks": [{"name": "main", "host": "127.0.0.1", "port": 5070}],
            },
            "apps": [
                {
                    "ref": "app",
                    "url": "ws://127.0.0.1:9/app",
                    "signing_secret": "s",
                    "audio": {"codec": "pcmu", "rate": 8000},
                    "speech": {"voice": "local/en-US", "language": "en-US", "stt": "none"},
                }
            ],
            "numbers": [{"number": "*", "app": "app"}],
        },
        {},
    )
    gw = Gateway(config, clock=clock)
    call = Call(
        gw,
        call_ref="CA" + "0" * 32,
        app=config.apps["app"],
        direction="inbound",
        from_="+15550001111",
        to="+15550002222",
        carrier="fake",
    )
    gw.registry.add(call)
    call.link = FakeLink()  # type: ignore[assignment]
    call.attach_carrier(leg)
    try:
        yield Rig(gw, clock, call, leg)
    finally:
        if not call.ended.is_set():
            await call.end("app_hangup")
        await gw.http.aclose()


def tone_frame(value: int, fmt: AudioFormat = PCMU_8K) -> bytes:
    return bytes([value]) * fmt.frame_bytes(20)


async def test_warm_transfer_consults_then_completes(rig: Rig) -> None:
    await rig.command({"type": "transfer", "id": "w1", "to": "+15557654321", "mode": "warm"})
    assert rig.leg.dials == [("+15557654321", "+15550002222", None)]
    # While the party rings, the caller waits unheard (hold) and hears silence.
    rig.link.audio.clear()
    rig.leg.events.on_carrier_audio(tone_frame(0x10))  # type: ignore[union-attr]
    assert rig.link.audio == []
    await rig.command({"type": "transfer.complete", "id": "w1"})
    assert rig.link.of_type("error")[-1]["code"] == "bad_message"  # not answered yet

    party = FakeLeg(PCMA_8K)
    assert rig.leg.answer is not None
    rig.leg.answer.set_result(party)
    await settle()
    # The party's audio reaches the app (converted to the session's µ-law) in the caller's
    # place; the caller's does not.
    assert party.events is not None
    party.events.on_carrier_audio(PCMA_8K.silence(20))
    rig.leg.events.on_carrier_audio(tone_frame(0x10))  # type: ignore[union-attr]
    assert len(rig.link.audio) == 1
    # The app's output goes to the party (A-law), the caller keeps hearing silence (music).
    rig.call.on_app_binary(tone_frame(0x20) * 10)
    await rig.command({"type": "mark", "name": "after-burst"})
    await rig.ticks(40)
    assert sum(f != PCMA_8K.silence(20) for f in party.sent) == 10
    assert all(len(f) == 160 for f in party.sent)
    assert all(f == PCMU_8K.silence(20) for f in rig.leg.sent[-40:])
    assert rig.link.of_type("mark")[0]["name"] == "after-burst"
    # dtmf.send goes to the consulted party.
    await rig.command({"type": "dtmf.send", "digits": "1"})
    assert party.dtmf == ["1"]

    await rig.command({"type": "transfer.complete", "id": "w1"})
    await settle()
    assert rig.link.of_type("session.end") == [
        {"type": "session.end", "reason": "transfer", "id": "w1"}
    ]
    call = rig.call
    assert call.state == "bridged" and not call.ended.is_set()
    assert not rig.leg.hung_up and not party.hung_up
    # Bridged: each side hears the other, in its own format.
    rig.leg.events.on_carrier_audio(tone_frame(0x55))  # type: ignore[union-attr]
    party.events.on_carrier_audio(tone_frame(0x2A, PCMA_8K))
    rig.leg.sent.clear()
    party.sent.clear()
    await rig.ticks(1)
    assert len(rig.leg.sent) == 1 and len(party.sent) == 1
    assert party.sent[0] != PCMA_8K.silence(20)
    # Keypresses cross over.
    rig.leg.events.on_carrier_dtmf("5")  # type: ignore[union-attr]
    assert party.dtmf[-1] == "5"
    # The party hangs up: the caller is hung up and the call is over.
    party.events.on_carrier_hangup()
    await settle()
    assert rig.leg.hung_up
    assert call.ended.is_set() and call.state == "ended"
    assert rig.gw.registry.describe(call.call_ref)["endReason"] == "transfer"  # type: ignore[index]


async def test_warm_transfer_times_out_after_30_s(rig: Rig) -> None:
    await rig.command({"type": "transfer", "id": "w2", "to": "+15557654321", "mode": "warm"})
    await rig.ticks(int((ANSWER_TIMEOUT_S - 0.1) / 0.02))
    assert not rig.link.of_type("error") and not rig.leg.dial_cancelled
    await rig.ticks(10)
    assert rig.leg.dial_cancelled
    err = rig.link.of_type("error")[-1]
    assert (err["code"], err["relatesTo"]) == ("transfer_failed", "w2")
    # The caller is back with the app: heard again, and the app's output reaches them.
    rig.link.audio.clear()
    rig.leg.events.on_carrier_audio(tone_frame(0x10))  # type: ignore[union-attr]
    assert len(rig.link.audio) == 1
    assert rig.call.transfer is None and rig.call.state == "active"
    # A new transfer may start.
    await rig.command({"type": "transfer", "id": "w3", "to": "+15557654321", "mode": "warm"})
    assert len(rig.leg.dials) == 2


async def test_party_hangs_up_during_consultation(rig: Rig) -> None:
    await rig.command({"type": "transfer", "id": "w", "to": "+15557654321", "mode": "warm"})
    party = FakeLeg()
    rig.leg.answer.set_result(party)  # type: ignore[union-attr]
    await settle()
    party.events.on_carrier_hangup()  # type: ignore[union-attr]
    await settle()
    err = rig.link.of_type("error")[-1]
    assert (err["code"], err["relatesTo"]) == ("transfer_failed", "w")
    rig.call.on_app_binary(tone_frame(0x20) * 5)
    rig.leg.sent.clear()
    await rig.ticks(30)
    assert any(f != PCMU_8K.silence(20) for f in rig.leg.sent)


async def test_resume_cancels_a_warm_transfer(rig: Rig) -> None:
    await rig.command({"type": "transfer", "id": "w", "to": "+15557654321", "mode": "warm"})
    party = FakeLeg()
    rig.leg.answer.set_result(party)  # type: ignore[union-attr]
    await settle()
    await rig.command({"type": "hold"})
    assert rig.link.of_type("error")[-1]["code"] == "bad_message"
    await rig.command({"type": "resume"})
    await settle()
    assert party.hung_up
    err = rig.link.of_type("error")[-1]
    assert (err["code"], err["relatesTo"]) == ("transfer_failed", "w")
    assert rig.call.transfer is None


async def test_busy_party_fails_the_transfer(rig: Rig) -> None:
    await rig.command({"type": "transfer", "id": "c", "to": "+15557654321"})
    rig.leg.answer.set_exception(TransferError("transfer_failed", "busy (486)"))  # type: ignore[union-attr]
    await settle()
    err = rig.link.of_type("error")[-1]
    assert (err["code"], err["relatesTo"], err["message"]) == ("transfer_failed", "c", "busy (486)")
    assert rig.call.state == "active"


async def test_cold_transfer_bridges_with_ringback_meanwhile(rig: Rig) -> None:
    await rig.command({"type": "transfer", "id": "c", "to": "sip:+15557654321@127.0.0.1"})
    assert rig.leg.dials[0][0] == "sip:+15557654321@127.0.0.1"
    rig.leg.sent.clear()
    await rig.ticks(50)  # one second of ringback: the 440+480 Hz tone, not silence
    expected = ringback_pcm16()
    assert len(expected) == 6 * 8000 * 2
    assert sum(f != PCMU_8K.silence(20) for f in rig.leg.sent) >= 45
    party = FakeLeg()
    rig.leg.answer.set_result(party)  # type: ignore[union-attr]
    await settle()
    assert rig.link.of_type("session.end")[-1]["reason"] == "transfer"
    assert rig.call.state == "bridged" and rig.gw.registry.get(rig.call.call_ref) is rig.call
    # DELETE /v1/calls/{callRef} on a bridged call hangs up both parties.
    await rig.call.end("app_hangup")
    assert rig.leg.hung_up and party.hung_up and rig.call.ended.is_set()


async def test_caller_hangs_up_while_the_party_rings(rig: Rig) -> None:
    await rig.command({"type": "transfer", "id": "c", "to": "+15557654321", "mode": "warm"})
    rig.leg.events.on_carrier_hangup()  # type: ignore[union-attr]
    await settle()
    assert rig.leg.dial_cancelled
    assert rig.link.of_type("session.end")[-1]["reason"] == "caller_hangup"
    assert rig.call.ended.is_set()


async def test_native_cold_and_refer(rig: Rig) -> None:
    rig.leg.refer_result = TransferError("transfer_failed", "NOTIFY: 503")
    await rig.command({"type": "transfer", "id": "r", "to": "+15557654321", "mode": "refer"})
    err = rig.link.of_type("error")[-1]
    assert (err["code"], err["relatesTo"]) == ("transfer_failed", "r")
    rig.leg.refer_result = None
    await rig.command({"type": "transfer", "id": "r2", "to": "+15557654321", "mode": "refer"})
    await settle()
    assert rig.leg.refers == ["+15557654321", "+15557654321"]
    assert rig.link.of_type("session.end")[-1] == {
        "type": "session.end",
        "reason": "transfer",
        "id": "r2",
    }
    assert rig.leg.closed and not rig.leg.hung_up
    assert sv1  # the protocol module is what the rig speaks


async def test_frames_dropped_for_slow_peers_are_counted_past_the_call(rig: Rig) -> None:
    """``/metrics`` counts audio dropped because a peer read too slowly: the live calls' own
    counts, and those of ended calls once their links and legs are gone."""
    from appbridge.http.metrics import render_metrics
    from bench.report import parse_metric

    def dropped(to: str) -> float:
        text = render_metrics(rig.gw)
        return parse_metric(text, "appbridge_audio_frames_dropped_total", {"to": to})

    assert dropped("app") == 0 and dropped("carrier") == 0
    rig.link.audio_dropped_frames = 3
    rig.leg.audio_dropped = 2
    assert dropped("app") == 3 and dropped("carrier") == 2
    await rig.call.end("app_hangup")
    assert rig.call.link is None and rig.call.leg is None
    assert dropped("app") == 3 and dropped("carrier") == 2
