"""The asyncio shell around the registration cores (``registration.py``; docs/sip.md,
"Registering with a trunk").

:class:`SipRegistrations` holds one :class:`~.registration.RegistrationCore` per
``register = true`` trunk and does what the cores cannot:

- resolves the trunk's host and, for ``transport = "tcp"`` (or ``"tls"``), opens or reuses the
  connection to it before every request (``SipTransport.connect_tcp``); a failure there is a
  transport error for the core. Requests go through the transaction layer as non-INVITE client
  transactions (RFC 3261 §17.1.2): ``SipInbound`` hands back their responses and timeouts.
- keeps one asyncio timer at the cores' earliest deadline and feeds them ``now``.
- carries the keepalives: a double CRLF on the registration's connection (RFC 5626 §3.5.1). A
  connection that was lost since the 200 (``connect_tcp`` gives a new one, or none) is a
  keepalive failure: the core registers again on the new flow.
- tells ``SipInbound`` which trunk an INVITE belongs to (:meth:`trunk_for_invite`): one whose
  Request-URI user is a registration's Contact user, or that arrives from a registrar's address
  or on its connection.
- unregisters on shutdown, waiting at most ``UNREGISTER_WAIT_S`` so a stop never hangs.
- describes each trunk for ``GET /v1/trunks`` (docs/operations.md): never its password.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from appbridge.carriers.sip.headers import SipParseError, SipUri
from appbridge.carriers.sip.message import Request, Response, new_tag
from appbridge.carriers.sip.registration import (
    KEEPALIVE_S,
    RETRY_BASE_S,
    RegistrationCore,
    RegistrationParams,
    RegState,
    SendKeepalive,
    SendRequest,
)
from appbridge.carriers.sip.resolve import resolve_ipv4
from appbridge.carriers.sip.transport import Peer, SipTransport
from appbridge.clock import Clock
from appbridge.env_knobs import positive_from_env

if TYPE_CHECKING:
    from appbridge.config import SipConfig, SipTrunk

log = logging.getLogger(__name__)

UNREGISTER_WAIT_S = 2.0
CONNECT_TIMEOUT_S = 5.0
#: Environment knobs (docs/sip.md, "Registering with a trunk"): the first retry's delay and
#: the keepalive interval, for tests and unusual NATs.
RETRY_ENV = "APPBRIDGE_SIP_REGISTER_RETRY_S"
KEEPALIVE_ENV = "APPBRIDGE_SIP_KEEPALIVE_S"


def _iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


@dataclass(eq=False)
class TrunkRegistration:
    """One trunk's registration: its core and where its requests go."""

    trunk: SipTrunk
    core: RegistrationCore
    address: str | None = None  # the registrar's IP, once resolved
    flow: Peer | None = None  # the peer the last 200 came on (the registered flow)
    sending: set[asyncio.Task[None]] = field(default_factory=set, repr=False)


