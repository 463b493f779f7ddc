"""Transfers between two real baresips through the gateway (docs/sip.md, "Transfers"): cold, warm
and REFER.

Two baresip 1.0.0 processes (tests/integration/baresip.py) stand on either side of the gateway,
which runs in-process (``gateway_env``) with ``[sip]`` on loopback and one trunk, ``main``,
pointing at B:

- **A**, the caller, calls the gateway and plays a 1 kHz tone (then silence);
- **B**, the new party, auto-answers the gateway's (or A's) INVITE and plays a 1.5 kHz tone.

A's source address (127.0.0.1) is the trunk's host, so A's call belongs to trunk ``main`` and an
E.164 transfer target is dialed through it, to B (docs/sip.md, "Transfers"). The app
is a :class:`FakeApp` (pcm16 16 kHz). Each test checks what each baresip really heard, decoded
by baresip itself (its ``sndfile`` recordings), by the dominant frequency of every loud 100 ms
window (``tone_windows`` of test_baresip.py), plus the session's events and
``GET /v1/calls/{callRef}``:

1. cold (docs/protocol-session-v1.md "transfer", ``cold`` on SIP calls): the app plays a
   700 Hz tone to A, transfers; the session ends with ``transfer``; the call is ``bridged``;
   A hears the app, then B's 1.5 kHz, and B hears A's 1 kHz, through the gateway's bridge (A on
   PCMU, B on G.722: the bridge converts); A hangs up, B gets the gateway's BYE, the call
   record ends.
2. warm (``warm``): A hears a 500 Hz greeting; while B is consulted the app receives B's tone
   and B hears the app's 700 Hz, while A hears no app audio; ``transfer.complete`` joins A and
   B (G.722 on both legs) and ends the session with ``transfer``; then as in 1.
3. REFER (``refer``, RFC 3515): baresip 1.0.0 follows a REFER by itself (the ``menu`` module,
   loaded by the harness, logs "menu: transferring call"; ctrl_tcp reports a ``TRANSFER``
   event with the Refer-To): it answers 202, calls the Refer-To target (B, directly, not
   through the gateway) and reports that INVITE's outcome in NOTIFYs; the gateway sees NOTIFY
   200, sends BYE and ends the session with ``transfer``; A and B hear each other on their own
   call. The target is a ``sip:`` URI with B's port, or an E.164 number (the Refer-To then
   names the trunk's host and port).

Codecs: the 1.5 kHz player (B) is always on G.722. On a G.711 leg baresip resamples its 16 kHz
WAV source to 8 kHz, and that resampler leaves a 1.5 kHz tone at about a tenth of its level
(RMS 5657 -> 502, measured in B's ``enc`` dump) while 1 kHz passes whole: too quiet to count
as heard. sndfile names its dumps by the second, so a baresip's calls must start at least a
second apart to get a file each.

Under CI=true a missing baresip fails these tests (``require_baresip``); elsewhere they skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from appbridge.media.wav import DecodedAudio
from appbridge.testing import FakeSession
from appbridge.testing.audio import dominant_freq, tone_pcm16
from tests.integration.baresip import AUDIO_RATE_HZ, Baresip, BaresipError, require_baresip
from tests.integration.conftest import API_TOKEN, Env, gateway_env
from tests.integration.test_baresip import (
    APP_RATE_HZ,
    gateway_sip_port,
    near,
    sip_settings,
    tone_windows,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ROUTED = "+15550001111"  # the number A calls: routed to the app
PARTY = "+15550002222"  # B, the transfer target
A_NUMBER = "+15550003333"
A_HZ = 1000.0
B_HZ = 1500.0
GREETING_HZ = 500.0  # what the app plays to A
CONSULT_HZ = 700.0  # what the app plays to B (warm) or to A before a cold transfer
TONE_S = 14.0  # how long each baresip plays its tone: longer than any call here
#: Enough 100 ms windows of a tone to call it heard (about 1 s of it).
HEARD_WINDOWS = 8


@dataclass
class Pair:
    env: Env
    a: Baresip
    b: Baresip
    http: httpx.AsyncClient

    @property
    def gateway_uri(self) -> str:
        return f"sip:{ROUTED}@127.0.0.1:{gateway_sip_port(self.env)}"

    async def call_record(self, call_ref: str) -> dict[str, Any]:
        got = await self.http.get(f"/v1/calls/{call_ref}")
        assert got.status_code == 200, got.text
        record: dict[str, Any] = got.json()
        return record

    async def ended_record(self, call_ref: str, timeout_s: float = 5.0) -> dict[str, Any]:
        """The call's record once its state is ``ended`` (polled over the REST API, which has
        no push of its own)."""
        async with asyncio.timeout(timeout_s):
            for _ in itertools.count():
                record = await self.call_record(call_ref)
                if record["state"] == "ended":
                    return record
                await asyncio.sleep(0.05)
        raise AssertionError("unreachable")

    def logs(self) -> str:
        return f"--- A ---\n{self.a.log_text()}\n--- B ---\n{self.b.log_text()}"


def _tone_wav(path: Path, freq_hz: float) -> Path:
    """A baresip source: the tone for `TONE_S`, then silence (aufile ends the call at EOF)."""
    pcm = tone_pcm16(freq_hz, int(TONE_S * 1000), AUDIO_RATE_HZ, amplitude=8000)
    return Baresip.write_wav(path, pcm, hold_s=20.0)


async def _started(workdir: Path, **options: Any) -> Baresip:
    """A started baresip. baresip also binds SIP over TLS on TCP port SIP port + 1, which the
    harness's `free_port` does not reserve: on "Address already in use" a fresh pick of
    ports is tried (each process is started before the next one picks its ports)."""
    for attempt in range(3):
        peer = Baresip(workdir / f"try{attempt}", **options)
        try:
            await peer.start()
        except BaresipError as exc:
            await peer.stop()
            if "Address already in use" not in str(exc) or attempt == 2:
                raise
            continue
        return peer
    raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def baresip_pair(
    tmp_path: Path, *, rtp_low: int, a_codec: str, b_codec: str
) -> AsyncIterator[Pair]:
    """A (caller) and B (auto-answer party) around a gateway whose one trunk points at B.
    Each process gets its own RTP range, away from the gateway's (`rtp_low`..+99)."""
    require_baresip()
    peers: list[Baresip] = []
    try:
        b = await _started(
            tmp_path / "b",
            user=PARTY,
            codecs=(b_codec,),
            play=_tone_wav(tmp_path / "b.wav", B_HZ),
            rtp_ports=(rtp_low + 1100, rtp_low + 1199),
        )
        peers.append(b)
        a = await _started(
            tmp_path / "a",
            user=A_NUMBER,
            codecs=(a_codec,),
            play=_tone_wav(tmp_path / "a.wav", A_HZ),
            rtp_ports=(rtp_low + 1000, rtp_low + 1099),
        )
        peers.append(a)
        async with (
            gateway_env(
                sip=sip_settings(rtp_low, trunk_port=b.sip_port),
                numbers=[{"number": ROUTED, "app": "main"}],
            ) as env,
            httpx.AsyncClient(
                base_url=env.base_url,
                headers={"Authorization": f"Bearer {API_TOKEN}"},
                timeout=10,
            ) as http,
        ):
            yield Pair(env, a, b, http)
    finally:
        for peer in reversed(peers):
            await peer.stop()


