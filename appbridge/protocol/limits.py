"""Frame-size limits shared by the wire codecs."""

from __future__ import annotations


def utf8_size_over(frame: bytes | str, limit_bytes: int) -> bool:
    """Whether ``frame`` is over ``limit_bytes`` in UTF-8, without encoding a str unless its
    length alone cannot tell (a character is 1 to 4 bytes)."""
    if isinstance(frame, str):
        if len(frame) > limit_bytes:
            return True
        if len(frame) * 4 <= limit_bytes:
            return False
        return len(frame.encode("utf-8", "surrogatepass")) > limit_bytes
    return len(frame) > limit_bytes
