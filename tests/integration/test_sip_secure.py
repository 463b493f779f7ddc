"""SIP over TLS with mandatory SRTP, against real baresips (docs/sip.md, "TLS and SRTP trunks"
and "SRTP (SDES)"; RFC 3261 §26.3.1, RFC 4568, RFC 3711).

The gateway runs in-process with a ``tls:`` listener (``tls_gateway`` of test_sip_tls.py); every
baresip speaks SIP over TLS only (``TlsBaresip``: ``;transport=tls``) with ``mediaenc=srtp-mand``
(RTP/SAVP with SDES keys), so no call here can fall back to plain signalling or plain RTP.

1. Both directions: baresip calls the gateway's ``tls:`` listener (a trunk for its address with
   ``transport = "tls"``, ``srtp = "required"``), and answers ``POST /v1/calls`` through a
   ``transport = "tls"`` trunk whose ``srtp`` is left at its TLS default (required). The tones
   cross both ways, and a tcpdump capture of the gateway's RTP ports passes test_sip_srtp.py's
   capture check (``check_capture``): no plain audio on the wire, and the call's own keys
   decrypt it to the tones.
2. Transfers over such a trunk, as over UDP (test_baresip_transfer.py, whose helpers drive
   them): cold and warm (the gateway dials B over TLS with SRTP and bridges two SRTP legs), and
   REFER to an E.164 number (the Refer-To names the trunk with ``;transport=tls``, and A calls B
   itself over TLS with SRTP). One gateway and one A/B pair serve the three, one after another,
   since each transfer ends both calls before the next starts; each baresip's recordings are
   read per call.

Under CI=true a missing baresip or tcpdump fails these tests; elsewhere they skip
(deploy/install-test-peers.sh installs them).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

from appbridge.carriers.sip.leg import SipLeg
from tests.integration.baresip import require_baresip
from tests.integration.test_baresip import (
    APP_RATE_HZ,
    app_tone,
    assert_heard_app_tone,
    near,
    recording,
    tone_windows,
)
from tests.integration.test_baresip_transfer import (
    A_HZ,
    A_NUMBER,
    B_HZ,
    CONSULT_HZ,
    GREETING_HZ,
    HEARD_WINDOWS,
    PARTY,
    Pair,
    _pcm_rate,
    _tone_wav,
    a_calls_in,
    bridged_then_a_hangs_up,
    finished_recording,
    first_index,
    last_index,
    wait_inbound_tone,
)
from tests.integration.test_sip_srtp import (
    caller_wav,
    capture,
    check_capture,
    require_tcpdump,
)
from tests.integration.test_sip_tls import ROUTED, TlsBaresip, TlsEnv, _api, tls_gateway
from tests.tls_support import make_ca

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

CALLER = "+15550003333"
CALLEE = "+15550004444"
#: The gateway's RTP ports (100 from here) in each test, and the baresips' ranges.
RTP_BOTH_WAYS = 46_400
RTP_TRANSFERS = 46_600
PEER_RTP = 50_000


def peer_rtp(k: int) -> tuple[int, int]:
    """The RTP range of the ``k``-th baresip: away from the gateway's and from each other."""
    low = PEER_RTP + 100 * k
    return (low, low + 99)


def live_legs(env: TlsEnv) -> list[tuple[str, SipLeg, int]]:
    """(transport, leg, RTP port) of every SIP leg of a call still going, inbound then
    outbound: an ended call's record stays a while for retransmissions (RFC 3261 §17.2.2)."""
    sip = env.gw.sip
    assert sip is not None
    out = [
        (str(sc.peer[0]), sc.leg, sc.rtp_port)
        for sc in sip.inbound.calls.values()
        if sc.leg is not None and sc.rtp_port is not None and not sc.call.ended.is_set()
    ]
    out += [
        (str(d.peer[0]), d.leg, d.rtp_port)
        for d in sip.outbound.dials.values()
        if d.leg is not None and not d.released
    ]
    return out


def secure_legs(env: TlsEnv) -> list[tuple[str, bool]]:
    """(transport, SRTP on) of every live SIP leg (`live_legs`)."""
    return [(kind, leg.srtp is not None) for kind, leg, _ in live_legs(env)]


def the_leg(env: TlsEnv) -> tuple[SipLeg, int]:
    """The one live leg (a call over TLS with SRTP) and the gateway's RTP port for it."""
    assert secure_legs(env) == [("tls", True)], secure_legs(env)
    _, leg, port = live_legs(env)[0]
    return leg, port


