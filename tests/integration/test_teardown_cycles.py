"""An ended call leaves no reference cycle behind.

The gateway runs full collections on its own schedule (media/gc_pacer.py) and freezes what
survives one, so each pass walks only what is new; that is sound only while an ended call is
freed by reference counting alone. Cyclic garbage of an ended call would survive in the frozen
generation until a deep pass. These tests run whole calls of each carrier against real peers
(sipp, the fake Twilio and app on loopback), end them from either side, and collect with
``gc.DEBUG_SAVEALL``: no group of objects that only refer to one another (a strongly connected
component of the garbage) may hold an object of the gateway's, named by type when one does.

The peers' own cycles (httpx responses, websockets' asyncio server, the test caller, the app
SDK) are theirs: only the components holding a gateway object (``appbridge`` but not its test
peers, test caller or SDK; uvicorn; httptools) and no peer object count. A call still winding
down is alive, not garbage, so nothing here depends on timing.
"""

from __future__ import annotations

import asyncio
import base64
import gc
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from appbridge.carriers import twilio_outbound
from appbridge.carriers.sip.transaction import Timers
from appbridge.testing.audio import tone_pcm16, ulaw_encode
from appbridge.testing.fake_app import FakeApp
from appbridge.testing.fake_twilio_outbound import Callee
from tests.integration.conftest import API_TOKEN, SECRET, Env, gateway_env
from tests.integration.sdk_sip_support import (
    PARTY,
    PARTY_UAS,
    run_sipp_uas,
    sdk_sip_env,
    sipp_listening,
)
from tests.integration.sipp_support import sipp_required
from tests.integration.test_call_control import _app, _reload, with_apps
from tests.integration.test_session_protocol import connect
from tests.integration.test_sip_sipp import PCAPS, ROUTED, SipEnv, run_sipp, sip_gateway
from tests.integration.test_twilio_dialect import twilio_env
from tests.integration.test_twilio_outbound import api, place, wait_state

GATEWAY_MODULES = ("appbridge.", "uvicorn.", "httptools.")
#: The peers that ship in the package but are not the gateway: the test peers, the test caller
#: (``appbridge call``) and the app SDK, which run in the callers' and the apps' processes.
PEER_MODULES = ("appbridge.testing", "appbridge.caller", "appbridge.sdk")


def _is_peers(obj: object) -> bool:
    return (type(obj).__module__ or "").startswith(PEER_MODULES)


def _is_gateways(obj: object) -> bool:
    module = type(obj).__module__ or ""
    return module.startswith(GATEWAY_MODULES) and not module.startswith(PEER_MODULES)


def _components(garbage: list[object]) -> Iterator[list[object]]:
    """The strongly connected components of more than one object (Tarjan, iterative)."""
    by_id = {id(o): o for o in garbage}
    edges = {i: [id(r) for r in gc.get_referents(o) if id(r) in by_id] for i, o in by_id.items()}
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    for root in by_id:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if child < len(edges[node]):
                work.append((node, child + 1))
                nxt = edges[node][child]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(by_id[top])
                    if top == node:
                        break
                if len(component) > 1:
                    yield component
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])


@contextmanager
def cycles_left() -> Iterator[list[str]]:
    """Yields a list, filled on exit with one line per garbage cycle holding a gateway object."""
    found: list[str] = []
    gc.collect()
    try:
        yield found
    finally:
        # The gateway's paced passes freeze what survives them: what a cycle left in the frozen
        # generation must be found too.
        gc.unfreeze()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            for component in _components(list(gc.garbage)):
                ours = [o for o in component if _is_gateways(o)]
                # A peer's own cycle may hold gateway types it uses too (the test caller's
                # SipLeg): it is the peer's, in the caller's process in real life.
                if ours and not any(_is_peers(o) for o in component):
                    kinds = Counter(type(o).__qualname__ for o in ours)
                    found.append(", ".join(f"{n} x{c}" for n, c in sorted(kinds.items())))
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.collect()


async def _wait_ended(pending: Callable[[], int], timeout_s: float = 5.0) -> None:
    """Until ``pending()`` is 0 (bounded), then past the app links' 1 s close timers
    (apps/link.py), which hold their sockets until they fire."""
    async with asyncio.timeout(timeout_s):
        while True:
            if not pending():
                break
            await asyncio.sleep(0.05)
    await asyncio.sleep(1.2)


