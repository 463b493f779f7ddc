"""``appbridge call``: the command line of the test callers (docs/caller.md).

An ``http://`` URL is a call through the gateway's Twilio ingress
(:mod:`appbridge.caller.twilio`), a ``sip:`` URI a real SIP call (:mod:`appbridge.caller.sip`),
with the same options and output. The first Ctrl-C (or SIGTERM) hangs up cleanly, a second one
abandons the call (exit 130); a usage error exits 2. The options themselves are registered by
:mod:`appbridge.cli`, which imports this module only when the command runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from argparse import Namespace
from collections.abc import Awaitable, Callable
from pathlib import Path

from appbridge.caller.common import EXIT_ABANDONED, EXIT_USAGE, CallerUsageError
from appbridge.caller.sip.call import SipCallPlan, load_wav_pcm16_8k, place_sip_call
from appbridge.caller.twilio import CallPlan, load_wav_ulaw, place_test_call

__all__ = [
    "run_call_command",
    "run_sip_call_command",
    "run_until_hung_up",
    "sip_plan_from_args",
    "twilio_plan_from_args",
]


def twilio_plan_from_args(args: Namespace) -> CallPlan:
    """The ``appbridge call`` options as a :class:`CallPlan` for an ``http://`` URL."""
    token = args.auth_token if args.auth_token is not None else os.environ.get("TWILIO_AUTH_TOKEN")
    play = load_wav_ulaw(Path(args.play)) if args.play else b""
    return CallPlan(
        url=args.url.rstrip("/"),
        from_=args.from_,
        to=args.to,
        play_ulaw=play,
        digits=args.digits or "",
        seconds=args.seconds,
        auth_token=token or None,
        account_sid=args.account_sid,
        public_url=args.public_url.rstrip("/") if args.public_url else None,
        record=Path(args.record) if args.record else None,
    )


def sip_plan_from_args(args: Namespace) -> SipCallPlan:
    """The ``appbridge call`` options as a :class:`SipCallPlan` for a ``sip:`` URI."""
    return SipCallPlan(
        uri=args.url,
        from_user=args.from_,
        play_pcm16=load_wav_pcm16_8k(Path(args.play)) if args.play else b"",
        digits=args.digits or "",
        duration_s=args.seconds,
        record=Path(args.record) if args.record else None,
    )


def run_call_command(args: Namespace) -> int:
    """``appbridge call``: a Twilio call for an ``http://`` URL, a SIP call for ``sip:``."""
    if str(args.url).lower().startswith(("sip:", "sips:")):
        return run_sip_call_command(args)
    try:
        plan = twilio_plan_from_args(args)
        plan.validate()
    except CallerUsageError as exc:
        print(f"appbridge call: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def call(hang_up: asyncio.Event) -> int:
        return (await place_test_call(plan, hang_up=hang_up)).exit_code

    return run_until_hung_up(call)


def run_sip_call_command(args: Namespace) -> int:
    """``appbridge call sip:...``: BYE on the first Ctrl-C (CANCEL before the answer)."""
    try:
        sip_plan = sip_plan_from_args(args)
        sip_plan.validate()
    except CallerUsageError as exc:
        print(f"appbridge call: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def call(hang_up: asyncio.Event) -> int:
        return (await place_sip_call(sip_plan, hang_up=hang_up)).exit_code

    return run_until_hung_up(call)


def run_until_hung_up(call: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    """Run one test call (Twilio or SIP) to its exit code: the first Ctrl-C (or SIGTERM) sets
    the ``hang_up`` event the call watches, a second one abandons it (exit 130)."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        hang_up = asyncio.Event()
        current = asyncio.current_task()

        def on_signal() -> None:
            if hang_up.is_set() and current is not None:
                current.cancel()
            hang_up.set()

        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, on_signal)
                installed.append(sig)
        try:
            return await call(hang_up)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    try:
        return asyncio.run(main())
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("appbridge call: abandoned", file=sys.stderr)
        return EXIT_ABANDONED
