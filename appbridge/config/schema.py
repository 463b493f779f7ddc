"""Checking primitives for the configuration file: typed reads, ``${NAME}``, value formats.

Three rules of docs/configuration.md ("General rules") shape this module:

- A string value that is exactly ``"${NAME}"`` is read from the environment variable NAME, and a
  missing variable is a configuration error. The lookup happens when a key is *read*, so a
  reference inside an unknown key is reported once (as the unknown key), not twice. Environment
  values are text; a reference in an integer, number or boolean key is converted from its text
  (``port = "${PORT}"`` works), since an operator cannot put a TOML integer in a variable.
- Unknown keys are errors, at every level, so a typo never passes silently.
- Every problem is collected, each as ``"<key.path>: <message>"``; checking never stops at the
  first one, so one run of ``appbridge check-config`` shows everything to fix.

Types are strict: TOML ``true`` is not an integer (Python's ``bool`` is an ``int`` subclass, which
is why every integer read checks for ``bool`` first), and ``"80"`` is not a port unless it came
from the environment. Secret values are never echoed in messages.
"""

from __future__ import annotations

import ipaddress
import json
import re
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")

CA_BUNDLE_MAX_CERTS: Final = 16
CA_BUNDLE_MAX_BYTES: Final = 256 * 1024
"""A private CA bundle holds at most 16 PEM certificates in at most 256 KiB (docs/configuration.md,
``[server]``), enough for any real chain while keeping start-up reads small."""
MAX_REF_CHARS: Final = 128
"""Ids are at most 128 characters, the limit of ids in docs/protocol-session-v1.md."""

_ENV_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_LOOKS_LIKE_ENV_REF_RE = re.compile(r"\$\{.*\}", re.DOTALL)
_INT_TEXT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_LABEL_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_E164_RE = re.compile(r"\+[0-9]{2,15}")
_REF_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
_PEM_CERT_RE = re.compile(
    rb"-----BEGIN CERTIFICATE-----\s*(.*?)-----END CERTIFICATE-----", re.DOTALL
)

# RFC 5646 §2.1 (BCP 47) well-formedness, case-insensitive; grandfathered tags are listed whole.
_ALNUM = "[a-z0-9]"
_LANGTAG = (
    r"(?:[a-z]{2,3}(?:-[a-z]{3}){0,3}|[a-z]{4}|[a-z]{5,8})"  # language (with extlang)
    r"(?:-[a-z]{4})?"  # script
    r"(?:-(?:[a-z]{2}|[0-9]{3}))?"  # region
    rf"(?:-(?:{_ALNUM}{{5,8}}|[0-9]{_ALNUM}{{3}}))*"  # variants
    rf"(?:-[0-9a-wy-z](?:-{_ALNUM}{{2,8}})+)*"  # extensions
    rf"(?:-x(?:-{_ALNUM}{{1,8}})+)?"  # private use
)
_PRIVATEUSE = rf"x(?:-{_ALNUM}{{1,8}})+"
_GRANDFATHERED = (
    "en-gb-oed|i-ami|i-bnn|i-default|i-enochian|i-hak|i-klingon|i-lux|i-mingo|i-navajo|i-pwn|"
    "i-tao|i-tay|i-tsu|sgn-be-fr|sgn-be-nl|sgn-ch-de|art-lojban|cel-gaulish|no-bok|no-nyn|"
    "zh-guoyu|zh-hakka|zh-min|zh-min-nan|zh-xiang"
)
_BCP47_RE = re.compile(rf"(?:{_GRANDFATHERED})|{_PRIVATEUSE}|{_LANGTAG}", re.IGNORECASE)


class _Missing:
    """Marks a value that could not be read; its problem is already recorded."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()


class EnvValue(str):
    """A string that came from the environment through ``${NAME}``."""


def key_path(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def item_path(parent: str, index: int) -> str:
    return f"{parent}[{index}]"


def describe(value: object, *, secret: bool = False) -> str:
    """A value as a problem message shows it: TOML spelling, strings quoted, secrets hidden."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        if secret:
            return "a string"
        text = value if len(value) <= 60 else value[:57] + "..."
        return json.dumps(text, ensure_ascii=False)
    if isinstance(value, int | float):
        return "a number" if secret else repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__}"