async def test_ended_twilio_calls_leave_no_cycles(env: Env) -> None:
    with cycles_left() as cycles:
        calls = []
        for _ in range(2):
            call, session, _ = await connect(env)
            await session.send({"type": "speak", "id": "s1", "text": "One moment."})
            await session.send({"type": "mark", "id": "m1", "name": "after-speak"})
            await call.send_silence(200)
            await session.wait_for("output.done", timeout=10)
            await session.send({"type": "speak", "id": "s2", "text": "A longer sentence here."})
            await session.send({"type": "clear", "id": "c1"})
            calls.append((call, session))
        first, second = calls
        await first[0].hangup()  # the caller ends one
        await second[1].send({"type": "hangup", "id": "bye"})  # the app the other (REST)
        for call, session in calls:
            await session.wait_for("session.end", timeout=5)
            await session.wait_closed(timeout=5)
            await call.wait_closed(timeout=5)
        await _wait_ended(lambda: len(env.gw.registry))
        del calls, first, second, call, session
    assert cycles == []


@sipp_required()
@pytest.mark.timeout(90)
def short_sip_timers(gw: Any) -> None:
    """T1 of 100 ms (RFC 3261 §17.1.1.1 lets a network scale it): the SIP side's keep-after-end
    timers (32 and 64 x T1) then run out in seconds, not half a minute. Loopback answers in
    well under 100 ms, so nothing is retransmitted that would not be anyway."""
    assert gw.sip is not None
    gw.sip.transport.layer.timers = Timers(t1_s=0.1, t2_s=0.8, t4_s=1.0, d_s=6.4)


async def test_ended_sip_calls_leave_no_cycles(tmp_path: Path) -> None:
    async with sip_gateway(41400) as env:
        short_sip_timers(env.gw)
        with cycles_left() as cycles:
            await _sip_call_ended_by_caller(env, tmp_path)
            await _sip_call_ended_by_app(env, tmp_path)
            await _wait_ended(lambda: len(env.gw.registry))
            # The SIP side is kept 32 x T1 after the end, for retransmissions (Timer J).
            sip = env.gw.sip
            assert sip is not None
            await _wait_ended(lambda: len(sip.inbound.calls), timeout_s=40)
    assert cycles == []


async def _sip_call_ended_by_caller(env: SipEnv, tmp: Path) -> None:
    sipp = asyncio.create_task(
        run_sipp(env, "uac_basic.xml", ROUTED, tmp, pcap=str(PCAPS / "g711a.pcap"), pause_ms="2000")
    )
    session = await env.app.next_session(timeout=10)
    await session.wait_for("session.start", timeout=5)
    await session.send({"type": "speak", "id": "s1", "text": "Hello there."})
    rc, log = await sipp
    assert rc == 0, log
    await session.wait_for("session.end", timeout=5)


async def _sip_call_ended_by_app(env: SipEnv, tmp: Path) -> None:
    sipp = asyncio.create_task(
        run_sipp(env, "uac_gateway_bye.xml", ROUTED, tmp, pcap=str(PCAPS / "g711a.pcap"))
    )
    session = await env.app.next_session(timeout=10)
    await session.wait_for("session.start", timeout=5)
    await session.wait_until(lambda: len(session.audio) >= 5, timeout=8)
    await session.send({"type": "hangup", "id": "bye"})
    await session.wait_for("session.end", timeout=5)
    rc, log = await sipp
    assert rc == 0, log


async def test_ended_twilio_dialect_calls_leave_no_cycles() -> None:
    async with twilio_env() as (env, app):
        with cycles_left() as cycles:
            call = await env.twilio.place_call("+15550001111", "+15550002222")
            session = await asyncio.wait_for(app.sessions.get(), 10)
            await call.send_audio_ulaw(ulaw_encode(tone_pcm16(800, 400, 8000)))
            await session.wait_for("media", n=5)
            start = (await session.wait_for("start"))[0]
            sid = start["streamSid"]
            payload = base64.b64encode(ulaw_encode(tone_pcm16(500, 200, 8000))).decode()
            await session.send({"event": "media", "streamSid": sid, "media": {"payload": payload}})
            await session.send({"event": "mark", "streamSid": sid, "mark": {"name": "m"}})
            await session.send({"event": "clear", "streamSid": sid})
            await call.hangup()
            await session.closed.wait()
            await call.wait_closed(timeout=5)
            await _wait_ended(lambda: len(env.gw.registry))
            del call, session
    assert cycles == []


