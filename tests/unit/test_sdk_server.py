"""The SDK server against a scripted "gateway" peer over real loopback WebSockets.

The peer plays the gateway's part with the websockets client and json only: it signs the request
(hmac, as docs/protocol-session-v1.md says), sends ``session.start`` and then whatever the test
scripts, including the turn events the gateway's turn detector sends (docs/protocol-session-v1.md),
so gather of a speech turn and automatic barge-in are tested on the wire. Bad input is sent the same
way: a bad or stale signature, garbage frames, a peer that vanishes mid-await.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from appbridge.sdk import AppServer, GatherResult, OutputResult, Session, SessionClosed
from appbridge.testing.fake_twilio import LoopbackServer

SECRET = "peer-secret"
START: dict[str, Any] = {
    "type": "session.start",
    "protocol": "fonoster.session.v1",
    "sessionRef": "0f0e0d0c-0b0a-4909-8807-060504030201",
    "callRef": "CA" + "ab" * 16,
    "appRef": "main",
    "direction": "inbound",
    "from": "+15550001111",
    "to": "+15550002222",
    "metadata": {},
    "handoff": None,
    "audio": {"codec": "pcm16", "rate": 16000},
    "tracks": [{"id": 1, "side": "inbound", "kind": "audio", "codec": "pcm16"}],
    "speech": {"voice": "local/en-US", "language": "en-US"},
}


def sign(url: str, secret: str = SECRET, ts: int | None = None) -> dict[str, str]:
    stamp = int(time.time()) if ts is None else ts
    mac = hmac.new(secret.encode(), f"{stamp}.{url}".encode(), hashlib.sha256).hexdigest()
    return {"X-Fonoster-Timestamp": str(stamp), "X-Fonoster-Signature": mac}


class Peer:
    """The gateway's side of one session socket, scripted by a test."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def send(self, msg: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(json.dumps(msg) if isinstance(msg, dict) else msg)

    async def expect(self, kind: str, timeout_s: float = 5.0) -> dict[str, Any]:
        """The next command of type ``kind`` (others are skipped)."""
        async with asyncio.timeout(timeout_s):
            while True:
                frame = await self.ws.recv()
                if isinstance(frame, str):
                    msg = json.loads(frame)
                    if msg["type"] == kind:
                        return msg  # type: ignore[no-any-return]

    async def commands_until_closed(self, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        async with asyncio.timeout(timeout_s):
            try:
                while True:
                    frame = await self.ws.recv()
                    if isinstance(frame, str):
                        out.append(json.loads(frame))
            except ConnectionClosed:
                return out


class Harness:
    def __init__(self, server: AppServer) -> None:
        self.server = server
        self.sessions: asyncio.Queue[Session] = asyncio.Queue()
        self.calls = 0

    async def dial(self, headers: dict[str, str] | None = None, start: bool = True) -> Peer:
        url = self.server.url
        ws = await connect(
            url, additional_headers=sign(url) if headers is None else headers, compression=None
        )
        peer = Peer(ws)
        if start:
            await peer.send(START)
        return peer

    async def session(self) -> Session:
        return await asyncio.wait_for(self.sessions.get(), 5)


@asynccontextmanager
async def harness(
    handler: Callable[[Session, Harness], Awaitable[None]] | None = None, **kw: Any
) -> AsyncIterator[Harness]:
    holder: list[Harness] = []

    async def run(session: Session) -> None:
        h = holder[0]
        h.calls += 1
        h.sessions.put_nowait(session)
        if handler is not None:
            await handler(session, h)
        else:
            await session.wait_closed()

    server = AppServer(run, secrets=kw.pop("secrets", SECRET), **kw)
    holder.append(Harness(server))
    async with server:
        yield holder[0]


async def test_a_signed_peer_gets_a_session_with_its_start_data() -> None:
    async with harness() as h:
        peer = await h.dial()
        session = await h.session()
        assert session.from_ == "+15550001111" and session.call_ref == START["callRef"]
        assert session.handoff_payload is None and session.metadata == {}
        await peer.ws.close()
        await asyncio.wait_for(session.wait_closed(), 5)


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(lambda url: sign(url, secret="wrong"), id="bad-signature"),
        pytest.param(lambda url: sign(url, ts=int(time.time()) - 301), id="stale"),
        pytest.param(lambda url: sign(url, ts=int(time.time()) + 301), id="future"),
        pytest.param(lambda url: sign(url + "?x=1"), id="other-url"),
        pytest.param(lambda url: {}, id="unsigned"),
    ],
)
async def test_bad_requests_get_401_and_never_reach_the_handler(
    headers: Callable[[str], dict[str, str]],
) -> None:
    async with harness() as h:
        with pytest.raises(InvalidStatus) as info:
            await h.dial(headers(h.server.url))
        assert info.value.response.status_code == 401
        assert h.calls == 0 and h.server.refused == 1


async def test_secret_rotation_and_a_wrong_path() -> None:
    async with harness(secrets=["new", SECRET]) as h:
        await h.dial()
        await h.session()
        url = h.server.url.replace("/session", "/other")
        with pytest.raises(InvalidStatus) as info:
            await connect(url, additional_headers=sign(url))
        assert info.value.response.status_code == 404


async def test_garbage_instead_of_session_start_closes_without_the_handler() -> None:
    async with harness() as h:
        for first in ("not json", json.dumps({"type": "dtmf", "digit": "1"}), b"\x01\x00"):
            peer = await h.dial(start=False)
            await peer.send(first)
            await peer.commands_until_closed()
            assert peer.ws.close_code == 1008
        assert h.calls == 0


