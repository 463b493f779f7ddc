"""What the browser-call signalling answers (docs/webrtc.md, "Signalling"): the SDP answer, a
refusal, and the ICE servers the directory tells a browser about.

Kept apart from carriers/webrtc/signalling.py, which needs aiortc, so that the HTTP routes can
answer the directory and refuse bad requests without importing it (http/routes_webrtc.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from appbridge.carriers.requests import OutboundError

if TYPE_CHECKING:
    from appbridge.config.model import WebRtcConfig


class WebRtcRefusal(OutboundError):
    """A browser's offer answered other than 201: like any call request that cannot be placed
    (carriers/requests.py), its HTTP status and the error code of http/errors.py."""


@dataclass(frozen=True, slots=True)
class Answer:
    call_ref: str
    sdp: str


def ice_servers(cfg: WebRtcConfig) -> list[dict[str, Any]]:
    """``iceServers`` of the directory, in the browser's ``RTCIceServer`` shape (W3C WebRTC)."""
    out: list[dict[str, Any]] = []
    for s in cfg.ice_servers:
        entry: dict[str, Any] = {"urls": list(s.urls)}
        if s.username is not None:
            entry["username"] = s.username
        if s.credential is not None:
            entry["credential"] = s.credential
        out.append(entry)
    return out
