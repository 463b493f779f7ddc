"""Fetching ``play`` media for an app, within bounds (docs/configuration.md, ``[media]``).

Every URL is fetched with bounded size, time and redirects, http/https only, and never from
loopback, private or link-local addresses unless the operator allows it (``[media]
allow_private = true``). Cloud metadata services (by name and by address) are refused even
then: they hand out the host's credentials. Each redirect target is checked again. The host is
resolved here and every address it resolves to is checked; the request then goes to the checked
name (a DNS answer that changes between the two is a documented, accepted window).

A URL comes from an app, so whatever is wrong with it (a host that cannot be IDNA-encoded, a bad
port) is a :class:`FetchError`, answered ``play_fetch_failed``, and never anything else.

Formats (docs/protocol-session-v1.md, ``play``): WAV (PCM or µ-law, any rate), and headerless audio
named by its Content-Type: ``audio/basic``/``audio/x-mulaw``/``audio/pcmu`` (µ-law, ``rate``
parameter or 8 kHz) and ``audio/L16`` (RFC 2586: big-endian 16-bit, ``rate`` parameter required).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from typing import Final, Protocol
from urllib.parse import urljoin, urlsplit

import httpx

from appbridge.media.codecs import AudioFormat, Converter, ulaw_to_pcm16
from appbridge.media.wav import DecodedAudio, WavError, parse_wav


class FetchLimits(Protocol):
    @property
    def allow_private(self) -> bool: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def max_redirects(self) -> int: ...


class FetchError(Exception):
    pass


@dataclass(frozen=True)
class DefaultLimits:
    allow_private: bool = False
    max_bytes: int = 16 * 1024 * 1024
    timeout_s: float = 10.0
    max_redirects: int = 3


#: Cloud instance-metadata services: refused whatever ``allow_private`` says.
_METADATA_HOSTS = frozenset(
    {"metadata.google.internal", "metadata", "instance-data", "instance-data.ec2.internal"}
)
_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle
        "169.254.169.253",  # AWS's DNS resolver
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.123",  # AWS time sync
        "100.100.100.200",  # Alibaba Cloud
        "fd00:ec2::254",  # AWS over IPv6
        "fd00:ec2::23",
    )
)


def _is_metadata(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip in _METADATA_ADDRESSES


def _address_blocked(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return bool(
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or (isinstance(ip, ipaddress.IPv4Address) and ip in ipaddress.ip_network("100.64.0.0/10"))
    )


async def _check_target(url: str, limits: FetchLimits) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise FetchError(f"only http and https URLs can be played, not {parts.scheme or 'none'}:")
    host = parts.hostname
    if not host:
        raise FetchError("the URL has no host")
    if host.lower().rstrip(".") in _METADATA_HOSTS:
        raise FetchError(f"{host} is a metadata address")
    for ip in await _addresses(host, parts.port or (443 if parts.scheme == "https" else 80)):
        if _is_metadata(ip):
            raise FetchError(f"{host} resolves to {ip}, a cloud metadata address")
        if not limits.allow_private and _address_blocked(ip):
            raise FetchError(
                f"{host} resolves to {ip}, a loopback/private/link-local address "
                "(allowed only with [media] allow_private = true)"
            )


async def _addresses(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise FetchError(f"cannot resolve {host}: {exc.strerror or exc}") from None
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


#: Source audio that `convert_for_call` converts at a time, letting the event loop run between.
SLICE_MS: Final = 50


async def convert_for_call(audio: DecodedAudio, out_format: AudioFormat) -> bytes:
    """A fetched file in the call's format, converted a slice at a time with the event loop
    running between slices. Going down in rate the low-pass filter costs up to 1001 taps per
    sample (media/antialias.py): a file at the size limit, converted in one piece, would hold
    every call's media back for up to a second."""
    conv = Converter(AudioFormat("pcm16", audio.rate_hz), out_format)
    pcm, step = audio.pcm16, max(2, audio.rate_hz * SLICE_MS // 1000 * 2)
    parts = []
    for at in range(0, len(pcm), step):
        parts.append(conv.convert(pcm[at : at + step]))
        await asyncio.sleep(0)
    return b"".join(parts)


async def fetch_audio(client: httpx.AsyncClient, url: str, limits: FetchLimits) -> DecodedAudio:
    try:
        async with asyncio.timeout(limits.timeout_s):
            body, content_type = await _fetch_bytes(client, url, limits)
    except TimeoutError:
        raise FetchError(f"no complete answer within {limits.timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise FetchError(f"{type(exc).__name__}: {exc}") from None
    except (httpx.InvalidURL, ValueError) as exc:
        # A host that cannot be IDNA-encoded (UnicodeError), a port out of range: the app's URL.
        raise FetchError(f"bad URL: {exc}") from None
    return decode_audio(body, content_type)


async def _fetch_bytes(
    client: httpx.AsyncClient, url: str, limits: FetchLimits
) -> tuple[bytes, str]:
    for _ in range(limits.max_redirects + 1):
        await _check_target(url, limits)
        async with client.stream("GET", url, follow_redirects=False) as resp:
            if resp.is_redirect:
                location = resp.headers.get("location")
                if not location:
                    raise FetchError(f"HTTP {resp.status_code} without a Location")
                url = urljoin(url, location)
                continue
            if resp.status_code != 200:
                raise FetchError(f"HTTP {resp.status_code}")
            declared = resp.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > limits.max_bytes:
                raise FetchError(f"{declared} bytes is over the {limits.max_bytes}-byte limit")
            chunks: list[bytes] = []
            total = 0
            async for chunk in resp.aiter_bytes():
                total += len(chunk)
                if total > limits.max_bytes:
                    raise FetchError(f"more than the {limits.max_bytes}-byte limit")
                chunks.append(chunk)
            return b"".join(chunks), resp.headers.get("content-type", "")
    raise FetchError(f"more than {limits.max_redirects} redirects")


def decode_audio(body: bytes, content_type: str) -> DecodedAudio:
    mime, _, params_text = content_type.partition(";")
    mime = mime.strip().lower()
    params = {}
    for part in params_text.split(";"):
        name, _, value = part.partition("=")
        if name.strip():
            params[name.strip().lower()] = value.strip().strip('"')
    if body[:4] == b"RIFF" or mime in ("audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"):
        try:
            return parse_wav(body)
        except WavError as exc:
            raise FetchError(f"bad WAV: {exc}") from None
    rate = _rate(params)
    if mime in ("audio/basic", "audio/x-mulaw", "audio/pcmu", "audio/mulaw"):
        return DecodedAudio(pcm16=ulaw_to_pcm16(body), rate_hz=rate or 8000)
    if mime in ("audio/l16", "audio/x-l16"):
        if rate is None:
            raise FetchError("audio/L16 needs a rate parameter (RFC 2586)")
        if len(body) % 2:
            body = body[:-1]
        return DecodedAudio(pcm16=_be16_to_le16(body), rate_hz=rate)
    raise FetchError(
        f"unsupported media type {mime or 'none'!r}: "
        "use WAV (PCM or µ-law), audio/basic or audio/L16"
    )


def _rate(params: dict[str, str]) -> int | None:
    value = params.get("rate")
    if value is None:
        return None
    if not value.isdigit() or not 4000 <= int(value) <= 192000:
        raise FetchError(f"bad rate parameter {value!r}")
    return int(value)


def _be16_to_le16(data: bytes) -> bytes:
    swapped = bytearray(len(data))
    swapped[0::2] = data[1::2]
    swapped[1::2] = data[0::2]
    return bytes(swapped)
