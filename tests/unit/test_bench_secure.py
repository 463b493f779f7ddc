"""bench/sip_secure.py: ``--srtp`` and ``--sip-transport tls`` give the gateway a valid secure
configuration (docs/configuration.md) and the workers what their callers need."""

from __future__ import annotations

import argparse
import asyncio
import ssl
from pathlib import Path

import pytest

from appbridge.config import Config, load_config
from bench.gateway_proc import GatewaySpec, render_config
from bench.options import build_parser
from bench.sip_caller import SipEndpoint
from bench.sip_secure import (
    TlsSipEndpoint,
    gateway_fields,
    make_pki,
    open_endpoint,
    prepare,
    ramp_fields,
)

ENV = {"BENCH_TWILIO_TOKEN": "t", "BENCH_APP_SECRET": "s"}


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    args = build_parser().parse_args(["--sip-share", "1", "--out", str(tmp_path), *extra])
    args.soak = None
    return args


def _spec(args: argparse.Namespace) -> GatewaySpec:
    return GatewaySpec(
        port=18080,
        rest_base_url="http://127.0.0.1:18081",
        app_urls=("ws://127.0.0.1:18082/session",),
        account_sid="AC" + "be" * 16,
        sip_port=15070,
        rtp_ports=(24000, 24399),
        **gateway_fields(args),
    )


def _load(tmp_path: Path, spec: GatewaySpec) -> Config:
    path = tmp_path / "gateway.toml"
    path.write_text(render_config(spec))
    return load_config(path, ENV)


def test_plain_runs_keep_their_configuration(tmp_path: Path) -> None:
    args = _args(tmp_path)
    assert prepare(args) is None and args.sip_pki is None
    config = _load(tmp_path, _spec(args))
    assert config.sip is not None
    assert config.sip.listen == ("udp:127.0.0.1:15070",) and config.sip.trunks == ()
    assert ramp_fields(args, _spec(args)) == {
        "sip": ["127.0.0.1", 15070],
        "sip_secure": {"srtp": False, "tls_ca": None},
    }


def test_srtp_gives_the_callers_trunk_srtp_required(tmp_path: Path) -> None:
    args = _args(tmp_path, "--srtp")
    assert prepare(args) is None
    config = _load(tmp_path, _spec(args))
    assert config.sip is not None and config.sip.tls is None
    (trunk,) = config.sip.trunks
    assert (trunk.host, trunk.transport, trunk.srtp) == ("127.0.0.1", "udp", "required")
    assert ramp_fields(args, _spec(args))["sip_secure"] == {"srtp": True, "tls_ca": None}


def test_tls_makes_certificates_a_listener_and_a_tls_trunk(tmp_path: Path) -> None:
    args = _args(tmp_path, "--srtp", "--sip-transport", "tls")
    assert prepare(args) is None
    spec = _spec(args)
    config = _load(tmp_path, spec)  # load_config checks the files (docs/configuration.md)
    assert config.sip is not None and config.sip.tls is not None
    assert config.sip.listen == ("udp:127.0.0.1:15070", f"tls:127.0.0.1:{spec.sip_tls_port}")
    (trunk,) = config.sip.trunks
    assert (trunk.transport, trunk.srtp) == ("tls", "required")
    ramp = ramp_fields(args, spec)
    assert ramp["sip"] == ["127.0.0.1", spec.sip_tls_port]
    assert ramp["sip_secure"] == {"srtp": True, "tls_ca": str(tmp_path / "pki" / "bench-ca.pem")}


def test_secure_options_need_sip_calls(tmp_path: Path) -> None:
    args = build_parser().parse_args(["--sip-share", "0", "--srtp", "--out", str(tmp_path)])
    problem = prepare(args)
    assert problem is not None and "--sip-share" in problem
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--sip-transport", "tcp"])


def test_the_worker_endpoint_follows_the_ramp(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    plain = open_endpoint(("127.0.0.1", 5060), None)
    assert type(plain) is SipEndpoint and not plain.srtp and plain.via == "SIP/2.0/UDP"
    secure = open_endpoint(("127.0.0.1", 5061), {"srtp": True, "tls_ca": str(pki.ca_file)})
    assert isinstance(secure, TlsSipEndpoint) and secure.srtp
    assert (secure.via, secure.contact_params) == ("SIP/2.0/TLS", ";transport=tls")


OPTIONS = (
    b"OPTIONS sip:bench@127.0.0.1 SIP/2.0\r\n"
    b"Via: SIP/2.0/TLS 127.0.0.1:5061;branch=z9hG4bK-bench-1\r\n"
    b"From: <sip:gw@127.0.0.1>;tag=g1\r\nTo: <sip:bench@127.0.0.1>\r\n"
    b"Call-ID: no-such-call@127.0.0.1\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\n"
    b"Content-Length: 0\r\n\r\n"
)


async def test_the_tls_endpoint_verifies_the_gateway_and_frames_its_stream(
    tmp_path: Path,
) -> None:
    """A TLS server with the run's certificate: the endpoint's handshake checks it against the
    run's CA and ``localhost``; a request split over two records is framed as one message
    (RFC 3261 §18.3) and answered on the same connection (481: no such call)."""
    pki = make_pki(tmp_path)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(pki.cert_file, pki.key_file)
    answers: asyncio.Queue[bytes] = asyncio.Queue()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(OPTIONS[:40])
        await writer.drain()
        writer.write(OPTIONS[40:])
        await writer.drain()
        await answers.put(await reader.readuntil(b"\r\n\r\n"))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_context)
    port = int(server.sockets[0].getsockname()[1])
    endpoint = open_endpoint(("127.0.0.1", port), {"srtp": True, "tls_ca": str(pki.ca_file)})
    try:
        await endpoint.start()
        answer = await asyncio.wait_for(answers.get(), 5)
        assert answer.startswith(b"SIP/2.0 481 "), answer
        assert endpoint.bad_messages == 0
    finally:
        await endpoint.stop()
        server.close()
        await server.wait_closed()
    # A CA that did not sign the gateway's certificate: the handshake fails.
    other = make_pki(tmp_path / "other")
    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_context)
    port = int(server.sockets[0].getsockname()[1])
    try:
        refused = open_endpoint(("127.0.0.1", port), {"tls_ca": str(other.ca_file)})
        with pytest.raises(ssl.SSLCertVerificationError):
            await refused.start()
    finally:
        server.close()
        await server.wait_closed()
