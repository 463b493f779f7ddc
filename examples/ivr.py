"""IVR: a DTMF menu that transfers the caller, built with the voice SDK (docs/sdk.md).

Press 1 for sales (a cold transfer), 2 for support (type a ticket number ending with #, then a
transfer), or * to hear the menu again. It shows ``gather`` with a prompt the caller can press
through, digit collection up to a terminator, ``transfer``, and how a failed transfer surfaces
as an exception (``TransferFailed``) while the call stays with the app.

Run it next to the gateway (see examples/README.md)::

    .venv/bin/python examples/ivr.py               # listens on ws://127.0.0.1:9002/session
    make run CONFIG=examples/appbridge.examples.toml
    .venv/bin/appbridge call http://127.0.0.1:8080 --to +15550000002 --digits 2123#

Transfers go through Twilio's REST API, so with the test caller (no real Twilio) the transfer
fails and the IVR says so: that is the error path at work.
"""

from __future__ import annotations

import asyncio
import logging
import os

from appbridge.sdk import AppServer, Session, TransferFailed

MENU = (
    "Thanks for calling Example Corp. For sales, press 1. For support, press 2. "
    "To hear this again, press star."
)
SALES_NUMBER = os.environ.get("SALES_NUMBER", "+15557650001")
SUPPORT_NUMBER = os.environ.get("SUPPORT_NUMBER", "+15557650002")
SECRET = os.environ.get("APP_SECRET", "examples-secret")
PORT = int(os.environ.get("APP_PORT", "9002"))
MAX_TRIES = 3


async def connect(session: Session, number: str, team: str) -> bool:
    """Transfers the caller; True when the call left this app."""
    await session.say(f"Connecting you to {team}.")
    try:
        await session.transfer(number)
    except TransferFailed:
        await session.say(f"Sorry, {team} cannot be reached right now.")
        return False
    return True


async def ivr(session: Session) -> None:
    for _ in range(MAX_TRIES):
        choice = await session.gather(
            prompt=MENU, max_digits=1, terminators="", speech=False, timeout_s=6
        )
        if choice.digits == "1":
            if await connect(session, SALES_NUMBER, "sales"):
                return
        elif choice.digits == "2":
            ticket = await session.gather(
                prompt="Please type your ticket number, then press pound.",
                speech=False,
                terminators="#",
                timeout_s=10,
            )
            if ticket.digits:
                await session.say(f"Ticket {' '.join(ticket.digits)}. Thank you.")
            if await connect(session, SUPPORT_NUMBER, "support"):
                return
        elif choice.digits not in ("*", ""):
            await session.say("Sorry, that is not an option.")
    await session.say("Goodbye.")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    asyncio.run(AppServer(ivr, secrets=SECRET).serve_forever("127.0.0.1", PORT))