async def a_calls_in(pair: Pair) -> tuple[FakeSession, str]:
    """A dials the gateway; returns the app's session and the callRef."""
    await pair.a.dial(pair.gateway_uri)
    session = await pair.env.app.next_session(timeout=10)
    start = await session.wait_for("session.start", timeout=5)
    assert start["from"] == A_NUMBER and start["to"] == ROUTED
    await pair.a.wait_event("CALL_ESTABLISHED")
    return session, str(start["callRef"])


async def finished_recording(peer: Baresip, index: int = -1) -> DecodedAudio:
    """baresip's recording of a call that has ended (sndfile completes it at the call's end)."""
    for _ in range(100):
        files = peer.recordings()
        if files and len(files) >= (index + 1 if index >= 0 else -index):
            heard = peer.received_audio(index)
            if heard.pcm16:
                return heard
        await asyncio.sleep(0.05)
    return peer.received_audio(index)


def _pcm_rate(audio: DecodedAudio) -> tuple[bytes, int]:
    return audio.pcm16, audio.rate_hz


async def app_tone(session: FakeSession, freq_hz: float, ms: int) -> None:
    await session.send_binary(tone_pcm16(freq_hz, ms, APP_RATE_HZ, amplitude=8000))


async def wait_inbound_tone(session: FakeSession, freq_hz: float, timeout_s: float) -> None:
    """Waits until the last 400 ms of the app's inbound track are a `freq_hz` tone."""
    span = APP_RATE_HZ * 2 * 400 // 1000

    def tail_is_tone() -> bool:
        pcm = session.inbound_audio()
        return len(pcm) >= span and abs(dominant_freq(pcm[-span:], APP_RATE_HZ) - freq_hz) < 25

    await session.wait_until(tail_is_tone, timeout=timeout_s)


def first_index(freqs: list[float], target_hz: float, tolerance_hz: float = 25.0) -> int:
    return next(i for i, f in enumerate(freqs) if abs(f - target_hz) <= tolerance_hz)


def last_index(freqs: list[float], target_hz: float, tolerance_hz: float = 25.0) -> int:
    return max(i for i, f in enumerate(freqs) if abs(f - target_hz) <= tolerance_hz)


