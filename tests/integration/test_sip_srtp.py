"""SDES-SRTP on SIP trunks (docs/sip.md, "SRTP (SDES)") against real peers, over UDP.

- baresip with mandatory SRTP (``mediaenc=srtp-mand``, module srtp.so) calls the gateway, and
  answers ``POST /v1/calls`` on a trunk with ``srtp = "required"``: the tones cross both ways,
  and a tcpdump capture of the gateway's RTP ports holds no plain audio. The capture check
  would fail with SRTP off: every packet must carry the 80-bit tag, no payload may hold a run
  of µ-law silence (which the gateway sends between the app's tones), the payload bytes must
  look random, and the captured packets, decrypted with the call's own keys, must be the
  tones while their plain payloads appear nowhere in the capture. An ``optional`` trunk's
  best-effort offer (RTP/AVP with crypto lines) to baresip with ``mediaenc=srtp`` is SRTP too.
- sipp offering plain RTP/AVP to a ``required`` trunk gets 488 with a 399 Warning; sipp's
  built-in UAS answering our RTP/SAVP offer without crypto fails the outbound call (BYE).

Under CI=true a missing baresip, sipp or tcpdump fails; elsewhere the test skips
(deploy/install-test-peers.sh installs them).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import shutil
import struct
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from pylibsrtp import Policy, Session

from appbridge.carriers.sip.leg import SipLeg
from appbridge.carriers.sip.sdes import SrtpKeys
from appbridge.media.codecs import AudioFormat, Converter
from appbridge.testing.audio import dominant_freq, tone_pcm16
from tests.integration.baresip import AUDIO_RATE_HZ, Baresip, in_ci, require_baresip
from tests.integration.conftest import API_TOKEN, Env, gateway_env
from tests.integration.sipp_support import (
    SCENARIOS,
    finish_sipp,
    free_port,
    scenario_file,
    sipp_required,
    spawn_sipp,
)
from tests.integration.test_baresip import (
    APP_RATE_HZ,
    app_tone,
    assert_heard_app_tone,
    gateway_sip_port,
    near,
    recording,
    tone_windows,
)
from tests.integration.test_sip_outbound import outbound_gateway, start_sipp, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ROUTED = "+15550001111"
CALLEE = "+15550002222"
TCPDUMP = shutil.which("tcpdump")
SUITE = "AES_CM_128_HMAC_SHA1_80"
PCMU_FRAME = 160
TAG_80 = 10
TAG_32 = 4


def require_tcpdump() -> str:
    if TCPDUMP is None:
        reason = "tcpdump missing: run deploy/install-test-peers.sh (as root)"
        if in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    return TCPDUMP


# -- the capture ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Datagram:
    src_port: int
    dst_port: int
    payload: bytes


def read_pcap(path: Path) -> list[Datagram]:
    """The UDP/IPv4 datagrams of a classic pcap file (Ethernet, Linux cooked or raw IP)."""
    data = path.read_bytes()
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        raise AssertionError(f"not a pcap file: {magic!r}")
    linktype = struct.unpack_from(f"{endian}I", data, 20)[0]
    link_bytes = {1: 14, 113: 16, 276: 20, 101: 0, 228: 0}[linktype]
    out: list[Datagram] = []
    offset = 24
    while offset + 16 <= len(data):
        caplen = struct.unpack_from(f"{endian}I", data, offset + 8)[0]
        frame = data[offset + 16 : offset + 16 + caplen]
        offset += 16 + caplen
        ip = frame[link_bytes:]
        if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 17:
            continue
        udp = ip[(ip[0] & 0x0F) * 4 :]
        src, dst, length = struct.unpack_from("!HHH", udp)
        out.append(Datagram(src, dst, bytes(udp[8:length])))
    return out


def entropy_bits(data: bytes) -> float:
    counts = Counter(data)
    return -sum(n / len(data) * math.log2(n / len(data)) for n in counts.values())


@contextlib.asynccontextmanager
async def capture(path: Path, low: int, high: int) -> AsyncIterator[None]:
    """tcpdump on loopback for UDP on ports ``low..high`` while the block runs."""
    proc = await asyncio.create_subprocess_exec(
        require_tcpdump(),
        "-i",
        "lo",
        "-U",
        "-n",
        "-w",
        str(path),
        "udp",
        "portrange",
        f"{low}-{high}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(10):
            while b"listening on" not in await proc.stderr.readline():
                if proc.returncode is not None:
                    raise AssertionError("tcpdump did not start")
        yield
    finally:
        if proc.returncode is None:
            proc.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 5)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def ulaw_tone(freq_hz: float) -> bytes:
    pcm = tone_pcm16(freq_hz, 200, 8000, amplitude=8000)
    return Converter(AudioFormat("pcm16", 8000), AudioFormat("pcmu", 8000)).convert(pcm)


def decrypt(packets: list[bytes], key: bytes, suite: str) -> list[bytes]:
    """The RTP payloads of SRTP packets, through libsrtp with the sender's key."""
    profile = (
        Policy.SRTP_PROFILE_AES128_CM_SHA1_80
        if suite == SUITE
        else Policy.SRTP_PROFILE_AES128_CM_SHA1_32
    )
    session = Session(Policy(key=key, ssrc_type=Policy.SSRC_ANY_INBOUND, srtp_profile=profile))
    return [session.unprotect(p)[12:] for p in packets]


