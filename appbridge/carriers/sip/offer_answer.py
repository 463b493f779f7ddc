"""The offer/answer model (RFC 3264) for a call's one audio stream, on top of :mod:`.sdp`.

`SdpNegotiator` is our side of one call's offer/answer exchanges (docs/sip.md):

- Codecs: those of :mod:`.sdp` in our preference order, plus telephone-event (RFC 4733
  section 7) on a dynamic payload type with events 0-16.
- `create_answer(offer)` (RFC 3264 section 6): one answer `m=` line per offered one, in order;
  the first usable audio stream (RTP/AVP, non-zero port, a codec in common) is accepted with ONE
  audio codec plus telephone-event when offered, using the offer's payload type numbers; every
  other stream is rejected with port 0. No usable audio stream raises `OfferAnswerError`, which
  the SIP layer answers with 488. The codec is the offerer's most preferred one that we support
  (its order is its preference, RFC 3264 section 6.1), or ours with `prefer="local"`.
- `create_offer()` / `process_answer(answer)` (RFC 3264 sections 5 and 7) for outbound calls.
- Direction (RFC 3264 section 6.1, table of section 8.4): an offer's sendonly is answered
  recvonly, recvonly with sendonly, inactive with inactive, sendrecv with our own wish (which
  hold/resume sets). An old-style hold, c=0.0.0.0 (RFC 3264 section 8.4, from RFC 2543), is
  read as the peer not wanting media: as sendonly.
- Addresses: `c=` and the `o=` address carry `public_address` when it is set (NAT), else the
  local address; the port is the call's RTP port.
- SRTP (SDES, RFC 4568; docs/sip.md, "SRTP (SDES)"): the call's ``srtp`` policy picks the
  profile (RTP/AVP or RTP/SAVP) and the crypto lines of an offer, and which offered line an
  answer takes (:mod:`.sdes`). Every offer and every new answer carries fresh keys; a re-offer
  whose chosen crypto line is the one already in use keeps the session and our key (no rekey),
  a changed one rekeys both ways. A refusal is `OfferAnswerError` with a ``warning`` text.
- Versions (RFC 3264 section 8): `o=` keeps one session id for the whole call; its version goes
  up by one whenever we send a description that differs from our previous one, and stays when
  we send the same again. A remote description whose `o=` version did not change is reported as
  `unchanged` (a session refresh that needs no media change).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal

from appbridge.carriers.sip.sdes import (
    CryptoLine,
    SrtpKeys,
    SrtpPolicy,
    SrtpRefused,
    answer_choice,
    answered_line,
    new_key,
    offer_lines,
    offer_profile,
    usable_crypto,
)
from appbridge.carriers.sip.sdp import (
    CODECS,
    PTIME_MS,
    STATIC_PAYLOAD_TYPES,
    Attribute,
    Codec,
    Connection,
    Direction,
    MediaDescription,
    Origin,
    SdpError,
    SessionDescription,
    default_codecs,
)
from appbridge.media import g722

__all__ = ["NegotiatedAudio", "OfferAnswerError", "SdpNegotiator"]

_REVERSE: Final[dict[Direction, Direction]] = {
    "sendrecv": "sendrecv",
    "sendonly": "recvonly",
    "recvonly": "sendonly",
    "inactive": "inactive",
}
_AUDIO_PROTOS: Final = frozenset({"RTP/AVP", "RTP/SAVP"})
TELEPHONE_EVENT: Final = "telephone-event"
DEFAULT_EVENT_PT: Final = 101


class OfferAnswerError(ValueError):
    """Valid SDP that cannot be accepted (no common audio codec, ...): SIP 488. `warning` is
    the text of a 399 Warning header when the refusal needs one (SRTP policy, RFC 3261
    §20.43)."""

    def __init__(self, message: str, warning: str | None = None) -> None:
        super().__init__(message)
        self.warning = warning


@dataclass(frozen=True, slots=True)
class NegotiatedAudio:
    """The outcome of one offer/answer exchange for the call's audio stream.

    Payload types: we send with the numbers of the peer's description and receive with those
    of ours (RFC 3264 section 6.1); in an answer we made they are the same. `send` and
    `receive` say whether media flows each way given both directions; `remote_hold` is true
    when the peer asked not to receive (sendonly, inactive, or c=0.0.0.0).
    """

    codec: Codec
    send_payload_type: int
    receive_payload_type: int
    send_event_payload_type: int | None
    receive_event_payload_type: int | None
    remote_address: str
    remote_port: int
    local_direction: Direction
    remote_direction: Direction
    remote_ptime_ms: int | None
    unchanged: bool = False
    srtp: SrtpKeys | None = None

    @property
    def send(self) -> bool:
        return self.local_direction in ("sendrecv", "sendonly")

    @property
    def receive(self) -> bool:
        return self.local_direction in ("sendrecv", "recvonly")

    @property
    def remote_hold(self) -> bool:
        return self.remote_direction in ("sendonly", "inactive")

    @property
    def receive_payload_types(self) -> frozenset[int]:
        pts = {self.receive_payload_type}
        if self.receive_event_payload_type is not None:
            pts.add(self.receive_event_payload_type)
        return frozenset(pts)


def _pt(fmt: str) -> int | None:
    """A format of an RTP/AVP m= line as a payload type number (0..127), else None."""
    if fmt.isascii() and fmt.isdigit() and len(fmt) <= 3:
        pt = int(fmt)
        return pt if pt <= 127 else None
    return None


def _codec_of(pt: int, rtpmap: dict[int, tuple[str, int, int]]) -> Codec | None:
    """Which of our codecs an offered format is: by rtpmap when present, else the static
    assignment of RFC 3551 section 6."""
    mapped = rtpmap.get(pt)
    if mapped is None:
        return STATIC_PAYLOAD_TYPES.get(pt)
    name, rate, channels = mapped
    codec = CODECS.get(name.upper())
    if codec is None or rate != codec.rtp_clock_hz or channels != 1:
        return None
    return replace(codec, payload_type=pt)


def _event_pt(m: MediaDescription, clock_hz: int) -> int | None:
    rtpmap = m.rtpmap()
    for fmt in m.formats:
        pt = _pt(fmt)
        mapped = rtpmap.get(pt) if pt is not None else None
        if mapped and mapped[0].lower() == TELEPHONE_EVENT and mapped[1] == clock_hz:
            return pt
    return None


def _remote_direction(session: SessionDescription, m: MediaDescription) -> Direction:
    direction = m.direction(session.direction())
    conn = m.connection or session.connection
    if conn is not None and conn.is_hold_address and direction in ("sendrecv", "sendonly"):
        return "sendonly"
    return direction


def _combine(wanted: Direction, allowed: Direction) -> Direction:
    """The direction that does no more than both `wanted` and `allowed` permit."""
    send = wanted in ("sendrecv", "sendonly") and allowed in ("sendrecv", "sendonly")
    recv = wanted in ("sendrecv", "recvonly") and allowed in ("sendrecv", "recvonly")
    if send and recv:
        return "sendrecv"
    return "sendonly" if send else "recvonly" if recv else "inactive"


class SdpNegotiator:
    """Our side of the offer/answer exchanges of one call (module doc)."""

    def __init__(
        self,
        *,
        local_address: str,
        rtp_port: int,
        public_address: str | None = None,
        codecs: Sequence[str] | None = None,
        event_payload_type: int = DEFAULT_EVENT_PT,
        prefer: Literal["offer", "local"] = "offer",
        session_id: int | None = None,
        username: str = "appbridge",
        srtp: SrtpPolicy = "off",
    ) -> None:
        names = tuple(codecs) if codecs is not None else default_codecs()
        unknown = [n for n in names if n not in CODECS]
        if unknown:
            raise ValueError(f"unknown codecs {unknown}")
        if "G722" in names and not g722.AVAILABLE:
            names = tuple(n for n in names if n != "G722")
        if not names:
            raise ValueError("no codec to negotiate")
        self._codecs = [CODECS[n] for n in names]
        self._address = public_address or local_address
        self._rtp_port = rtp_port
        self._event_pt = event_payload_type
        self._prefer = prefer
        self._session_id = str(session_id if session_id is not None else secrets.randbits(62))
        self._username = username
        self._version = int(self._session_id) % 1_000_000_000
        self._last_sent: bytes | None = None
        self._remote_version: tuple[str, int] | None = None
        self.direction: Direction = "sendrecv"
        self._offered: SessionDescription | None = None
        self._srtp_policy: SrtpPolicy = srtp
        self._offered_crypto: list[CryptoLine] = []
        #: The SRTP in use after the last exchange (None: plain RTP).
        self.srtp: SrtpKeys | None = None

    @property
    def address(self) -> str:
        return self._address

    @property
    def session_version(self) -> int:
        return self._version

    def _addr_type(self) -> str:
        return "IP6" if ":" in self._address else "IP4"

    def _finish(self, session: SessionDescription) -> SessionDescription:
        """Stamps the o= line: version + 1 only when the content changed (RFC 3264 s. 8)."""
        body = session.body_without_origin()
        if self._last_sent is not None and body != self._last_sent:
            self._version += 1
        self._last_sent = body
        session.origin = replace(session.origin, session_version=self._version)
        return session

    def _skeleton(self) -> SessionDescription:
        conn = Connection("IN", self._addr_type(), self._address)
        origin = Origin(self._username, self._session_id, 0, "IN", conn.addr_type, self._address)
        return SessionDescription(origin=origin, session_name="AppBridge", connection=conn)

    def _audio_media(
        self,
        codecs: Iterable[Codec],
        event_pt: int | None,
        direction: Direction,
        proto: str = "RTP/AVP",
        crypto: Sequence[CryptoLine] = (),
    ) -> MediaDescription:
        codecs = list(codecs)
        formats = [str(c.payload_type) for c in codecs]
        attrs = [Attribute("rtpmap", f"{c.payload_type} {c.name}/{c.rtp_clock_hz}") for c in codecs]
        if event_pt is not None:
            formats.append(str(event_pt))
            attrs.append(Attribute("rtpmap", f"{event_pt} {TELEPHONE_EVENT}/8000"))
            attrs.append(Attribute("fmtp", f"{event_pt} 0-16"))
        attrs.append(Attribute("ptime", str(PTIME_MS)))
        attrs.append(Attribute(direction))
        attrs.extend(Attribute("crypto", line.value()) for line in crypto)
        return MediaDescription("audio", self._rtp_port, proto, formats, attributes=attrs)

    # -- we offer ----------------------------------------------------------------------

    def create_offer(self, direction: Direction | None = None) -> SessionDescription:
        """An offer (initial, or a re-offer with the same session id) with all our codecs."""
        if direction is not None:
            self.direction = direction
        session = self._skeleton()
        policy = self._srtp_policy
        self._offered_crypto = offer_lines(policy)
        media = self._audio_media(
            self._codecs,
            self._event_pt,
            self.direction,
            offer_profile(policy),
            self._offered_crypto,
        )
        session.media.append(media)
        self._offered = session
        return self._finish(session)

    def process_answer(self, answer: SessionDescription) -> NegotiatedAudio:
        """Reads the answer to our last offer (RFC 3264 section 7)."""
        offer = self._offered
        if offer is None:
            raise OfferAnswerError("no offer is outstanding")
        if len(answer.media) != len(offer.media):
            raise OfferAnswerError("the answer must have one m= line per offered one")
        m = answer.media[0]
        if m.media != "audio" or m.port == 0:
            raise OfferAnswerError("the audio stream was rejected")
        rtpmap = m.rtpmap()
        offered = {c.name: c for c in self._codecs}
        chosen: Codec | None = None
        for fmt in m.formats:
            pt = _pt(fmt)
            codec = _codec_of(pt, rtpmap) if pt is not None else None
            if codec is not None and codec.name in offered:
                chosen = codec
                break
        if chosen is None:
            raise OfferAnswerError("the answer has none of the offered codecs")
        try:
            pair = answered_line(
                self._srtp_policy, m.proto, m.attribute_values("crypto"), self._offered_crypto
            )
        except SrtpRefused as exc:
            raise OfferAnswerError(str(exc), str(exc)) from None
        keys = (
            None if pair is None else SrtpKeys(pair[0].suite, pair[0].tag, pair[0].key, pair[1].key)
        )
        result = self._negotiated(
            answer,
            m,
            chosen,
            receive_pt=offered[chosen.name].payload_type,
            receive_event_pt=self._event_pt,
            local_direction=_combine(self.direction, _REVERSE[_remote_direction(answer, m)]),
            srtp=keys,
        )
        self._offered = None
        return result

    # -- we answer ---------------------------------------------------------------------

    def create_answer(
        self, offer: SessionDescription, direction: Direction | None = None
    ) -> tuple[SessionDescription, NegotiatedAudio]:
        """Answers an offer (RFC 3264 section 6); raises `OfferAnswerError` (SIP 488) when no
        audio stream can be accepted."""
        if direction is not None:
            self.direction = direction
        session = self._skeleton()
        accepted: tuple[MediaDescription, Codec, int | None] | None = None
        keys: SrtpKeys | None = None
        refusal: str | None = None
        for m in offer.media:
            if accepted is None and m.media == "audio" and m.port and m.proto in _AUDIO_PROTOS:
                codec = self._pick(m)
                if codec is not None:
                    try:
                        theirs = answer_choice(
                            self._srtp_policy, m.proto, usable_crypto(m.attribute_values("crypto"))
                        )
                    except SrtpRefused as exc:
                        refusal = refusal or str(exc)
                        theirs = None
                        codec = None
                if codec is not None:
                    event_pt = _event_pt(m, codec.rtp_clock_hz)
                    accepted = (m, codec, event_pt)
                    keys = self._answer_keys(theirs)
                    local = _combine(self.direction, _REVERSE[_remote_direction(offer, m)])
                    crypto = [CryptoLine(keys.tag, keys.suite, keys.send_key)] if keys else []
                    media = self._audio_media([codec], event_pt, local, m.proto, crypto)
                    session.media.append(media)
                    continue
            first = m.formats[:1] or ["0"]
            session.media.append(MediaDescription(m.media, 0, m.proto, first))
        if accepted is None:
            raise OfferAnswerError(
                "no acceptable audio stream (488 Not Acceptable Here)"
                + (f": {refusal}" if refusal else ""),
                refusal,
            )
        m, codec, event_pt = accepted
        local = _combine(self.direction, _REVERSE[_remote_direction(offer, m)])
        result = self._negotiated(
            offer,
            m,
            codec,
            receive_pt=codec.payload_type,
            receive_event_pt=event_pt,
            local_direction=local,
            srtp=keys,
        )
        return self._finish(session), result

    def _answer_keys(self, theirs: CryptoLine | None) -> SrtpKeys | None:
        """The SRTP of an answer: the session in use when the offer repeats its line (a
        re-INVITE that changes no key, RFC 4568 §7.1.4), else a fresh key of ours."""
        if theirs is None:
            return None
        current = self.srtp
        if (
            current is not None
            and current.tag == theirs.tag
            and current.suite == theirs.suite
            and current.receive_key == theirs.key
        ):
            return current
        return SrtpKeys(theirs.suite, theirs.tag, new_key(), theirs.key)

    def _pick(self, m: MediaDescription) -> Codec | None:
        rtpmap = m.rtpmap()
        ours = {c.name for c in self._codecs}
        pts = [pt for pt in map(_pt, m.formats) if pt is not None]
        offered = [
            c for c in (_codec_of(pt, rtpmap) for pt in pts) if c is not None and c.name in ours
        ]
        if not offered:
            return None
        if self._prefer == "local":
            rank = {c.name: i for i, c in enumerate(self._codecs)}
            return min(offered, key=lambda c: rank[c.name])
        return offered[0]

    def _negotiated(
        self,
        remote: SessionDescription,
        m: MediaDescription,
        codec: Codec,
        *,
        receive_pt: int,
        receive_event_pt: int | None,
        local_direction: Direction,
        srtp: SrtpKeys | None,
    ) -> NegotiatedAudio:
        conn = m.connection or remote.connection
        if conn is None:
            raise SdpError("no c= line for the audio stream (RFC 4566 section 5.7)")
        key = (remote.origin.session_id, remote.origin.session_version)
        unchanged = self._remote_version == key
        self._remote_version = key
        send_event_pt = _event_pt(m, codec.rtp_clock_hz)
        self.srtp = srtp
        return NegotiatedAudio(
            codec=codec,
            send_payload_type=codec.payload_type,
            receive_payload_type=receive_pt,
            send_event_payload_type=send_event_pt,
            receive_event_payload_type=receive_event_pt if send_event_pt is not None else None,
            remote_address=conn.address,
            remote_port=m.port,
            local_direction=local_direction,
            remote_direction=_remote_direction(remote, m),
            remote_ptime_ms=m.ptime_ms(),
            unchanged=unchanged,
            srtp=srtp,
        )
