"""A Pipecat bot built for Twilio Media Streams, answering AppBridge calls unchanged.

AppBridge speaks the exact Twilio Media Streams messages to apps configured with ``protocol =
"twilio"`` (docs/protocol-twilio.md, "Twilio-dialect apps"), so a Pipecat bot written for Twilio
runs against it as is. The two settings that matter:

- the gateway dials this app's WebSocket (``ws://127.0.0.1:9004/ws`` in
  examples/appbridge.examples.toml), where Pipecat's runner helper reads ``connected`` and
  ``start`` as it does for Twilio;
- ``TwilioFrameSerializer(base_url=...)`` points at the gateway instead of api.twilio.com, so
  ``auto_hang_up`` (an ``EndFrame`` ending the pipeline) hangs the call up through AppBridge's
  Twilio-compatible REST endpoint, with the ``[http]`` account SID and token of the gateway.

The pipeline here echoes the caller (no cloud keys needed) and hangs up when the caller presses
``#``. A real bot puts its STT, LLM and TTS services between ``transport.input()`` and
``transport.output()``; nothing else changes.

It runs in Pipecat's own virtualenv (``.venv-pipecat``, made by
``bash deploy/install-test-peers.sh``; or ``pip install "pipecat-ai[websocket]" fastapi
uvicorn`` anywhere)::

    .venv-pipecat/bin/python examples/pipecat_twilio.py      # listens on 127.0.0.1:9004/ws
    make run CONFIG=examples/appbridge.examples.toml
    .venv/bin/appbridge call http://127.0.0.1:8080 --to +15550000004 --play some.wav --digits '#'
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import uvicorn
from fastapi import FastAPI, WebSocket
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InputAudioRawFrame,
    InputDTMFFrame,
    OutputAudioRawFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.runner.utils import parse_telephony_websocket
from pipecat.serializers.twilio import TwilioFrameSerializer
from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport
from pipecat.workers.runner import WorkerRunner

#: Twilio streams are µ-law at 8 kHz; running the pipeline at that rate avoids resampling.
RATE_HZ = 8000


class EchoUntilPound(FrameProcessor):
    """Sends the caller's audio back; ``#`` ends the pipeline, which hangs the call up."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InputAudioRawFrame):
            await self.push_frame(
                OutputAudioRawFrame(
                    audio=frame.audio, sample_rate=frame.sample_rate, num_channels=1
                )
            )
        elif isinstance(frame, InputDTMFFrame) and frame.button.value == "#":
            await self.push_frame(EndFrame())
        else:
            await self.push_frame(frame, direction)


async def run_bot(websocket: WebSocket, args: argparse.Namespace) -> None:
    """One call, exactly as a Pipecat bot handles a Twilio call."""
    transport_type, call_data = await parse_telephony_websocket(websocket)
    if transport_type != "twilio":
        await websocket.close()
        return
    serializer = TwilioFrameSerializer(
        stream_sid=call_data["stream_id"],  # AppBridge's sessionRef
        call_sid=call_data["call_id"],  # AppBridge's callRef
        account_sid=args.account_sid,
        auth_token=args.auth_token,
        base_url=args.gateway,  # hang-ups go to AppBridge, not api.twilio.com
    )
    transport = FastAPIWebsocketTransport(
        websocket,
        FastAPIWebsocketParams(
            audio_in_enabled=True,
            audio_out_enabled=True,
            add_wav_header=False,
            serializer=serializer,
        ),
    )
    pipeline = Pipeline([transport.input(), EchoUntilPound(), transport.output()])
    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(audio_in_sample_rate=RATE_HZ, audio_out_sample_rate=RATE_HZ),
    )

    @transport.event_handler("on_client_disconnected")
    async def on_client_disconnected(_transport: Any, _ws: Any) -> None:
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


def build_app(args: argparse.Namespace) -> FastAPI:
    app = FastAPI()

    @app.websocket("/ws")
    async def media_stream(websocket: WebSocket) -> None:
        await websocket.accept()
        await run_bot(websocket, args)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="Pipecat Twilio bot for AppBridge")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("APP_PORT", "9004")))
    parser.add_argument(
        "--gateway",
        default=os.environ.get("APPBRIDGE_URL", "http://127.0.0.1:8080"),
        help="the gateway's base URL, used as Twilio's REST root for hang-ups",
    )
    parser.add_argument(
        "--account-sid",
        default=os.environ.get("APPBRIDGE_HTTP_SID", "AC" + "0" * 32),
        help="[http] account_sid of the gateway (and the app's workspace_ref)",
    )
    parser.add_argument(
        "--auth-token",
        default=os.environ.get("APPBRIDGE_HTTP_TOKEN", "examples-http-token"),
        help="[http] auth_token of the gateway",
    )
    args = parser.parse_args()
    config = uvicorn.Config(build_app(args), host=args.host, port=args.port, log_level="info")
    asyncio.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()
