"""A call whose app speaks and listens through Deepgram (docs/speech.md), against the fake Deepgram.

The real clients run inside the real gateway; the fake reproduces Deepgram's wire format.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from appbridge.testing.audio import tone_pcm16, ulaw_encode
from appbridge.testing.fake_app import FakeApp
from appbridge.testing.fake_deepgram import FakeDeepgram
from tests.integration.conftest import SECRET, Env, gateway_env
from tests.integration.test_session_protocol import connect


@asynccontextmanager
async def deepgram_env(script: list[str]) -> AsyncIterator[tuple[Env, FakeDeepgram]]:
    async with FakeDeepgram(script=script) as dg:

        def apps(app: FakeApp) -> list[dict[str, Any]]:
            return [
                {
                    "ref": "main",
                    "url": app.url,
                    "signing_secret": SECRET,
                    "speech": {"voice": "deepgram/aura-2-thalia-en", "language": "en-US"},
                }
            ]

        speech = {"deepgram": {"api_key": dg.api_key, "base_url": dg.base_url}}
        async with gateway_env(apps, speech=speech) as env:
            yield env, dg


async def test_speak_and_listen_through_deepgram() -> None:
    async with deepgram_env(["I need to speak to billing."]) as (env, dg):
        call, session, start = await connect(env, continuous_media=True)
        assert start["speech"]["voice"] == "deepgram/aura-2-thalia-en"
        await session.send({"type": "speak", "id": "hi", "text": "Hello from Deepgram."})
        done = await session.wait_for("output.done", timeout=10)
        assert done["id"] == "hi" and done["heardMs"] > 500
        assert dg.speak_requests and "aura-2-thalia-en" in str(dg.speak_requests[0])
        # The caller "speaks": loud audio the fake segments into one scripted utterance.
        await call.send_audio_ulaw(ulaw_encode(tone_pcm16(300, 1500, 8000, amplitude=9000)))
        ended = await session.wait_for("turn.ended", timeout=15)
        assert ended["text"] == "I need to speak to billing."
        assert dg.listen_sessions  # one stream, opened when the call started


async def test_deepgram_failures_reach_the_app_as_provider_errors() -> None:
    async with deepgram_env([]) as (env, dg):
        dg.speak_failure = "server_error"
        dg.listen_failure = "server_error"
        _, session, _ = await connect(env)
        await session.send({"type": "speak", "id": "s", "text": "Will this work?"})
        errors = [await session.wait_for("error", timeout=10) for _ in range(2)]
        by_relates = {e["relatesTo"]: e["code"] for e in errors}
        assert by_relates == {"s": "provider_unavailable", "listen": "provider_unavailable"}
        dg.speak_failure = None
        await session.send({"type": "speak", "id": "ok", "text": "Now it works."})
        await session.wait_for("output.done", timeout=10)
        await asyncio.sleep(0)
