"""Helpers of tests/integration/test_sdk_sip.py: the SDK over the SIP carrier.

- :func:`sdk_sip_env`: the real gateway in-process with ``[sip]`` on a free loopback UDP port
  and one trunk (``party``, 127.0.0.1 at :attr:`SdkSipEnv.party_port`: where a sipp UAS plays
  the new party of transfers; its host also admits the loopback caller, docs/sip.md), two
  SDK ``AppServer`` apps (``main`` and ``second``, for handoffs) and a small HTTP server with
  the WAV files that ``play``/``hold`` fetch.
- :class:`ReferringCaller`: the SIP test caller that also acts as an RFC 3515 referee.
- :func:`run_sipp_uas`: one sipp UAS call on the trunk's port.
- audio measures on what the caller heard (pcm16, 8 kHz, 20 ms frames).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import Response as HttpResponse
from starlette.routing import Route

from appbridge.caller.sip import SipTestCaller
from appbridge.carriers.sip.message import Request
from appbridge.gateway import Gateway
from appbridge.media.wav import write_wav
from appbridge.sdk import AppServer, Session
from appbridge.testing.audio import rms_pcm16, tone_pcm16, ulaw_encode
from appbridge.testing.fake_twilio import LoopbackServer
from appbridge.testing.harness import bind_loopback, running_gateway
from tests.integration.conftest import SECRET, make_config
from tests.integration.sipp_support import (
    finish_sipp,
    free_port,
    port_taken,
    scenario_file,
    spawn_sipp,
)

ROUTED = "+15550002222"
PARTY = "+15557654321"
#: The gateway's RTP ports in these tests: no other test module uses this range.
RTP_PORTS = (47000, 47399)
FRAME_BYTES = 320  # 20 ms of pcm16 at 8 kHz
SILENT_RMS = 150.0
MUSIC_HZ = 600  # /tone.wav: 800 ms of it at 22.05 kHz
PARTY_HZ = 1200  # what the sipp party plays: neither ringback (440/480 Hz) nor the hold music
SIPP_TIMEOUT_S = 30

_callers = itertools.count(1)


def next_caller_number() -> str:
    """A fresh caller number per call: sessions are matched to their call by ``from``."""
    return f"+1555100{next(_callers):04d}"


@dataclass
class SdkSipEnv:
    gw: Gateway
    main: AppServer
    second: AppServer
    media_url: str
    udp_port: int
    party_port: int
    _waiting: dict[str, asyncio.Future[Session]] = field(default_factory=dict)
    second_sessions: asyncio.Queue[Session] = field(default_factory=asyncio.Queue)

    def uri(self, number: str = ROUTED) -> str:
        return f"sip:{number}@127.0.0.1:{self.udp_port}"

    def _future(self, from_: str) -> asyncio.Future[Session]:
        if from_ not in self._waiting:
            self._waiting[from_] = asyncio.get_running_loop().create_future()
        return self._waiting[from_]

    def arrived(self, session: Session) -> None:
        fut = self._future(session.from_)
        if not fut.done():
            fut.set_result(session)

    async def session_of(self, caller: SipTestCaller, timeout_s: float = 10.0) -> Session:
        return await asyncio.wait_for(asyncio.shield(self._future(caller.from_user)), timeout_s)

    async def call(self, caller: SipTestCaller) -> Session:
        """Places ``caller``'s call and returns the app's session of it."""
        assert await caller.call(timeout_s=10) == 200
        return await self.session_of(caller)

    def caller(self, cls: type[SipTestCaller] = SipTestCaller) -> SipTestCaller:
        return cls(self.uri(), from_user=next_caller_number())


async def _media_server() -> LoopbackServer:
    tone = write_wav(tone_pcm16(MUSIC_HZ, 800, 22050), 22050)

    async def serve(request: HttpRequest) -> HttpResponse:
        if request.path_params["name"] == "tone.wav":
            return HttpResponse(tone, media_type="audio/wav")
        return HttpResponse(b"no", status_code=404)

    server = LoopbackServer(Starlette(routes=[Route("/{name}", serve)]))
    await server.start()
    return server


@asynccontextmanager
async def sdk_sip_env() -> AsyncIterator[SdkSipEnv]:
    holder: list[SdkSipEnv] = []

    async def main_handler(session: Session) -> None:
        holder[0].arrived(session)
        await session.wait_closed()

    async def second_handler(session: Session) -> None:
        holder[0].second_sessions.put_nowait(session)
        await session.wait_closed()

    main = await AppServer(main_handler, secrets=SECRET).serve()
    second = await AppServer(second_handler, secrets=SECRET).serve()
    media = await _media_server()
    party_port = free_port()
    sock = bind_loopback()
    apps = [
        {"ref": "main", "url": main.url, "signing_secret": SECRET},
        {"ref": "second", "url": second.url, "signing_secret": SECRET},
    ]
    config = make_config(
        sock.getsockname()[1],
        "http://127.0.0.1:9",
        apps,
        numbers=[{"number": ROUTED, "app": "main"}],
        sip={
            "listen": ["udp:127.0.0.1:5060"],
            "rtp_ports": list(RTP_PORTS),
            "trunks": [
                {"name": "party", "host": "127.0.0.1", "port": party_port, "transport": "udp"}
            ],
        },
    )
    assert config.sip is not None
    # Port 0 (any free port) bypasses the validator on purpose: tests must not collide.
    config = dataclasses.replace(
        config, sip=dataclasses.replace(config.sip, listen=("udp:127.0.0.1:0",))
    )
    try:
        async with running_gateway(config, sock) as gw:
            assert gw.sip is not None
            udp_port = gw.sip.transport.udp_addresses[0][1]
            holder.append(SdkSipEnv(gw, main, second, media.base_url, udp_port, party_port))
            yield holder[0]
    finally:
        await media.stop()
        await second.close()
        await main.close()


# ------------------------------------------------------------------ a REFER-capable caller
class ReferringCaller(SipTestCaller):
    """The SIP test caller, also a referee (RFC 3515 §2.4): it accepts a REFER with 202, then
    reports ``notify_status`` in a final NOTIFY (``message/sipfrag``, Subscription-State
    terminated) as if it had called the Refer-To target. It does not place that call."""

    notify_status = 200

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.refers: list[Request] = []

    def _on_request(self, request: Request) -> None:
        dialog, link = self.dialog, self._link
        if request.method != "REFER" or dialog is None or link is None:
            super()._on_request(request)
            return
        if not dialog.matches(request):
            link.respond(request, 481)
            return
        dialog.on_request(request)
        self.refers.append(request)
        link.respond(request, 202)
        self._event("refer", f"REFER to {request.headers.get('Refer-To')} accepted (202)")
        reason = "OK" if self.notify_status < 300 else "Declined"
        for body, state in (
            (b"SIP/2.0 100 Trying\r\n", "active;expires=60"),
            (f"SIP/2.0 {self.notify_status} {reason}\r\n".encode(), "terminated;reason=noresource"),
        ):
            notify = dialog.create_request(
                "NOTIFY",
                body=body,
                content_type="message/sipfrag;version=2.0",
                headers=[("Event", "refer"), ("Subscription-State", state)],
            )
            link.send_request(notify)


# ------------------------------------------------------------------ sipp as the new party
PARTY_UAS = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<!-- The new party of a transfer: answers PCMU, then plays @AUDIO@ (headerless mu-law 8 kHz,
     looped) until the gateway's BYE, which it answers 200. -->
<scenario name="appbridge sdk transfer party">
  <recv request="INVITE"/>
  <send>
    <![CDATA[
      SIP/2.0 180 Ringing
      [last_Via:]
      [last_From:]
      [last_To:];tag=[pid]SIPpTag01[call_number]
      [last_Call-ID:]
      [last_CSeq:]
      Contact: <sip:party@[local_ip]:[local_port]>
      Content-Length: 0

    ]]>
  </send>
  <send retrans="500">
    <![CDATA[
      SIP/2.0 200 OK
      [last_Via:]
      [last_From:]
      [last_To:];tag=[pid]SIPpTag01[call_number]
      [last_Call-ID:]
      [last_CSeq:]
      Contact: <sip:party@[local_ip]:[local_port]>
      Content-Type: application/sdp
      Content-Length: [len]

      v=0
      o=party 1 1 IN IP[local_ip_type] [local_ip]
      s=-
      c=IN IP[media_ip_type] [media_ip]
      t=0 0
      m=audio [media_port] RTP/AVP 0 101
      a=rtpmap:0 PCMU/8000
      a=rtpmap:101 telephone-event/8000
      a=fmtp:101 0-16
      a=ptime:20

    ]]>
  </send>
  <recv request="ACK"/>
  <nop>
    <action>
      <exec rtp_stream="@AUDIO@,-1,0"/>
    </action>
  </nop>
  <recv request="BYE"/>
  <send>
    <![CDATA[
      SIP/2.0 200 OK
      [last_Via:]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      [last_CSeq:]
      Content-Length: 0

    ]]>
  </send>
</scenario>
"""