class Reader:
    """Collects problems and warnings while typed getters walk the parsed TOML."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[str] = []
        self.warnings: list[str] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    # -- structure -----------------------------------------------------------------------------

    def check_keys(self, path: str, table: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
        for key in table:
            if key not in allowed:
                self.problem(key_path(path, key), "unknown key")

    def resolve(self, value: Any, path: str) -> Any:
        """Apply ``${NAME}`` to a string value; other values pass through."""
        if not isinstance(value, str) or not value.startswith("${"):
            return value
        match = _ENV_REF_RE.fullmatch(value)
        if match is None:
            if _LOOKS_LIKE_ENV_REF_RE.fullmatch(value):
                self.problem(path, 'not a valid "${NAME}" reference (NAME: letters, digits, _)')
                return MISSING
            return value
        name = match.group(1)
        if name not in self.env:
            self.problem(path, f"environment variable {name} is not set")
            return MISSING
        return EnvValue(self.env[name])

    def table(self, parent: Mapping[str, Any], key: str, path: str) -> dict[str, Any] | None:
        """An optional sub-table; ``None`` when absent or of the wrong type (reported)."""
        if key not in parent:
            return None
        value = parent[key]
        if not isinstance(value, dict):
            self.problem(path, f"expected a table, got {describe(value)}")
            return None
        return value

    def array(self, parent: Mapping[str, Any], key: str, path: str) -> list[Any] | None:
        if key not in parent:
            return None
        value = parent[key]
        if not isinstance(value, list):
            self.problem(path, f"expected an array, got {describe(value)}")
            return None
        return value

    def tables(self, parent: Mapping[str, Any], key: str, path: str) -> list[dict[str, Any]]:
        """An array of tables (``[[apps]]``); entries of another type are reported and skipped."""
        items = self.array(parent, key, path)
        result: list[dict[str, Any]] = []
        for index, item in enumerate(items or []):
            if isinstance(item, dict):
                result.append(item)
            else:
                self.problem(item_path(path, index), f"expected a table, got {describe(item)}")
                result.append({})
        return result

    # -- scalars -------------------------------------------------------------------------------

    def string(
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        *,
        required: bool = False,
        secret: bool = False,
        max_chars: int = 4096,
    ) -> str | None:
        """A non-empty string; ``None`` when absent (reported if required) or invalid."""
        if key not in parent:
            if required:
                self.problem(path, "missing (required)")
            return None
        return self.string_value(parent[key], path, secret=secret, max_chars=max_chars)

    def string_value(
        self, raw: Any, path: str, *, secret: bool = False, max_chars: int = 4096
    ) -> str | None:
        value = self.resolve(raw, path)
        if value is MISSING:
            return None
        if not isinstance(value, str):
            self.problem(path, f"expected a string, got {describe(value, secret=secret)}")
            return None
        if not value:
            self.problem(path, "must not be empty")
            return None
        if len(value) > max_chars:
            self.problem(path, f"longer than {max_chars} characters")
            return None
        return str(value)

    def choice(
        self, parent: Mapping[str, Any], key: str, path: str, options: tuple[str, ...], default: str
    ) -> str:
        value = self.string(parent, key, path)
        if value is None:
            return default
        if value not in options:
            listed = ", ".join(f'"{option}"' for option in options)
            self.problem(path, f"expected one of {listed}, got {describe(value)}")
            return default
        return value

    def integer(
        self, parent: Mapping[str, Any], key: str, path: str, *, default: int, low: int, high: int
    ) -> int:
        if key not in parent:
            return default
        return self.integer_value(parent[key], path, low=low, high=high, default=default)

    def integer_value(self, raw: Any, path: str, *, low: int, high: int, default: int) -> int:
        value = self.resolve(raw, path)
        if value is MISSING:
            return default
        if isinstance(value, EnvValue) and _INT_TEXT_RE.fullmatch(value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.problem(path, f"expected an integer {low}-{high}, got {describe(value)}")
            return default
        return value

    def number(
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        *,
        default: float,
        low: float,
        high: float,
    ) -> float:
        """A positive number (integer or float) in ``(low, high]``."""
        if key not in parent:
            return default
        value = self.resolve(parent[key], path)
        if value is MISSING:
            return default
        if isinstance(value, EnvValue) and _FLOAT_TEXT_RE.fullmatch(value):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
            self.problem(
                path, f"expected a number above {low:g} up to {high:g}, got {describe(value)}"
            )
            return default
        return float(value)

    def boolean(self, parent: Mapping[str, Any], key: str, path: str, *, default: bool) -> bool:
        if key not in parent:
            return default
        value = self.resolve(parent[key], path)
        if value is MISSING:
            return default
        if isinstance(value, EnvValue) and value in ("true", "false"):
            return value == "true"
        if not isinstance(value, bool):
            self.problem(path, f"expected true or false, got {describe(value)}")
            return default
        return value

    def strings(
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        check: Callable[[str], str | None] | None = None,
        *,
        secret: bool = False,
    ) -> list[str] | None:
        """An array of non-empty strings; ``check`` returns a problem message or ``None``."""
        items = self.array(parent, key, path)
        if items is None:
            return None
        result: list[str] = []
        for index, item in enumerate(items):
            item_at = item_path(path, index)
            value = self.string_value(item, item_at, secret=secret)
            if value is None:
                continue
            message = check(value) if check is not None else None
            if message is not None:
                self.problem(item_at, message)
                continue
            result.append(value)
        return result


# -- value formats ---------------------------------------------------------------------------


def is_e164(text: str) -> bool:
    """``+`` and 2 to 15 digits (ITU-T E.164 allows at most 15)."""
    return _E164_RE.fullmatch(text) is not None


def is_bcp47(text: str) -> bool:
    """Well-formed per RFC 5646 §2.1 (syntax only; subtags are not checked against a registry)."""
    return _BCP47_RE.fullmatch(text) is not None


def is_host(text: str) -> bool:
    """An IPv4/IPv6 address or a DNS name (labels of letters, digits, ``-`` and ``_``)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    name = text[:-1] if text.endswith(".") else text
    return 0 < len(name) <= 253 and all(_LABEL_RE.fullmatch(label) for label in name.split("."))