# -- 1. both directions ---------------------------------------------------------------------


async def test_tls_with_mandatory_srtp_both_ways(tmp_path: Path) -> None:
    require_baresip()
    require_tcpdump()
    ca = make_ca(tmp_path / "pki")
    wav = caller_wav(tmp_path)  # 1 kHz for 2 s, then silence
    caller = TlsBaresip(
        tmp_path / "caller",
        ca.leaf("caller", ips=("127.0.0.1",)),
        ca,
        user=CALLER,
        codecs=("PCMU",),
        play=wav,
        mediaenc="srtp-mand",
        rtp_ports=peer_rtp(0),
    )
    callee = TlsBaresip(
        tmp_path / "callee",
        ca.leaf("callee", dns=("localhost",), ips=("127.0.0.1",)),
        ca,
        user=CALLEE,
        codecs=("PCMU",),
        play=wav,
        mediaenc="srtp-mand",
        rtp_ports=peer_rtp(1),
    )
    trunks = [
        # The caller's address: its calls are this trunk's, with SRTP required.
        {"name": "caller", "host": "127.0.0.1", "port": caller.tls_port, "transport": "tls",
         "srtp": "required"},
        # No srtp key: required is the default over TLS (docs/configuration.md).
        {"name": "secure", "host": "localhost", "port": callee.tls_port, "transport": "tls"},
    ]  # fmt: skip
    low = RTP_BOTH_WAYS
    async with tls_gateway(tmp_path, low, trunks, ca) as env, _api(env) as http:
        assert env.gw.sip is not None
        assert [t.srtp for t in env.gw.config.sip.trunks] == ["required", "required"]
        async with caller, capture(tmp_path / "in.pcap", low, low + 99):
            await caller.dial(f"sip:{ROUTED}@127.0.0.1:{env.tls_port};transport=tls")
            session = await env.app.next_session(timeout=10)
            start = await session.wait_for("session.start", timeout=5)
            assert start["direction"] == "inbound" and start["from"] == CALLER
            assert [sc.srtp for sc in env.gw.sip.inbound.calls.values()] == ["required"]
            leg, in_port = the_leg(env)
            assert leg.srtp is not None
            in_keys = leg.srtp.keys
            await app_tone(session, 600, 1200)
            await caller.wait_event("CALL_ESTABLISHED")
            # Three seconds each way: the app's tone played out, then silence.
            await session.wait_until(lambda: leg.frames_sent >= 150 <= leg.frames_delivered, 10)
            windows = tone_windows(session.inbound_audio(), APP_RATE_HZ)
            assert near(windows, 1000) >= 5, f"{windows}\n{caller.log_text()}"
            await caller.hangup()
            end = await session.wait_for("session.end", timeout=10)
            assert end["reason"] == "caller_hangup"
            await caller.wait_event("CALL_CLOSED")
            assert leg.srtp.auth_failures == 0
            assert_heard_app_tone(await recording(caller), 600, caller)
        check_capture(tmp_path / "in.pcap", in_port, in_keys, 600, 1000)

        async with callee, capture(tmp_path / "out.pcap", low, low + 99):
            body = {"app": "main", "to": CALLEE, "from": ROUTED, "carrier": "sip:secure"}
            created = await http.post("/v1/calls", json=body)
            assert created.status_code == 201, created.text
            call_ref = created.json()["callRef"]
            await callee.wait_event("CALL_ESTABLISHED", timeout_s=10)
            session = await env.app.next_session(timeout=10)
            start = await session.wait_for("session.start", timeout=5)
            assert start["direction"] == "outbound" and start["callRef"] == call_ref
            leg, out_port = the_leg(env)
            assert leg.srtp is not None
            out_keys = leg.srtp.keys
            await app_tone(session, 600, 1200)
            await session.wait_until(lambda: leg.frames_sent >= 150 <= leg.frames_delivered, 10)
            windows = tone_windows(session.inbound_audio(), APP_RATE_HZ)
            assert near(windows, 1000) >= 5, f"{windows}\n{callee.log_text()}"
            deleted = await http.delete(f"/v1/calls/{call_ref}")
            assert deleted.status_code in (200, 202, 204), deleted.text
            await callee.wait_event("CALL_CLOSED", timeout_s=10)
            assert leg.srtp.auth_failures == 0
            assert_heard_app_tone(await recording(callee), 600, callee)
        check_capture(tmp_path / "out.pcap", out_port, out_keys, 600, 1000)


