"""A browser stand-in on aiortc, for the tests and the bench (tests/integration/test_webrtc.py,
bench/webrtc_load.py).

It does what docs/webrtc.md asks of a browser: it opens the ``"appbridge"`` data channel
before its offer, sends an audio track (a tone, or silence, paced in real time as a microphone
is), posts the offer to ``POST /v1/webrtc/calls`` and applies the answer. What it hears is kept
as 16 kHz mono pcm16, and the data channel's messages as parsed JSON.
"""

from __future__ import annotations

import array
import asyncio
import fractions
import json
import math
import time
from typing import Any, Final

import av
import httpx
from aiortc import RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from appbridge.carriers.webrtc.messages import CHANNEL_LABEL

HEARD_RATE_HZ: Final = 16_000
_MIC_RATE_HZ: Final = 48_000
_MIC_SAMPLES: Final = _MIC_RATE_HZ // 50


class ToneTrack(MediaStreamTrack):
    """A microphone that hears a sine of ``freq_hz`` (None: silence), 20 ms a frame in real
    time. One second of the tone is made once and looped (seamless for whole-hertz tones), so
    a bench of many calls spends its CPU on WebRTC, not on sines."""

    kind = "audio"

    def __init__(self, freq_hz: float | None = None, amplitude: int = 8000) -> None:
        super().__init__()
        self.amplitude = amplitude
        self._pts = 0
        self._start: float | None = None
        self._time_base = fractions.Fraction(1, _MIC_RATE_HZ)
        self._second = b""
        self.freq_hz = freq_hz

    @property
    def freq_hz(self) -> float | None:
        return self._freq_hz

    @freq_hz.setter
    def freq_hz(self, value: float | None) -> None:
        self._freq_hz = value
        if value is None:
            self._second = bytes(_MIC_RATE_HZ * 2)
            return
        step = 2 * math.pi * value / _MIC_RATE_HZ
        samples = (round(self.amplitude * math.sin(step * i)) for i in range(_MIC_RATE_HZ))
        self._second = array.array("h", samples).tobytes()

    def _samples(self) -> bytes:
        offset = self._pts % _MIC_RATE_HZ * 2
        return self._second[offset : offset + _MIC_SAMPLES * 2]

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            due = self._start + self._pts / _MIC_RATE_HZ
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        frame = av.AudioFrame(format="s16", layout="mono", samples=_MIC_SAMPLES)
        frame.planes[0].update(self._samples())
        frame.sample_rate = _MIC_RATE_HZ
        frame.pts = self._pts
        frame.time_base = self._time_base
        self._pts += _MIC_SAMPLES
        return frame


class BrowserPeer:
    """One browser call (module doc). ``codec`` ("opus", "PCMU", "PCMA") limits what it offers,
    as ``RTCRtpTransceiver.setCodecPreferences`` does in a browser."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        codec: str | None = None,
        tone_hz: float | None = None,
    ) -> None:
        self.base_url = base_url
        self.token = token
        self.codec = codec
        self.mic = ToneTrack(tone_hz)
        self.pc = RTCPeerConnection()
        self.channel = self.pc.createDataChannel(CHANNEL_LABEL)
        self.messages: list[dict[str, Any]] = []
        self.heard = bytearray()
        self.call_ref: str | None = None
        self.answer: dict[str, Any] | None = None
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=HEARD_RATE_HZ)
        self._reader: asyncio.Task[None] | None = None
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)

    def _on_message(self, data: str | bytes) -> None:
        try:
            value = json.loads(data)
        except ValueError:
            value = {"type": "<not json>", "raw": str(data)[:200]}
        self.messages.append(value)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, av.AudioFrame)
            for out in self._resampler.resample(frame):
                self.heard += bytes(out.planes[0])[: out.samples * 2]

    async def offer(self) -> str:
        transceiver = self.pc.addTransceiver(self.mic, direction="sendrecv")
        if self.codec is not None:
            codecs = RTCRtpSender.getCapabilities("audio").codecs
            wanted = [c for c in codecs if c.mimeType.lower() == f"audio/{self.codec.lower()}"]
            transceiver.setCodecPreferences(wanted)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def call(
        self, to: str | None = None, *, app: str | None = None, timeout_s: float = 20.0
    ) -> httpx.Response:
        """Offer, post, and apply the answer when it is a 201; the response either way."""
        body: dict[str, Any] = {"type": "offer", "sdp": await self.offer()}
        if to is not None:
            body["to"] = to
        if app is not None:
            body["app"] = app
        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        async with httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s) as client:
            resp = await client.post("/v1/webrtc/calls", json=body, headers=headers)
        if resp.status_code == 201:
            self.answer = resp.json()
            self.call_ref = self.answer["callRef"]
            answer = RTCSessionDescription(sdp=self.answer["sdp"], type="answer")
            await self.pc.setRemoteDescription(answer)
        return resp

    async def wait_channel_open(self, timeout_s: float = 10.0) -> None:
        if self.channel.readyState == "open":
            return
        opened = asyncio.Event()
        self.channel.once("open", opened.set)
        await asyncio.wait_for(opened.wait(), timeout_s)

    def send(self, message: dict[str, Any]) -> None:
        self.channel.send(json.dumps(message))

    def ended(self) -> dict[str, Any] | None:
        return next((m for m in self.messages if m.get("type") == "ended"), None)

    async def close(self) -> None:
        await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()