BUSY_UAS = """<?xml version="1.0" encoding="ISO-8859-1" ?>
<!-- A busy new party (RFC 3261 §21.4.24): 486, then the ACK. -->
<scenario name="appbridge sdk busy party">
  <recv request="INVITE"/>
  <send retrans="500">
    <![CDATA[
      SIP/2.0 486 Busy Here
      [last_Via:]
      [last_From:]
      [last_To:];tag=[pid]SIPpTag01[call_number]
      [last_Call-ID:]
      [last_CSeq:]
      Content-Length: 0

    ]]>
  </send>
  <recv request="ACK"/>
</scenario>
"""


async def run_sipp_uas(env: SdkSipEnv, scenario: str, tmp: Path) -> tuple[int, str]:
    """One sipp UAS call on the trunk's port; returns sipp's exit code and the end of its log."""
    audio = tmp / "party.ulaw"
    audio.write_bytes(ulaw_encode(tone_pcm16(PARTY_HZ, 2000, 8000, amplitude=8000)))
    path = scenario_file(tmp, scenario, "party_uas.xml", audio=str(audio))
    proc = await spawn_sipp(
        tmp, "-sf", str(path), local_port=env.party_port, timeout_s=SIPP_TIMEOUT_S
    )
    return await finish_sipp(proc, tmp, timeout_s=SIPP_TIMEOUT_S)