class SipRegistrations:
    """The registrations of one SIP service (module doc)."""

    def __init__(
        self,
        clock: Clock,
        transport: SipTransport,
        cfg: SipConfig,
        *,
        rand: Callable[[], float] = random.random,
        unregister_wait_s: float = UNREGISTER_WAIT_S,
    ) -> None:
        self.clock = clock
        self.transport = transport
        self.cfg = cfg
        self.rand = rand
        self.unregister_wait_s = unregister_wait_s
        self.entries: list[TrunkRegistration] = []
        self.by_call_id: dict[str, TrunkRegistration] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._changed = asyncio.Event()
        self.retry_base_s = positive_from_env(RETRY_ENV, RETRY_BASE_S, float) or RETRY_BASE_S
        self.keepalive_s = positive_from_env(KEEPALIVE_ENV, KEEPALIVE_S, float)

    # -- life --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Resolve each registering trunk and send its first REGISTER (answers come later)."""
        for trunk in self.cfg.trunks:
            if not trunk.register or trunk.username is None or trunk.password is None:
                continue
            address = await self._resolve(trunk.host, trunk.port)
            core = RegistrationCore(self._params(trunk, address), random=self.rand)
            entry = TrunkRegistration(trunk, core, address=address)
            self.entries.append(entry)
            self.by_call_id[entry.core.p.call_id] = entry
            log.info("sip: registering with trunk %s as %s", trunk.name, trunk.username)
            self._run(entry, entry.core.start(self.clock.now()))

    async def stop(self) -> None:
        """Unregister every trunk, waiting at most ``unregister_wait_s`` (module doc)."""
        now = self.clock.now()
        for entry in self.entries:
            self._run(entry, entry.core.stop(now))
        deadline = time.monotonic() + self.unregister_wait_s
        while not all(e.core.done for e in self.entries):
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("sip: unregistering took too long; stopping anyway")
                break
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                continue
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for entry in self.entries:
            for task in list(entry.sending):
                task.cancel()

    def _params(self, trunk: SipTrunk, address: str | None) -> RegistrationParams:
        kind = trunk.transport
        host = self.cfg.public_address or self.transport.local_host
        if host in ("0.0.0.0", "::"):
            host = _local_ip_toward(address) if address is not None else "127.0.0.1"
        port = self.transport.local_port(kind)  # the listener the registrar will call
        params: tuple[tuple[str, str | None], ...] = (("transport", kind),) if kind != "udp" else ()
        assert trunk.username is not None and trunk.password is not None
        # An unguessable Contact user: it admits calls from any address (docs/sip.md).
        user = f"{trunk.username}-{secrets.token_hex(8)}"
        contact = SipUri(scheme="sip", user=user, host=host, port=port, params=params)
        return RegistrationParams(
            username=trunk.username,
            password=trunk.password,
            host=trunk.host,
            port=trunk.port if trunk.port != (5061 if kind == "tls" else 5060) else None,
            contact=contact,
            via_transport=kind.upper(),
            via_sent_by=f"{host}:{port}",
            call_id=f"{uuid.uuid4().hex}@{host}",
            from_tag=new_tag(),
            expires_s=trunk.register_expires_s,
            uri_params=params,
            retry_base_s=self.retry_base_s,
            keepalive_s=self.keepalive_s,
        )

    async def _resolve(self, host: str, port: int) -> str | None:
        try:
            return await resolve_ipv4(host, port, CONNECT_TIMEOUT_S)
        except OSError:
            return None

    # -- effects -----------------------------------------------------------------------------
    def _run(self, entry: TrunkRegistration, effects: list[SendRequest | SendKeepalive]) -> None:
        for effect in effects:
            task = asyncio.get_running_loop().create_task(self._send(entry, effect))
            entry.sending.add(task)
            task.add_done_callback(entry.sending.discard)
        self._changed.set()
        self._rearm()

    async def _peer(self, entry: TrunkRegistration) -> Peer:
        """Where the trunk's requests go: resolved each time it is unknown; a TCP or TLS
        connection opened or reused (raises ``OSError`` when it cannot be had)."""
        trunk = entry.trunk
        if entry.address is None:
            entry.address = await self._resolve(trunk.host, trunk.port)
            if entry.address is None:
                raise OSError(f"cannot resolve {trunk.host}")
        if trunk.transport == "udp":
            return ("udp", entry.address, trunk.port)
        if trunk.transport == "tls":
            connect_tls = getattr(self.transport, "connect_tls", None)
            if connect_tls is None:
                raise OSError("SIP over TLS is not available")
            peer: Peer = await connect_tls(entry.address, trunk.port, server_hostname=trunk.host)
            return peer
        return await self.transport.connect_tcp(entry.address, trunk.port, CONNECT_TIMEOUT_S)

    async def _send(self, entry: TrunkRegistration, effect: SendRequest | SendKeepalive) -> None:
        core = entry.core
        try:
            peer = await self._peer(entry)
        except (OSError, TimeoutError) as exc:
            if entry.address != entry.trunk.host:
                entry.address = None  # a name: resolve it again on the next attempt
            reason = str(exc) or "timed out"
            log.warning(
                "sip: trunk %s unreachable for its registration: %s", entry.trunk.name, reason
            )
            now = self.clock.now()
            if isinstance(effect, SendKeepalive):
                self._run(entry, core.keepalive_failed(now, f"keepalive: {reason}"))
            else:
                self._run(entry, core.on_failure(effect.request, now, f"transport: {reason}"))
            return
        if isinstance(effect, SendKeepalive):
            if peer != entry.flow:
                self._run(entry, core.keepalive_failed(self.clock.now(), "connection lost"))
                return
            self.transport.send_to(b"\r\n\r\n", peer)
            return
        self.transport.send_request(effect.request, peer)

    # -- from SipInbound -----------------------------------------------------------------------
    def on_message(self, message: Request | Response, peer: Peer, now: float) -> bool:
        """A response to one of our REGISTERs or keepalives; False for anything else."""
        if not isinstance(message, Response):
            return False
        try:
            entry = self.by_call_id.get(message.call_id)
        except SipParseError:
            return False
        if entry is None:
            return False
        before = entry.core.state
        effects = entry.core.on_response(message, now)
        if entry.core.state is RegState.REGISTERED:
            if before is not RegState.REGISTERED:
                log.info("sip: registered with trunk %s", entry.trunk.name)
            if message.status < 300:
                entry.flow = peer
        elif entry.core.state is RegState.FAILED and before is not RegState.FAILED:
            log.warning(
                "sip: registration with trunk %s failed: %s",
                entry.trunk.name,
                entry.core.last_error,
            )
        self._run(entry, effects)
        return True

    def on_timeout(self, request: Request, now: float) -> bool:
        try:
            entry = self.by_call_id.get(request.call_id)
        except SipParseError:
            return False
        if entry is None:
            return False
        effects = entry.core.on_failure(request, now, "no response from the registrar")
        if entry.core.state is RegState.FAILED:
            log.warning("sip: registration with trunk %s failed: no response", entry.trunk.name)
        self._run(entry, effects)
        return True

    def trunk_for_invite(self, invite: Request, peer: Peer) -> tuple[SipTrunk, bool] | None:
        """The registering trunk an INVITE arrived on, and whether its Request-URI carries our
        Contact user (then the called number is the To header's; docs/sip.md)."""
        uri = invite.uri
        for entry in self.entries:
            contact = entry.core.p.contact
            if uri.is_sip and uri.user is not None and uri.user == contact.user:
                return entry.trunk, True
        try:
            via = invite.top_via
            source = via.received or via.host
        except SipParseError:
            source = None
        for entry in self.entries:
            if (entry.flow is not None and peer == entry.flow) or (
                source is not None and source == entry.address
            ):
                return entry.trunk, False
        return None

    # -- timer -------------------------------------------------------------------------------
    def _rearm(self) -> None:
        deadlines = [d for e in self.entries if (d := e.core.next_deadline()) is not None]
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not deadlines:
            return
        delay = max(0.0, min(deadlines) - self.clock.now())
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self.clock.now()
        for entry in self.entries:
            due = entry.core.next_deadline()
            if due is not None and due <= now:
                self._run(entry, entry.core.on_timer(now))
        self._rearm()

    # -- GET /v1/trunks ----------------------------------------------------------------------
    def describe(self) -> list[dict[str, Any]]:
        """Every configured trunk with its registration (docs/operations.md, ``/v1/trunks``)."""
        by_name = {e.trunk.name: e for e in self.entries}
        return [self._trunk(trunk, by_name.get(trunk.name)) for trunk in self.cfg.trunks]

    def _trunk(self, trunk: SipTrunk, entry: TrunkRegistration | None) -> dict[str, Any]:
        registration: dict[str, Any]
        if entry is None:
            registration = {"state": RegState.DISABLED.value}
        else:
            core = entry.core
            registration = {"state": core.state.value, "contact": str(core.p.contact)}
            wall = self.clock.wall() - self.clock.now()
            if core.state is RegState.REGISTERED and core.expires_at is not None:
                registration["expiresAt"] = _iso(wall + core.expires_at)
            if core.last_error is not None:
                registration["lastError"] = core.last_error
            if (at := core.next_attempt_at()) is not None:
                registration["nextAttemptAt"] = _iso(wall + at)
        return {
            "name": trunk.name,
            "host": trunk.host,
            "port": trunk.port,
            "transport": trunk.transport,
            "srtp": trunk.srtp,
            "register": trunk.register,
            "registration": registration,
        }

    def counts(self) -> dict[str, int]:
        """Registering trunks per state, for ``/metrics``."""
        out = {state.value: 0 for state in RegState if state is not RegState.DISABLED}
        for entry in self.entries:
            out[entry.core.state.value] += 1
        return out


def describe_without_service(cfg: SipConfig) -> list[dict[str, Any]]:
    """The trunks when the SIP service is not running: nothing is registered."""
    return [
        {
            "name": t.name,
            "host": t.host,
            "port": t.port,
            "transport": t.transport,
            "srtp": t.srtp,
            "register": t.register,
            "registration": {
                "state": (RegState.UNREGISTERED if t.register else RegState.DISABLED).value
            },
        }
        for t in cfg.trunks
    ]


def _local_ip_toward(address: str) -> str:
    """The local address the kernel would use toward ``address`` (a UDP connect sends
    nothing), for a Contact when we listen on a wildcard address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((address, 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"
