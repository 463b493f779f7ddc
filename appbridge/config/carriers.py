"""Readers of the carrier sections: ``[carriers.twilio]`` and ``[sip]`` with its trunks.

How Twilio and SIP trunks reach the gateway (docs/configuration.md, ``[carriers.twilio]`` and
``[sip]``; docs/sip.md). A trunk name is unique like an app ref, and RTP ports come in pairs
because RTCP takes the odd port above each RTP port (RFC 3550 §11).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from appbridge.config.model import (
    DEFAULT_RTP_PORTS,
    DEFAULT_SIP_LISTEN,
    TWILIO_API_BASE,
    SipConfig,
    SipTransport,
    SipTrunk,
    SrtpMode,
    TwilioCarrierConfig,
)
from appbridge.config.schema import (
    Reader,
    check_cidr,
    check_http_base_url,
    describe,
    is_host,
    item_path,
    key_path,
    read_account_sid,
    read_ref,
)
from appbridge.config.tls import parse_tls_files

_LISTEN_RE = re.compile(r"(udp|tcp|tls):(\[[^\]]*\]|[^:\[\]]+):([0-9]{1,5})")


def parse_twilio(reader: Reader, data: Mapping[str, Any]) -> TwilioCarrierConfig | None:
    carriers = reader.table(data, "carriers", "carriers")
    if carriers is None:
        return None
    reader.check_keys("carriers", carriers, ("twilio",))
    table = reader.table(carriers, "twilio", "carriers.twilio")
    if table is None:
        return None
    path = "carriers.twilio"
    reader.check_keys(path, table, ("account_sid", "auth_token", "api_base"))
    account_sid = read_account_sid(reader, table, key_path(path, "account_sid"))
    token = reader.string(table, "auth_token", key_path(path, "auth_token"), secret=True)
    if token is None and "auth_token" not in table:
        reader.warn(
            "carriers.twilio.auth_token is not set: Twilio webhooks and media streams are "
            "accepted without X-Twilio-Signature checks, and transfers cannot use the REST API"
        )
    api_base = reader.string(table, "api_base", key_path(path, "api_base")) or TWILIO_API_BASE
    message = check_http_base_url(api_base)
    if message is not None:
        reader.problem(key_path(path, "api_base"), message)
    return TwilioCarrierConfig(account_sid, token, api_base)


def parse_sip(reader: Reader, data: Mapping[str, Any], base_dir: Path) -> SipConfig | None:
    """``[sip]``: the listeners, the RTP port range and the trunks (docs/sip.md, "Trunks and
    who may call")."""
    table = reader.table(data, "sip", "sip")
    if table is None:
        return None
    reader.check_keys("sip", table, ("listen", "rtp_ports", "public_address", "trunks", "tls"))
    listen: tuple[str, ...] = DEFAULT_SIP_LISTEN
    if "listen" in table:
        entries = reader.strings(table, "listen", "sip.listen", _check_listen) or []
        if isinstance(table["listen"], list) and not table["listen"]:
            reader.problem("sip.listen", "must hold at least one entry")
        _report_duplicates(reader, "sip.listen", entries)
        listen = tuple(entries)
    rtp_ports = _parse_rtp_ports(reader, table)
    public_address = reader.string(table, "public_address", "sip.public_address")
    if public_address is not None and not is_host(public_address):
        reader.problem(
            "sip.public_address",
            f"expected an IP address or host name, got {describe(public_address)}",
        )
    trunks: list[SipTrunk] = []
    seen: dict[str, str] = {}
    for index, entry in enumerate(reader.tables(table, "trunks", "sip.trunks")):
        trunk = _parse_trunk(reader, item_path("sip.trunks", index), entry, seen)
        if trunk is not None:
            trunks.append(trunk)
    tls = parse_tls_files(reader, table, "sip.tls", base_dir, with_ca=True)
    if tls is None and "tls" not in table and any(e.startswith("tls:") for e in listen):
        reader.problem("sip.listen", 'a "tls:" listener needs [sip] tls (cert_file, key_file)')
    return SipConfig(listen, rtp_ports, public_address, tuple(trunks), tls)


def _check_listen(text: str) -> str | None:
    match = _LISTEN_RE.fullmatch(text)
    expected = f'expected "udp:HOST:PORT", "tcp:HOST:PORT" or "tls:HOST:PORT", got {describe(text)}'
    if match is None:
        return expected
    host = match.group(2)
    if host.startswith("["):
        host = host[1:-1]
        if ":" not in host:
            return expected
    if not is_host(host) or not 1 <= int(match.group(3)) <= 65535:
        return expected
    return None


def _parse_rtp_ports(reader: Reader, table: Mapping[str, Any]) -> tuple[int, int]:
    """An ordered range within 1024..65535 with an even count: RTP and RTCP take port pairs."""
    path = "sip.rtp_ports"
    if "rtp_ports" not in table:
        return DEFAULT_RTP_PORTS
    items = reader.array(table, "rtp_ports", path)
    if items is None:
        return DEFAULT_RTP_PORTS
    if len(items) != 2:
        reader.problem(path, f"expected two ports [first, last], got {len(items)} values")
        return DEFAULT_RTP_PORTS
    problems_before = len(reader.problems)
    low, high = (
        reader.integer_value(item, item_path(path, i), low=1024, high=65535, default=0)
        for i, item in enumerate(items)
    )
    if len(reader.problems) > problems_before:
        return DEFAULT_RTP_PORTS
    if low >= high:
        reader.problem(path, f"the first port must be below the last, got [{low}, {high}]")
    elif (high - low + 1) % 2:
        reader.problem(path, f"the range must hold an even number of ports, got {high - low + 1}")
    return (low, high)


def _parse_trunk(
    reader: Reader, path: str, table: Mapping[str, Any], seen: dict[str, str]
) -> SipTrunk | None:
    reader.check_keys(path, table, _TRUNK_KEYS)
    name = read_ref(reader, table, "name", key_path(path, "name"), seen, "trunk name")
    host = reader.string(table, "host", key_path(path, "host"), required=True)
    if host is not None and not is_host(host):
        reader.problem(
            key_path(path, "host"), f"expected an IP address or host name, got {describe(host)}"
        )
    transport = reader.choice(
        table, "transport", key_path(path, "transport"), ("udp", "tcp", "tls"), "udp"
    )
    default_port = 5061 if transport == "tls" else 5060
    port = reader.integer(
        table, "port", key_path(path, "port"), default=default_port, low=1, high=65535
    )
    username = reader.string(table, "username", key_path(path, "username"))
    password = reader.string(table, "password", key_path(path, "password"), secret=True)
    if password is not None and username is None and "username" not in table:
        reader.problem(key_path(path, "password"), "set without username")
    allow = reader.strings(table, "allow", key_path(path, "allow"), check_cidr) or []
    srtp = reader.choice(
        table,
        "srtp",
        key_path(path, "srtp"),
        ("off", "optional", "required"),
        "required" if transport == "tls" else "off",
    )
    register = reader.boolean(table, "register", key_path(path, "register"), default=False)
    if register and ("username" not in table or "password" not in table):
        reader.problem(key_path(path, "register"), "needs username and password")
    expires = reader.integer(
        table,
        "register_expires_s",
        key_path(path, "register_expires_s"),
        default=3600,
        low=60,
        high=86400,
    )
    if name is None or host is None:
        return None
    return SipTrunk(
        name,
        host,
        port,
        cast(SipTransport, transport),
        username,
        password,
        tuple(allow),
        cast(SrtpMode, srtp),
        register,
        expires,
    )


_TRUNK_KEYS = (
    "name",
    "host",
    "port",
    "transport",
    "username",
    "password",
    "allow",
    "srtp",
    "register",
    "register_expires_s",
)


def _report_duplicates(reader: Reader, path: str, values: list[str]) -> None:
    first: dict[str, int] = {}
    for index, value in enumerate(values):
        if value in first:
            reader.problem(path, f"duplicate entry {describe(value)}")
        first.setdefault(value, index)
