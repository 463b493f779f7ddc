"""Keeping a registration with a trunk (RFC 3261 §10): the sans-I/O core (docs/sip.md,
"Registering with a trunk").

Theory of operation
-------------------
One :class:`RegistrationCore` per ``register = true`` trunk. It never reads a clock and does
no I/O: the shell (``register_client.py``) feeds it ``now`` with every input and carries out
the effects it returns (:class:`SendRequest`, :class:`SendKeepalive`). Inputs:

- :meth:`~RegistrationCore.start` sends the first REGISTER (To/From ``sip:<user>@<host>``, our
  Contact, ``Expires``; one Call-ID for the life of the registration and a CSeq that grows with
  every request, §10.2).
- :meth:`~RegistrationCore.on_response` takes the final response of the pending REGISTER:

  - 2xx: ``registered``. The granted expiry is our Contact's ``expires`` parameter in the
    200, else its ``Expires`` header, else what we asked (§10.2.4); the refresh goes at
    ``max(granted / 2, granted - 30 s)`` after the 200, so a long registration is refreshed
    30 s before it lapses and a short one half-way.
  - 401/407: answered once per challenge with digest credentials (RFC 7616, RFC 8760 for
    SHA-256; ``digest.py``). A new challenge after our credentials with the same nonce and not
    ``stale`` means the credentials are wrong: ``failed``.
  - 423 Interval Too Brief: the same REGISTER again at once with ``Min-Expires`` (§10.2.8).
  - anything else: ``failed``, retried after a backoff (below).

- :meth:`~RegistrationCore.on_failure`: no response (Timer F) or a transport error.
- :meth:`~RegistrationCore.on_timer`: refresh, retry after a failure, keepalive.
- :meth:`~RegistrationCore.keepalive_failed`: the shell lost the flow (a TCP connection went
  away, an OPTIONS keepalive timed out): register again at once.
- :meth:`~RegistrationCore.stop`: unregister (``Expires: 0``); :attr:`done` once answered.

Backoff after a failure: ``retry_base_s`` (5 s) doubling per consecutive failure up to
``retry_max_s`` (300 s), scaled by ``0.8 + 0.2 * random()`` from the injected random source; a
``Retry-After`` on the failure (RFC 3261 §20.33) replaces it, up to an hour. Keepalives run
while registered, every ``keepalive_s`` (30 s): a double CRLF over TCP and TLS (RFC 5626
§3.5.1, §4.4.1), an OPTIONS over UDP (any response proves the path; only its timeout fails).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from appbridge.carriers.sip.digest import DigestChallenge, DigestError, authorization
from appbridge.carriers.sip.headers import NameAddr, SipParseError, SipUri
from appbridge.carriers.sip.message import Headers, Request, Response, new_branch

__all__ = [
    "KEEPALIVE_S",
    "RETRY_BASE_S",
    "RETRY_MAX_S",
    "RegState",
    "RegistrationCore",
    "RegistrationParams",
    "SendKeepalive",
    "SendRequest",
    "refresh_delay",
]

RETRY_BASE_S = 5.0
RETRY_MAX_S = 300.0
KEEPALIVE_S = 30.0
REFRESH_MARGIN_S = 30.0
MAX_CHALLENGES = 3  # answered challenges in a row before giving up (each new nonce once)
JITTER = 0.2
RETRY_AFTER_MAX_S = 3600.0  # a Retry-After longer than this is taken as this
ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, NOTIFY"


class RegState(StrEnum):
    """What ``GET /v1/trunks`` shows (docs/sip.md, "Registering with a trunk")."""

    UNREGISTERED = "unregistered"
    REGISTERING = "registering"
    REGISTERED = "registered"
    FAILED = "failed"
    DISABLED = "disabled"


@dataclass(frozen=True, slots=True)
class SendRequest:
    """Send this REGISTER or keepalive OPTIONS through a non-INVITE client transaction."""

    request: Request


@dataclass(frozen=True, slots=True)
class SendKeepalive:
    """Send a double CRLF on the registration's connection (RFC 5626 §3.5.1)."""


Effect = SendRequest | SendKeepalive


@dataclass(frozen=True, slots=True)
class RegistrationParams:
    """Who registers where. ``contact`` is our Contact URI; ``via_transport``/``via_sent_by``
    make the Via (RFC 3261 §18.1.1); ``reliable`` is TCP or TLS (keepalive by CRLF)."""

    username: str
    password: str
    host: str  # the registrar's domain: Request-URI, To and From host
    port: int | None
    contact: SipUri
    via_transport: str  # "UDP", "TCP" or "TLS"
    via_sent_by: str
    call_id: str
    from_tag: str
    expires_s: int
    uri_params: tuple[tuple[str, str | None], ...] = ()
    retry_base_s: float = RETRY_BASE_S
    retry_max_s: float = RETRY_MAX_S
    keepalive_s: float | None = KEEPALIVE_S

    @property
    def reliable(self) -> bool:
        return self.via_transport != "UDP"


