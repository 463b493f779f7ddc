"""The plaintext ws:// rule (docs/configuration.md) and redaction."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appbridge.net.plaintext import check_plaintext, parse_authority, plaintext_allowed, redact_url

ALLOWED = [
    # IPv4 loopback, RFC 1918, link-local, edges of each range
    "ws://127.0.0.1/s",
    "ws://127.255.255.254:9000/s",
    "ws://10.0.0.5:9100/listen",
    "ws://10.255.255.255/",
    "ws://172.16.0.1/",
    "ws://172.31.255.255/",
    "ws://192.168.1.20:8080/app?x=1",
    "ws://169.254.10.10/",
    # IPv6 loopback, unique-local, link-local
    "ws://[::1]:9000/s",
    "ws://[fc00::1]/",
    "ws://[fd12:3456:789a::1]:80/",
    "ws://[fe80::1]/",
    "ws://[febf:ffff::1]/",
    # IPv4-mapped IPv6 counts by its IPv4 part
    "ws://[::ffff:10.0.0.5]/",
    "ws://[::ffff:127.0.0.1]:1/",
    "ws://[::ffff:7f00:1]/",
    # zone ids on link-local addresses (RFC 6874 %25, and a bare %)
    "ws://[fe80::1%25eth0]:9000/",
    "ws://[fe80::abcd%eth0]/",
    # names
    "ws://localhost:8080/demo/session",
    "ws://LOCALHOST/",
    "ws://localhost./",
    "ws://app.localhost/",
    "ws://agent.internal:9000/",
    "ws://api.railway.internal/",
    "ws://printer.local/",
    "ws://agent.default.svc.cluster.local:8000/ws",
    # legacy IPv4 spellings that still denote a private address
    "ws://127.1/",
    "ws://0x7f000001/",
    "ws://2130706433/",
    "ws://012.0.0.1/",  # octal 012 = 10
    # wss:// is always accepted
    "wss://8.8.8.8/",
    "wss://app.example.com/session",
    "wss://[2001:db8::1]/",
    # userinfo does not change the host
    "ws://user:pw@10.0.0.1/",
]

REFUSED = [
    "ws://8.8.8.8/",
    "ws://203.0.113.5:9000/",
    "ws://172.15.255.255/",  # just below 172.16/12
    "ws://172.32.0.0/",  # just above
    "ws://192.169.0.1/",
    "ws://169.255.0.1/",
    "ws://100.64.0.1/",  # carrier-grade NAT is not RFC 1918
    "ws://0.0.0.0/",
    "ws://255.255.255.255/",
    "ws://[2001:db8::1]/",
    "ws://[::]/",
    "ws://[fec0::1]/",  # deprecated site-local is not unique-local
    "ws://[::ffff:8.8.8.8]/",  # mapped public IPv4
    "ws://[64:ff9b::a00:5]/",  # NAT64 is not IPv4-mapped
    "ws://[2001:db8::1%25eth0]/",  # a zone does not make a public address private
    "ws://[fd00::1%25eth0]/",  # a zone is accepted only on link-local
    "ws://[::1%25lo]/",
    "ws://app.example.com/",
    "ws://localhost.example.com/",
    "ws://internal.example.com/",
    "ws://example.local.com/",
    "ws://agent./",  # absolute: the TLD "agent", not a search-list name
    # legacy IPv4 spellings of public addresses read as names by a naive rule
    "ws://0x08080808/",
    "ws://134744072/",
    "ws://8.8.2056/",
    "ws://1.2.3.4.5/",  # five numeric parts: not an address, and not a name either
    "ws://256.1.1.1/",
    # malformed or ambiguous
    "ws:///path",
    "ws://",
    "ws://exa mple.local/",
    "ws://evil.com\\@localhost/",
    "ws://[::1/",
    "ws://[127.0.0.1]/",
    "ws://host.local:99999/",
    "ws://host.local:/",
    "ws://a..local/",
    "ws://-bad.local/",
    "ws://münchen.local/",
    "ftp://10.0.0.1/",
    "not a url",
]


@pytest.mark.parametrize("url", ALLOWED)
def test_allowed(url: str) -> None:
    allowed, warning = plaintext_allowed(url)
    assert allowed, check_plaintext(url).reason
    assert warning is None


@pytest.mark.parametrize("url", REFUSED)
def test_refused(url: str) -> None:
    verdict = check_plaintext(url)
    assert not verdict.allowed
    assert verdict.reason
    assert plaintext_allowed(url) == (False, None)


@pytest.mark.parametrize("url", ["ws://agent/", "ws://agent:9000/x", "ws://my_service:80/"])
def test_single_label_is_allowed_with_a_warning(url: str) -> None:
    allowed, warning = plaintext_allowed(url)
    assert allowed
    assert warning is not None
    assert "single-label" in warning
    assert ".internal" in warning


def test_single_label_words_that_are_also_suffixes_only_warn() -> None:
    for url in ("ws://internal/", "ws://local/"):
        allowed, warning = plaintext_allowed(url)
        assert allowed and warning is not None


def test_warning_does_not_leak_path_or_credentials() -> None:
    _, warning = plaintext_allowed("ws://user:secret@agent:9000/path?token=abc")
    assert warning is not None
    assert "secret" not in warning and "token" not in warning and "/path" not in warning
    assert "ws://agent:9000" in warning


def test_public_reason_names_the_address() -> None:
    assert "8.8.8.8" in (check_plaintext("ws://0x08080808/").reason or "")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ws://user:pw@10.0.0.1/path?token=abc#frag", "ws://10.0.0.1:80"),
        ("wss://app.example.com/session?key=1", "wss://app.example.com:443"),
        ("wss://APP.Example.com:8443", "wss://app.example.com:8443"),
        ("ws://[::1]:9000/x", "ws://[::1]:9000"),
        ("ws://[fe80::1%25eth0]/x", "ws://[fe80::1%25eth0]:80"),
        ("https://h/x", "https://h:443"),
        ("http://h/x", "http://h:80"),
        ("not a url with secret", "<invalid url>"),
        ("ws://x\\@y/secret", "<invalid url>"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_parse_authority_fields() -> None:
    authority = parse_authority("WS://Agent.Internal:9000/a/b?c=d")
    assert authority is not None
    assert (authority.scheme, authority.host, authority.port) == ("ws", "agent.internal", 9000)
    assert not authority.is_ipv6_literal
    v6 = parse_authority("ws://[FE80::1%25eth0]/")
    assert v6 is not None
    assert (v6.host, v6.zone, v6.port, v6.effective_port) == ("fe80::1", "eth0", None, 80)
    assert v6.is_ipv6_literal


def test_the_last_at_sign_ends_userinfo_like_urllib() -> None:
    # urllib (used by the websockets client) connects to the host after the last "@"
    authority = parse_authority("ws://a@evil.com@10.0.0.1/")
    assert authority is not None and authority.host == "10.0.0.1"
    assert plaintext_allowed("ws://a@10.0.0.1@evil.com/") == (False, None)


# -- properties: every spelling of an address gets the verdict of the address -----------------

_PRIVATE_V4 = [
    ipaddress.IPv4Network(n)
    for n in ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16")
]


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_ipv4_spellings_agree(value: int) -> None:
    address = ipaddress.IPv4Address(value)
    expected = any(address in net for net in _PRIVATE_V4)
    spellings = [
        str(address),
        str(value),  # one decimal number, as inet_aton reads it
        hex(value),  # 0x...
        f"[::ffff:{address}]",  # IPv4-mapped IPv6
        ".".join(f"0{int(octet):o}" for octet in str(address).split(".")),  # octal octets
    ]
    for host in spellings:
        assert plaintext_allowed(f"ws://{host}:9000/x") == (expected, None), host


@given(st.integers(min_value=0, max_value=2**128 - 1))
def test_ipv6_verdict_matches_the_ranges(value: int) -> None:
    address = ipaddress.IPv6Address(value)
    mapped = address.ipv4_mapped
    if mapped is not None:
        expected = any(mapped in net for net in _PRIVATE_V4)
    else:
        expected = (
            address == ipaddress.IPv6Address("::1")
            or address in ipaddress.IPv6Network("fc00::/7")
            or address in ipaddress.IPv6Network("fe80::/10")
        )
    assert plaintext_allowed(f"ws://[{address}]/") == (expected, None)
    zoned_expected = address in ipaddress.IPv6Network("fe80::/10")
    assert plaintext_allowed(f"ws://[{address}%25eth0]/") == (zoned_expected, None)


@given(st.text(max_size=40))
def test_arbitrary_text_never_raises(text: str) -> None:
    allowed, warning = plaintext_allowed(text)
    assert isinstance(allowed, bool)
    assert warning is None or isinstance(warning, str)
    assert isinstance(redact_url(text), str)
    allowed, _ = plaintext_allowed("ws://" + text)
    assert isinstance(allowed, bool)
