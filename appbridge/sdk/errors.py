"""The SDK's exceptions: one per ``error`` code of the session protocol, plus a closed session.

docs/protocol-session-v1.md, "Errors": the gateway answers a command it cannot carry out with
``error { code, message, fatal, relatesTo }``, where ``relatesTo`` is the command's ``id``. The SDK
gives every command it sends an id of its own, so it can hand that error to whoever awaits the
command, as an exception of the code's own class. An app then writes ``except OnHold:`` instead of
comparing strings. A code this version does not know (the protocol only ever adds them) becomes a
plain :class:`CommandError`, never a crash.

A session that ends or whose socket closes makes every pending await raise
:class:`SessionClosed` (:class:`SessionEnded` when the gateway said why with ``session.end``),
so an app never hangs on a call that is gone.
"""

from __future__ import annotations

from typing import Final

from appbridge.protocol.session_v1 import ErrorEvent

__all__ = [
    "BadMessage",
    "CommandError",
    "FeatureNotSupported",
    "InternalError",
    "InvalidCatalogId",
    "OnHold",
    "PlayFetchFailed",
    "ProviderTimeout",
    "ProviderUnavailable",
    "QueueFull",
    "ReadOnly",
    "SdkError",
    "SessionClosed",
    "SessionEnded",
    "TransferFailed",
    "error_from_event",
]


class SdkError(Exception):
    """Base of every exception the SDK raises on purpose."""


class SessionClosed(SdkError):
    """The session is over (or its socket closed) while a command was pending or being sent."""

    def __init__(self, message: str = "the session is closed", reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        """The ``session.end`` reason when the gateway sent one, else ``None``."""


class SessionEnded(SessionClosed):
    """The gateway ended the session (``session.end``) before the awaited command finished."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the session ended ({reason})", reason)


class CommandError(SdkError):
    """An ``error`` event that answered a command this session sent (docs/protocol-session-v1.md,
    "Errors")."""

    code: str = "unknown"

    def __init__(self, code: str, message: str, relates_to: str | None, fatal: bool = False):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.relates_to = relates_to
        self.fatal = fatal


class BadMessage(CommandError):
    """``bad_message``: a field was wrong or a limit was exceeded."""


class ReadOnly(CommandError):
    """``read_only``: a listen-only socket sent a command."""


class ProviderUnavailable(CommandError):
    """``provider_unavailable``: the speech or language provider failed."""


class ProviderTimeout(CommandError):
    """``provider_timeout``: the provider did not answer in time."""


class InvalidCatalogId(CommandError):
    """``invalid_catalog_id``: a voice or language id is not in the catalog."""


class FeatureNotSupported(CommandError):
    """``feature_not_supported``: the provider or the carrier cannot do what was asked."""


class TransferFailed(CommandError):
    """``transfer_failed``: the transfer target could not be reached."""


class OnHold(CommandError):
    """``on_hold``: the command is not allowed while the caller is on hold."""


class QueueFull(CommandError):
    """``queue_full``: more than 120 s of output is queued."""


class PlayFetchFailed(CommandError):
    """``play_fetch_failed``: the media could not be fetched."""


class InternalError(CommandError):
    """``internal``: anything else (a handoff target that cannot be reached, for one)."""


_BY_CODE: Final[dict[str, type[CommandError]]] = {
    "bad_message": BadMessage,
    "read_only": ReadOnly,
    "provider_unavailable": ProviderUnavailable,
    "provider_timeout": ProviderTimeout,
    "invalid_catalog_id": InvalidCatalogId,
    "feature_not_supported": FeatureNotSupported,
    "transfer_failed": TransferFailed,
    "on_hold": OnHold,
    "queue_full": QueueFull,
    "play_fetch_failed": PlayFetchFailed,
    "internal": InternalError,
}


def error_from_event(event: ErrorEvent) -> CommandError:
    """The exception of ``event``'s code (a plain :class:`CommandError` for an unknown code)."""
    cls = _BY_CODE.get(event.code, CommandError)
    return cls(event.code, event.message, event.relates_to, event.fatal)
