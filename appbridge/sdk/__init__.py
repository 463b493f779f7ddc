"""``appbridge.sdk``: write a ``fonoster.session.v1`` voice app in a dozen lines.

Most apps use an SDK that builds ``say``, ``gather`` and the rest from the
protocol's messages, and sends ``clear`` when the caller starts talking over an interruptible
item. This is that SDK for Python (asyncio)::

    from appbridge.sdk import AppServer, Session

    async def handler(session: Session) -> None:
        await session.say("Hello! Say something, or press a key.")
        answer = await session.gather(timeout_s=8)
        await session.say(f"You said {answer.text or answer.digits or 'nothing'}.")

    asyncio.run(AppServer(handler, secrets="my-secret").serve_forever("127.0.0.1", 9000))

The tutorial and the reference are docs/sdk.md.
"""

from appbridge.protocol.signing import fonoster_headers
from appbridge.sdk.errors import (
    BadMessage,
    CommandError,
    FeatureNotSupported,
    InternalError,
    InvalidCatalogId,
    OnHold,
    PlayFetchFailed,
    ProviderTimeout,
    ProviderUnavailable,
    QueueFull,
    ReadOnly,
    SdkError,
    SessionClosed,
    SessionEnded,
    TransferFailed,
)
from appbridge.sdk.events import (
    AudioFrame,
    DtmfEvent,
    ErrorEvent,
    Event,
    EventsLost,
    GatherResult,
    MarkEvent,
    OutputDone,
    OutputInterrupted,
    OutputQueueLevel,
    OutputResult,
    OutputStarted,
    Resumed,
    SessionEnd,
    SessionStart,
    TranscriptPartial,
    TurnBackchannel,
    TurnEnded,
    TurnEstimate,
    TurnLikelyEnded,
    TurnResumed,
    TurnUserStarted,
)
from appbridge.sdk.handles import Output, Pending, TransferHandle
from appbridge.sdk.server import AppServer, Handler, ResumeHook
from appbridge.sdk.session import Session
from appbridge.sdk.verification import Verifier

__all__ = [
    "AppServer",
    "AudioFrame",
    "BadMessage",
    "CommandError",
    "DtmfEvent",
    "ErrorEvent",
    "Event",
    "EventsLost",
    "FeatureNotSupported",
    "GatherResult",
    "Handler",
    "InternalError",
    "InvalidCatalogId",
    "MarkEvent",
    "OnHold",
    "Output",
    "OutputDone",
    "OutputInterrupted",
    "OutputQueueLevel",
    "OutputResult",
    "OutputStarted",
    "Pending",
    "PlayFetchFailed",
    "ProviderTimeout",
    "ProviderUnavailable",
    "QueueFull",
    "ReadOnly",
    "ResumeHook",
    "Resumed",
    "SdkError",
    "Session",
    "SessionClosed",
    "SessionEnd",
    "SessionEnded",
    "SessionStart",
    "TranscriptPartial",
    "TransferFailed",
    "TransferHandle",
    "TurnBackchannel",
    "TurnEnded",
    "TurnEstimate",
    "TurnLikelyEnded",
    "TurnResumed",
    "TurnUserStarted",
    "Verifier",
    "fonoster_headers",
]