async def test_a_call_handed_off_after_hold_leaves_no_cycles(env: Env) -> None:
    """Hold and resume, then a handoff: the first app's link, commands and queue are let go
    while the call lives on with the second app's, and the caller ends it there."""
    async with with_apps(1) as (second,):
        apps = dict(env.gw.config.apps)
        apps["second"] = _app("second", second.url)
        _reload(env, apps)
        with cycles_left() as cycles:
            call, first, _ = await connect(env)
            await first.send({"type": "hold", "id": "h"})
            await first.send({"type": "resume", "id": "r"})
            await first.send({"type": "speak", "id": "s", "text": "Passing you on."})
            await first.wait_for("output.done", timeout=10)
            await first.send({"type": "handoff", "id": "ho", "app": "second", "payload": {}})
            await first.wait_for("session.end", timeout=5)
            session = await second.next_session(timeout=5)
            await session.wait_for("session.start", timeout=5)
            await session.send({"type": "speak", "id": "hi", "text": "Second app here."})
            await session.wait_for("output.done", timeout=10)
            await call.hangup()
            await session.wait_for("session.end", timeout=5)
            for ws in (first, session):
                await ws.wait_closed(timeout=5)
            await call.wait_closed(timeout=5)
            await _wait_ended(lambda: len(env.gw.registry))
            del call, first, session, ws
    assert cycles == []


@pytest.fixture
def short_dial_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Twilio dial's record is kept 60 s after it ends (late status callbacks), holding its
    call and leg alive: forget it after 0.2 s here, so that the check sees them freed."""
    monkeypatch.setattr(twilio_outbound, "LINGER_S", 0.2)


@pytest.mark.usefixtures("short_dial_linger")
async def test_an_outbound_rest_call_over_twilio_leaves_no_cycles(env: Env) -> None:
    """``POST /v1/calls`` through Twilio: the dial, its status callbacks, the callee's stream
    and the session, ended with ``DELETE`` (the REST hang-up)."""
    env.rest.dialer.default_callee = Callee("answer", after_ms=20)
    with cycles_left() as cycles:
        ref = await place(env, "+15550004444")
        out = await env.rest.dialer.next_call()
        call = await out.wait_stream()
        session = await env.app.next_session(timeout=5)
        await session.wait_for("session.start", timeout=5)
        await call.send_audio_ulaw(ulaw_encode(tone_pcm16(400, 200, 8000)))
        await session.send({"type": "speak", "id": "s", "text": "An outbound hello."})
        await session.wait_for("output.done", timeout=10)
        assert (await api(env, "DELETE", f"/v1/calls/{ref}")).status_code == 200
        await session.wait_for("session.end", timeout=5)
        await call.wait_closed(timeout=5)
        await out.wait_for_status("completed")
        await wait_state(env, ref, {"ended"})
        await _wait_ended(lambda: len(env.gw.registry))
        del out, call, session
    assert cycles == []


@pytest.mark.usefixtures("short_dial_linger")
async def test_a_warm_transfer_over_twilio_leaves_no_cycles(env: Env) -> None:
    """The engine's warm transfer: a party dialed through Twilio, the consultation, the bridge
    after ``transfer.complete``, then the caller hangs up and the party's stream ends."""
    env.rest.dialer.default_callee = Callee("answer", after_ms=20)
    with cycles_left() as cycles:
        caller = await env.twilio.place_call("+15550001111", "+15550002222")
        session = await env.app.next_session(timeout=5)
        await session.wait_for("session.start", timeout=5)
        await session.send({"type": "transfer", "id": "w1", "to": "+15550004321", "mode": "warm"})
        out = await env.rest.dialer.next_call()
        party = await out.wait_stream()
        heard = session.inbound_audio
        before = len(heard())
        await party.send_audio_ulaw(ulaw_encode(tone_pcm16(600, 400, 8000)))
        # The consultation is on once the party's audio reaches the app.
        await session.wait_until(lambda: len(heard()) - before >= 9600, timeout=5)
        await session.send({"type": "transfer.complete", "id": "w1"})
        await session.wait_for("session.end", timeout=5)
        await caller.send_audio_ulaw(ulaw_encode(tone_pcm16(500, 200, 8000)))
        await caller.hangup()
        await caller.wait_closed(timeout=5)
        await party.wait_closed(timeout=10)
        await session.wait_closed(timeout=5)
        await _wait_ended(lambda: len(env.gw.registry), timeout_s=10)
        del caller, session, out, party
    assert cycles == []


