"""A real Pipecat app built for Twilio Media Streams, for the interop test (docs/interop.md).

Run in the Pipecat virtualenv (``.venv-pipecat``, see deploy/install-test-peers.sh), never in the
gateway's own: it imports ``pipecat``, ``fastapi`` and ``uvicorn`` from there. The gateway dials it
with ``protocol = "twilio"`` (docs/protocol-twilio.md) exactly as Twilio would, and nothing
here knows it is not Twilio: the WebSocket is handled as Pipecat's own runner handles a Twilio
call (``parse_telephony_websocket`` reads the first two text frames, ``connected`` then
``start``), the serializer is Pipecat's ``TwilioFrameSerializer`` with ``base_url`` pointed at the
gateway, and the call ends through Pipecat's ``auto_hang_up``, which POSTs ``Status=completed``
to ``{base_url}/2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json`` (docs/protocol-twilio.md,
"Hanging up a Twilio-dialect call").

Scenarios (``--scenario``):

- ``echo``: every ``InputAudioRawFrame`` goes back out as an ``OutputAudioRawFrame``.
- ``interrupt``: the app plays a tone of its own, then broadcasts Pipecat's ``InterruptionFrame``
  part-way through, which makes the serializer send ``clear``.

Either way the pipeline is ended with an ``EndFrame`` after ``--call-s`` seconds.

What happened is printed on stdout as one JSON object per line, for the test to read:
``listening``, ``frame_seen``, ``parsed``, ``first_audio``, ``dtmf``, ``tone``, ``interrupted``,
``audio``, ``hangup``, ``finished``. Pipecat's own log
(loguru) goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import sys
import time
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, WebSocket
from loguru import logger
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InputAudioRawFrame,
    InputDTMFFrame,
    OutputAudioRawFrame,
    StartFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.runner.utils import parse_telephony_websocket
from pipecat.serializers.twilio import TwilioFrameSerializer
from pipecat.transports.websocket.fastapi import (
    FastAPIWebsocketParams,
    FastAPIWebsocketTransport,
)
from pipecat.workers.runner import WorkerRunner

#: Twilio Media Streams carry µ-law at 8 kHz (docs/protocol-twilio.md); the pipeline runs at that
#: rate so that the serializer never resamples and an echoed tone keeps its exact frequency.
RATE_HZ = 8000
#: Input audio kept for the frequency measurement: enough for a few seconds of call.
MAX_KEPT_BYTES = RATE_HZ * 2 * 10


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout: the test's only view of what Pipecat did."""
    print(json.dumps({"event": event, "t": round(time.monotonic(), 3), **fields}), flush=True)


def dominant_hz(pcm16: bytes, rate_hz: int) -> float:
    """The strongest frequency in signed 16-bit little-endian mono PCM (0.0 for silence)."""
    samples = np.frombuffer(pcm16, dtype="<i2").astype(np.float64)
    if samples.size < 2 or not np.any(samples):
        return 0.0
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    spectrum[0] = 0.0
    return float(np.argmax(spectrum) * rate_hz / samples.size)


def tone_pcm16(freq_hz: float, duration_ms: int, rate_hz: int) -> bytes:
    n = rate_hz * duration_ms // 1000
    t = np.arange(n) / rate_hz
    return (np.sin(2 * math.pi * freq_hz * t) * 12000).astype("<i2").tobytes()


class Echo(FrameProcessor):
    """Turns caller audio around: InputAudioRawFrame in, the same PCM as OutputAudioRawFrame out."""

    def __init__(self) -> None:
        super().__init__()
        self.frames_in = 0
        self.bytes_in = 0
        self.kept = bytearray()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InputAudioRawFrame):
            self.note_input(frame)
            await self.push_frame(
                OutputAudioRawFrame(
                    audio=frame.audio,
                    sample_rate=frame.sample_rate,
                    num_channels=frame.num_channels,
                )
            )
        else:
            if isinstance(frame, InputDTMFFrame):
                emit("dtmf", digit=frame.button.value)
            await self.push_frame(frame, direction)

    def note_input(self, frame: InputAudioRawFrame) -> None:
        if self.frames_in == 0:
            emit("first_audio", sample_rate=frame.sample_rate, bytes=len(frame.audio))
        self.frames_in += 1
        self.bytes_in += len(frame.audio)
        if len(self.kept) < MAX_KEPT_BYTES:
            self.kept += frame.audio


class ToneThenInterrupt(Echo):
    """Plays its own tone, then interrupts it the way Pipecat does when the user speaks.

    ``broadcast_interruption`` sends an ``InterruptionFrame`` both ways; the output transport
    drops the audio it still holds and the serializer turns the frame into ``clear``.
    Caller audio is only counted here, not echoed, so that the tone is all the caller hears.
    """

    def __init__(self, freq_hz: float, tone_ms: int, interrupt_after_s: float) -> None:
        super().__init__()
        self.freq_hz = freq_hz
        self.tone_ms = tone_ms
        self.interrupt_after_s = interrupt_after_s

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await FrameProcessor.process_frame(self, frame, direction)
        if isinstance(frame, InputAudioRawFrame):
            self.note_input(frame)
            return
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame):
            self.create_task(self._play_and_interrupt(), name="tone-then-interrupt")

    async def _play_and_interrupt(self) -> None:
        audio = tone_pcm16(self.freq_hz, self.tone_ms, RATE_HZ)
        await self.push_frame(OutputAudioRawFrame(audio=audio, sample_rate=RATE_HZ, num_channels=1))
        emit("tone", freq_hz=self.freq_hz, ms=self.tone_ms)
        await asyncio.sleep(self.interrupt_after_s)
        await self.broadcast_interruption()
        emit("interrupted", after_s=self.interrupt_after_s)


