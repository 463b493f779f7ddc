"""The README's first browser call: `/phone` against the embedded demo app, configured as
`make run` serves it (docs/web.md, "Opening them"), with the browser's fake microphone speaking
a sentence. The page finds no number to dial (only the ``"*"`` route) and calls the demo app.

The configuration is the embedded default's (docs/configuration.md, "The embedded default")
written out, without SIP, with ``[webrtc] host_addresses`` on loopback so that media stays on it.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.browser.conftest import BrowserEnv
from tests.browser.support import free_port, poll, serve_toml
from tests.browser.test_pages import dbfs_of, page_at, status_of

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]

DEMO_TOML = """
[server]
host = "127.0.0.1"
port = {port}

[webrtc]
host_addresses = ["127.0.0.1"]

[[apps]]
ref = "demo"
url = "ws://127.0.0.1:{port}/demo/session"

[[numbers]]
number = "*"
app = "demo"
"""


async def _app_says(base: str, call_ref: str, words: str) -> bool:
    """Whether the demo app has sent a ``speak`` containing ``words`` (the call's console)."""
    async with httpx.AsyncClient() as client:
        page = (await client.get(f"{base}/v1/console/calls/{call_ref}/timeline")).json()
    texts = [
        str((e.get("data") or {}).get("text", ""))
        for e in page["entries"]
        if e["kind"] == "message" and e["type"] == "speak" and e["dir"] == "from_app"
    ]
    return any(words in text for text in texts)


async def test_a_newcomer_talks_to_the_demo_app(browser_env: BrowserEnv) -> None:
    port = free_port()
    async with serve_toml(browser_env.folder, port, DEMO_TOML.format(port=port)) as gateway:
        env = BrowserEnv(
            browser_env.browser, gateway, browser_env.agent, browser_env.echo, browser_env.folder
        )
        async with page_at(env, gateway.base + "/phone") as page:
            await poll(lambda: page.input_value("#app"), 10, "the demo app chosen")
            assert await page.input_value("#app") == "demo"
            await page.click("#call")

            async def call_ref() -> Any:
                status = await status_of(page)
                assert not status.startswith(("error", "ended")), gateway.log_tail()
                return await page.get_attribute("body", "data-call-ref")

            ref = await poll(call_ref, 20, "the page in a call")

            async def greeted() -> bool:
                return await dbfs_of(page, "#level-out") > -50

            await poll(greeted, 15, "the greeting heard in the page", 0.05)
            await poll(lambda: _app_says(gateway.base, ref, "Hello"), 5, "the greeting")
            await page.click('[data-digit="5"]')
            await poll(lambda: _app_says(gateway.base, ref, "5"), 10, "the demo naming key 5")
            # The microphone's sentence comes back as "You said: ...".
            await poll(lambda: _app_says(gateway.base, ref, "You said"), 40, "what it heard", 0.3)
            await page.click("#hangup")

            async def ended() -> bool:
                return await status_of(page) == "ended: caller_hangup"

            await poll(ended, 10, "the page to say 'ended: caller_hangup'")