def check_cidr(text: str) -> str | None:
    """A problem message for an ``allow`` network, or ``None``; a bare address is a /32 or /128."""
    try:
        ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        return f"expected a network such as 198.51.100.0/24, got {describe(text)} ({exc})"
    return None


def check_http_base_url(text: str) -> str | None:
    """``public_url`` / ``api_base``: http(s), a host, an optional path prefix without a
    trailing slash, and no userinfo, query or fragment (docs/configuration.md, ``[server]``:
    routes are appended)."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    del port
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"expected an http:// or https:// URL, got {describe(text)}"
    if "@" in parts.netloc:
        return "must not contain user info"
    if parts.query or "?" in text:
        return "must not have a query string"
    if parts.fragment or "#" in text:
        return "must not have a fragment"
    if parts.path.endswith("/"):
        return "must not end with a slash (routes are appended to it)"
    return None


def check_ca_bundle(path: Path) -> str | None:
    """A private CA bundle must be readable, not empty, 1 to 16 PEM certificates, at most
    256 KiB, and accepted by OpenSSL. Returns a problem message or ``None``."""
    try:
        size_bytes = path.stat().st_size
        if not path.is_file():
            return f"{path} is not a file"
        if size_bytes > CA_BUNDLE_MAX_BYTES:
            return f"{path} is {size_bytes} bytes; at most {CA_BUNDLE_MAX_BYTES} are allowed"
        data = path.read_bytes()
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if not data.strip():
        return f"{path} is empty"
    blocks = _PEM_CERT_RE.findall(data)
    if not blocks:
        return f"{path} holds no PEM certificate"
    if len(blocks) > CA_BUNDLE_MAX_CERTS:
        return f"{path} holds {len(blocks)} certificates; at most {CA_BUNDLE_MAX_CERTS} are allowed"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=str(path))
    except (ssl.SSLError, ValueError) as exc:
        return f"{path} is not a valid PEM bundle ({exc})"
    loaded = context.cert_store_stats()["x509"]
    distinct = len({b"".join(block.split()) for block in blocks})
    if loaded < distinct:
        return (
            f"{path} is not a valid PEM bundle (OpenSSL loaded {loaded} of {distinct} certificates)"
        )
    return None


# -- identifiers shared by several sections ------------------------------------------------------


def read_ref(
    reader: Reader,
    table: Mapping[str, Any],
    key: str,
    path: str,
    seen: dict[str, str],
    what: str,
) -> str | None:
    """A required, unique identifier of 1-128 characters from ``[A-Za-z0-9._-]``."""
    value = reader.string(table, key, path, required=True, max_chars=MAX_REF_CHARS)
    if value is None:
        return None
    if not _REF_RE.fullmatch(value):
        reader.problem(path, f"expected letters, digits, '.', '_' or '-', got {describe(value)}")
        return None
    if value in seen:
        reader.problem(path, f"duplicate {what} {describe(value)} (first at {seen[value]})")
        return None
    seen[value] = path.rsplit(".", 1)[0]
    return value


def read_account_sid(reader: Reader, table: Mapping[str, Any], path: str) -> str:
    """A Twilio-style account SID: ``AC`` and 32 hex digits."""
    value = reader.string(table, "account_sid", path, required=True)
    if value is None:
        return ""
    body = value[2:]
    if not (
        value.startswith("AC")
        and len(body) == 32
        and all(c in "0123456789abcdefABCDEF" for c in body)
    ):
        reader.problem(path, f'expected "AC" and 32 hex digits, got {describe(value)}')
    return value


def check_redis_url(text: str) -> str | None:
    """``[cluster] redis_url``: ``redis://`` or ``rediss://`` (TLS) with a host, the form
    redis-py's ``from_url`` reads (docs/configuration.md, ``[cluster]``)."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    del port
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        return f"expected a redis:// or rediss:// URL, got {describe(text, secret=True)}"
    return None
