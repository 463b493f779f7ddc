"""The command line (docs/operations.md): serve, check-config, sign."""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from appbridge import cli
from appbridge.config import Config, default_config
from appbridge.protocol.signing import fonoster_signature, verify_fonoster

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "appbridge.example.toml"
EXAMPLE_VARS = (
    "APPBRIDGE_HTTP_TOKEN",
    "APPBRIDGE_API_TOKEN",
    "TWILIO_AUTH_TOKEN",
    "TRUNK_PASSWORD",
    "SUPPORT_LINE_SECRET",
    "OVERFLOW_SECRET",
)
VALID = (
    '[[apps]]\nref = "a"\nurl = "wss://app.example.com/s"\n[[numbers]]\nnumber = "*"\napp = "a"\n'
)


@pytest.fixture(autouse=True)
def _no_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests choose the voice check themselves; the real catalog is tested once below."""
    monkeypatch.setattr(cli, "_known_voice", lambda: {"local/en-US"}.__contains__)
    monkeypatch.delenv(cli.CONFIG_ENV, raising=False)


# -- sign -------------------------------------------------------------------------------------


def test_sign_prints_exactly_the_two_headers(capsys: pytest.CaptureFixture[str]) -> None:
    url = "wss://app.example.com/session?x=1"
    assert cli.main(["sign", "--secret", "s3", "--url", url, "--timestamp", "1700000000"]) == 0
    out, err = capsys.readouterr()
    assert out == (
        "X-Fonoster-Timestamp: 1700000000\n"
        f"X-Fonoster-Signature: {fonoster_signature('s3', url, 1700000000)}\n"
    )
    assert err == ""


def test_sign_known_vector(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sign", "--secret", "s", "--url", "ws://x/y", "--timestamp", "10"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "X-Fonoster-Signature: df60c654cbbbdb46a61a0ddbd4aa2759f5f733bda74267e12c60aa8f46651def"
    )


def test_sign_defaults_to_now(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "time", lambda: 1_700_000_123.9)
    assert cli.main(["sign", "--secret", "k", "--url", "wss://h/s"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "X-Fonoster-Timestamp: 1700000123"
    timestamp = lines[0].split(": ")[1]
    signature = lines[1].split(": ")[1]
    assert verify_fonoster("k", "wss://h/s", timestamp, signature, now_s=1_700_000_123.9)


@pytest.mark.parametrize(
    "argv",
    [
        ["sign", "--url", "wss://h/s"],
        ["sign", "--secret", "k"],
        ["sign", "--secret", "k", "--url", "wss://h", "--timestamp", "-5"],
        ["sign", "--secret", "k", "--url", "wss://h", "--timestamp", "soon"],
    ],
)
def test_sign_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "usage:" in err


# -- check-config -----------------------------------------------------------------------------


def test_check_config_example(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in EXAMPLE_VARS:
        monkeypatch.setenv(name, "x")
    assert cli.main(["check-config", str(EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    assert out == f"OK: {EXAMPLE}\n"
    assert err == ""


def test_check_config_example_with_the_real_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    for name in EXAMPLE_VARS:
        monkeypatch.setenv(name, "x")
    assert cli.main(["check-config", str(EXAMPLE)]) == 0


def test_check_config_lists_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        '[server]\nport = "80a"\n[[apps]]\nref = "a"\nurl = "ws://example.com/x"\n'
        'speech = { voice = "nope/voice" }\n[[numbers]]\nnumber = "*"\napp = "nope"\n'
    )
    assert cli.main(["check-config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == 'server.port: expected an integer 1-65535, got "80a"'
    assert lines[1].startswith("apps[0].url: ws:// is only allowed for loopback/private hosts")
    assert lines[2] == 'apps[0].speech.voice: unknown voice "nope/voice"'
    assert lines[3] == 'numbers[0].app: unknown app "nope"'
    assert len(lines) == 4


def test_check_config_prints_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "warn.toml"
    path.write_text('[[apps]]\nref = "a"\nurl = "ws://agent:9000/s"\n')
    assert cli.main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"OK: {path}\n"
    warnings = err.splitlines()
    assert len(warnings) == 2 and all(line.startswith("warning: ") for line in warnings)
    assert any("single-label" in line for line in warnings)


def test_check_config_missing_file_and_bad_toml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["check-config", str(tmp_path / "none.toml")]) == 1
    assert "cannot read the file" in capsys.readouterr().err
    path = tmp_path / "syntax.toml"
    path.write_text("[server\n")
    assert cli.main(["check-config", str(path)]) == 1
    assert "invalid TOML" in capsys.readouterr().err


def test_check_config_needs_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-config"]) == 2
    assert "usage:" in capsys.readouterr().err


# -- serve ------------------------------------------------------------------------------------


class FakeServer:
    def __init__(self) -> None:
        self.calls: list[tuple[Config, str | None]] = []

    def serve(self, config: Config, config_path: str | None = None) -> int:
        self.calls.append((config, config_path))
        return 0


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> FakeServer:
    fake = FakeServer()
    module = types.ModuleType("appbridge.server")
    module.serve = fake.serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "appbridge.server", module)
    return fake


def test_serve_embedded_default(server: FakeServer) -> None:
    assert cli.main(["serve"]) == 0
    ((config, path),) = server.calls
    assert path is None
    assert config == default_config()


def test_serve_config_from_environment(
    server: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "env.toml"
    path.write_text(VALID)
    monkeypatch.setenv(cli.CONFIG_ENV, str(path))
    assert cli.main(["serve"]) == 0
    ((config, used),) = server.calls
    assert used == str(path) and config.source == str(path)


def test_serve_flag_wins_over_environment(
    server: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = tmp_path / "flag.toml"
    chosen.write_text(VALID)
    monkeypatch.setenv(cli.CONFIG_ENV, str(tmp_path / "missing.toml"))
    assert cli.main(["serve", "--config", str(chosen)]) == 0
    assert server.calls[0][1] == str(chosen)


def test_serve_empty_environment_variable_means_default(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cli.CONFIG_ENV, "")
    assert cli.main(["serve"]) == 0
    assert server.calls[0][1] is None


def test_serve_invalid_config_exits_2_with_one_line_per_problem(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[server]\nport = 0\ncolour = "red"\n')
    assert cli.main(["serve", "--config", str(path)]) == 2
    assert server.calls == []
    assert capsys.readouterr().err.splitlines() == [
        "server.colour: unknown key",
        "server.port: expected an integer 1-65535, got 0",
        "apps: at least one [[apps]] entry is required",
    ]


def test_serve_checks_voices_with_the_catalog(
    server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "voice.toml"
    path.write_text(
        VALID.replace('app.example.com/s"', 'app.example.com/s"\nspeech = { voice = "x/y" }')
    )
    assert cli.main(["serve", "--config", str(path)]) == 2
    assert 'unknown voice "x/y"' in capsys.readouterr().err


# -- the catalog hook, the parser, extra commands ---------------------------------------------


def test_known_voice_uses_the_catalog_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    catalog = types.SimpleNamespace(is_known_voice=lambda voice: voice == "v/1")
    module = types.ModuleType("appbridge.speech.catalog")
    module.default_catalog = lambda: catalog  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "appbridge.speech.catalog", module)
    check = cli._known_voice()
    assert check is not None and check("v/1") and not check("v/2")


def test_known_voice_without_a_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "appbridge.speech.catalog", None)
    assert cli._known_voice() is None


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "check-config" in err and "sign" in err and "serve" in err


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "usage:" in capsys.readouterr().out
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("appbridge ")


def test_extra_commands_register(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def register(commands: Any) -> None:
        parser: argparse.ArgumentParser = commands.add_parser("hello", help="say hello")
        parser.add_argument("name")
        parser.set_defaults(handler=lambda args: print(f"hello {args.name}") or 7)

    monkeypatch.setattr(cli, "EXTRA_COMMANDS", [register])
    assert cli.main(["hello", "world"]) == 7
    assert capsys.readouterr().out == "hello world\n"