def refresh_delay(granted_s: float) -> float:
    """Seconds after a 200 when the refresh goes (module doc)."""
    return max(granted_s / 2, granted_s - REFRESH_MARGIN_S)


def retry_after(response: Response) -> float | None:
    """The delta-seconds of a ``Retry-After`` (RFC 3261 §20.33), comments ignored."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    head = value.split(";", 1)[0].split("(", 1)[0].strip()
    return min(float(head), RETRY_AFTER_MAX_S) if head.isdigit() else None


class RegistrationCore:
    """One trunk's registration (module doc)."""

    def __init__(self, params: RegistrationParams, *, random: Callable[[], float]) -> None:
        self.p = params
        self.random = random
        self.state = RegState.UNREGISTERED
        self.cseq = 0
        self.expires_s = params.expires_s  # asked; raised by a 423
        self.pending: Request | None = None
        self.keepalive_pending: Request | None = None
        self.challenges = 0  # answered in a row on this attempt
        self.last_nonce: str | None = None  # of the credentials on the pending request
        self.failures = 0  # in a row, for the backoff
        self.last_error: str | None = None
        self.expires_at: float | None = None
        self.refresh_at: float | None = None
        self.retry_at: float | None = None
        self.keepalive_at: float | None = None
        self.stopping = False
        self.done = False  # stopped and, when it was registered, unregistered

    # -- inputs -----------------------------------------------------------------------------
    def start(self, now: float) -> list[Effect]:
        return self._register(now)

    def on_response(self, response: Response, now: float) -> list[Effect]:
        """A response to the pending REGISTER or to a keepalive OPTIONS."""
        try:
            cseq = response.cseq
        except SipParseError:
            return []
        if cseq.method == "OPTIONS":
            ka = self.keepalive_pending
            if ka is not None and ka.cseq.seq == cseq.seq and response.status >= 200:
                self.keepalive_pending = None  # any final answer: the path is open
            return []
        pending = self.pending
        if pending is None or cseq.method != "REGISTER" or cseq.seq != pending.cseq.seq:
            return []
        status = response.status
        if status < 200:
            return []
        self.pending = None
        if status < 300:
            return self._accepted(response, now)
        if status in (401, 407):
            return self._challenged(pending, response, now)
        if status == 423:
            return self._too_brief(response, now)
        reason = response.reason or ""
        return self._failed(f"{status} {reason}".strip(), now, retry_after(response))

    def on_failure(self, request: Request, now: float, error: str) -> list[Effect]:
        """No final response in time, or the transport failed for ``request``."""
        try:
            seq, method = request.cseq.seq, request.cseq.method
        except SipParseError:
            return []
        if method == "OPTIONS":
            ka = self.keepalive_pending
            if ka is not None and ka.cseq.seq == seq:
                self.keepalive_pending = None
                return self.keepalive_failed(now, f"keepalive: {error}")
            return []
        if self.pending is None or self.pending.cseq.seq != seq:
            return []
        self.pending = None
        return self._failed(error, now, None)

    def keepalive_failed(self, now: float, error: str) -> list[Effect]:
        """The path to the registrar is gone: register again at once (RFC 5626 §4.4.1)."""
        if self.stopping or self.state is not RegState.REGISTERED or self.pending is not None:
            return []
        self.last_error = error
        return self._register(now)

    def next_deadline(self) -> float | None:
        times = (self.refresh_at, self.retry_at, self.keepalive_at)
        return min((t for t in times if t is not None), default=None)

    def on_timer(self, now: float) -> list[Effect]:
        if self.stopping:
            return []
        if self.retry_at is not None and self.retry_at <= now:
            self.retry_at = None
            return self._register(now)
        if self.refresh_at is not None and self.refresh_at <= now:
            self.refresh_at = None
            self.keepalive_at = None
            return self._register(now)
        if self.keepalive_at is not None and self.keepalive_at <= now:
            return self._keepalive(now)
        return []

    def stop(self, now: float) -> list[Effect]:
        """Unregister when there may be a binding (§10.2.2, ``Expires: 0``); else done."""
        if self.stopping:
            return []
        self.stopping = True
        self.refresh_at = self.retry_at = self.keepalive_at = None
        bound = self.state is RegState.REGISTERED or self.pending is not None
        if not bound:
            self.done = True
            self.state = RegState.UNREGISTERED
            return []
        self.challenges = 0
        self.last_nonce = None
        return [SendRequest(self._set_pending(self._request(0)))]

    # -- what the API shows ----------------------------------------------------------------
    def next_attempt_at(self) -> float | None:
        return self.retry_at if self.state is RegState.FAILED else None

    # -- steps -------------------------------------------------------------------------------
    def _register(self, now: float) -> list[Effect]:
        if self.state is not RegState.REGISTERED:
            self.state = RegState.REGISTERING
        self.challenges = 0
        self.last_nonce = None
        return [SendRequest(self._set_pending(self._request(self.expires_s)))]

    def _set_pending(self, request: Request) -> Request:
        self.pending = request
        return request

    def _accepted(self, response: Response, now: float) -> list[Effect]:
        self.failures = 0
        self.challenges = 0
        self.retry_at = None
        if self.stopping:
            self._finish()
            return []
        granted = self._granted(response)
        if granted <= 0:
            return self._failed("the registrar kept no binding for our Contact", now, None)
        self.state = RegState.REGISTERED
        self.last_error = None
        self.expires_at = now + granted
        self.refresh_at = now + refresh_delay(granted)
        self.keepalive_pending = None
        ka = self.p.keepalive_s
        self.keepalive_at = now + ka if ka is not None else None
        return []

    def _granted(self, response: Response) -> float:
        """Our Contact's ``expires`` in the 200, else ``Expires``, else what we asked."""
        ours = self.p.contact
        try:
            contacts = response.contacts
        except SipParseError:
            contacts = []
        for contact in contacts:
            uri = contact.uri
            if uri.user == ours.user and uri.host == ours.host and uri.port == ours.port:
                value = contact.param("expires")
                if value is not None and value.strip().isdigit():
                    return float(value)
        header = (response.headers.get("Expires") or "").strip()
        if header.isdigit():
            return float(header)
        return float(self.expires_s)

    def _challenged(self, sent: Request, response: Response, now: float) -> list[Effect]:
        try:
            challenge = DigestChallenge.from_response(response)
        except DigestError as exc:
            return self._failed(f"{response.status}: {exc}", now, None)
        repeated = self.last_nonce is not None and challenge.nonce == self.last_nonce
        if (repeated and not challenge.stale) or self.challenges >= MAX_CHALLENGES:
            return self._failed(f"{response.status}: the registrar refused our credentials", now)
        self.challenges += 1
        self.last_nonce = challenge.nonce
        expires = 0 if self.stopping else self.expires_s
        request = self._request(expires)
        name, value = authorization(
            challenge,
            username=self.p.username,
            password=self.p.password,
            method="REGISTER",
            uri=str(request.uri),
        )
        request.headers.add(name, value)
        return [SendRequest(self._set_pending(request))]

    def _too_brief(self, response: Response, now: float) -> list[Effect]:
        text = (response.headers.get("Min-Expires") or "").strip()
        if self.stopping or not text.isdigit() or int(text) <= self.expires_s:
            return self._failed("423 without a usable Min-Expires", now)
        self.expires_s = int(text)
        nonce = self.last_nonce
        effects = self._register(now)
        self.last_nonce = nonce
        return effects

    def _failed(self, error: str, now: float, wait_s: float | None = None) -> list[Effect]:
        self.last_error = error
        if self.stopping:
            self._finish()
            return []
        self.state = RegState.FAILED
        self.failures += 1
        self.expires_at = self.refresh_at = self.keepalive_at = None
        self.keepalive_pending = None
        if wait_s is None:
            nominal = min(self.p.retry_max_s, self.p.retry_base_s * 2 ** (self.failures - 1))
            wait_s = nominal * (1 - JITTER + JITTER * self.random())
        self.retry_at = now + wait_s
        return []

    def _finish(self) -> None:
        self.state = RegState.UNREGISTERED
        self.expires_at = None
        self.done = True

    def _keepalive(self, now: float) -> list[Effect]:
        ka = self.p.keepalive_s
        self.keepalive_at = now + ka if ka is not None else None
        if self.p.reliable:
            return [SendKeepalive()]
        if self.keepalive_pending is not None:
            return []  # the last OPTIONS is still out; its timeout decides
        request = self._options()
        self.keepalive_pending = request
        return [SendRequest(request)]

    # -- messages ----------------------------------------------------------------------------
    def _aor(self) -> str:
        return f"<{SipUri(scheme='sip', user=self.p.username, host=self.p.host)}>"

    def _registrar_uri(self) -> SipUri:
        return SipUri(scheme="sip", host=self.p.host, port=self.p.port, params=self.p.uri_params)

    def _base_headers(self, method: str) -> Headers:
        self.cseq += 1
        p = self.p
        return Headers(
            [
                ("Via", f"SIP/2.0/{p.via_transport} {p.via_sent_by};branch={new_branch()};rport"),
                ("Max-Forwards", "70"),
                ("From", f"{self._aor()};tag={p.from_tag}"),
                ("To", self._aor()),
                ("Call-ID", p.call_id),
                ("CSeq", f"{self.cseq} {method}"),
            ]
        )

    def _request(self, expires_s: int) -> Request:
        """A REGISTER for our one Contact (§10.2; ``Expires: 0`` removes it, §10.2.2)."""
        headers = self._base_headers("REGISTER")
        headers.add("Contact", str(NameAddr(uri=self.p.contact)))
        headers.add("Expires", str(expires_s))
        headers.add("Allow", ALLOW)
        headers.add("User-Agent", "AppBridge")
        return Request("REGISTER", self._registrar_uri(), headers)

    def _options(self) -> Request:
        """An out-of-dialog OPTIONS to the registrar: the UDP keepalive (module doc)."""
        headers = self._base_headers("OPTIONS")
        headers.add("Accept", "application/sdp")
        headers.add("User-Agent", "AppBridge")
        return Request("OPTIONS", self._registrar_uri(), headers)