# -- 2. transfers ---------------------------------------------------------------------------


@dataclass
class TlsPair(Pair):
    """test_baresip_transfer.py's pair, whose A dials the gateway's ``tls:`` listener."""

    tls_port: int = 0

    @property
    def gateway_uri(self) -> str:
        return f"sip:{ROUTED}@127.0.0.1:{self.tls_port};transport=tls"


def assert_all_secure(pair: TlsPair, legs: int) -> None:
    found = secure_legs(pair.env)
    assert found == [("tls", True)] * legs, found


async def cold(pair: TlsPair) -> None:
    """test_baresip_transfer.py's cold transfer: the app, then B through the bridge."""
    session, call_ref = await a_calls_in(pair)
    await wait_inbound_tone(session, A_HZ, timeout_s=5)
    await app_tone(session, CONSULT_HZ, 1200)
    await asyncio.sleep(1.4)  # let it play out to A
    await session.send({"type": "transfer", "id": "x1", "to": PARTY})
    answered = await pair.b.wait_event("CALL_ESTABLISHED", timeout_s=10)
    assert f"sip:{ROUTED}@" in str(answered.get("peeruri")), answered
    end = await session.wait_for("session.end", timeout=10)
    assert end["reason"] == "transfer" and end.get("id") == "x1", end
    assert not session.of_type("error"), session.of_type("error")
    assert_all_secure(pair, 2)  # A's leg and the gateway's call to B: both TLS, both SRTP
    await bridged_then_a_hangs_up(pair, call_ref)
    a_windows = tone_windows(*_pcm_rate(await finished_recording(pair.a)))
    b_windows = tone_windows(*_pcm_rate(await finished_recording(pair.b)))
    logs = pair.logs()
    assert near(a_windows, CONSULT_HZ) >= HEARD_WINDOWS, f"{a_windows}\n{logs}"
    assert near(a_windows, B_HZ) >= HEARD_WINDOWS, f"{a_windows}\n{logs}"
    assert last_index(a_windows, CONSULT_HZ) < first_index(a_windows, B_HZ), a_windows
    assert near(b_windows, A_HZ) >= HEARD_WINDOWS, f"{b_windows}\n{logs}"
    assert near(b_windows, CONSULT_HZ) == 0, b_windows


async def warm(pair: TlsPair) -> None:
    """test_baresip_transfer.py's warm transfer: B consulted by the app, then joined to A."""
    session, call_ref = await a_calls_in(pair)
    await wait_inbound_tone(session, A_HZ, timeout_s=5)
    await app_tone(session, GREETING_HZ, 1200)
    await asyncio.sleep(1.4)
    await session.send({"type": "transfer", "id": "w1", "to": PARTY, "mode": "warm"})
    await pair.b.wait_event("CALL_ESTABLISHED", timeout_s=10)
    await wait_inbound_tone(session, B_HZ, timeout_s=10)
    assert (await pair.call_record(call_ref))["state"] == "active"
    assert_all_secure(pair, 2)
    await app_tone(session, CONSULT_HZ, 1500)  # the app talks to B only
    await asyncio.sleep(1.8)
    await session.send({"type": "transfer.complete", "id": "w1"})
    end = await session.wait_for("session.end", timeout=10)
    assert end["reason"] == "transfer" and end.get("id") == "w1", end
    assert not session.of_type("error"), session.of_type("error")
    await bridged_then_a_hangs_up(pair, call_ref)
    a_windows = tone_windows(*_pcm_rate(await finished_recording(pair.a)))
    b_windows = tone_windows(*_pcm_rate(await finished_recording(pair.b)))
    logs = pair.logs()
    assert near(a_windows, GREETING_HZ) >= HEARD_WINDOWS, f"{a_windows}\n{logs}"
    assert near(a_windows, CONSULT_HZ) == 0, a_windows
    assert near(a_windows, B_HZ) >= HEARD_WINDOWS, f"{a_windows}\n{logs}"
    assert last_index(a_windows, GREETING_HZ) < first_index(a_windows, B_HZ), a_windows
    assert near(b_windows, CONSULT_HZ) >= HEARD_WINDOWS, f"{b_windows}\n{logs}"
    assert near(b_windows, A_HZ) >= HEARD_WINDOWS, f"{b_windows}\n{logs}"
    assert near(b_windows, GREETING_HZ) == 0, b_windows
    assert last_index(b_windows, CONSULT_HZ) < first_index(b_windows, A_HZ), b_windows