def watch_pipecat_log() -> None:
    """Report, from Pipecat's own log records, what its runner parsed and how the hang-up went.

    ``parse_telephony_websocket`` traces the raw first and second frames; ``TwilioFrameSerializer``
    logs the outcome of its auto hang-up POST (success on 200, "already terminated" on a 404 with
    code 20404, an error otherwise).
    """

    def sink(message: Any) -> None:
        record = message.record
        text = str(record["message"])
        name = record["name"] or ""
        if name == "pipecat.runner.utils":
            for which in ("First", "Second"):
                prefix = f"{which} message: "
                if text.startswith(prefix):
                    emit("frame_seen", which=which.lower(), raw=text[len(prefix) :])
        elif name == "pipecat.serializers.twilio":
            if text.startswith("Successfully terminated Twilio call"):
                emit("hangup", ok=True, message=text)
            elif "already terminated" in text:
                emit("hangup", ok=False, already_ended=True, message=text)
            elif text.startswith("Failed to"):
                emit("hangup", ok=False, message=text)

    logger.remove()
    logger.add(sys.stderr, level="DEBUG")
    logger.add(sink, level="TRACE", format="{message}")


def build_app(args: argparse.Namespace) -> FastAPI:
    app = FastAPI()

    @app.websocket("/ws")
    async def media_stream(websocket: WebSocket) -> None:
        await websocket.accept()
        await run_call(websocket, args)

    return app


async def run_call(websocket: WebSocket, args: argparse.Namespace) -> None:
    """One call, as a Pipecat bot handles a Twilio call."""
    transport_type, call_data = await parse_telephony_websocket(websocket)
    emit(
        "parsed",
        transport=transport_type,
        streamSid=call_data["stream_id"],
        callSid=call_data["call_id"],
        customParameters=dict(call_data.get("body") or {}),
    )
    if transport_type != "twilio":
        await websocket.close()
        return
    serializer = TwilioFrameSerializer(
        stream_sid=call_data["stream_id"],
        call_sid=call_data["call_id"],
        account_sid=args.account_sid,
        auth_token=args.auth_token,
        base_url=args.base_url,
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
    processor: Echo = (
        ToneThenInterrupt(args.tone_hz, args.tone_ms, args.interrupt_after_s)
        if args.scenario == "interrupt"
        else Echo()
    )
    pipeline = Pipeline([transport.input(), processor, transport.output()])
    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(audio_in_sample_rate=RATE_HZ, audio_out_sample_rate=RATE_HZ),
    )

    @transport.event_handler("on_client_disconnected")
    async def on_client_disconnected(_transport: Any, _ws: Any) -> None:
        emit("client_disconnected")
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    done, _ = await asyncio.wait({running}, timeout=args.call_s)
    ended_by_us = not done
    if ended_by_us:
        # The end of the pipeline is what triggers auto_hang_up in the serializer.
        await worker.queue_frame(EndFrame())
        await running
    emit(
        "audio",
        frames_in=processor.frames_in,
        bytes_in=processor.bytes_in,
        dominant_hz=round(dominant_hz(bytes(processor.kept), RATE_HZ), 1),
    )
    emit("finished", ended_by_app=ended_by_us)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--fd", type=int, help="serve on this inherited listening socket instead")
    parser.add_argument("--base-url", required=True, help="the gateway, as Twilio's REST root")
    parser.add_argument("--account-sid", required=True)
    parser.add_argument("--auth-token", required=True)
    parser.add_argument("--scenario", choices=("echo", "interrupt"), default="echo")
    parser.add_argument("--call-s", type=float, default=3.0, help="end the pipeline after this")
    parser.add_argument("--tone-hz", type=float, default=500.0)
    parser.add_argument("--tone-ms", type=int, default=3000)
    parser.add_argument("--interrupt-after-s", type=float, default=0.6)
    args = parser.parse_args()
    watch_pipecat_log()
    if args.fd is not None:
        # The test binds the socket itself, so the gateway can be configured with this app's
        # URL before either process runs (no race for a free port).
        sock = socket.socket(fileno=args.fd)
    else:
        # Bound before uvicorn starts, so the port is known and connections wait in the backlog.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host, args.port))
        sock.listen(16)
    server = uvicorn.Server(
        uvicorn.Config(build_app(args), log_level="warning", access_log=False, lifespan="off")
    )
    emit("listening", port=sock.getsockname()[1])
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
