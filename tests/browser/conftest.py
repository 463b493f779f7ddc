"""One headless chromium, one gateway process and two scripted apps for the whole module: a
browser and a gateway each take seconds to start, and every test opens its own pages and call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from appbridge.testing.fake_app import FakeApp
from tests.browser.support import (
    APP_SECRET,
    GatewayProcess,
    chromium_args,
    echo_app,
    gateway_process,
    require_chromium,
    speech_wav,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.browser)


@dataclass
class BrowserEnv:
    browser: Any  # playwright.async_api.Browser
    gateway: GatewayProcess
    agent: FakeApp
    echo: FakeApp
    folder: Path


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def browser_env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BrowserEnv]:
    executable = require_chromium()
    from playwright.async_api import async_playwright

    folder = tmp_path_factory.mktemp("browser")
    wav = speech_wav(folder / "caller.wav")
    agent = FakeApp(secret=APP_SECRET)
    echo = FakeApp(secret=APP_SECRET)
    echo.handler = echo_app
    await agent.start()
    await echo.start()
    try:
        async with (
            gateway_process(folder, agent.url, echo.url) as gateway,
            async_playwright() as playwright,
        ):
            browser = await playwright.chromium.launch(
                executable_path=executable, args=chromium_args(wav)
            )
            try:
                yield BrowserEnv(browser, gateway, agent, echo, folder)
            finally:
                await browser.close()
    finally:
        await agent.stop()
        await echo.stop()
