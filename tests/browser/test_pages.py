"""/phone and /console in a real browser (docs/web.md): chromium calls the gateway over WebRTC
with a fake microphone that speaks a known sentence, and the app on the other side is a script.

The gateway is an ``appbridge serve`` process on 127.0.0.1; browser, gateway and apps talk over
loopback only.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from appbridge.testing.fake_app import FakeApp, FakeSession
from appbridge.testing.wer import word_error_rate
from tests.browser.conftest import BrowserEnv
from tests.browser.support import (
    API_TOKEN,
    ARTEFACTS,
    SENTENCE,
    gateway_process,
    pcm16_rms_dbfs,
    poll,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]

AGENT_NUMBER = "+15550001000"


@asynccontextmanager
async def page_at(env: BrowserEnv, url: str, base: str | None = None) -> AsyncIterator[Any]:
    """A page in a fresh browser context (its own cookies), microphone allowed for the origin."""
    context = await env.browser.new_context(viewport={"width": 1100, "height": 900})
    await context.grant_permissions(["microphone"], origin=base or env.gateway.base)
    page = await context.new_page()
    try:
        await page.goto(url)
        yield page
    finally:
        await context.close()


async def dbfs_of(page: Any, selector: str) -> float:
    value = await page.get_attribute(selector, "data-dbfs")
    return float(value) if value is not None else -100.0


async def status_of(page: Any) -> str:
    return str(await page.text_content("#status") or "").strip()


async def call_from(page: Any, app: FakeApp, env: BrowserEnv) -> tuple[FakeSession, str]:
    """Press Call; wait until the app has its session and the page says "in call"."""
    before = len(app.sessions)
    await page.click("#call")
    await poll(
        lambda: len(app.sessions) > before, 20, f"the app's session\n{env.gateway.log_tail()}"
    )
    session = app.sessions[before]
    start = await session.wait_for("session.start", timeout=10)

    async def in_call() -> bool:
        status = await status_of(page)
        assert not status.startswith(("error", "ended")), status
        return status == "in call"

    await poll(in_call, 15, "the page to say 'in call'")
    assert await page.get_attribute("body", "data-call-ref") == start["callRef"]
    return session, str(start["callRef"])


async def console_calls(env: BrowserEnv, base: str | None = None, **kw: Any) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        res = await client.get((base or env.gateway.base) + "/v1/console/calls", **kw)
        assert res.status_code == 200, res.text
        return dict(res.json())


async def test_a_spoken_call_reaches_the_app_and_the_app_is_heard(browser_env: BrowserEnv) -> None:
    env = browser_env
    async with page_at(env, env.gateway.base + "/phone") as page:
        await poll(lambda: page.input_value("#number"), 10, "the directory's first number")
        assert await page.input_value("#number") == AGENT_NUMBER
        assert await status_of(page) == "idle"
        session, call_ref = await call_from(page, env.agent, env)
        start = session.of_type("session.start")[0]
        assert start["from"] == "browser" and start["to"] == AGENT_NUMBER
        live = (await console_calls(env))["live"]
        assert [c["carrier"] for c in live if c["callRef"] == call_ref] == ["webrtc"]
        await session.send({"type": "listen.update", "patience": "low"})

        # The caller's audio arrives like a phone call's, and the local STT hears the sentence.
        await session.wait_until(lambda: len(session.inbound_audio()) > 32000, timeout=10)
        assert pcm16_rms_dbfs(session.inbound_audio()) > -60

        def recognised() -> list[str]:
            texts = [m.get("text", "") for m in session.of_type("turn.ended")]
            return [t for t in texts if word_error_rate(SENTENCE, t) <= 0.5]

        heard = await poll(recognised, 40, f"a turn.ended close to {SENTENCE!r}", 0.2)
        assert heard

        # The app speaks; the page's speaker meter sees it.
        await session.send(
            {
                "type": "speak",
                "id": "hello",
                "text": "Hello from the test app. Your balance is forty two dollars.",
            }
        )

        async def loud() -> bool:
            return await dbfs_of(page, "#level-out") > -50

        await poll(loud, 15, "#level-out above -50 dBFS", 0.05)

        # The transcript shows the turn's text.
        await page.wait_for_selector("#transcript li[data-type='turn.ended']", timeout=10000)
        shown = await page.locator("#transcript li[data-type='turn.ended']").all_text_contents()
        assert any(word_error_rate(SENTENCE, text.replace("ended", "", 1)) <= 0.5 for text in shown)

        async def speaking() -> bool:
            return await dbfs_of(page, "#level-in") > -60

        await poll(speaking, 10, "#level-in above -60 dBFS (the caller speaking)", 0.05)
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTEFACTS / "phone.png"), full_page=True)

        # Keypad presses arrive as dtmf; Hang up ends the session as caller_hangup.
        for digit in ("5", "#"):
            await page.click(f'[data-digit="{digit}"]')
            got = await session.wait_for("dtmf", timeout=5)
            assert got["digit"] == digit
        await page.click("#hangup")
        end = await session.wait_for("session.end", timeout=10)
        assert end["reason"] == "caller_hangup"
        await poll(lambda: status_of(page), 5, "a status")

        async def ended() -> bool:
            return await status_of(page) == "ended: caller_hangup"

        await poll(ended, 5, "the page to say 'ended: caller_hangup'")


async def test_the_console_follows_a_call_live_and_after_it_ended(browser_env: BrowserEnv) -> None:
    env = browser_env
    async with (
        page_at(env, env.gateway.base + "/phone") as phone,
        page_at(env, env.gateway.base + "/console") as console,
    ):
        await poll(lambda: phone.input_value("#number"), 10, "the directory's first number")
        session, call_ref = await call_from(phone, env.agent, env)
        row = f'#live tr[data-call-ref="{call_ref}"]'
        await console.wait_for_selector(row, timeout=10000)
        cells = await console.locator(f"{row} td").all_text_contents()
        assert cells[:5] == [call_ref, "agent", "webrtc", "browser", AGENT_NUMBER]
        await console.click(row)
        await console.wait_for_selector(
            '#timeline li[data-kind="message"][data-type="session.start"]', state="attached"
        )
        await session.send({"type": "speak", "id": "s1", "text": "This <b>line</b> is shown."})
        await console.wait_for_selector(
            '#timeline li[data-kind="message"][data-type="speak"]', state="attached"
        )
        speak_row = console.locator('#timeline li[data-type="speak"]').first
        assert await speak_row.get_attribute("data-dir") == "from_app"
        assert "<b>line</b>" in str(await speak_row.text_content())  # text, never markup
        assert await console.locator("#timeline b").count() == 0

        async def levels_shown() -> bool:
            return await dbfs_of(console, "#level-in") > -100

        await poll(levels_shown, 10, "the console's caller level", 0.2)
        await console.wait_for_selector(
            '#timeline li[data-kind="message"][data-type="turn.ended"]',
            state="attached",
            timeout=30000,
        )
        await console.screenshot(path=str(ARTEFACTS / "console.png"), full_page=True)

        # Hang up from the console; the call moves to the ended list and stays selectable.
        await console.click("#hangup")
        await session.wait_for("session.end", timeout=10)
        await console.wait_for_selector(f'#ended tr[data-call-ref="{call_ref}"]', timeout=10000)

        async def phone_ended() -> bool:
            return (await status_of(phone)).startswith("ended: ")

        await poll(phone_ended, 10, "the phone to show the end")
    async with page_at(env, env.gateway.base + "/console") as console:
        await console.click(f'#ended tr[data-call-ref="{call_ref}"]')
        await console.wait_for_selector(
            '#timeline li[data-kind="message"][data-type="session.end"]', state="attached"
        )
        types = await console.eval_on_selector_all(
            "#timeline li[data-kind='message']", "els => els.map(e => e.dataset.type)"
        )
        assert types.index("session.start") < types.index("speak") < types.index("session.end")


async def test_pages_need_a_login_off_loopback(browser_env: BrowserEnv) -> None:
    env = browser_env
    async with gateway_process(
        env.folder, env.agent.url, env.echo.url, host="0.0.0.0", tokens=True
    ) as gateway:
        async with httpx.AsyncClient(follow_redirects=False) as client:
            for path in ("/phone", "/console", "/v1/webrtc/directory", "/v1/console/calls"):
                res = await client.get(gateway.base + path)
                assert res.status_code == 401, (path, res.status_code)
                assert API_TOKEN not in res.text
            authorised = await client.get(
                gateway.base + "/v1/webrtc/directory",
                headers={"Authorization": f"Bearer {API_TOKEN}"},
            )
            assert authorised.status_code == 200
        async with page_at(env, gateway.base + "/phone", gateway.base) as page:
            assert await page.locator("#call").count() == 0  # the login form, not the phone
            await page.fill('input[name="token"]', API_TOKEN)
            await page.press('input[name="token"]', "Enter")
            await page.wait_for_selector("#call", timeout=10000)
            assert API_TOKEN not in page.url
            cookies = await page.context.cookies(gateway.base)
            session_cookie = [c for c in cookies if c["name"] == "appbridge_session"]
            assert session_cookie and session_cookie[0]["httpOnly"]
            assert session_cookie[0]["value"] != API_TOKEN
            await poll(lambda: page.input_value("#number"), 10, "the directory's first number")
            before = len(env.agent.sessions)
            await page.click("#call")
            await poll(lambda: len(env.agent.sessions) > before, 20, "the app's session")
            session = env.agent.sessions[before]
            await session.wait_for("session.start", timeout=10)
            await poll(lambda: page.get_attribute("body", "data-call-ref"), 15, "a connected call")
            await page.click("#hangup")
            end = await session.wait_for("session.end", timeout=10)
            assert end["reason"] == "caller_hangup"
    assert API_TOKEN not in gateway.log.read_text(errors="replace")


async def test_a_refused_call_shows_the_gateways_message(browser_env: BrowserEnv) -> None:
    env = browser_env
    async with page_at(env, env.gateway.base + "/phone") as page:
        await poll(lambda: page.input_value("#number"), 10, "the directory's first number")
        await page.fill("#number", "+15559990000")  # no route for it
        await page.click("#call")

        async def refused() -> str:
            status = await status_of(page)
            return status if status.startswith("error: ") else ""

        status = await poll(refused, 15, "an error in #status")
        assert len(status) > len("error: ")
        assert await page.is_enabled("#call")  # ready for the next try


# The page's side of the echo measurement: a silent oscillator replaces the microphone; once the
# echoed speech has died down, the tone is switched on and the remote track watched for it.
MEASURE_JS = """
async (trials) => {
  const call = window.appbridgePhone.call();
  const ctx = call.audioContext;
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const osc = ctx.createOscillator();
  osc.frequency.value = 1000;
  const gain = ctx.createGain();
  gain.gain.value = 0;
  const dest = ctx.createMediaStreamDestination();
  osc.connect(gain).connect(dest);
  osc.start();
  const sender = call.pc.getSenders().find((s) => s.track && s.track.kind === "audio");
  await sender.replaceTrack(dest.stream.getAudioTracks()[0]);
  const analyser = ctx.createAnalyser();
  analyser.fftSize = 256;
  ctx.createMediaStreamSource(call.remoteStream).connect(analyser);
  const buf = new Float32Array(analyser.fftSize);
  const level = () => {
    analyser.getFloatTimeDomainData(buf);
    let sum = 0;
    for (const v of buf) sum += v * v;
    const rms = Math.sqrt(sum / buf.length);
    return rms > 0 ? 20 * Math.log10(rms) : -100;
  };
  const results = [];
  for (let i = 0; i < trials; i++) {
    let quietSince = performance.now();
    const waitStart = performance.now();
    while (performance.now() - quietSince < 500) {
      if (level() > -50) quietSince = performance.now();
      if (performance.now() - waitStart > 8000) return { error: "no quiet echo", results };
      await sleep(3);
    }
    const t0 = performance.now();
    gain.gain.setValueAtTime(0.5, ctx.currentTime);
    let ms = null;
    while (performance.now() - t0 < 3000) {
      if (level() > -30) { ms = performance.now() - t0; break; }
      await sleep(1);
    }
    gain.gain.setValueAtTime(0, ctx.currentTime);
    if (ms === null) return { error: "the tone never came back", results };
    results.push(ms);
  }
  return { results };
}
"""


async def test_mouth_to_ear_latency_through_an_echo_app(browser_env: BrowserEnv) -> None:
    env = browser_env
    async with page_at(env, env.gateway.base + "/phone") as page:
        await poll(lambda: page.locator("#app option[value='echo']").count(), 10, "the apps")
        await page.select_option("#app", "echo")
        _, call_ref = await call_from(page, env.echo, env)
        outcome = await page.evaluate(MEASURE_JS, 3)
        assert "error" not in outcome, outcome
        trials = [round(ms, 1) for ms in outcome["results"]]
        assert all(ms < 3000 for ms in trials)
        figure = {
            "mouth_to_ear_ms": round(statistics.median(trials), 1),
            "trials_ms": trials,
            "path": "chromium -> WebRTC -> gateway -> echo app -> gateway -> WebRTC -> chromium",
            "callRef": call_ref,
            "measuredAt": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        (ARTEFACTS / "latency.json").write_text(json.dumps(figure, indent=2) + "\n")
        print(
            f"\nmouth-to-ear latency through the echo app: {figure['mouth_to_ear_ms']} ms {trials}"
        )
        await page.click("#hangup")
