"""``appbridge serve``: the asyncio shell around the gateway (docs/operations.md).

uvicorn serves the Starlette app on uvloop with the sans-I/O websockets implementation, and the
Twilio Media Stream beside it without the ASGI layer (``net/ws_fastpath.py``). Signals are the
gateway's own, not uvicorn's:

* SIGHUP reloads the configuration file: a valid one replaces apps, numbers and secrets for new
  calls at once (a rotated signing secret takes effect immediately; docs/operations.md, "Signals");
  live calls go on untouched; an invalid one is refused with its problems logged and the old one
  stays.
* SIGTERM drains: from the handler on, ``/readyz`` answers 503, out-of-dialog OPTIONS and new
  calls get 503 (docs/sip.md, "OPTIONS"), live calls may finish for ``server.drain_timeout_s``;
  then the rest are ended and the process exits 0 (docs/operations.md, "Signals"). A second
  SIGTERM, or SIGINT, stops at once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import ssl
import sys
from collections.abc import Callable

from appbridge import compiled
from appbridge.config import Config, ConfigError, load_config
from appbridge.gateway import Gateway
from appbridge.http.uvicorn_server import EmbeddedServer, gateway_server, tls_problem
from appbridge.net.listen import ListenError, tcp_socket

log = logging.getLogger("appbridge")


def _setup_logging(config: Config) -> None:
    """``[logging]`` (docs/configuration.md): text or JSON lines on stderr; APPBRIDGE_LOG_LEVEL
    overrides the level, and a ``[cluster] node_id`` is put on every JSON line."""
    from appbridge import logs

    settings = config.logging
    level = os.environ.get("APPBRIDGE_LOG_LEVEL") or settings.level
    cluster = getattr(config, "cluster", None)
    node = getattr(cluster, "node_id", None) if cluster is not None else None
    logs.add_secrets(logs.config_secrets(config))
    logs.configure(settings.format, level, node=node or None, stream=sys.stderr)


def _known_voice() -> Callable[[str], bool] | None:
    from appbridge.speech.catalog import default_catalog

    return default_catalog().is_known_voice


class _Signals:
    """SIGTERM drains (a second one stops at once), SIGINT stops, SIGHUP reloads the file
    (docs/operations.md)."""

    def __init__(self, gw: Gateway, config_path: str | None) -> None:
        self.gw = gw
        self.config_path = config_path
        self.stop_now = asyncio.Event()
        self.drain_requested = asyncio.Event()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig, handler in (
            (signal.SIGTERM, self.on_term),
            (signal.SIGINT, self.on_int),
            (signal.SIGHUP, self.on_hup),
        ):
            try:
                loop.add_signal_handler(sig, handler)
            except (NotImplementedError, RuntimeError):
                pass

    def on_term(self) -> None:
        if self.drain_requested.is_set():
            log.warning("second SIGTERM: stopping now")
            self.stop_now.set()
        else:
            # Marked here, not when the main task wakes up: a probe or an INVITE read in the
            # same loop iteration already sees the drain.
            self.gw.draining = True
            log.info("SIGTERM: draining (new calls refused, live calls may finish)")
            self.drain_requested.set()

    def on_int(self) -> None:
        log.warning("SIGINT: stopping now")
        self.stop_now.set()

    def on_hup(self) -> None:
        config_path = self.config_path
        if config_path is None:
            log.warning("SIGHUP: running on the embedded default; nothing to reload")
            return
        try:
            new = load_config(config_path, known_voice=_known_voice())
        except ConfigError as exc:
            log.error("SIGHUP: %s is invalid; keeping the running configuration", config_path)
            for problem in exc.problems:
                log.error("  %s", problem)
            return
        except OSError as exc:
            log.error(
                "SIGHUP: cannot read %s: %s; keeping the running configuration", config_path, exc
            )
            return
        from appbridge import logs

        logs.add_secrets(logs.config_secrets(new))
        self.gw.reload(new)


async def run_gateway(
    config: Config,
    config_path: str | None,
    *,
    ready: Callable[[Gateway, EmbeddedServer], None] | None = None,
) -> int:
    # A TLS pair that cannot be served is one line naming its key, and exit 1 (as a port in use).
    problem = tls_problem(config.server.tls) if config.server.tls is not None else None
    if problem is not None:
        log.error("%s", problem)
        return 1
    gw = Gateway(config)
    try:
        server = gateway_server(gw, host=config.server.host, port=config.server.port)
    except (ssl.SSLError, OSError) as exc:  # the files changed since the check above
        log.error("server.tls: %s", exc)
        return 1
    loop = asyncio.get_running_loop()
    signals = _Signals(gw, config_path)
    signals.install(loop)

    # A listener that cannot open is one line naming its key and address, and exit 1.
    try:
        http_socket = tcp_socket(config.server.host, config.server.port, key="server.port")
    except ListenError as exc:
        log.error("%s", exc)
        return 1
    try:
        await gw.start()
    except ListenError as exc:
        http_socket.close()
        log.error("%s", exc)
        await gw.stop()
        return 1
    serve_task = loop.create_task(server.serve(sockets=[http_socket]))
    if not await _listening(server, serve_task):
        log.error(
            "the HTTP listener could not start on %s:%s", config.server.host, config.server.port
        )
        await gw.stop()
        return 1
    # Start-up garbage is long-lived: freeze it so later full collections need not walk it.
    gc.collect()
    gc.freeze()
    log.info(
        "AppBridge listening on %s://%s:%s (config: %s)",
        "https" if config.server.tls is not None else "http",
        config.server.host,
        config.server.port,
        config.source,
    )
    _report_build()
    if ready is not None:
        ready(gw, server)

    drain_task = loop.create_task(signals.drain_requested.wait())
    stop_task = loop.create_task(signals.stop_now.wait())
    await asyncio.wait({drain_task, stop_task, serve_task}, return_when=asyncio.FIRST_COMPLETED)
    if signals.drain_requested.is_set() and not signals.stop_now.is_set():
        await _drain(gw, loop, signals.stop_now, stop_task)
    gw.draining = True
    await gw.stop()
    server.should_exit = True
    await serve_task
    drain_task.cancel()
    stop_task.cancel()
    return 0


async def _listening(server: EmbeddedServer, serve_task: asyncio.Task[None]) -> bool:
    """Wait until the listener is up; False when serving ended first (the port is taken)."""
    while not server.started:
        if serve_task.done():
            await serve_task
            return False
        await asyncio.sleep(0.01)
    return True


async def _drain(
    gw: Gateway,
    loop: asyncio.AbstractEventLoop,
    stop_now: asyncio.Event,
    stop_task: asyncio.Task[bool],
) -> None:
    """New calls are refused; live ones may end within ``drain_timeout_s``. Those still up at
    the deadline are ended by ``Gateway.stop`` (reason ``timeout``) and the exit code stays 0
    (docs/operations.md, "Signals")."""
    gw.draining = True
    deadline = loop.time() + gw.config.server.drain_timeout_s
    while len(gw.registry) and loop.time() < deadline and not stop_now.is_set():
        await asyncio.wait({stop_task}, timeout=0.2)
    if len(gw.registry):
        log.warning("drain: ending %d call(s) still live", len(gw.registry))


def _report_build() -> None:
    """Which media path runs: compiled (mypyc, appbridge/compiled.py) or interpreted, and whether
    a compiled module is older than its source (an edit not rebuilt is not running)."""
    interpreted = [m for m in compiled.COMPILED_MODULES if not compiled.is_compiled(m)]
    if interpreted:
        log.info(
            "media path: %d of %d modules interpreted (no compiled build)",
            len(interpreted),
            len(compiled.COMPILED_MODULES),
        )
    stale = compiled.stale_modules()
    if stale:
        log.warning(
            "compiled modules older than their source, the old build runs (rebuild with "
            "`make install`): %s",
            ", ".join(stale),
        )


def serve(config: Config, config_path: str | None = None) -> int:
    _setup_logging(config)
    for warning in getattr(config, "warnings", ()):
        log.warning("%s", warning)
    if config.sip is not None:
        # Imported before the loop runs: importing the SIP stack took the loop 70-90 ms at
        # start-up, which the stall trace (APPBRIDGE_STALL_TRACE_MS) reported as a stall.
        import appbridge.carriers.sip.inbound  # noqa: F401
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return exit_now_if_speech_runs(asyncio.run(run_gateway(config, config_path)))
    return exit_now_if_speech_runs(uvloop.run(run_gateway(config, config_path)))


#: How long the exit waits for a speech decode or model load that is already running.
SPEECH_EXIT_GRACE_S = 1.0


def exit_now_if_speech_runs(code: int) -> int:
    """Returns ``code`` once the speech workers are done; when one still runs after
    :data:`SPEECH_EXIT_GRACE_S`, ends the process at once with ``code``. Its work belongs to
    calls that have ended, and Python would otherwise join the thread however long it takes
    (``speech/workers.py``; docs/operations.md, "Signals")."""
    if "appbridge.speech.workers" not in sys.modules:
        return code  # no speech worker was ever started
    from appbridge.speech.workers import finish_all

    if finish_all(SPEECH_EXIT_GRACE_S):
        return code
    log.info("exit: not waiting for speech work of ended calls")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
