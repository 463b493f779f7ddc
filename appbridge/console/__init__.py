"""The call console's backend: what ``GET /v1/console/calls`` and each call's timeline show
(docs/operations.md, "The console and the softphone")."""

from appbridge.console.board import CallConsole
from appbridge.console.recorder import CallRecorder

__all__ = ["CallConsole", "CallRecorder"]
