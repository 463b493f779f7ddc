"""Admission control on the recogniser's lag (docs/configuration.md, "Admission control"): with
``server.max_stt_lag_s``, a gateway whose local STT is too far behind refuses new calls until it
has caught up. The real engine is made to fall behind by real decodes queued ahead of a caller's."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future

import httpx

from appbridge.speech.providers.local_stt import LocalSttProvider, Recognition
from bench.report import parse_metric
from tests.integration.conftest import gateway_env
from tests.integration.test_session_protocol import connect
from tests.integration.test_turns import synthesise_ulaw

LIMIT_S = 1.0
#: Eight seconds of quiet noise at 16 kHz: a decode of a full window, as a long utterance costs.
BURDEN_PCM = bytes(range(16)) * (16000 * 2 * 8 // 16)


async def test_new_calls_are_refused_while_the_recogniser_is_behind() -> None:
    async with gateway_env(server_extra={"max_stt_lag_s": LIMIT_S}) as env:
        local = env.gw.stt_providers["local"]
        assert isinstance(local, LocalSttProvider)
        call, session, _ = await connect(env, continuous_media=True)
        await session.send({"type": "listen.update", "patience": "low"})
        await asyncio.sleep(0.3)
        engine = local.engine
        await asyncio.wrap_future(engine.load())
        started = time.monotonic()
        await asyncio.wrap_future(engine.submit(BURDEN_PCM, [], final=True))
        one_s = time.monotonic() - started  # what one decode costs on this machine now
        # Keep about 3 s of decoding queued until the caller's utterance closes, so that its
        # final waits behind it.
        depth = engine.workers * max(4, round(3.0 / one_s))
        burden: list[Future[Recognition]] = []
        await call.send_audio_ulaw(await synthesise_ulaw("Do you have any appointments?"))
        (live,) = list(env.gw.registry)
        assert live.ears is not None and live.ears.stream is not None
        stream = live.ears.stream
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            if stream.finals_owed == 0:
                while engine.backlog < depth:
                    burden.append(engine.submit(BURDEN_PCM, [], final=True))
            elif local.lag_s() >= LIMIT_S + 0.2:
                break
            await asyncio.sleep(0.02)
        assert local.lag_s() >= LIMIT_S, "the recogniser never fell behind"

        async with httpx.AsyncClient(base_url=env.base_url) as client:
            metrics = (await client.get("/metrics")).text
        assert parse_metric(metrics, "appbridge_stt_lag_seconds") >= LIMIT_S
        refused = await env.twilio.place_call("+15550001111", "+15550002222")
        assert "Reject" in refused.twiml_verbs and not refused.has_stream
        assert env.gw.registry.total_rejected == 1

        await asyncio.gather(*(asyncio.wrap_future(f) for f in burden))
        ended = await session.wait_for("turn.ended", timeout=30)
        assert ended["text"], ended  # the late final still carried the words
        assert local.lag_s() == 0.0
        again, _session, _ = await connect(env)
        assert again.has_stream  # caught up: calls are taken again