async def test_malformed_messages_never_reach_the_handler() -> None:
    async with harness() as h:
        peer = await h.dial()
        session = await h.session()
        for junk in (
            "{",
            "[]",
            '{"type": 5}',
            '{"type":"dtmf","digit":"99"}',
            '{"type":"output.done","id":"x","heardMs":-1}',
            b"",
        ):
            await peer.send(junk)
        await peer.send({"type": "dtmf", "digit": "3"})
        await peer.send({"type": "session.end", "reason": "caller_hangup"})
        events = [e async for e in session]
        assert [type(e).__name__ for e in events] == ["DtmfEvent", "SessionEnd"]


async def test_the_peer_closing_mid_await_makes_the_await_raise() -> None:
    outcome: asyncio.Future[BaseException | OutputResult] = asyncio.Future()

    async def handler(session: Session, h: Harness) -> None:
        try:
            outcome.set_result(await session.say("This will never finish."))
        except SessionClosed as exc:
            outcome.set_result(exc)
            raise

    async with harness(handler) as h:
        peer = await h.dial()
        await peer.expect("speak")
        await peer.ws.close()
        assert isinstance(await asyncio.wait_for(outcome, 5), SessionClosed)


async def test_gather_of_a_speech_turn_from_turn_events() -> None:
    result: asyncio.Future[GatherResult] = asyncio.Future()

    async def handler(session: Session, h: Harness) -> None:
        result.set_result(await session.gather(timeout_s=30, prompt="What would you like?"))
        await session.say(f"You said {result.result().text}")

    async with harness(handler) as h:
        peer = await h.dial()
        prompt = await peer.expect("speak")
        await peer.send({"type": "output.started", "id": prompt["id"]})
        await peer.send({"type": "output.done", "id": prompt["id"], "heardMs": 900})
        await peer.send({"type": "turn.user_started"})
        await peer.send({"type": "turn.likely_ended", "text": "a table"})
        await peer.send({"type": "turn.resumed"})
        await peer.send(
            {
                "type": "turn.ended",
                "text": "a table for two",
                "language": "en-US",
                "confidence": 0.93,
                "durationMs": 2100,
                "abandoned": False,
            }
        )
        reply = await peer.expect("speak")
        assert reply["text"] == "You said a table for two"
        gathered = result.result()
        assert gathered.kind == "speech" and gathered.turn is not None
        assert gathered.turn.confidence == 0.93


@pytest.mark.parametrize("auto", [True, False])
async def test_automatic_barge_in_on_the_wire(auto: bool) -> None:
    result: asyncio.Future[OutputResult] = asyncio.Future()

    async def handler(session: Session, h: Harness) -> None:
        result.set_result(await session.say("A long explanation of opening hours."))
        await session.wait_closed()

    async with harness(handler, auto_barge_in=auto) as h:
        peer = await h.dial()
        speak = await peer.expect("speak")
        await peer.send({"type": "output.started", "id": speak["id"]})
        await peer.send({"type": "turn.user_started"})
        await peer.send({"type": "dtmf", "digit": "1"})  # a probe that the SDK read on
        if auto:
            clear = await peer.expect("clear")
            assert clear["id"] != speak["id"]
            await peer.send(
                {
                    "type": "output.interrupted",
                    "id": speak["id"],
                    "heardText": "A long",
                    "heardMs": 450,
                }
            )
            said = await asyncio.wait_for(result, 5)
            assert said.interrupted and said.heard_text == "A long"
        else:
            await peer.send({"type": "output.done", "id": speak["id"], "heardMs": 2400})
            assert (await asyncio.wait_for(result, 5)).done
        await peer.send({"type": "session.end", "reason": "caller_hangup"})
        commands = await peer.commands_until_closed()
        assert [c["type"] for c in commands].count("clear") == 0


async def test_a_handler_that_returns_hangs_up_and_one_that_fails_too() -> None:
    async def handler(session: Session, h: Harness) -> None:
        if h.calls == 2:
            raise RuntimeError("app bug")

    async with harness(handler) as h:
        for _ in range(2):
            peer = await h.dial()
            hangup = await peer.expect("hangup")
            await peer.send({"type": "session.end", "reason": "app_hangup", "id": hangup["id"]})
            await peer.commands_until_closed()
            assert peer.ws.close_code == 1000


async def test_mounted_in_a_starlette_app() -> None:
    sessions: asyncio.Queue[Session] = asyncio.Queue()

    async def handler(session: Session) -> None:
        sessions.put_nowait(session)
        said = await session.say("Hello from Starlette")
        await session.say(f"{said.status}")

    server = AppServer(handler, secrets=SECRET)
    web = LoopbackServer(
        Starlette(routes=[WebSocketRoute("/voice", server)]), ws="websockets-sansio"
    )
    await web.start()
    try:
        url = f"ws://127.0.0.1:{web.port}/voice"
        with pytest.raises(InvalidStatus) as info:
            await connect(url, additional_headers=sign(url, secret="wrong"))
        assert info.value.response.status_code == 401 and server.refused == 1
        peer = Peer(await connect(url, additional_headers=sign(url)))
        await peer.send(START)
        first = await peer.expect("speak")
        assert first["text"] == "Hello from Starlette"
        await peer.send({"type": "output.done", "id": first["id"], "heardMs": 700})
        second = await peer.expect("speak")
        assert second["text"] == "done"
        await peer.send({"type": "output.done", "id": second["id"], "heardMs": 300})
        hangup = await peer.expect("hangup")
        await peer.send({"type": "session.end", "reason": "app_hangup", "id": hangup["id"]})
        await peer.commands_until_closed()
        assert sessions.qsize() == 1
    finally:
        await web.stop()