async def sipp_listening(port: int, timeout_s: float = 5.0) -> None:
    """Waits until sipp bound the trunk's UDP port (a bind of our own then fails)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if port_taken(port):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"sipp did not bind 127.0.0.1:{port}")


# ------------------------------------------------------------------ what the caller heard
def frames_8k(pcm16: bytes) -> list[bytes]:
    return [pcm16[i : i + FRAME_BYTES] for i in range(0, len(pcm16) - FRAME_BYTES + 1, FRAME_BYTES)]


async def hear_on(caller: SipTestCaller, seconds: float = 0.3, timeout_s: float = 10.0) -> None:
    """Until the caller has heard ``seconds`` more of the call. Its RTP never stops (silence
    once nothing plays), so whatever the gateway played before now has then come through the
    caller's jitter buffer: counted in media time, not wall time, so a loaded machine cannot
    cut it short (a fixed sleep could)."""
    target = len(caller.heard()) + int(seconds * 8000) * 2
    await caller.wait_until(lambda: len(caller.heard()) >= target, timeout_s)


def voiced_span_s(pcm16: bytes) -> float:
    """Seconds from the first to the last non-silent 20 ms frame (0 when all silent)."""
    loud = [i for i, f in enumerate(frames_8k(pcm16)) if rms_pcm16(f) >= SILENT_RMS]
    return (loud[-1] - loud[0] + 1) * 0.020 if loud else 0.0


def voiced_s(pcm16: bytes) -> float:
    """Seconds of non-silent 20 ms frames."""
    return sum(rms_pcm16(f) >= SILENT_RMS for f in frames_8k(pcm16)) * 0.020


def is_silent(pcm16: bytes) -> bool:
    return all(rms_pcm16(f) < SILENT_RMS for f in frames_8k(pcm16))


def at_s(offset_s: float) -> int:
    """The byte offset of ``offset_s`` seconds into pcm16 8 kHz audio (frame aligned)."""
    return round(offset_s / 0.020) * FRAME_BYTES