def check_capture(
    path: Path, gw_port: int, keys: SrtpKeys, sent_hz: float, heard_hz: float
) -> None:
    """The capture check of the module doc, for one call's RTP port ``gw_port``."""
    datagrams = read_pcap(path)
    out = [d.payload for d in datagrams if d.src_port == gw_port]
    into = [d.payload for d in datagrams if d.dst_port == gw_port and d.payload[1] & 0xFF < 192]
    assert len(out) >= 50 and len(into) >= 50, (len(out), len(into))
    # Every packet the gateway sent carries the suite's SRTP tag (RFC 3711 §4.2, RFC 4568 §6.2).
    tag = TAG_80 if keys.suite == SUITE else TAG_32
    assert {len(p) for p in out} == {12 + PCMU_FRAME + tag}
    silence = b"\xff" * 12
    tone = ulaw_tone(sent_hz)
    for packet in out + into:
        body = packet[12:]
        assert silence not in body and b"\x7f" * 12 not in body
        assert tone[:16] not in body
    wire = b"".join(p[12 : 12 + PCMU_FRAME] for p in out)
    assert entropy_bits(wire) > 7.8, entropy_bits(wire)
    # Decrypted with the call's keys, the same packets are the audio: µ-law silence and tone.
    plain_out = decrypt(out, keys.send_key, keys.suite)
    assert sum(1 for p in plain_out if p == b"\xff" * PCMU_FRAME) >= 5
    from_gateway = Converter(AudioFormat("pcmu", 8000), AudioFormat("pcm16", 8000))
    freqs = [dominant_freq(from_gateway.convert(p), 8000) for p in plain_out if p != b"\xff" * 160]
    assert sum(1 for f in freqs if abs(f - sent_hz) < 30) >= 10, freqs
    plain_in = decrypt(into, keys.receive_key, keys.suite)
    freqs = [dominant_freq(from_gateway.convert(p), 8000) for p in plain_in]
    assert sum(1 for f in freqs if abs(f - heard_hz) < 30) >= 10, freqs
    raw = path.read_bytes()
    for p in plain_out + plain_in:
        if len(set(p)) > 4:  # frames with audio in them, not silence
            assert p[:32] not in raw


# -- the gateway ----------------------------------------------------------------------------


def srtp_sip(rtp_low: int, trunk_port: int, srtp: str | None = "required") -> dict[str, object]:
    """``[sip]`` with one trunk at ``trunk_port`` with this ``srtp``; None: no trunk at all."""
    trunk = {"name": "main", "host": "127.0.0.1", "port": trunk_port, "srtp": srtp}
    return {
        "listen": [f"udp:127.0.0.1:{free_port()}"],
        "rtp_ports": [rtp_low, rtp_low + 99],
        "trunks": [trunk] if srtp is not None else [],
    }


