"""SRTP and SRTCP (RFC 3711) for one call leg, through libsrtp (pylibsrtp): no crypto here.

`SrtpStreams` holds the two libsrtp sessions of a call: the outbound one with our master key
(any SSRC we send, RFC 3711 §3.2.1) and the inbound one with the peer's (any SSRC it sends,
so an SSRC change of the peer needs no new key). libsrtp keeps the rollover counters
(RFC 3711 §3.3.1) and the replay lists (§3.3.2).

A packet that fails authentication or the replay check is dropped and counted
(`auth_failures`, `replays`) and never raises: a forged, stale or corrupted datagram costs the
call nothing but that packet (docs/sip.md, "SRTP (SDES)"). One warning per `LOG_INTERVAL_S`
at most reports the drops of a call, and `DROPS` adds up every leg's for ``/metrics``
(``appbridge_srtp_packets_dropped_total``, docs/operations.md). RTCP multiplexed on the RTP
port (RFC 5761) is told apart by its packet type and goes through the SRTCP side of the inbound
session.

`rekey` follows a re-INVITE that changed a key (RFC 4568 §7.1.4): only the side whose key
changed gets a new session. A browser leg's sessions are keyed by its DTLS handshake instead
(RFC 5764 §4.2, in aiortc): `SrtpStreams.over` counts and drops the same way on those.
"""

from __future__ import annotations

import logging
from typing import Final

from pylibsrtp import Error as LibSrtpError
from pylibsrtp import Policy, Session

from appbridge.carriers.sip.sdes import SrtpKeys

__all__ = ["DROPS", "LOG_INTERVAL_S", "SrtpDrops", "SrtpStreams"]

log = logging.getLogger(__name__)

#: At most one drop warning per call this often.
LOG_INTERVAL_S: Final = 10.0
_PROFILES: Final[dict[str, int]] = {
    "AES_CM_128_HMAC_SHA1_80": Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    "AES_CM_128_HMAC_SHA1_32": Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}


class SrtpDrops:
    """Packets every leg of the process dropped, by cause; a counter survives its call."""

    __slots__ = ("auth_failures", "replays")

    def __init__(self) -> None:
        self.auth_failures = 0
        self.replays = 0


DROPS: Final = SrtpDrops()


def _session(key: bytes, suite: str, ssrc_type: int) -> Session:
    return Session(Policy(key=key, ssrc_type=ssrc_type, srtp_profile=_PROFILES[suite]))


class SrtpStreams:
    """The SRTP of one call leg (module doc)."""

    __slots__ = (
        "_dropped_logged",
        "_inbound",
        "_label",
        "_next_log_s",
        "_outbound",
        "auth_failures",
        "keys",
        "replays",
        "rtcp_received",
    )

    def __init__(self, keys: SrtpKeys, label: str = "sip") -> None:
        if keys.suite not in _PROFILES:
            raise ValueError(f"unsupported SRTP suite {keys.suite!r}")
        self.keys: SrtpKeys | None = keys
        self._start(
            _session(keys.receive_key, keys.suite, Policy.SSRC_ANY_INBOUND),
            _session(keys.send_key, keys.suite, Policy.SSRC_ANY_OUTBOUND),
            label,
        )

    @classmethod
    def over(cls, inbound: Session, outbound: Session, *, label: str) -> SrtpStreams:
        """Streams on two sessions keyed elsewhere (module doc); they are never rekeyed."""
        streams = cls.__new__(cls)
        streams.keys = None
        streams._start(inbound, outbound, label)
        return streams

    def _start(self, inbound: Session, outbound: Session, label: str) -> None:
        self._label = label
        self._outbound = outbound
        self._inbound = inbound
        self.auth_failures = 0
        self.replays = 0
        self.rtcp_received = 0
        self._next_log_s = float("-inf")
        self._dropped_logged = 0

    def __repr__(self) -> str:
        keys = self.keys
        return (
            f"<SrtpStreams {keys.suite} tag {keys.tag}>" if keys else f"<SrtpStreams {self._label}>"
        )

    @property
    def dropped(self) -> int:
        return self.auth_failures + self.replays

    def rekey(self, keys: SrtpKeys) -> None:
        """New sessions for the sides whose key (or suite) changed; the others carry on."""
        if keys == self.keys:
            return
        if self.keys is None:
            raise ValueError("streams keyed by DTLS are not rekeyed by SDES")
        if keys.suite not in _PROFILES:
            raise ValueError(f"unsupported SRTP suite {keys.suite!r}")
        old = self.keys
        same_suite = keys.suite == old.suite
        if not same_suite or keys.send_key != old.send_key:
            self._outbound = _session(keys.send_key, keys.suite, Policy.SSRC_ANY_OUTBOUND)
        if not same_suite or keys.receive_key != old.receive_key:
            self._inbound = _session(keys.receive_key, keys.suite, Policy.SSRC_ANY_INBOUND)
        self.keys = keys

    def protect(self, packet: bytes) -> bytes:
        """An RTP packet as SRTP (RFC 3711 §3.1): encrypted payload, authentication tag."""
        return self._outbound.protect(packet)

    def protect_rtcp(self, packet: bytes) -> bytes:
        """An RTCP compound packet as SRTCP (RFC 3711 §3.4)."""
        return self._outbound.protect_rtcp(packet)

    def unprotect(self, data: bytes, now: float) -> bytes | None:
        """The plain packet of an SRTP or (multiplexed) SRTCP datagram, or None when it was
        dropped: failed authentication, a replay, or not SRTP at all."""
        rtcp = len(data) >= 2 and 192 <= data[1] <= 223  # RFC 5761 §4, as rtp.is_rtcp
        try:
            if rtcp:
                plain = self._inbound.unprotect_rtcp(data)
                self.rtcp_received += 1
                return plain
            return self._inbound.unprotect(data)
        except LibSrtpError as exc:
            if "replay" in str(exc) or "too old" in str(exc):
                self.replays += 1
                DROPS.replays += 1
            else:
                self.auth_failures += 1
                DROPS.auth_failures += 1
        except (ValueError, IndexError):
            self.auth_failures += 1  # too long for libsrtp's buffer, or an unlisted status
            DROPS.auth_failures += 1
        self._log_drops(now)
        return None

    def _log_drops(self, now: float) -> None:
        if now < self._next_log_s:
            return
        self._next_log_s = now + LOG_INTERVAL_S
        dropped = self.dropped
        log.warning(
            "%s: SRTP dropped %d packet(s) since the last report (%d failed authentication, "
            "%d replayed so far)",
            self._label,
            dropped - self._dropped_logged,
            self.auth_failures,
            self.replays,
        )
        self._dropped_logged = dropped
