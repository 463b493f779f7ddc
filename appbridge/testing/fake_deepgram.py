"""Deepgram, played from the outside: ``POST /v1/speak`` and ``WS /v1/listen`` on loopback.

The real clients (:mod:`appbridge.speech.providers.deepgram` and ``deepgram_stt``) run against
this server in tests. It reproduces the documented wire formats (developers.deepgram.com; see
those modules' docstrings for the pages): ``Authorization: Token <key>`` or 401 with the JSON
error body ``{"err_code", "err_msg", "request_id"}`` (a refused WebSocket upgrade carries the same
body and a ``dg-error`` header); raw linear16 audio streamed back from ``/v1/speak``; and on
``/v1/listen`` binary audio in, ``Results`` / ``SpeechStarted`` / ``UtteranceEnd`` /
``Metadata`` out, ``KeepAlive`` / ``Finalize`` / ``CloseStream`` understood, 1011 ``NET-0001``
after ``idle_timeout_s`` (10 s, as Deepgram) with neither audio nor KeepAlive. The JSON shapes
and codes are Deepgram's; the wording of error messages is ours where the docs give none.

Deterministic transcripts: the listen endpoint segments the audio by energy, 20 ms at a time in
*audio* time (never the wall clock): a frame is speech when its RMS reaches ``speech_rms``. Each
utterance takes the next text of :attr:`FakeDeepgram.script`; interim results reveal one word per
300 ms of speech, and the final one (``is_final`` and ``speech_final``) comes when the silence
reaches the request's ``endpointing`` (Deepgram's default 10 ms when absent). The speak endpoint
answers ``ms_per_char`` ms of a 220 Hz tone per character of text.

Failures on demand (:attr:`speak_failure`, :attr:`listen_failure`): auth and HTTP errors, a
stall (headers or handshake never come, or nothing more after the first audio), a close with
1011/1008 and the documented payloads, and malformed JSON. For a refused connection, point the
client at :func:`closed_port_base_url`. Like the other fakes it never imports the gateway's own
speech code, so a misreading shared by both ends cannot hide.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import socket
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import parse_qs

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from appbridge.testing.fake_twilio import LoopbackServer

__all__ = [
    "FakeDeepgram",
    "ListenFailure",
    "ListenRecord",
    "SpeakFailure",
    "SpeakRecord",
    "closed_port_base_url",
]

SpeakFailure = Literal[
    "unauthorized",
    "forbidden",
    "payment_required",
    "rate_limited",
    "server_error",
    "stall",
    "stall_mid_stream",
]
ListenFailure = Literal[
    "payment_required",
    "rate_limited",
    "server_error",
    "stall_handshake",
    "stall_results",
    "close_1011",
    "net_0001",
    "data_0000",
    "malformed_json",
]

_STT_MODELS = frozenset({"nova-3", "nova-2", "nova-2-phonecall", "nova-3-medical"})
_NOVA3_LANGUAGES = frozenset({
    "multi", "en", "en-us", "en-au", "en-gb", "en-in", "en-nz", "es", "es-419", "fr", "fr-ca",
    "pt", "pt-br", "pt-pt", "de", "de-ch", "nl", "nl-be", "sv", "sv-se", "da", "da-dk", "it",
    "tr", "no", "id", "bg", "cs", "fi", "hi", "hu", "ja", "ko", "ko-kr", "pl", "ru", "uk", "vi",
    "ca", "et", "el", "lv", "lt", "ms", "ro", "sk", "zh", "zh-cn", "zh-tw", "zh-hans", "zh-hant",
    "hr", "gu", "gu-in", "mr", "be",
})  # fmt: skip
_SPEAK_RATES_HZ = frozenset({8000, 16000, 24000, 32000, 48000})
_HTTP_ERRORS: dict[str, tuple[int, str, str]] = {
    "unauthorized": (401, "INVALID_AUTH", "Invalid credentials."),
    "forbidden": (403, "ACCESS_DENIED", "Access denied."),
    "payment_required": (402, "PAYMENT_REQUIRED", "Project does not have enough credits."),
    "rate_limited": (429, "TOO_MANY_REQUESTS", "Too many requests. Please try again later."),
    "server_error": (500, "INTERNAL_SERVER_ERROR", "Something went wrong on our side."),
}
_BAD_MODEL = "No such model/language/tier combination found."
_BAD_JSON = "Content-type was application/json, but we could not process the JSON payload."
_FRAME_S = 0.020
_INTERIM_WORD_S = 0.3
_EMPTY_FINAL_AFTER_S = 3.0  # silence long enough gets an empty final result, as Deepgram sends


def closed_port_base_url() -> str:
    """An ``http://127.0.0.1:PORT`` where nothing listens: connections are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _error_body(status_code: int, err_code: str, err_msg: str) -> JSONResponse:
    request_id = str(uuid.uuid4())
    body = {"err_code": err_code, "err_msg": err_msg, "request_id": request_id}
    headers = {"dg-request-id": request_id, "dg-error": err_msg}
    return JSONResponse(body, status_code=status_code, headers=headers)


