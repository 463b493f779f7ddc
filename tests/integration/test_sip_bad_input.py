"""Bad SIP input that a parser alone cannot settle (docs/sip.md, "Bad input"): a required
extension the gateway lacks (RFC 3261 §8.2.2.3, with real sipp), and requests over TCP that lack
the headers a transaction is matched on (§8.1.1, §18.3)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from appbridge.testing import FakeApp
from appbridge.testing.harness import bind_loopback, running_gateway
from tests.integration.conftest import SECRET, make_config
from tests.integration.sipp_support import sipp_required
from tests.integration.test_sip_sipp import ROUTED, run_sipp, sip_gateway

pytestmark = [pytest.mark.timeout(60)]

OPTIONS = (
    "OPTIONS sip:{ROUTED}@127.0.0.1 SIP/2.0\r\n"
    "{via}"
    "From: <sip:probe@127.0.0.1>;tag=t1\r\n"
    "To: <sip:{ROUTED}@127.0.0.1>\r\n"
    "Call-ID: tcp-bad-{n}@127.0.0.1\r\n"
    "{cseq}"
    "Max-Forwards: 70\r\n"
    "Content-Length: 0\r\n\r\n"
)
VIA = "Via: SIP/2.0/TCP 127.0.0.1:5999;branch=z9hG4bK-tcp-{n}\r\n"
CSEQ = "CSeq: 1 OPTIONS\r\n"


@sipp_required()
async def test_an_invite_requiring_an_unknown_extension_gets_420(tmp_path: Path) -> None:
    async with sip_gateway(43000) as env:
        rc, log = await run_sipp(env, "uac_require.xml", ROUTED, tmp_path)
        assert rc == 0, log
        assert env.gw.sip is not None and env.gw.sip.inbound.calls == {}
        assert env.app.sessions == [] and len(env.gw.registry) == 0


@asynccontextmanager
async def tcp_gateway() -> AsyncIterator[int]:
    app = FakeApp(secret=SECRET)
    await app.start()
    sock = bind_loopback()
    config = make_config(
        sock.getsockname()[1],
        "http://127.0.0.1:9",
        [{"ref": "main", "url": app.url, "signing_secret": SECRET}],
        numbers=[{"number": ROUTED, "app": "main"}],
        sip={"listen": ["tcp:127.0.0.1:5060"], "rtp_ports": [43100, 43199]},
    )
    assert config.sip is not None
    config = dataclasses.replace(
        config, sip=dataclasses.replace(config.sip, listen=("tcp:127.0.0.1:0",))
    )
    try:
        async with running_gateway(config, sock) as gw:
            assert gw.sip is not None
            yield gw.sip.transport.tcp_addresses[0][1]
    finally:
        await app.stop()


async def _exchange(port: int, request: str) -> tuple[bytes, bool]:
    """Send ``request`` on a new connection: the answer, and whether the gateway then closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request.encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        try:
            closed = await asyncio.wait_for(reader.read(1), 3) == b""
        except TimeoutError:
            closed = False
        return answer, closed
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("via", "cseq"), [pytest.param("", CSEQ, id="no-via"), pytest.param(VIA, "", id="no-cseq")]
)
async def test_a_tcp_request_without_via_or_cseq_is_answered_and_the_stream_closed(
    via: str, cseq: str
) -> None:
    async with tcp_gateway() as port:
        request = OPTIONS.format(ROUTED=ROUTED, via=via.format(n=1), cseq=cseq, n=1)
        answer, closed = await _exchange(port, request)
        assert answer.startswith(b"SIP/2.0 400 "), answer
        assert closed
        # A well-formed request on a new connection is answered as always, and the stream stays.
        request = OPTIONS.format(ROUTED=ROUTED, via=VIA.format(n=2), cseq=CSEQ, n=2)
        answer, closed = await _exchange(port, request)
        assert answer.startswith(b"SIP/2.0 200 ") and not closed, answer


async def test_a_tcp_request_requiring_an_unknown_extension_gets_420() -> None:
    async with tcp_gateway() as port:
        request = OPTIONS.format(ROUTED=ROUTED, via=VIA.format(n=3), cseq=CSEQ, n=3)
        request = request.replace("Max-Forwards", "Require: timer\r\nMax-Forwards")
        answer, closed = await _exchange(port, request)
        assert answer.startswith(b"SIP/2.0 420 ") and b"\r\nUnsupported: timer\r\n" in answer
        assert not closed
