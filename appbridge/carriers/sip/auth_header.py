"""The authentication headers' values: ``scheme auth-param *(COMMA auth-param)``.

WWW-Authenticate, Proxy-Authenticate, Authorization and Proxy-Authorization share this grammar
(RFC 3261 §20.27, §25.1; RFC 7616 §3.3); ``digest.py`` computes what goes in them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from appbridge.carriers.sip.headers import TOKEN_RE, Scanner, quote_string, unquote_string

_AUTH_VALUE_RE = re.compile(r'[^\s,"]+')


@dataclass(frozen=True, slots=True)
class AuthHeader:
    """``scheme auth-param *(COMMA auth-param)``: the value of WWW-Authenticate,
    Proxy-Authenticate, Authorization and Proxy-Authorization (RFC 3261 §20.27, §25.1; RFC 7616
    §3.3). ``params`` are unquoted, keyed by lower-case name, in order."""

    scheme: str
    params: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, text: str) -> AuthHeader:
        s = Scanner(text.strip(), "authentication header")
        scheme = s.match(TOKEN_RE)
        params: list[tuple[str, str]] = []
        if not s.at_end():
            if s.peek() not in " \t":
                raise s.fail()
            while True:
                s.skip_ws()
                name = s.match(TOKEN_RE).lower()
                s.skip_ws()
                s.expect("=")
                s.skip_ws()
                raw = s.quoted() if s.peek() == '"' else s.match(_AUTH_VALUE_RE)
                params.append((name, unquote_string(raw)))
                s.skip_ws()
                if s.at_end():
                    break
                s.expect(",")
        return cls(scheme=scheme, params=tuple(params))

    def get(self, name: str) -> str | None:
        lower = name.lower()
        for key, value in self.params:
            if key == lower:
                return value
        return None

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.params)


def format_auth(scheme: str, params: list[tuple[str, str, bool]]) -> str:
    """Serialise ``(name, value, quoted)`` auth-params after ``scheme`` (RFC 7616 §3.4 says
    which are quoted: algorithm, nc and qop are tokens, the rest quoted-strings)."""
    parts = [f"{name}={quote_string(value) if quoted else value}" for name, value, quoted in params]
    return f"{scheme} " + ", ".join(parts)
