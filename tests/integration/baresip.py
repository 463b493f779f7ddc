"""A real baresip (Debian package ``baresip``, 1.0.0) as a SIP peer for integration tests.

Why baresip: it is a complete user agent with its own SIP stack, jitter buffer and G.711/G.722
codecs, so a call between it and the gateway checks interop that our own test caller (built on
our own stack) cannot. It runs headless on 127.0.0.1 with a private config directory:

- audio source ``aufile``: plays one WAV (mono pcm16 at `AUDIO_RATE_HZ`; aufile 1.0.0 refuses
  any other rate) and, when the file ends, the ``menu`` module hangs the call up. Pad the WAV
  with silence to keep a call open (`Baresip.write_wav(..., hold_s=...)`);
- audio player ``aubridge``: a bridge device with no sound card behind it;
- audio filter ``sndfile``: writes what baresip sent (``dump-*-enc.wav``) and received
  (``dump-*-dec.wav``) per call into the config directory, at the codec's rate; the files are
  complete once the call has ended;
- codecs ``g711`` and ``g722``; which ones a call may use is the account's ``audio_codecs``;
- ``menu`` provides the ``dial``/``hangup``/``accept`` commands and the auto-answer
  (``answermode=auto`` in the account); ``ctrl_tcp`` carries them: JSON in netstrings,
  ``{"command", "params", "token"}`` in, ``{"response", "ok", "data", "token"}`` and
  ``{"event": true, "type": "CALL_ESTABLISHED", ...}`` out.

Everything is learnt from ``baresip -h``, the config template baresip writes on first start, and
the module list in /usr/lib/baresip/modules. The log (stdout and stderr) is kept in the config
directory and printed by `Baresip.log_text` for failure messages.

Usage (see tests/integration/test_baresip.py)::

    require_baresip()                     # fails under CI=true when missing, else skips
    async with running_baresip(tmp_path / "bob", codecs=("G722",), play=wav_path) as bob:
        # or: bob = Baresip(...); configure a trunk at bob.sip_port; async with bob: ...
        await bob.dial("sip:+15550001111@127.0.0.1:5062")   # or: the gateway calls bob.uri
        await bob.wait_event("CALL_ESTABLISHED")
        await bob.hangup()
        await bob.wait_event("CALL_CLOSED")
        heard = bob.received_audio()       # DecodedAudio(pcm16, rate_hz)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from appbridge.media.wav import DecodedAudio, parse_wav, write_wav

BARESIP = shutil.which("baresip")
MODULE_DIR = Path("/usr/lib/baresip/modules")
#: aufile plays only files at the source rate, and the source rate is set to this.
AUDIO_RATE_HZ = 16_000
#: baresip's names for the codecs (its ``audio_codecs`` account parameter).
CODEC_NAMES = {"PCMU": "PCMU/8000/1", "PCMA": "PCMA/8000/1", "G722": "G722/16000/1"}
START_TIMEOUT_S = 10.0


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def require_baresip() -> str:
    """baresip's path; a missing baresip fails under CI=true and skips elsewhere."""
    if BARESIP is None:
        reason = "baresip missing: run deploy/install-test-peers.sh (as root)"
        if in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    return BARESIP