async def bridged_then_a_hangs_up(pair: Pair, call_ref: str) -> None:
    """The call stays listed as ``bridged`` while A and B talk; A's hang-up ends B's leg (the
    gateway's BYE) and the call record."""
    record = await pair.call_record(call_ref)
    assert record["state"] == "bridged", record
    assert record["endReason"] == "transfer", record
    await asyncio.sleep(2.0)  # A and B talk through the bridge
    assert (await pair.call_record(call_ref))["state"] == "bridged"
    await pair.a.hangup()
    await pair.a.wait_event("CALL_CLOSED")
    closed = await pair.b.wait_event("CALL_CLOSED", timeout_s=10)
    # libre reports a BYE from the remote side as ECONNRESET: the gateway's BYE reached B.
    assert closed.get("param") == "Connection reset by peer", closed
    record = await pair.ended_record(call_ref)
    assert record["ended"] is not None, record


# ------------------------------------------------------------------------------------- tests
async def test_cold_transfer_bridges_two_baresips(tmp_path: Path) -> None:
    async with baresip_pair(tmp_path, rtp_low=45_000, a_codec="PCMU", b_codec="G722") as pair:
        session, call_ref = await a_calls_in(pair)
        # The app hears A, then says something to A, then transfers.
        await wait_inbound_tone(session, A_HZ, timeout_s=5)
        await app_tone(session, CONSULT_HZ, 1200)
        await asyncio.sleep(1.4)  # let it play out to A
        await session.send({"type": "transfer", "id": "x1", "to": PARTY})
        answered = await pair.b.wait_event("CALL_ESTABLISHED", timeout_s=10)
        # The gateway calls B, with the called number as caller ID (protocol doc "transfer").
        assert f"sip:{ROUTED}@" in str(answered.get("peeruri")), answered
        end = await session.wait_for("session.end", timeout=10)
        assert end["reason"] == "transfer" and end.get("id") == "x1", end
        assert not session.of_type("error"), session.of_type("error")

        await bridged_then_a_hangs_up(pair, call_ref)

        heard_a = await finished_recording(pair.a)
        heard_b = await finished_recording(pair.b)
        assert heard_a.rate_hz == 8000 and heard_b.rate_hz == 16_000  # PCMU and G.722 legs
        a_windows = tone_windows(heard_a.pcm16, heard_a.rate_hz)
        b_windows = tone_windows(heard_b.pcm16, heard_b.rate_hz)
        logs = pair.logs()
        # A: the app's 700 Hz, then B's 1.5 kHz through the bridge.
        assert near(a_windows, CONSULT_HZ) >= HEARD_WINDOWS, f"{a_windows}\n{logs}"
        assert near(a_windows, B_HZ) >= HEARD_WINDOWS, f"{a_windows}\n{logs}"
        assert last_index(a_windows, CONSULT_HZ) < first_index(a_windows, B_HZ), a_windows
        # B: A's 1 kHz, and never the app (its session ended before B answered).
        assert near(b_windows, A_HZ) >= HEARD_WINDOWS, f"{b_windows}\n{logs}"
        assert near(b_windows, CONSULT_HZ) == 0, b_windows


async def test_warm_transfer_consults_b_then_joins_a_and_b(tmp_path: Path) -> None:
    async with baresip_pair(tmp_path, rtp_low=45_200, a_codec="G722", b_codec="G722") as pair:
        session, call_ref = await a_calls_in(pair)
        await wait_inbound_tone(session, A_HZ, timeout_s=5)
        await app_tone(session, GREETING_HZ, 1200)
        await asyncio.sleep(1.4)
        await session.send({"type": "transfer", "id": "w1", "to": PARTY, "mode": "warm"})
        answered = await pair.b.wait_event("CALL_ESTABLISHED", timeout_s=10)
        assert f"sip:{ROUTED}@" in str(answered.get("peeruri")), answered
        # B takes A's place toward the app: B's tone arrives as the inbound track.
        await wait_inbound_tone(session, B_HZ, timeout_s=10)
        assert (await pair.call_record(call_ref))["state"] == "active"
        await app_tone(session, CONSULT_HZ, 1500)  # the app talks to B only
        await asyncio.sleep(1.8)
        assert not session.closed
        await session.send({"type": "transfer.complete", "id": "w1"})
        end = await session.wait_for("session.end", timeout=10)
        assert end["reason"] == "transfer" and end.get("id") == "w1", end
        assert not session.of_type("error"), session.of_type("error")

        await bridged_then_a_hangs_up(pair, call_ref)

        heard_a = await finished_recording(pair.a)
        heard_b = await finished_recording(pair.b)
        assert heard_a.rate_hz == heard_b.rate_hz == 16_000  # G.722 on both legs
        a_windows = tone_windows(heard_a.pcm16, heard_a.rate_hz)
        b_windows = tone_windows(heard_b.pcm16, heard_b.rate_hz)
        logs = pair.logs()
        # A: the greeting, then (after waiting in silence) B; never the app's words to B.
        assert near(a_windows, GREETING_HZ) >= HEARD_WINDOWS, f"{a_windows}\n{logs}"
        assert near(a_windows, CONSULT_HZ) == 0, a_windows
        assert near(a_windows, B_HZ) >= HEARD_WINDOWS, f"{a_windows}\n{logs}"
        assert last_index(a_windows, GREETING_HZ) < first_index(a_windows, B_HZ), a_windows
        # B: the app's 700 Hz during the consultation, then A's 1 kHz; never the greeting.
        assert near(b_windows, CONSULT_HZ) >= HEARD_WINDOWS, f"{b_windows}\n{logs}"
        assert near(b_windows, A_HZ) >= HEARD_WINDOWS, f"{b_windows}\n{logs}"
        assert near(b_windows, GREETING_HZ) == 0, b_windows
        assert last_index(b_windows, CONSULT_HZ) < first_index(b_windows, A_HZ), b_windows


