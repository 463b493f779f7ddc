"""uvicorn, minus its signal handling: the gateway (or a test) owns the process's signals."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn


class EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:  # older uvicorn releases
        return


def uvicorn_config(app: object, **overrides: object) -> uvicorn.Config:
    """The settings every embedded server of the gateway runs with (uvloop set up by the caller)."""
    settings: dict[str, object] = {
        "loop": "none",
        "ws": "websockets-sansio",
        "http": "httptools",
        "lifespan": "off",
        "log_level": "warning",
        "access_log": False,
        "ws_max_size": 1024 * 1024,
        "ws_ping_interval": None,
        "timeout_graceful_shutdown": 2,
    }
    settings.update(overrides)
    return uvicorn.Config(app, **settings)  # type: ignore[arg-type]