def free_port(kind: int = socket.SOCK_STREAM, *, also_udp: bool = False) -> int:
    """A port free on 127.0.0.1 now (baresip binds its own; a rare race is acceptable)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not also_udp:
            return port
        # baresip's SIP port over UDP too, and its TLS transport's on the next port.
        if _bindable(port, socket.SOCK_DGRAM) and _bindable(port + 1, socket.SOCK_STREAM):
            return port
    raise RuntimeError("no free port on 127.0.0.1")


def _bindable(port: int, kind: int) -> bool:
    try:
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def _netstring(payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return str(len(body)).encode() + b":" + body + b","


class BaresipError(RuntimeError):
    """baresip did not start, answered a command with ok=false, or an event never came."""


class Baresip:
    """One baresip process (module doc). Not started until `start`; `stop` is idempotent."""

    def __init__(
        self,
        workdir: Path,
        *,
        user: str = "baresip",
        codecs: Sequence[str] = ("PCMU",),
        play: Path | None = None,
        auto_answer: bool = True,
        rtp_ports: tuple[int, int] | None = None,
        mediaenc: str | None = None,
    ) -> None:
        unknown = [c for c in codecs if c not in CODEC_NAMES]
        if unknown or not codecs:
            raise ValueError(f"codecs must be some of {sorted(CODEC_NAMES)}, got {list(codecs)}")
        self.workdir = workdir
        self.user = user
        self.codecs = tuple(codecs)
        self.play = play
        self.auto_answer = auto_answer
        #: The account's ``mediaenc`` (``srtp-mand``: SDES-SRTP with RTP/SAVP, module srtp.so).
        self.mediaenc = mediaenc
        self.sip_port = free_port(also_udp=True)
        self.ctrl_port = free_port()
        if rtp_ports is None:
            low = 40_000 + (self.sip_port % 200) * 100
            rtp_ports = (low, low + 99)
        self.rtp_ports = rtp_ports
        self.events: list[dict[str, Any]] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._log_file: Any = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._read_task: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._changed = asyncio.Event()
        self._token = 0
        self._claimed: set[int] = set()

    # -- identity ----------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        """Where to call this baresip: its account's AOR."""
        return f"sip:{self.user}@127.0.0.1:{self.sip_port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "baresip.log"

    def log_text(self, last_bytes: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-last_bytes:]
        except OSError:
            return "(no log)"

    # -- audio -------------------------------------------------------------------------------
    @staticmethod
    def write_wav(
        path: Path, pcm16: bytes, rate_hz: int = AUDIO_RATE_HZ, hold_s: float = 0.0
    ) -> Path:
        """Writes what baresip will play: `pcm16` at `rate_hz` (must be `AUDIO_RATE_HZ`),
        then `hold_s` of silence, since the call ends when the file does."""
        if rate_hz != AUDIO_RATE_HZ:
            raise ValueError(f"baresip's aufile plays {AUDIO_RATE_HZ} Hz files only here")
        path.write_bytes(write_wav(pcm16 + bytes(2 * int(rate_hz * hold_s)), rate_hz))
        return path

    def recordings(self, kind: str = "dec") -> list[Path]:
        """sndfile's files, oldest first: ``dec`` is what baresip received, ``enc`` what it sent."""
        return sorted(self.workdir.glob(f"dump-*-{kind}.wav"), key=lambda p: p.stat().st_mtime)

    def received_audio(self, index: int = -1) -> DecodedAudio:
        """What baresip heard in a call (the last by default), decoded by baresip itself."""
        files = self.recordings("dec")
        if not files:
            raise BaresipError(f"no recording in {self.workdir}\n{self.log_text()}")
        return parse_wav(files[index].read_bytes())

    # -- lifecycle ---------------------------------------------------------------------------
    def _config_text(self) -> str:
        play = self.play or self.workdir / "silence.wav"
        if self.play is None:
            self.write_wav(play, b"", hold_s=60.0)
        lines = [
            "poll_method epoll",
            f"sip_listen 127.0.0.1:{self.sip_port}",
            "net_interface 127.0.0.1",  # SDP and Contact on loopback, not the host's address
            "call_local_timeout 30",
            "call_max_calls 4",
            f"audio_source aufile,{play}",
            f"audio_player aubridge,{self.user}",
            f"audio_alert aubridge,{self.user}-alert",
            f"ausrc_srate {AUDIO_RATE_HZ}",
            f"auplay_srate {AUDIO_RATE_HZ}",
            "ausrc_channels 1",
            "auplay_channels 1",
            "audio_level no",
            f"rtp_ports {self.rtp_ports[0]}-{self.rtp_ports[1]}",
            "rtcp_mux no",
            "jitter_buffer_delay 1-10",
            f"module_path {MODULE_DIR}",
            "module g722.so",
            "module g711.so",
            "module aufile.so",
            "module aubridge.so",
            "module sndfile.so",
            *(["module srtp.so"] if self.mediaenc else []),
            "module_tmp account.so",
            "module_app menu.so",
            "module_app ctrl_tcp.so",
            f"ctrl_tcp_listen 127.0.0.1:{self.ctrl_port}",
            f"snd_path {self.workdir}",
            "statmode_default off",
            "ringback_disabled yes",
        ]
        return "\n".join(lines) + "\n"

    def _account_text(self) -> str:
        codecs = ",".join(CODEC_NAMES[c] for c in self.codecs)
        answer = "auto" if self.auto_answer else "manual"
        enc = f";mediaenc={self.mediaenc}" if self.mediaenc else ""
        return f"<{self.uri}>;regint=0;answermode={answer};audio_codecs={codecs}{enc}\n"

    async def start(self) -> None:
        binary = require_baresip()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "config").write_text(self._config_text())
        (self.workdir / "accounts").write_text(self._account_text())
        (self.workdir / "contacts").write_text("")
        self._log_file = self.log_path.open("wb")
        self._proc = await asyncio.create_subprocess_exec(
            binary,
            "-f",
            str(self.workdir),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=asyncio.subprocess.STDOUT,
            cwd=str(self.workdir),
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while True:
            if self._proc.returncode is not None:
                raise BaresipError(
                    f"baresip exited with {self._proc.returncode}\n{self.log_text()}"
                )
            try:
                self._reader, self._writer = await asyncio.open_connection(
                    "127.0.0.1", self.ctrl_port
                )
                break
            except OSError:
                if loop.time() > deadline:
                    raise BaresipError(f"ctrl_tcp never listened\n{self.log_text()}") from None
                await asyncio.sleep(0.05)
        self._read_task = loop.create_task(self._read_loop())
        # ctrl_tcp listens before the UAs are ready: ask something harmless until it answers.
        await self.command("reginfo")

    async def stop(self) -> None:
        """``quit``, then terminate, then kill: whatever it takes within a few seconds."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(BaresipError, OSError, TimeoutError):
                await self.command("quit", timeout_s=1.0)
            try:
                await asyncio.wait_for(proc.wait(), 3.0)
            except TimeoutError:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 2.0)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
            self._writer = None
        if self._read_task is not None:
            self._read_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._read_task
            self._read_task = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    async def __aenter__(self) -> Baresip:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    # -- control -----------------------------------------------------------------------------
    async def command(self, name: str, params: str = "", timeout_s: float = 5.0) -> dict[str, Any]:
        """Runs a baresip command (the ones ``help`` lists) and returns its response; raises
        BaresipError when baresip answers ok=false."""
        if self._writer is None:
            raise BaresipError("baresip is not running")
        self._token += 1
        token = f"t{self._token}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[token] = future
        self._writer.write(_netstring({"command": name, "params": params, "token": token}))
        await self._writer.drain()
        try:
            response = await asyncio.wait_for(future, timeout_s)
        finally:
            self._pending.pop(token, None)
        if not response.get("ok", False):
            raise BaresipError(f"{name} {params}: {response.get('data')!r}")
        return response

    async def dial(self, uri: str) -> None:
        await self.command("dial", uri)

    async def hangup(self) -> None:
        await self.command("hangup")

    async def accept(self) -> None:
        await self.command("accept")

    async def wait_event(
        self,
        event_type: str,
        timeout_s: float = 10.0,
        where: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """The first event of `event_type` (e.g. CALL_INCOMING, CALL_ESTABLISHED, CALL_CLOSED)
        not returned by an earlier call."""
        cursor = 0
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    while cursor < len(self.events):
                        ev = self.events[cursor]
                        if (
                            cursor not in self._claimed
                            and ev.get("type") == event_type
                            and (where is None or where(ev))
                        ):
                            self._claimed.add(cursor)
                            return ev
                        cursor += 1
                    if self._read_task is None or self._read_task.done():
                        raise BaresipError(f"ctrl_tcp closed before {event_type}")
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            seen = [e.get("type") for e in self.events]
            raise BaresipError(
                f"no {event_type} in {timeout_s} s; events: {seen}\n{self.log_text()}"
            ) from None

    async def _read_loop(self) -> None:
        assert self._reader is not None
        reader = self._reader
        try:
            while True:
                length = await reader.readuntil(b":")
                body = await reader.readexactly(int(length[:-1]))
                if await reader.readexactly(1) != b",":
                    raise BaresipError("bad netstring from ctrl_tcp")
                msg = json.loads(body)
                if msg.get("response"):
                    future = self._pending.get(str(msg.get("token")))
                    if future is not None and not future.done():
                        future.set_result(msg)
                elif msg.get("event"):
                    self.events.append(msg)
                self._changed.set()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            self._changed.set()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(BaresipError("ctrl_tcp closed"))


@contextlib.asynccontextmanager
async def running_baresip(workdir: Path, **options: Any) -> AsyncIterator[Baresip]:
    """A started `Baresip` (options as its constructor), stopped on exit whatever happens.
    ``async with Baresip(...) as peer`` does the same for a peer made earlier (to know its
    `sip_port` before the gateway's trunk is configured)."""
    async with Baresip(workdir, **options) as peer:
        yield peer