async def test_ended_calls_with_listeners_leave_no_cycles() -> None:
    async with with_apps(1) as (listener,):

        def apps(app: FakeApp) -> list[dict[str, Any]]:
            return [
                {
                    "ref": "main",
                    "url": app.url,
                    "signing_secret": SECRET,
                    "listeners": [{"url": listener.url, "tracks": "both"}],
                }
            ]

        async with gateway_env(apps) as env:
            with cycles_left() as cycles:
                call, session, _ = await connect(env)
                heard = await listener.next_session(timeout=5)
                await heard.wait_for("session.start", timeout=5)
                await session.send({"type": "speak", "id": "s", "text": "Hello listeners."})
                await session.wait_for("output.done", timeout=10)
                await session.send({"type": "hangup", "id": "end"})
                await heard.wait_for("session.end", timeout=5)
                await session.wait_closed(timeout=5)
                await call.wait_closed(timeout=5)
                await _wait_ended(lambda: len(env.gw.registry))
                del call, session, heard
    assert cycles == []


@sipp_required()
@pytest.mark.timeout(110)
async def test_a_cold_transfer_bridge_over_sip_leaves_no_cycles(tmp_path: Path) -> None:
    """The B2BUA path: the gateway dials the party over the trunk (an outbound dial), bridges
    the caller to it, and the caller hangs up. The dial is kept 64 x T1 after it ends."""
    async with sdk_sip_env() as env:
        short_sip_timers(env.gw)
        with cycles_left() as cycles:
            caller = env.caller()
            try:
                session = await env.call(caller)
                party = asyncio.create_task(run_sipp_uas(env, PARTY_UAS, tmp_path))
                await sipp_listening(env.party_port)
                end = await asyncio.wait_for(session.transfer(PARTY), 15)
                assert end.reason == "transfer"
                await asyncio.sleep(0.5)  # bridged: the caller hears the party
                await caller.hangup()
                rc, log = await asyncio.wait_for(party, 15)
                assert rc == 0, log
            finally:
                await caller.close()
            sip = env.gw.sip
            assert sip is not None
            await _wait_ended(lambda: len(env.gw.registry))
            await _wait_ended(lambda: len(sip.inbound.calls) + len(sip.outbound.dials), 60)
            del caller, session, party, end
    assert cycles == []


async def test_ended_browser_calls_leave_no_cycles() -> None:
    """Browser calls (docs/webrtc.md): the browser hangs up one over the data channel, the app
    the other. aiortc's own cycles are its own; none may hold a gateway object."""
    from appbridge.testing.webrtc_browser import BrowserPeer

    numbers = [{"number": "+15551230000", "app": "main"}]
    async with gateway_env(webrtc={"host_addresses": ["127.0.0.1"]}, numbers=numbers) as env:
        with cycles_left() as cycles:
            peers = []
            for codec, ender in (("opus", "browser"), ("PCMU", "app")):
                peer = BrowserPeer(env.base_url, token=API_TOKEN, codec=codec, tone_hz=440)
                assert (await peer.call(to="+15551230000")).status_code == 201
                session = await env.app.next_session(timeout=5)
                await session.wait_for("session.start", timeout=5)
                await peer.wait_channel_open()
                await session.send({"type": "speak", "id": "s", "text": "Hello browser."})
                await session.wait_for("output.done", timeout=10)
                if ender == "browser":
                    peer.send({"type": "hangup"})
                else:
                    await session.send({"type": "hangup", "id": "bye"})
                await session.wait_for("session.end", timeout=5)
                await session.wait_closed(timeout=5)
                peers.append(peer)
            await _wait_ended(lambda: len(env.gw.registry))
            for peer in peers:
                await peer.close()
            await asyncio.sleep(0.5)  # the gateway's side of each peer connection closes
            del peers, peer, session
    assert cycles == []
