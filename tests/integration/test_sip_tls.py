"""SIP over TLS against real peers (docs/sip.md, "TLS and SRTP trunks"; RFC 3261 §26.3.1).

The gateway runs in-process with a ``tls:`` listener on 127.0.0.1 and a private CA made by
tests/tls_support.py; the app is a :class:`FakeApp`.

- sipp over TLS: Debian's sipp is built without OpenSSL (no ``-t l1``), so sipp speaks its TCP
  transport (``-t t1``) to a local socat, and socat's OpenSSL client carries the stream to the
  gateway's TLS port, verifying the gateway's certificate against the test CA. The gateway
  therefore sees a real TLS client; sipp's own Via says TCP, which the gateway answers on the
  connection as RFC 3261 §18.2.2 asks.
- bad TLS input (garbage records, plain-text SIP, a client that stops mid-handshake) ends only
  that connection, and a good TLS call still works afterwards.
- baresip over TLS, as caller (it dials the gateway's ``tls:`` listener) and as callee through a
  ``transport = "tls"`` trunk (``POST /v1/calls``): the expected tones both ways.
- a trunk whose certificate names another host, or is signed by an unknown CA: the outbound
  call fails with 502 ``trunk_unreachable`` and a log line naming trunk, address and reason.
- the test caller (``appbridge call sip:...;transport=tls``) over the ``tls:`` listener.

Under CI=true a missing sipp, socat or baresip fails these tests; elsewhere they skip
(deploy/install-test-peers.sh installs them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from appbridge.caller.sip import SipCallFailed, SipTestCaller
from appbridge.carriers.sip import transport as sip_transport
from appbridge.gateway import Gateway
from appbridge.testing import FakeApp
from appbridge.testing.audio import tone_pcm16
from appbridge.testing.harness import bind_loopback, running_gateway
from tests import tls_support
from tests.integration.baresip import AUDIO_RATE_HZ, Baresip, require_baresip
from tests.integration.conftest import API_TOKEN, SECRET, make_config
from tests.integration.sipp_support import (
    SCENARIOS,
    finish_sipp,
    free_port,
    port_taken,
    scenario_file,
    sipp_required,
    spawn_sipp,
)
from tests.integration.test_baresip import (
    APP_RATE_HZ,
    app_tone,
    assert_heard_app_tone,
    near,
    recording,
    tone_windows,
)
from tests.tls_support import Leaf, make_ca

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PCAPS = Path("/usr/share/sip-tester")
ROUTED = "+15550001111"
CALLEE = "+15550002222"
SOCAT = shutil.which("socat")


def require_socat() -> str:
    if SOCAT is None:
        reason = "socat missing: run deploy/install-test-peers.sh (as root)"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    return SOCAT


@dataclass
class TlsEnv:
    gw: Gateway
    app: FakeApp
    ca: tls_support.TestCa
    tls_port: int
    base_url: str


@asynccontextmanager
async def tls_gateway(
    tmp: Path,
    rtp_low: int,
    trunks: list[dict[str, Any]] | None = None,
    ca: tls_support.TestCa | None = None,
) -> AsyncIterator[TlsEnv]:
    """The gateway with a ``tls:`` listener (port chosen by the OS) and the test CA (``ca``,
    else a new one) as ``[sip] tls.ca_file``."""
    ca = ca or make_ca(tmp / "pki")
    leaf = ca.leaf("gw", dns=("localhost",), ips=("127.0.0.1",))
    app = FakeApp(secret=SECRET)
    await app.start()
    sock = bind_loopback()
    sip: dict[str, Any] = {
        "listen": ["udp:127.0.0.1:5060", "tls:127.0.0.1:5061"],
        "rtp_ports": [rtp_low, rtp_low + 99],
        "tls": {
            "cert_file": str(leaf.cert_file),
            "key_file": str(leaf.key_file),
            "ca_file": str(ca.cert_file),
        },
    }
    if trunks:
        sip["trunks"] = trunks
    config = make_config(
        sock.getsockname()[1],
        "http://127.0.0.1:9",
        [{"ref": "main", "url": app.url, "signing_secret": SECRET}],
        numbers=[{"number": ROUTED, "app": "main"}],
        sip=sip,
    )
    assert config.sip is not None
    # Port 0 (any free port) bypasses the validator on purpose: tests must not collide.
    listen = ("udp:127.0.0.1:0", "tls:127.0.0.1:0")
    config = dataclasses.replace(config, sip=dataclasses.replace(config.sip, listen=listen))
    try:
        async with running_gateway(config, sock) as gw:
            assert gw.sip is not None
            port = gw.sip.transport.tls_addresses[0][1]
            yield TlsEnv(gw, app, ca, port, gw.config.server.base_url())
    finally:
        await app.stop()


@asynccontextmanager
async def socat_to(env: TlsEnv) -> AsyncIterator[int]:
    """A socat that takes plain TCP on a local port and carries it over TLS to the gateway,
    checking the gateway's certificate for ``localhost`` against the test CA (module doc)."""
    binary = require_socat()
    for _ in range(5):
        port = free_port(socket.SOCK_STREAM)
        proc = await asyncio.create_subprocess_exec(
            binary,
            f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
            f"OPENSSL:127.0.0.1:{env.tls_port},cafile={env.ca.cert_file},commonname=localhost",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        if await _socat_listening(proc, port):
            break
        # Another process took the port between the pick and socat's bind: pick again.
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
    else:
        pytest.fail("socat did not start on any of 5 free ports")
    try:
        yield port
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def _socat_listening(proc: asyncio.subprocess.Process, port: int) -> bool:
    """True once socat holds ``port`` and is still alive a moment later (a socat that lost the
    port to another process exits at once)."""
    for _ in range(300):
        if proc.returncode is not None:
            return False
        if port_taken(port, socket.SOCK_STREAM):
            await asyncio.sleep(0.05)
            return proc.returncode is None
        await asyncio.sleep(0.01)
    return False


async def sipp_call_over_tls(env: TlsEnv, tmp: Path) -> None:
    """sipp's basic call through socat: session.start, caller audio, caller_hangup."""
    path = scenario_file(
        tmp,
        (SCENARIOS / "uac_basic.xml").read_text(),
        "uac_basic.xml",
        pcap=str(PCAPS / "g711a.pcap"),
        pause_ms="3000",
    )
    async with socat_to(env) as socat_port:
        proc = await spawn_sipp(
            tmp,
            f"127.0.0.1:{socat_port}",
            "-sf",
            str(path),
            "-s",
            ROUTED,
            "-t",
            "t1",
            local_port=free_port(socket.SOCK_STREAM),
        )
        sipp = asyncio.create_task(finish_sipp(proc, tmp))
        session = await env.app.next_session(timeout=10)
        start = await session.wait_for("session.start", timeout=5)
        assert start["direction"] == "inbound" and start["to"] == ROUTED
        await session.wait_until(lambda: len(session.audio) >= 25, timeout=8)
        rc, log = await sipp
        assert rc == 0, log
        end = await session.wait_for("session.end", timeout=5)
        assert end["reason"] == "caller_hangup"


@sipp_required()
async def test_sipp_call_over_tls_through_socat(tmp_path: Path) -> None:
    async with tls_gateway(tmp_path, 45_000) as env:
        await sipp_call_over_tls(env, tmp_path)
        assert env.gw.sip is not None and env.gw.sip.inbound.rejected == {}


async def _closed_by_gateway(port: int, data: bytes, timeout_s: float = 5.0) -> bool:
    """Send ``data`` on a plain TCP connection to the TLS port: whether the gateway hung up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if data:
            writer.write(data)
            await writer.drain()
        async with asyncio.timeout(timeout_s):
            while await reader.read(4096):
                pass  # a TLS alert may come first
        return True
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    finally:
        writer.close()


PLAIN_OPTIONS = (
    b"OPTIONS sip:+15550001111@127.0.0.1 SIP/2.0\r\n"
    b"Via: SIP/2.0/TCP 127.0.0.1:5999;branch=z9hG4bK-plain-1\r\n"
    b"From: <sip:probe@127.0.0.1>;tag=p1\r\nTo: <sip:+15550001111@127.0.0.1>\r\n"
    b"Call-ID: plain-1@127.0.0.1\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\n"
    b"Content-Length: 0\r\n\r\n"
)


async def _tls_exchange(env: TlsEnv, data: bytes) -> tuple[bytes, bool]:
    """``data`` over a verified TLS connection: the first answer, and whether the gateway then
    closed the connection."""
    context = ssl.create_default_context(cafile=str(env.ca.cert_file))
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", env.tls_port, ssl=context, server_hostname="localhost"
    )
    try:
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        try:
            closed = await asyncio.wait_for(reader.read(1), 2) == b""
        except TimeoutError:
            closed = False
        except ConnectionError:
            closed = True
        return answer, closed
    finally:
        writer.close()


TLS_OPTIONS = PLAIN_OPTIONS.replace(b"SIP/2.0/TCP", b"SIP/2.0/TLS").replace(b"-1\r", b"-1;rport\r")


@sipp_required()
async def test_bad_tls_input_ends_only_that_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="appbridge.carriers.sip.transport")
    monkeypatch.setattr(sip_transport, "HANDSHAKE_TIMEOUT_S", 1.0)
    async with tls_gateway(tmp_path, 45_200) as env:
        # A connection held open with a good TLS session while the bad ones come and go.
        context = ssl.create_default_context(cafile=str(env.ca.cert_file))
        _, held = await asyncio.open_connection(
            "127.0.0.1", env.tls_port, ssl=context, server_hostname="localhost"
        )
        assert await _closed_by_gateway(env.tls_port, b"\x16\x03\x01\x00\x05garbage" * 20)
        assert await _closed_by_gateway(env.tls_port, os.urandom(3000))
        assert await _closed_by_gateway(env.tls_port, PLAIN_OPTIONS)
        # A client that stops mid-handshake: half a ClientHello, then nothing.
        assert await _closed_by_gateway(env.tls_port, b"\x16\x03\x01\x02\x00\x01", timeout_s=5)
        failures = [
            r.getMessage() for r in caplog.records if "TLS handshake from" in r.getMessage()
        ]
        assert len(failures) == 4, failures
        assert any("no TLS handshake in time" in f for f in failures), failures
        assert not held.is_closing()
        answer, closed = await _tls_exchange(env, TLS_OPTIONS)
        assert answer.startswith(b"SIP/2.0 200 ") and not closed, answer
        # RFC 3581 over TLS as over UDP: the source is stamped on the Via of the answer.
        assert b"Via: SIP/2.0/TLS 127.0.0.1:5999;branch=z9hG4bK-plain-1;rport=" in answer
        assert b";received=127.0.0.1" in answer, answer
        # The TCP stream rules hold on TLS: no Content-Length is answered 400 and the stream
        # closed, as its framing cannot be trusted (docs/sip.md, "What is supported").
        unframed = TLS_OPTIONS.replace(b"Content-Length: 0\r\n", b"")
        answer, closed = await _tls_exchange(env, unframed)
        assert answer.startswith(b"SIP/2.0 400 ") and closed, answer
        await sipp_call_over_tls(env, tmp_path)
        held.close()


# -- baresip -------------------------------------------------------------------------------


class TlsBaresip(Baresip):
    """baresip with TLS: its TLS transport listens on ``sip_port + 1`` (baresip's rule), trusts
    the test CA (``sip_cafile``) and presents ``leaf`` (``sip_certificate``: cert then key)."""

    def __init__(self, workdir: Path, leaf: Leaf, ca: tls_support.TestCa, **options: Any) -> None:
        super().__init__(workdir, **options)
        self.leaf = leaf
        self.ca = ca

    @property
    def tls_port(self) -> int:
        return self.sip_port + 1

    @property
    def uri(self) -> str:
        return f"sip:{self.user}@127.0.0.1:{self.tls_port};transport=tls"

    def _config_text(self) -> str:
        self.workdir.mkdir(parents=True, exist_ok=True)
        pem = self.workdir / "sip.pem"
        pem.write_bytes(self.leaf.cert_file.read_bytes() + self.leaf.key_file.read_bytes())
        return super()._config_text() + (f"sip_certificate {pem}\nsip_cafile {self.ca.cert_file}\n")

    def _account_text(self) -> str:
        text = super()._account_text()
        return text.replace(f"<sip:{self.user}@127.0.0.1:{self.sip_port}>", f"<{self.uri}>")


async def test_baresip_calls_in_over_tls_tones_both_ways(tmp_path: Path) -> None:
    require_baresip()
    wav = tmp_path / "caller.wav"
    Baresip.write_wav(wav, tone_pcm16(1000, 1500, AUDIO_RATE_HZ, amplitude=8000), hold_s=2.0)
    async with tls_gateway(tmp_path, 45_400) as env:
        leaf = env.ca.leaf("caller", ips=("127.0.0.1",))
        caller = TlsBaresip(tmp_path / "caller", leaf, env.ca, user="+15550003333", play=wav)
        async with caller:
            await caller.dial(f"sip:{ROUTED}@127.0.0.1:{env.tls_port};transport=tls")
            session = await env.app.next_session(timeout=10)
            start = await session.wait_for("session.start", timeout=5)
            assert start["direction"] == "inbound" and start["from"] == "+15550003333"
            assert env.gw.sip is not None
            calls = list(env.gw.sip.inbound.calls.values())
            assert [sc.peer[0] for sc in calls] == ["tls"]
            assert str(calls[0].contact.uri).endswith(f":{env.tls_port};transport=tls")
            await app_tone(session, 600, 1200)
            await caller.wait_event("CALL_ESTABLISHED")
            end = await session.wait_for("session.end", timeout=15)
            assert end["reason"] == "caller_hangup"
            await caller.wait_event("CALL_CLOSED")
            windows = tone_windows(session.inbound_audio(), APP_RATE_HZ)
            assert near(windows, 1000) >= 5, f"{windows}\n{caller.log_text()}"
            assert_heard_app_tone(await recording(caller), 600, caller)


def _api(env: TlsEnv) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    return httpx.AsyncClient(base_url=env.base_url, headers=headers, timeout=10)


async def test_outbound_call_over_a_tls_trunk_answered_by_baresip(tmp_path: Path) -> None:
    require_baresip()
    ca = make_ca(tmp_path / "pki")
    wav = tmp_path / "callee.wav"
    Baresip.write_wav(wav, tone_pcm16(1000, 1000, AUDIO_RATE_HZ, amplitude=8000), hold_s=20.0)
    callee = TlsBaresip(
        tmp_path / "callee", ca.leaf("callee", ips=("127.0.0.1",)), ca, user=CALLEE, play=wav
    )
    trunk = {
        "name": "secure",
        "host": "127.0.0.1",
        "port": callee.tls_port,
        "transport": "tls",
        "srtp": "off",
    }
    async with tls_gateway(tmp_path, 45_600, [trunk], ca) as env, _api(env) as http, callee:
        body = {"app": "main", "to": CALLEE, "from": ROUTED, "carrier": "sip:secure"}
        created = await http.post("/v1/calls", json=body)
        assert created.status_code == 201, created.text
        call_ref = created.json()["callRef"]
        await callee.wait_event("CALL_ESTABLISHED", timeout_s=10)
        session = await env.app.next_session(timeout=10)
        start = await session.wait_for("session.start", timeout=5)
        assert start["direction"] == "outbound" and start["callRef"] == call_ref
        assert env.gw.sip is not None
        dials = list(env.gw.sip.outbound.dials.values())
        assert [d.peer[0] for d in dials] == ["tls"]
        assert dials[0].invite.top_via.transport == "TLS"
        assert dials[0].invite.top_via.has_param("alias")
        await app_tone(session, 600, 1200)
        await session.wait_until(lambda: len(session.inbound_audio()) >= APP_RATE_HZ * 2, timeout=8)
        windows = tone_windows(session.inbound_audio(), APP_RATE_HZ)
        assert near(windows, 1000) >= 5, f"{windows}\n{callee.log_text()}"
        await asyncio.sleep(0.8)  # let the app's 1.2 s tone finish playing out
        deleted = await http.delete(f"/v1/calls/{call_ref}")
        assert deleted.status_code in (200, 202, 204), deleted.text
        await callee.wait_event("CALL_CLOSED", timeout_s=10)
        assert_heard_app_tone(await recording(callee), 600, callee)


# -- refused certificates ------------------------------------------------------------------


@asynccontextmanager
async def tls_server(leaf: Leaf) -> AsyncIterator[tuple[int, list[BaseException]]]:
    """A TLS server presenting ``leaf``: it never gets to SIP when the gateway refuses it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(leaf.cert_file, leaf.key_file)
    served: list[BaseException] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    try:
        yield int(server.sockets[0].getsockname()[1]), served
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("case", ["other-name", "unknown-ca"])
async def test_a_refused_trunk_certificate_fails_the_call(
    tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="appbridge.carriers.sip.uac")
    ca = make_ca(tmp_path / "pki")
    if case == "other-name":
        leaf = ca.leaf("trunk", dns=("other.example",))
        expected = "certificate verify failed: hostname mismatch"
    else:
        rogue = make_ca(tmp_path / "rogue", "rogue")
        leaf = rogue.leaf("trunk", dns=("localhost",))
        expected = "certificate verify failed: unable to get local issuer certificate"
    async with tls_server(leaf) as (port, _):
        trunk = {"name": "secure", "host": "localhost", "port": port, "transport": "tls"}
        async with tls_gateway(tmp_path, 45_800, [trunk], ca) as env, _api(env) as http:
            body = {"app": "main", "to": CALLEE, "from": ROUTED, "carrier": "sip:secure"}
            created = await http.post("/v1/calls", json=body)
            assert created.status_code == 502, created.text
            answer = created.json()
            assert answer["error"] == "trunk_unreachable"
            assert expected in answer["message"], answer
            lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
            assert lines and lines[0].startswith(
                f"sip: TLS to trunk 'secure' (localhost:{port}) refused: {expected}"
            ), lines
            assert env.app.sessions == [] and len(env.gw.registry) == 0


async def test_the_test_caller_over_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``appbridge call sip:...;transport=tls`` (docs/caller.md): the caller verifies the
    gateway's certificate with the CA named by ``SSL_CERT_FILE``."""
    async with tls_gateway(tmp_path, 46_000) as env:
        monkeypatch.setenv("SSL_CERT_FILE", str(env.ca.cert_file))
        uri = f"sip:{ROUTED}@127.0.0.1:{env.tls_port};transport=tls"
        async with SipTestCaller(uri, from_user="+15550003333") as caller:
            assert await caller.call(timeout_s=10) == 200
            session = await env.app.next_session(timeout=5)
            start = await session.wait_for("session.start", timeout=5)
            assert start["from"] == "+15550003333"
            assert env.gw.sip is not None
            assert [sc.peer[0] for sc in env.gw.sip.inbound.calls.values()] == ["tls"]
            await caller.hangup()
            end = await session.wait_for("session.end", timeout=5)
            assert end["reason"] == "caller_hangup"
        # Without the CA the gateway's certificate is refused, and the call fails at once.
        monkeypatch.delenv("SSL_CERT_FILE")
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "no-such-ca.pem"))
        async with SipTestCaller(uri, from_user="+15550003333") as caller:
            with pytest.raises(SipCallFailed):
                await caller.call(timeout_s=10)