async def refer(pair: TlsPair) -> None:
    """test_baresip_transfer.py's REFER to an E.164 number: the Refer-To names the TLS trunk,
    and A calls B itself, over TLS with SRTP (both baresips have ``mediaenc=srtp-mand``)."""
    session, call_ref = await a_calls_in(pair)
    await wait_inbound_tone(session, A_HZ, timeout_s=5)
    await app_tone(session, GREETING_HZ, 1200)
    await asyncio.sleep(1.4)  # also keeps the calls' recordings a second apart
    await session.send({"type": "transfer", "id": "r1", "to": PARTY, "mode": "refer"})
    transfer = await pair.a.wait_event("TRANSFER", timeout_s=5)
    expected = f"<sip:{PARTY}@127.0.0.1:{pair.b.tls_port};transport=tls>"
    assert transfer.get("param") == expected, transfer
    answered = await pair.b.wait_event("CALL_ESTABLISHED", timeout_s=10)
    assert f"sip:{A_NUMBER}@" in str(answered.get("peeruri")), f"{answered}\n{pair.logs()}"
    end = await session.wait_for("session.end", timeout=10)
    assert end["reason"] == "transfer" and end.get("id") == "r1", f"{end}\n{pair.logs()}"
    first = await pair.a.wait_event(
        "CALL_CLOSED", timeout_s=5, where=lambda e: f"sip:{ROUTED}@" in str(e.get("peeruri"))
    )
    assert first.get("param") == "Connection reset by peer", first  # a BYE from the gateway
    assert (await pair.ended_record(call_ref))["endReason"] == "transfer"
    await asyncio.sleep(2.0)  # A and B talk on their own call
    await pair.a.hangup()
    await pair.b.wait_event("CALL_CLOSED", timeout_s=10)
    with_app = tone_windows(*_pcm_rate(await finished_recording(pair.a, -2)))
    with_b = tone_windows(*_pcm_rate(await finished_recording(pair.a, -1)))
    b_windows = tone_windows(*_pcm_rate(await finished_recording(pair.b)))
    logs = pair.logs()
    assert near(with_app, GREETING_HZ) >= HEARD_WINDOWS, f"{with_app}\n{logs}"
    assert near(with_app, B_HZ) == 0, with_app
    assert near(with_b, B_HZ) >= HEARD_WINDOWS, f"{with_b}\n{logs}"
    assert near(b_windows, A_HZ) >= HEARD_WINDOWS, f"{b_windows}\n{logs}"
    assert near(b_windows, GREETING_HZ) == 0, b_windows


async def test_transfers_over_a_tls_srtp_trunk(tmp_path: Path) -> None:
    require_baresip()
    ca = make_ca(tmp_path / "pki")
    leaf = ca.leaf("peer", ips=("127.0.0.1",))
    # A offers PCMU first (its calls to the gateway run on it) and G.722 (its own call to B
    # after the REFER): B plays 1.5 kHz, which only G.722 carries well (test_baresip_transfer).
    a = TlsBaresip(
        tmp_path / "a",
        leaf,
        ca,
        user=A_NUMBER,
        codecs=("PCMU", "G722"),
        play=_tone_wav(tmp_path / "a.wav", A_HZ),
        mediaenc="srtp-mand",
        rtp_ports=peer_rtp(2),
    )
    b = TlsBaresip(
        tmp_path / "b",
        leaf,
        ca,
        user=PARTY,
        codecs=("G722",),
        play=_tone_wav(tmp_path / "b.wav", B_HZ),
        mediaenc="srtp-mand",
        rtp_ports=peer_rtp(3),
    )
    trunk = {"name": "main", "host": "127.0.0.1", "port": b.tls_port, "transport": "tls"}
    async with (
        tls_gateway(tmp_path, RTP_TRANSFERS, [trunk], ca) as env,
        _api(env) as http,
        a,
        b,
    ):
        pair = TlsPair(env, a, b, http, tls_port=env.tls_port)
        await cold(pair)
        await warm(pair)
        await refer(pair)
        # baresip's srtp module logs each call's SRTP: A's three calls to the gateway and its own
        # call to B after the REFER; B's calls from the gateway (cold, warm) and from A.
        enabled = "SRTP is Enabled (cryptosuite=AES_CM_128_HMAC_SHA1_"
        assert a.log_text(1_000_000).count(enabled) == 4, a.log_text()
        assert b.log_text(1_000_000).count(enabled) == 3, b.log_text()