@pytest.mark.parametrize(
    "target_form",
    ["sip-uri", "e164"],
)
async def test_refer_makes_a_call_b_itself(tmp_path: Path, target_form: str) -> None:
    rtp_low = 45_400 if target_form == "sip-uri" else 45_600
    await _refer_case(tmp_path, target_form, rtp_low)


async def _refer_case(tmp_path: Path, target_form: str, rtp_low: int) -> None:
    async with baresip_pair(tmp_path, rtp_low=rtp_low, a_codec="G722", b_codec="G722") as pair:
        session, call_ref = await a_calls_in(pair)
        await wait_inbound_tone(session, A_HZ, timeout_s=5)
        # The app greets A. This also keeps A's first call over a second long: sndfile names
        # its files by the second, so two calls started within one second share a file.
        await app_tone(session, GREETING_HZ, 1200)
        await asyncio.sleep(1.4)
        # A sip: URI target with B's port travels as the Refer-To as given; an E.164 target
        # becomes sip:+1555...@<the call's trunk>, which should reach B too.
        target = f"sip:{PARTY}@127.0.0.1:{pair.b.sip_port}" if target_form == "sip-uri" else PARTY
        await session.send(
            {"type": "transfer", "id": "r1", "to": target, "mode": "refer", "headers": {}}
        )
        transfer = await pair.a.wait_event("TRANSFER", timeout_s=5)
        # The Refer-To A follows: B's own address either way (the trunk's host and port).
        assert transfer.get("param") == f"<sip:{PARTY}@127.0.0.1:{pair.b.sip_port}>", transfer
        # A follows the REFER: B gets A's own call (From A), not one from the gateway.
        answered = await pair.b.wait_event("CALL_ESTABLISHED", timeout_s=10)
        assert f"sip:{A_NUMBER}@" in str(answered.get("peeruri")), f"{answered}\n{pair.logs()}"
        end = await session.wait_for("session.end", timeout=10)
        assert end["reason"] == "transfer" and end.get("id") == "r1", f"{end}\n{pair.logs()}"
        assert not session.of_type("error"), session.of_type("error")
        # The gateway let A's first call go (its BYE after NOTIFY 200): the record ends.
        first = await pair.a.wait_event(
            "CALL_CLOSED", timeout_s=5, where=lambda e: f"sip:{ROUTED}@" in str(e.get("peeruri"))
        )
        assert first.get("param") == "Connection reset by peer", first  # a BYE from the gateway
        record = await pair.ended_record(call_ref)
        assert record["endReason"] == "transfer", record
        await asyncio.sleep(2.0)  # A and B talk on their own call
        await pair.a.hangup()
        await pair.b.wait_event("CALL_CLOSED", timeout_s=10)

        assert len(pair.a.recordings()) == 2, pair.a.recordings()  # the gateway, then B
        with_app = tone_windows(*_pcm_rate(await finished_recording(pair.a, 0)))
        with_b = tone_windows(*_pcm_rate(await finished_recording(pair.a, 1)))
        b_windows = tone_windows(*_pcm_rate(await finished_recording(pair.b)))
        logs = pair.logs()
        # A heard the app on its call to the gateway, then B on its own call to B.
        assert near(with_app, GREETING_HZ) >= HEARD_WINDOWS, f"{with_app}\n{logs}"
        assert near(with_app, B_HZ) == 0, with_app
        assert near(with_b, B_HZ) >= HEARD_WINDOWS, f"{with_b}\n{logs}"
        assert near(with_b, GREETING_HZ) == 0, with_b
        assert near(b_windows, A_HZ) >= HEARD_WINDOWS, f"{b_windows}\n{logs}"
        assert near(b_windows, GREETING_HZ) == 0, b_windows
