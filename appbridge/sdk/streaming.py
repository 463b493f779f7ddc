"""``say_stream``'s text pump (docs/sdk.md, "6. Stream a model's answer"): the pieces of an
async (or plain) iterable become ``speak`` commands with one id and ``last: false``
(docs/protocol-session-v1.md, ``speak``), and an empty ``last: true`` piece ends the utterance.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from appbridge.protocol import session_v1 as sv1
from appbridge.sdk.events import OutputResult

if TYPE_CHECKING:
    from appbridge.sdk.handles import Output
    from appbridge.sdk.session import Session

__all__ = ["pump_text"]


async def pump_text(
    session: Session,
    out: Output,
    pieces: AsyncIterable[str] | Iterable[str],
    fields: dict[str, Any],
) -> None:
    """Sends ``pieces`` as ``speak`` with ``last: false`` under ``out``'s id, then the closing
    empty ``last: true`` piece; stops reading once the utterance is over."""
    sent = False
    failure: BaseException | None = None
    source = pieces if isinstance(pieces, AsyncIterable) else _aiter_sync(pieces)
    iterator = aiter(source)
    try:
        async for piece in iterator:
            if out.done() or session._closed or session.parked:
                break
            if piece:
                session._send(sv1.Speak(text=piece, id=out.id, last=False, **fields))
                sent = True
    except Exception as exc:  # the app's text source failed: close what was sent
        failure = exc
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
    if session._closed or session.parked or out.done():
        return
    if sent:
        session._send(sv1.Speak(text="", id=out.id, last=True, **fields))
    if failure is not None:
        session._pending.pop(out.id, None)
        out._fail(failure)
    elif not sent:
        session._settle(out, OutputResult(out.id, "done", 0))


async def _aiter_sync(pieces: Iterable[str]) -> AsyncIterator[str]:
    for piece in pieces:
        yield piece