@dataclass
class SpeakRecord:
    """One ``/v1/speak`` request as the fake saw it."""

    params: dict[str, str]
    text: str | None
    authorized: bool
    status: int = 0
    bytes_sent: int = 0
    completed: bool = False  # every byte went out (False: the client stopped reading first)


@dataclass
class ListenRecord:
    """One ``/v1/listen`` connection as the fake saw it."""

    params: dict[str, list[str]]
    authorized: bool
    status: int = 0
    audio_bytes: int = 0
    keepalives: int = 0
    finalizes: int = 0
    close_streams: int = 0
    other_messages: list[str] = field(default_factory=list)
    sent: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""
    keepalive_seen: asyncio.Event = field(default_factory=asyncio.Event)
    audio_seen: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def param(self, name: str) -> str | None:
        values = self.params.get(name)
        return values[0] if values else None


class _Transcriber:
    """The listen endpoint's speech logic, in audio time (no I/O)."""

    def __init__(self, params: dict[str, list[str]], script: deque[str], speech_rms: float):
        def one(name: str, default: str) -> str:
            return params.get(name, [default])[0]

        self.rate_hz = int(one("sample_rate", "16000"))
        self.interim = one("interim_results", "false") == "true"
        endpointing = one("endpointing", "10")
        self.endpointing_s = None if endpointing == "false" else int(endpointing) / 1000
        utterance_end = params.get("utterance_end_ms")
        self.utterance_end_s = int(utterance_end[0]) / 1000 if utterance_end else None
        self.vad_events = one("vad_events", "false") == "true"
        self.model = one("model", "nova-3")
        self.request_id = str(uuid.uuid4())
        self.model_uuid = str(uuid.uuid4())
        self._script = script
        self._speech_rms = speech_rms
        self._frame_bytes = int(self.rate_hz * _FRAME_S) * 2
        self._carry = b""
        self._sha = hashlib.sha256()
        self.t_s = 0.0
        self._window_start_s = 0.0  # start of the audio not yet covered by a final result
        self._in_speech = False
        self._speech_start_s = 0.0
        self._last_voiced_s = 0.0
        self._words: list[str] = []
        self._next_interim_s = 0.0
        self._utterance_end_due_s: float | None = None

    def audio(self, data: bytes) -> list[dict[str, Any]]:
        self._sha.update(data)
        data = self._carry + data
        usable = len(data) - len(data) % self._frame_bytes
        self._carry = data[usable:]
        out: list[dict[str, Any]] = []
        for i in range(0, usable, self._frame_bytes):
            samples = np.frombuffer(data[i : i + self._frame_bytes], dtype="<i2")
            rms = math.sqrt(float(np.mean(samples.astype(np.float64) ** 2)))
            out.extend(self._frame(rms >= self._speech_rms))
        return out

    def _frame(self, voiced: bool) -> list[dict[str, Any]]:
        start_s = self.t_s
        self.t_s = round(self.t_s + _FRAME_S, 6)
        out: list[dict[str, Any]] = []
        if voiced:
            if not self._in_speech:
                self._in_speech = True
                self._speech_start_s = start_s
                self._words = (self._script.popleft() if self._script else "").split()
                self._next_interim_s = start_s + _INTERIM_WORD_S
                self._utterance_end_due_s = None
                if self.vad_events:
                    out.append({"type": "SpeechStarted", "channel": [0], "timestamp": start_s})
            self._last_voiced_s = self.t_s
            if self.interim and self.t_s >= self._next_interim_s:
                self._next_interim_s += _INTERIM_WORD_S
                spoken = int((self.t_s - self._speech_start_s) / _INTERIM_WORD_S)
                out.append(self._results(self._words[: max(1, spoken)], False, False, False))
            return out
        silence_s = round(self.t_s - self._last_voiced_s, 6)  # 0.3 is 0.2999... in floats
        if self._in_speech and self.endpointing_s is not None and silence_s >= self.endpointing_s:
            out.append(self._final(speech_final=True, from_finalize=False))
        elif not self._in_speech:
            due = self._utterance_end_due_s
            if due is not None and self.t_s >= due:
                self._utterance_end_due_s = None
                out.append(
                    {
                        "type": "UtteranceEnd",
                        "channel": [0, 1],
                        "last_word_end": self._last_voiced_s,
                    }
                )
            if round(self.t_s - self._window_start_s, 6) >= _EMPTY_FINAL_AFTER_S:
                out.append(self._results([], True, False, False))
        return out

    def finalize(self) -> list[dict[str, Any]]:
        """``Finalize``: whatever is pending becomes final now (``from_finalize``)."""
        if self._in_speech:
            return [self._final(speech_final=False, from_finalize=True)]
        if self.t_s > self._window_start_s:
            return [self._results([], True, False, True)]
        return []

    def close(self) -> list[dict[str, Any]]:
        """``CloseStream``: the last result, then the summary ``Metadata``."""
        out = [self._final(speech_final=False, from_finalize=False)] if self._in_speech else []
        created = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        out.append(
            {
                "type": "Metadata",
                "transaction_key": "deprecated",
                "request_id": self.request_id,
                "sha256": self._sha.hexdigest(),
                "created": created,
                "duration": self.t_s,
                "channels": 1,
                "models": [self.model_uuid],
                "model_info": {
                    self.model_uuid: {"name": f"general-{self.model}", "version": "0", "arch": ""}
                },
            }
        )
        return out

    def _final(self, *, speech_final: bool, from_finalize: bool) -> dict[str, Any]:
        message = self._results(self._words, True, speech_final, from_finalize)
        self._in_speech = False
        if self.utterance_end_s is not None and self._words:
            self._utterance_end_due_s = self._last_voiced_s + self.utterance_end_s
        return message

    def _results(
        self, tokens: list[str], is_final: bool, speech_final: bool, from_finalize: bool
    ) -> dict[str, Any]:
        start_s, end_s = self._window_start_s, self.t_s
        if is_final:
            self._window_start_s = end_s
        span_s = max(self._last_voiced_s - self._speech_start_s, _FRAME_S)
        step_s = span_s / max(len(self._words), 1)
        words = [
            {
                "word": token.strip(".,!?;:").lower(),
                "start": round(self._speech_start_s + i * step_s, 3),
                "end": round(self._speech_start_s + (i + 1) * step_s, 3),
                "confidence": 0.99,
                "punctuated_word": token,
            }
            for i, token in enumerate(tokens)
        ]
        return {
            "type": "Results",
            "channel_index": [0, 1],
            "duration": round(end_s - start_s, 3),
            "start": round(start_s, 3),
            "is_final": is_final,
            "speech_final": speech_final,
            "channel": {
                "alternatives": [
                    {
                        "transcript": " ".join(tokens),
                        "confidence": 0.98 if tokens else 0.0,
                        "words": words,
                    }
                ]
            },
            "metadata": {
                "request_id": self.request_id,
                "model_info": {"name": f"general-{self.model}", "version": "0", "arch": ""},
                "model_uuid": self.model_uuid,
            },
            "from_finalize": from_finalize,
        }


