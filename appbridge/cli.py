"""The ``appbridge`` command line (docs/operations.md, "Running the gateway").

``serve`` runs the gateway, ``check-config`` validates a file and lists every problem with its key
path, ``sign`` prints the two ``X-Fonoster-*`` headers so an app developer can test their
verification (docs/configuration.md, "Signing headers: `appbridge sign`"). Exit codes: 0 success, 1
an invalid file given to ``check-config``, 2 a usage error or an invalid configuration given to
``serve``.

Heavy modules (the server, the speech catalog) are imported inside the commands that need them,
so ``check-config`` and ``sign`` answer quickly and work without the server's dependencies.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from appbridge import __version__
from appbridge.config import (
    DEMO_ACCOUNT_SID,
    Config,
    ConfigError,
    default_config,
    load_config,
)
from appbridge.protocol.signing import fonoster_headers

__all__ = ["build_parser", "main"]

CONFIG_ENV = "APPBRIDGE_CONFIG"
EXIT_OK = 0
EXIT_INVALID_FILE = 1
EXIT_USAGE = 2

Handler = Callable[[argparse.Namespace], int]
SubcommandRegistrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

EXTRA_COMMANDS: list[SubcommandRegistrar] = []
"""Registrars of further subcommands (the lead's ``call``); each adds its own parser."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``appbridge`` console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version or a usage error: argparse has printed it
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return handler(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="appbridge",
        description="AppBridge: a telephony media gateway for voice apps.",
    )
    parser.add_argument("--version", action="version", version=f"appbridge {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the gateway",
        description=(
            f"Run the gateway with --config FILE, else ${CONFIG_ENV}, else the embedded "
            "default (loopback only, the demo app answers every call)."
        ),
    )
    serve.add_argument("--config", metavar="FILE", help="TOML configuration file")
    serve.set_defaults(handler=_cmd_serve)

    check = commands.add_parser(
        "check-config",
        help="validate a configuration file",
        description="Print every problem of FILE with its key path; exit 0 when it is valid.",
    )
    check.add_argument("file", metavar="FILE")
    check.set_defaults(handler=_cmd_check_config)

    sign = commands.add_parser(
        "sign",
        help="print the signing headers for an app URL",
        description=(
            "Print X-Fonoster-Timestamp and X-Fonoster-Signature (HMAC-SHA256 of "
            "'<timestamp>.<url>') as AppBridge sends them when it dials URL."
        ),
    )
    sign.add_argument("--secret", required=True, help="the app's signing secret")
    sign.add_argument("--url", required=True, help="the app URL exactly as configured")
    sign.add_argument(
        "--timestamp", type=_unix_seconds, help="Unix seconds (default: now)", metavar="T"
    )
    sign.set_defaults(handler=_cmd_sign)

    # ---- more subcommands register here ---------------------------------------------------------
    # Add a parser with `commands.add_parser(...)` and `set_defaults(handler=fn)`, where `fn`
    # takes the parsed Namespace and returns the exit code; import heavy modules inside `fn`.
    _register_call(commands)
    for register in EXTRA_COMMANDS:
        register(commands)
    # ---- end of subcommand registration ---------------------------------------------------------
    return parser


def _unix_seconds(text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected Unix seconds (digits), got {text!r}")
    return int(text)


def _known_voice() -> Callable[[str], bool] | None:
    """The speech catalog's voice check, when the catalog module is available."""
    try:
        from appbridge.speech.catalog import default_catalog
    except ImportError:
        return None
    return default_catalog().is_known_voice


def _print_problems(problems: Sequence[str], stream: TextIO) -> None:
    for problem in problems:
        print(problem, file=stream)


def _cmd_serve(args: argparse.Namespace) -> int:
    config_path: str | None = args.config or os.environ.get(CONFIG_ENV) or None
    config: Config
    if config_path is None:
        config = default_config()
    else:
        try:
            config = load_config(config_path, known_voice=_known_voice())
        except ConfigError as exc:
            _print_problems(exc.problems, sys.stderr)
            return EXIT_USAGE
    from appbridge.server import serve

    return serve(config, config_path)


def _cmd_check_config(args: argparse.Namespace) -> int:
    path: str = args.file
    try:
        config = load_config(path, known_voice=_known_voice())
    except ConfigError as exc:
        _print_problems(exc.problems, sys.stderr)
        return EXIT_INVALID_FILE
    print(f"OK: {path}")
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return EXIT_OK


def _cmd_sign(args: argparse.Namespace) -> int:
    timestamp: int = args.timestamp if args.timestamp is not None else int(time.time())
    for name, value in fonoster_headers(args.secret, args.url, timestamp).items():
        print(f"{name}: {value}")
    return EXIT_OK


def _register_call(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """``appbridge call``: the test caller (``appbridge.caller``), playing Twilio's part."""
    call = commands.add_parser(
        "call",
        help="place a test call on a running gateway, as Twilio or a SIP phone would",
        description=(
            "Place a test call through the gateway's Twilio ingress (an http:// URL: post the "
            "voice webhook, open the media stream) or over SIP (a sip: URI: INVITE, RTP, RFC 4733 "
            "keypresses, BYE), send WAV audio or silence and keypresses, print every event with "
            "its time, and save what was heard. Ctrl-C hangs up (CANCEL before a SIP answer). "
            "Exit 0 when the call connected, 1 when it was refused, failed or could not be "
            "reached (the SIP status is printed), 2 on usage errors."
        ),
    )
    call.add_argument(
        "url",
        metavar="URL",
        help=(
            "the gateway's base URL, e.g. http://127.0.0.1:8080, or a SIP URI such as "
            "sip:+15550002222@127.0.0.1:5060 (add ;transport=tcp or ;transport=tls)"
        ),
    )
    call.add_argument(
        "--from",
        dest="from_",
        metavar="NUMBER",
        default="+15550001111",
        help="caller number (default +15550001111)",
    )
    call.add_argument(
        "--to",
        metavar="NUMBER",
        default="+15550002222",
        help="called number, which routes the call (default +15550002222)",
    )
    call.add_argument("--play", metavar="WAV", help="send this WAV file (any rate) as caller audio")
    call.add_argument(
        "--digits", metavar="DIGITS", help="keypresses to send, one per second after 2 s"
    )
    call.add_argument("--record", metavar="OUT.WAV", help="save what was heard (16-bit, 8 kHz)")
    call.add_argument(
        "--seconds",
        "--duration",
        dest="seconds",
        type=float,
        default=15.0,
        help="hang up after this long, in seconds (default 15)",
    )
    call.add_argument(
        "--auth-token",
        metavar="TOKEN",
        help="sign as Twilio with this auth token (default: $TWILIO_AUTH_TOKEN, else unsigned)",
    )
    call.add_argument(
        "--account-sid",
        metavar="AC...",
        default=DEMO_ACCOUNT_SID,
        help=f"AccountSid of the webhook and stream (default {DEMO_ACCOUNT_SID})",
    )
    call.add_argument(
        "--public-url",
        metavar="URL",
        help="the gateway's server.public_url, which signatures cover (default: URL)",
    )
    call.set_defaults(handler=_cmd_call)


def _cmd_call(args: argparse.Namespace) -> int:
    from appbridge.caller.cli import run_call_command

    return run_call_command(args)
