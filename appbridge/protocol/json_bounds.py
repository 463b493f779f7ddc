"""JSON from a peer, whatever its shape (docs/protocol-session-v1.md, "Errors for bad input").

msgspec guards its recursion with the interpreter's limit: a document nested deeper than that
raises :class:`RecursionError`, not a decode error. A peer chooses the nesting, so every decoder
of peer JSON (app messages, Twilio Media Stream messages, HTTP bodies) catches it too, and takes
the slow path here to answer it: :func:`top_level_strings` still finds a too-deep message's
``type`` and ``id`` without building its nested values, so the answer relates to the message.
The fast path (a well-formed message) pays nothing for this.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any, Final

import msgspec

#: The message of every answer to JSON nested too deeply to decode.
TOO_DEEP: Final = "JSON nested too deeply"

# One token of JSON: a string, a bracket, a colon or a comma; numbers, literals and whitespace
# between them are skipped.
_TOKEN_RE: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]', re.DOTALL)
_string_decoder: Final = msgspec.json.Decoder(str)
_any_decoder: Final = msgspec.json.Decoder()


class JsonBodyError(ValueError):
    """A body that is not the JSON object expected; the message is safe to send back."""


def top_level_strings(data: bytes | str, names: Collection[str]) -> dict[str, str]:
    """The string values of the top-level members ``names`` of a JSON object.

    Nested values are skipped by counting brackets, so any depth costs one linear scan. A
    member whose value is not a string is left out; so is everything when the document is not
    an object."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    found: dict[str, str] = {}
    depth = 0
    key: str | None = None
    expect_key = False
    for m in _TOKEN_RE.finditer(raw):
        token = m.group()
        first = token[0]
        if first == 0x22:  # a string
            if depth == 1 and expect_key:
                key, expect_key = _string(token), False
            elif depth == 1 and key is not None:
                if key in names and key not in found:
                    value = _string(token)
                    if value is not None:
                        found[key] = value
                key = None
            continue
        if first in (0x7B, 0x5B):  # { [
            if depth == 0 and first != 0x7B:
                return {}
            depth += 1
            expect_key = depth == 1
            if depth == 2:
                key = None
        elif first in (0x7D, 0x5D):  # } ]
            depth -= 1
            if depth <= 0:
                return found
        elif first == 0x2C and depth == 1:  # a comma between members
            expect_key, key = True, None
    return found


def _string(token: bytes) -> str | None:
    try:
        return _string_decoder.decode(token)
    except msgspec.MsgspecError:
        return None


def loads(data: bytes | str) -> Any:
    """Any JSON value from a peer (a vendor's answer, say); whatever is wrong with it, however
    deep, raises :class:`JsonBodyError`, a :class:`ValueError`."""
    try:
        return _any_decoder.decode(data)
    except RecursionError:
        raise JsonBodyError(TOO_DEEP) from None
    except msgspec.MsgspecError as exc:
        raise JsonBodyError(f"not valid JSON: {exc}") from None


def loads_object(body: bytes, *, max_bytes: int) -> dict[str, Any]:
    """An HTTP body that must be one JSON object of at most ``max_bytes``; anything else
    raises :class:`JsonBodyError` with a message for a 400 answer."""
    if len(body) > max_bytes:
        raise JsonBodyError(f"the body is over {max_bytes} bytes")
    try:
        data = _any_decoder.decode(body)
    except RecursionError:
        raise JsonBodyError(f"the body is not valid JSON: {TOO_DEEP}") from None
    except msgspec.MsgspecError as exc:
        raise JsonBodyError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise JsonBodyError("the body must be a JSON object")
    return data