class FakeDeepgram:
    """A loopback Deepgram. ``async with FakeDeepgram(script=["Hello there."]) as dg:`` and point
    a client at ``dg.base_url`` with ``dg.api_key``."""

    def __init__(
        self,
        *,
        api_key: str = "dg-test-key",
        script: Iterable[str] = (),
        ms_per_char: int = 60,
        speak_chunk_bytes: int = 4800,
        speech_rms: float = 500.0,
        idle_timeout_s: float = 10.0,
    ) -> None:
        self.api_key = api_key
        self.script: deque[str] = deque(script)
        self.ms_per_char = ms_per_char
        self.speak_chunk_bytes = speak_chunk_bytes
        self.speech_rms = speech_rms
        self.idle_timeout_s = idle_timeout_s
        self.speak_failure: SpeakFailure | None = None
        self.listen_failure: ListenFailure | None = None
        self.speak_requests: list[SpeakRecord] = []
        self.listen_sessions: list[ListenRecord] = []
        self.listen_opened = asyncio.Event()
        self._released = asyncio.Event()  # set at stop(): stalled handlers give up
        app = Starlette(
            routes=[
                Route("/v1/speak", self._speak, methods=["POST"]),
                WebSocketRoute("/v1/listen", self._listen),
            ]
        )
        self._server = LoopbackServer(app, ws="websockets-sansio")

    @property
    def base_url(self) -> str:
        return self._server.base_url

    async def start(self) -> None:
        await self._server.start()

    async def stop(self) -> None:
        self._released.set()
        await self._server.stop()

    async def __aenter__(self) -> FakeDeepgram:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _authorized(self, authorization: str | None) -> bool:
        return authorization == f"Token {self.api_key}"

    # -- POST /v1/speak ------------------------------------------------------------------------

    async def _speak(self, request: Request) -> Response:
        params = dict(request.query_params)
        record = SpeakRecord(params, None, self._authorized(request.headers.get("authorization")))
        self.speak_requests.append(record)
        failure = self.speak_failure
        if not record.authorized:
            failure = "unauthorized"
        if failure in _HTTP_ERRORS:
            record.status = _HTTP_ERRORS[failure][0]
            return _error_body(*_HTTP_ERRORS[failure])
        try:
            body = json.loads(await request.body())
            text = body["text"] if isinstance(body, dict) else None
        except (ValueError, KeyError):
            text = None
        rate_hz = int(params["sample_rate"]) if params.get("sample_rate", "").isdigit() else 0
        problem = None
        if not isinstance(text, str) or not text:
            problem = _BAD_JSON
        elif len(text) > 2000:
            problem = "Text length exceeds the maximum of 2000 characters."
        elif not params.get("model", "").startswith("aura"):
            problem = _BAD_MODEL
        elif params.get("encoding") != "linear16" or params.get("container") != "none":
            problem = "This fake speaks encoding=linear16 with container=none only."
        elif rate_hz not in _SPEAK_RATES_HZ:
            problem = "Unsupported sample_rate for linear16."
        if problem is not None:
            record.status = 400
            return _error_body(400, "Bad Request", problem)
        assert isinstance(text, str)
        record.text = text
        if failure == "stall":
            await self._released.wait()
            record.status = 503
            return _error_body(503, "SERVICE_UNAVAILABLE", "Shutting down.")
        record.status = 200
        audio = self.tone(len(text) * self.ms_per_char, rate_hz)
        headers = {
            "dg-request-id": str(uuid.uuid4()),
            "dg-model-name": params["model"],
            "dg-char-count": str(len(text)),
        }
        stall = failure == "stall_mid_stream"
        return StreamingResponse(
            self._speak_body(audio, record, stall),
            media_type="application/octet-stream",
            headers=headers,
        )

    async def _speak_body(
        self, audio: bytes, record: SpeakRecord, stall: bool
    ) -> AsyncIterator[bytes]:
        for i in range(0, len(audio), self.speak_chunk_bytes):
            piece = audio[i : i + self.speak_chunk_bytes]
            record.bytes_sent += len(piece)
            yield piece
            if stall:
                await self._released.wait()
                return
            await asyncio.sleep(0)  # let the client read (and maybe hang up) between pieces
        record.completed = True

    @staticmethod
    def tone(duration_ms: int, rate_hz: int) -> bytes:
        """``duration_ms`` of a 220 Hz tone at -12 dBFS, as little-endian 16-bit PCM."""
        n = rate_hz * duration_ms // 1000
        t = np.arange(n, dtype=np.float64) / rate_hz
        return (np.sin(2 * np.pi * 220.0 * t) * 8192).astype("<i2").tobytes()

    # -- WS /v1/listen -------------------------------------------------------------------------

    async def _listen(self, websocket: WebSocket) -> None:
        params = parse_qs(websocket.url.query, keep_blank_values=True)
        record = ListenRecord(params, self._authorized(websocket.headers.get("authorization")))
        self.listen_sessions.append(record)
        failure = self.listen_failure
        refusal = self._listen_refusal(record, failure)
        if refusal is not None:
            record.status = refusal.status_code
            record.ended.set()
            await websocket.send_denial_response(refusal)
            return
        if failure == "stall_handshake":
            await self._released.wait()
            record.ended.set()
            await websocket.close()
            return
        await websocket.accept()
        record.status = 101
        self.listen_opened.set()
        transcriber = _Transcriber(params, self.script, self.speech_rms)
        try:
            await self._listen_loop(websocket, record, transcriber, failure)
        finally:
            record.ended.set()

    def _listen_refusal(self, record: ListenRecord, failure: str | None) -> Response | None:
        if not record.authorized:
            return _error_body(*_HTTP_ERRORS["unauthorized"])
        if failure in _HTTP_ERRORS:
            return _error_body(*_HTTP_ERRORS[failure])
        model = record.param("model") or "nova-3"
        language = (record.param("language") or "en").lower()
        if model not in _STT_MODELS or (
            model.startswith("nova-3") and language not in _NOVA3_LANGUAGES
        ):
            return _error_body(400, "Bad Request", _BAD_MODEL)
        rate = record.param("sample_rate") or ""
        if record.param("encoding") not in (None, "linear16") or (
            record.param("encoding") and not rate.isdigit()
        ):
            return _error_body(400, "Bad Request", "Raw audio needs encoding and sample_rate.")
        return None

    async def _listen_loop(
        self,
        websocket: WebSocket,
        record: ListenRecord,
        transcriber: _Transcriber,
        failure: str | None,
    ) -> None:
        async def send(messages: list[dict[str, Any]]) -> None:
            for message in messages:
                if failure != "stall_results":
                    record.sent.append(message)
                    await websocket.send_text(json.dumps(message))

        async def close(code: int, reason: str) -> None:
            record.close_code, record.close_reason = code, reason
            await websocket.close(code, reason)

        while True:
            try:
                async with asyncio.timeout(self.idle_timeout_s):
                    message = await websocket.receive()
            except TimeoutError:
                await close(1011, "NET-0001")
                return
            if message["type"] == "websocket.disconnect":
                record.close_code = message.get("code")
                return
            data: bytes | None = message.get("bytes")
            text: str | None = message.get("text")
            if data is not None:
                if not data:  # an empty binary frame: Deepgram's older way to end a stream
                    text = '{"type":"CloseStream"}'
                else:
                    record.audio_bytes += len(data)
                    record.audio_seen.set()
                    if failure == "close_1011":
                        return await close(1011, "NET-0000")
                    if failure == "net_0001":
                        return await close(1011, "NET-0001")
                    if failure == "data_0000":
                        return await close(1008, "DATA-0000")
                    if failure == "malformed_json":
                        await websocket.send_text('{"type": "Results", "channel": {')
                        continue
                    await send(transcriber.audio(data))
                    continue
            kind = None
            with contextlib.suppress(ValueError, AttributeError):
                kind = json.loads(text or "").get("type")
            if kind == "KeepAlive":
                record.keepalives += 1
                record.keepalive_seen.set()
            elif kind == "Finalize":
                record.finalizes += 1
                await send(transcriber.finalize())
            elif kind == "CloseStream":
                record.close_streams += 1
                await send(transcriber.close())
                return await close(1000, "")
            else:
                record.other_messages.append(text or "")