def live_leg(env: Env) -> tuple[SipLeg, int]:
    """The one call's leg and the gateway's RTP port for it."""
    sip = env.gw.sip
    assert sip is not None
    legs = [(sc.leg, sc.rtp_port) for sc in sip.inbound.calls.values() if sc.leg is not None]
    legs += [(d.leg, d.rtp_port) for d in sip.outbound.dials.values() if d.leg is not None]
    assert len(legs) == 1, legs
    leg, port = legs[0]
    assert leg is not None and port is not None
    return leg, port


def caller_wav(tmp: Path) -> Path:
    return Baresip.write_wav(
        tmp / "tone.wav", tone_pcm16(1000, 2000, AUDIO_RATE_HZ, amplitude=8000), hold_s=4.0
    )


@pytest.mark.parametrize(
    ("srtp", "rtp_low"),
    [("required", 48_000), (None, 48_200)],
    ids=["required-trunk", "no-trunk-follows-the-offer"],
)
async def test_baresip_calls_in_with_mandatory_srtp(
    tmp_path: Path, srtp: str | None, rtp_low: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    require_baresip()
    require_tcpdump()
    caller = Baresip(
        tmp_path / "caller",
        user="+15550003333",
        codecs=("PCMU",),
        play=caller_wav(tmp_path),
        mediaenc="srtp-mand",
    )
    async with (
        gateway_env(
            sip=srtp_sip(rtp_low, caller.sip_port, srtp),
            numbers=[{"number": ROUTED, "app": "main"}],
        ) as env,
        caller,
        capture(tmp_path / "in.pcap", rtp_low, rtp_low + 99),
    ):
        await caller.dial(f"sip:{ROUTED}@127.0.0.1:{gateway_sip_port(env)}")
        session = await env.app.next_session(timeout=10)
        await session.wait_for("session.start", timeout=5)
        leg, gw_port = live_leg(env)
        assert leg.srtp is not None
        keys = leg.srtp.keys
        assert keys.suite in (SUITE, "AES_CM_128_HMAC_SHA1_32")
        await app_tone(session, 600, 1200)
        await session.wait_until(lambda: len(session.inbound_audio()) >= APP_RATE_HZ * 3, 10)
        windows = tone_windows(session.inbound_audio(), APP_RATE_HZ)
        assert near(windows, 1000) >= 5, windows
        end = await session.wait_for("session.end", timeout=15)  # the WAV ends: baresip's BYE
        assert end["reason"] == "caller_hangup"
        await caller.wait_event("CALL_CLOSED")
        assert leg.srtp is not None and leg.srtp.auth_failures == 0
        heard = await recording(caller)
        assert_heard_app_tone(heard, 600, caller)
    check_capture(tmp_path / "in.pcap", gw_port, keys, 600, 1000)
    for key in (keys.send_key, keys.receive_key):  # no key in the gateway's logs, even debug
        assert base64.b64encode(key).decode() not in caplog.text


async def test_an_off_trunk_refuses_baresip_mandatory_srtp(tmp_path: Path) -> None:
    require_baresip()
    caller = Baresip(
        tmp_path / "caller", user="+15550003333", codecs=("PCMU",), mediaenc="srtp-mand"
    )
    async with (
        gateway_env(
            sip=srtp_sip(48_400, caller.sip_port, "off"),
            numbers=[{"number": ROUTED, "app": "main"}],
        ) as env,
        caller,
    ):
        await caller.dial(f"sip:{ROUTED}@127.0.0.1:{gateway_sip_port(env)}")
        await caller.wait_event("CALL_CLOSED")
        sip = env.gw.sip
        assert sip is not None
        assert sip.inbound.rejected == {488: 1}
        assert env.app.sessions == []
        assert "488" in caller.log_text(100_000)


@pytest.mark.parametrize(
    ("srtp", "mediaenc", "rtp_low"),
    [("required", "srtp-mand", 48_600), ("optional", "srtp", 49_200)],
    ids=["required-trunk-savp", "optional-trunk-best-effort"],
)
async def test_outbound_call_to_baresip_with_srtp(
    tmp_path: Path, srtp: str, mediaenc: str, rtp_low: int
) -> None:
    """``required`` offers RTP/SAVP; ``optional`` offers RTP/AVP with crypto lines, which
    baresip's optional SRTP (``mediaenc=srtp``) takes: SRTP both ways either way."""
    require_baresip()
    require_tcpdump()
    callee = Baresip(
        tmp_path / "callee",
        user=CALLEE,
        codecs=("PCMU",),
        play=caller_wav(tmp_path),
        mediaenc=mediaenc,
    )
    async with (
        gateway_env(sip=srtp_sip(rtp_low, callee.sip_port, srtp)) as env,
        callee,
        capture(tmp_path / "out.pcap", rtp_low, rtp_low + 99),
        httpx.AsyncClient(
            base_url=env.base_url, headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=10
        ) as http,
    ):
        body = {"app": "main", "to": CALLEE, "from": ROUTED, "carrier": "sip:main"}
        created = await http.post("/v1/calls", json=body)
        assert created.status_code == 201, created.text
        call_ref = created.json()["callRef"]
        await callee.wait_event("CALL_ESTABLISHED", timeout_s=10)
        session = await env.app.next_session(timeout=10)
        await session.wait_for("session.start", timeout=5)
        leg, gw_port = live_leg(env)
        assert leg.srtp is not None
        keys = leg.srtp.keys
        await app_tone(session, 600, 1200)
        await session.wait_until(lambda: len(session.inbound_audio()) >= APP_RATE_HZ * 2, 8)
        windows = tone_windows(session.inbound_audio(), APP_RATE_HZ)
        assert near(windows, 1000) >= 5, windows
        # Three seconds each way: the app's 1.2 s tone played out, then silence.
        await session.wait_until(lambda: leg.frames_sent >= 150 <= leg.frames_delivered, 10)
        deleted = await http.delete(f"/v1/calls/{call_ref}")
        assert deleted.status_code in (200, 202, 204), deleted.text
        await callee.wait_event("CALL_CLOSED", timeout_s=10)
        assert leg.srtp is not None and leg.srtp.auth_failures == 0
        heard = await recording(callee)
        assert_heard_app_tone(heard, 600, callee)
    check_capture(tmp_path / "out.pcap", gw_port, keys, 600, 1000)


@sipp_required()
async def test_plain_offer_to_a_required_trunk_gets_488(tmp_path: Path) -> None:
    async with outbound_gateway(48_800, trunk={"srtp": "required"}) as env:
        sip = env.gw.sip
        assert sip is not None
        gw_port = sip.transport.udp_addresses[0][1]
        path = scenario_file(tmp_path, (SCENARIOS / "uac_488_srtp.xml").read_text(), "uac.xml")
        proc = await spawn_sipp(
            tmp_path,
            f"127.0.0.1:{gw_port}",
            "-sf",
            str(path),
            "-s",
            ROUTED,
            local_port=free_port(),
        )
        rc, log = await finish_sipp(proc, tmp_path)
        assert rc == 0, log  # the 488 came, with the Warning sipp checked
        assert sip.inbound.rejected == {488: 1}
        assert len(env.gw.registry) == 0


@sipp_required()
async def test_answer_without_crypto_fails_a_required_call(tmp_path: Path) -> None:
    async with outbound_gateway(49_000, trunk={"srtp": "required"}) as env:
        sipp = await start_sipp(env, tmp_path, None)  # sipp's uas answers plain RTP/AVP
        body = {"app": "main", "to": CALLEE, "from": ROUTED, "carrier": "sip:main"}
        created = await env.http.post("/v1/calls", json=body)
        assert created.status_code == 201, created.text
        ref = created.json()["callRef"]
        failed = await wait_state(env, ref, {"failed"})
        assert failed["sipStatus"] == 200
        rc, log = await finish_sipp(sipp, tmp_path)
        assert rc == 0, log  # sipp got our ACK and then our BYE
        assert env.app.sessions == []  # the app was never dialed
