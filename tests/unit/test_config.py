"""Configuration loading and validation (docs/configuration.md)."""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path

import pytest

from appbridge.config import (
    AppConfig,
    AudioConfig,
    Config,
    ConfigError,
    Fallback,
    ListenerConfig,
    NumberRoute,
    ServerConfig,
    SipTrunk,
    SpeechDefaults,
    TwilioCarrierConfig,
    default_config,
    load_config,
    parse_config,
)
from appbridge.config.schema import is_bcp47

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "appbridge.example.toml"
EXAMPLE_ENV = {
    name: f"value-of-{name}"
    for name in (
        "APPBRIDGE_HTTP_TOKEN",
        "APPBRIDGE_API_TOKEN",
        "TWILIO_AUTH_TOKEN",
        "TRUNK_PASSWORD",
        "SUPPORT_LINE_SECRET",
        "OVERFLOW_SECRET",
    )
}

# A self-signed CA made for these tests (openssl req -x509 -newkey ec, P-256, 100 years).
TEST_CA_PEM = """-----BEGIN CERTIFICATE-----
MIIBkDCCATWgAwIBAgIUP+cijy1STkwPRLKKL4FgrliemRMwCgYIKoZIzj0EAwIw
HDEaMBgGA1UEAwwRQXBwQnJpZGdlIHRlc3QgQ0EwIBcNMjYxMTMwMTI1NzQxWhgP
MjEyNjExMDYxMjU3NDFaMBwxGjAYBgNVBAMMEUFwcEJyaWRnZSB0ZXN0IENBMFkw
EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE31SlLGNnDYKl/4WO76DGiwkNaLUzmqaU
2IeCIFgamRNj/2JeMrtK4ZjaAOaK7lckkeKj7U1thwG6+Erob0MroKNTMFEwHQYD
VR0OBBYEFDsHpT5uc8kwLwYp+sjQWihXIB3PMB8GA1UdIwQYMBaAFDsHpT5uc8kw
LwYp+sjQWihXIB3PMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIh
AJ1A9pIGXQyNdzukHDelWAMlR63PDa3jDQFTT5ozGcD6AiEA3FP6dGhtAlegHEcN
0dwWb4aCqfRZH86QyH/XvFxETo4=
-----END CERTIFICATE-----
"""

APP = '[[apps]]\nref = "a"\nurl = "wss://app.example.com/s"\n'
ROUTE = '[[numbers]]\nnumber = "*"\napp = "a"\n'


def parse(
    text: str,
    env: Mapping[str, str] | None = None,
    *,
    known_voice: object = None,
    base_dir: Path | None = None,
) -> Config:
    return parse_config(
        tomllib.loads(text),
        env or {},
        known_voice=known_voice,  # type: ignore[arg-type]
        source="test.toml",
        base_dir=base_dir,
    )


def problems(text: str, env: Mapping[str, str] | None = None, **kwargs: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text, env, **kwargs)  # type: ignore[arg-type]
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


# -- the embedded default ----------------------------------------------------------------------


def test_default_config_matches_the_documented_embedded_default() -> None:
    config = default_config()
    assert config.server == ServerConfig(host="127.0.0.1", port=8080)
    assert config.server.public_url is None and config.server.base_url() == "http://127.0.0.1:8080"
    assert (config.http, config.api) == (None, None)
    # "SIP (once the SIP carrier exists) on udp and tcp 127.0.0.1:5060"; no trunk, so INVITEs
    # are taken from loopback only.
    assert config.sip is not None
    assert config.sip.listen == ("udp:127.0.0.1:5060", "tcp:127.0.0.1:5060")
    assert config.sip.trunks == () and config.sip.public_address is None
    assert default_config(sip_port=None).sip is None
    assert config.twilio == TwilioCarrierConfig("AC" + "0" * 32, None, "https://api.twilio.com")
    assert list(config.apps) == ["demo"]
    demo = config.apps["demo"]
    assert demo.url == "ws://127.0.0.1:8080/demo/session"
    assert demo.protocol == "fonoster" and demo.signing_secret is None
    assert demo.audio == AudioConfig("pcm16", 16000)
    assert demo.fallback == Fallback(message="Sorry, the demo app is not available right now.")
    assert config.numbers == (NumberRoute("*", "demo"),)
    assert config.source == "<embedded default>" and config.warnings == ()
    assert config.route("+15550001111") is demo


def test_default_config_port() -> None:
    config = default_config(port=9001)
    assert config.server.port == 9001
    assert config.apps["demo"].url == "ws://127.0.0.1:9001/demo/session"


def test_config_is_immutable() -> None:
    config = default_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.server = ServerConfig()  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.apps["x"] = config.apps["demo"]  # type: ignore[index]


# -- the example file --------------------------------------------------------------------------


def test_example_file_is_valid() -> None:
    config = load_config(EXAMPLE, EXAMPLE_ENV)
    assert config.source == str(EXAMPLE)
    assert config.server.public_url == "https://bridge.example.com"
    assert config.http is not None and config.http.auth_token == "value-of-APPBRIDGE_HTTP_TOKEN"
    assert config.api is not None and config.api.tokens == ("value-of-APPBRIDGE_API_TOKEN",)
    assert config.twilio is not None and config.twilio.auth_token == "value-of-TWILIO_AUTH_TOKEN"
    assert config.sip is not None
    assert config.sip.trunks == (
        SipTrunk(
            "main",
            "sip.carrier.example",
            5060,
            "udp",
            "appbridge",
            "value-of-TRUNK_PASSWORD",
            ("198.51.100.0/24",),
        ),
    )
    assert config.sip.rtp_ports == (20000, 29999)
    support = config.apps["support-line"]
    assert support.listeners == (ListenerConfig("ws://10.0.0.5:9100/listen", "both"),)
    assert support.fallback == Fallback(app="overflow")
    assert config.apps["overflow"].protocol == "twilio"
    assert config.route("+15550002222") is support
    assert config.route("+15559999999") is config.apps["overflow"]
    assert config.warnings == ()


def test_example_file_names_every_missing_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLE, {})
    assert sorted(info.value.problems) == sorted(
        [
            "http.auth_token: environment variable APPBRIDGE_HTTP_TOKEN is not set",
            "api.tokens[0]: environment variable APPBRIDGE_API_TOKEN is not set",
            "carriers.twilio.auth_token: environment variable TWILIO_AUTH_TOKEN is not set",
            "sip.trunks[0].password: environment variable TRUNK_PASSWORD is not set",
            "apps[0].signing_secret: environment variable SUPPORT_LINE_SECRET is not set",
            "apps[1].signing_secret: environment variable OVERFLOW_SECRET is not set",
        ]
    )


# -- reading the file --------------------------------------------------------------------------


def test_minimal_file_takes_defaults(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text(APP + ROUTE)
    config = load_config(path, {})
    assert config.server == ServerConfig()
    assert (config.http, config.api, config.twilio, config.sip) == (None, None, None, None)
    assert config.apps["a"] == AppConfig(ref="a", url="wss://app.example.com/s")
    assert config.apps["a"].speech == SpeechDefaults("local/en-US", "en-US")


def test_toml_syntax_error_has_line_info(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[server]\nport = 80\nhost = "x\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}: invalid TOML: ")
    assert "line 3" in problem


def test_missing_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml", {})
    assert "cannot read the file" in info.value.problems[0]
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[server]\nhost = "caf\xe9"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    assert "not UTF-8" in info.value.problems[0]


def test_load_config_reads_os_environ_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.toml"
    path.write_text(APP.replace('ref = "a"', 'ref = "a"\nsigning_secret = "${T_SECRET}"') + ROUTE)
    monkeypatch.setenv("T_SECRET", "abc")
    assert load_config(path).apps["a"].signing_secret == "abc"


def test_every_problem_is_collected() -> None:
    found = problems(
        '[server]\nport = "80a"\nhost = 5\n[[apps]]\nref = "a"\nurl = "ws://example.com/x"\n'
        'colour = "red"\n[[apps]]\nref = "b"\nurl = "ftp://x"\n'
        '[[numbers]]\nnumber = "+15550001111"\napp = "nope"\n'
    )
    assert 'server.port: expected an integer 1-65535, got "80a"' in found
    assert "server.host: expected a string, got 5" in found
    assert "apps[0].colour: unknown key" in found
    assert any(
        p.startswith("apps[0].url: ws:// is only allowed for loopback/private hosts (")
        for p in found
    )
    assert any(p.startswith("apps[1].url: expected a ws:// or wss:// URL") for p in found)
    assert 'numbers[0].app: unknown app "nope"' in found
    assert len(found) == 6


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("nope = 1\n", "nope"),
        ("[server]\ncolour = 1\n", "server.colour"),
        ('[http]\naccount_sid = "AC' + "0" * 32 + '"\nauth_token = "t"\nx = 1\n', "http.x"),
        ('[api]\ntokens = ["t"]\nx = 1\n', "api.x"),
        ("[carriers.telnyx]\n", "carriers.telnyx"),
        ('[carriers.twilio]\naccount_sid = "AC' + "0" * 32 + '"\nx = 1\n', "carriers.twilio.x"),
        ("[sip]\nx = 1\n", "sip.x"),
        ('[[sip.trunks]]\nname = "m"\nhost = "h"\nx = 1\n', "sip.trunks[0].x"),
        ('[[apps]]\nref = "b"\nurl = "wss://h"\nspeech = { x = 1 }\n', "apps[0].speech.x"),
        ('[[apps]]\nref = "b"\nurl = "wss://h"\naudio = { x = 1 }\n', "apps[0].audio.x"),
        (
            '[[apps]]\nref = "b"\nurl = "wss://h"\nfallback = { message = "m", x = 1 }\n',
            "apps[0].fallback.x",
        ),
        (
            '[[apps]]\nref = "b"\nurl = "wss://h"\nlisteners = [{ url = "wss://l", x = 1 }]\n',
            "apps[0].listeners[0].x",
        ),
        ('[[numbers]]\nnumber = "+15550001111"\napp = "a"\nx = 1\n', "numbers[0].x"),
    ],
)
def test_unknown_keys_at_every_level(text: str, path: str) -> None:
    assert problems(text + APP + ROUTE) == [f"{path}: unknown key"]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("port = true", "server.port: expected an integer 1-65535, got true"),
        ("port = 0", "server.port: expected an integer 1-65535, got 0"),
        ("port = 65536", "server.port: expected an integer 1-65535, got 65536"),
        ("port = 80.0", "server.port: expected an integer 1-65535, got 80.0"),
        ("max_calls = false", "server.max_calls: expected an integer 1-1000000, got false"),
        (
            "drain_timeout_s = true",
            "server.drain_timeout_s: expected a number above 0 up to 3600, got true",
        ),
        (
            "drain_timeout_s = 0",
            "server.drain_timeout_s: expected a number above 0 up to 3600, got 0",
        ),
        ('host = ""', "server.host: must not be empty"),
        ('host = "bad host"', 'server.host: expected an IP address or host name, got "bad host"'),
        ("host = [1]", "server.host: expected a string, got an array"),
    ],
)
def test_server_types_are_strict(line: str, problem: str) -> None:
    assert problems(f"[server]\n{line}\n" + APP + ROUTE) == [problem]


def test_server_values() -> None:
    config = parse(
        '[server]\nhost = "0.0.0.0"\nport = 9000\ndrain_timeout_s = 5\nmax_calls = 3\n' + APP
    )
    assert config.server == ServerConfig("0.0.0.0", 9000, None, None, 5.0, 3)
    assert isinstance(config.server.drain_timeout_s, float)
    assert config.server.base_url() == "http://127.0.0.1:9000"


@pytest.mark.parametrize(
    ("server", "base_url"),
    [
        (ServerConfig(host="::1", port=81), "http://[::1]:81"),
        (ServerConfig(host="::", port=81), "http://[::1]:81"),
        (ServerConfig(host="10.1.2.3", port=81), "http://10.1.2.3:81"),
        (ServerConfig(public_url="https://gw.example/prefix"), "https://gw.example/prefix"),
    ],
)
def test_base_url(server: ServerConfig, base_url: str) -> None:
    assert server.base_url() == base_url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://bridge.example.com", None),
        ("https://bridge.example.com/voice/gw", None),
        ("http://127.0.0.1:8080", None),
        ("https://bridge.example.com/", "must not end with a slash"),
        ("https://bridge.example.com/p/", "must not end with a slash"),
        ("https://bridge.example.com?x=1", "must not have a query string"),
        ("https://bridge.example.com/p?", "must not have a query string"),
        ("https://bridge.example.com#f", "must not have a fragment"),
        ("https://u:p@bridge.example.com", "must not contain user info"),
        ("wss://bridge.example.com", "expected an http:// or https:// URL"),
        ("bridge.example.com", "expected an http:// or https:// URL"),
        ("https://", "expected an http:// or https:// URL"),
        ("https://h:99999", "not a valid URL"),
    ],
)
def test_public_url(url: str, message: str | None) -> None:
    text = f'[server]\npublic_url = "{url}"\n' + APP + ROUTE
    if message is None:
        assert parse(text).server.public_url == url
    else:
        (problem,) = problems(text)
        assert problem.startswith("server.public_url: ") and message in problem


# -- ${NAME} -----------------------------------------------------------------------------------


def test_env_references_everywhere_strings_are() -> None:
    text = (
        '[server]\nhost = "${HOST}"\nport = "${PORT}"\ndrain_timeout_s = "${DRAIN}"\n'
        '[api]\ntokens = ["${T1}", "literal", "${T2}"]\n'
        '[[apps]]\nref = "${REF}"\nurl = "${URL}"\nallow_insecure = "${INSECURE}"\n'
        'speech = { voice = "${VOICE}" }\n' + ROUTE.replace('"a"', '"app1"')
    )
    env = {
        "HOST": "10.0.0.1",
        "PORT": "9000",
        "DRAIN": "2.5",
        "T1": "one",
        "T2": "two",
        "REF": "app1",
        "URL": "wss://h.example/s",
        "INSECURE": "false",
        "VOICE": "local/en-GB",
    }
    config = parse(text, env)
    assert (config.server.host, config.server.port) == ("10.0.0.1", 9000)
    assert config.server.drain_timeout_s == 2.5
    assert config.api is not None and config.api.tokens == ("one", "literal", "two")
    app = config.apps["app1"]
    assert app.url == "wss://h.example/s" and app.allow_insecure is False
    assert app.speech.voice == "local/en-GB"


def test_env_value_is_still_validated() -> None:
    found = problems('[server]\nport = "${PORT}"\n' + APP + ROUTE, {"PORT": "http"})
    assert found == ['server.port: expected an integer 1-65535, got "http"']


def test_missing_env_is_reported_once_at_its_path() -> None:
    found = problems(
        '[api]\ntokens = ["${A}", "${B}"]\n' + APP + 'signing_secret = "${S}"\n' + ROUTE, {"A": "x"}
    )
    assert found == [
        "api.tokens[1]: environment variable B is not set",
        "apps[0].signing_secret: environment variable S is not set",
    ]


def test_only_an_exact_reference_is_substituted() -> None:
    text = APP + 'signing_secret = "pre-${S}"\n' + ROUTE
    assert parse(text, {"S": "x"}).apps["a"].signing_secret == "pre-${S}"
    assert problems(APP + 'signing_secret = "${not valid}"\n' + ROUTE) == [
        'apps[0].signing_secret: not a valid "${NAME}" reference (NAME: letters, digits, _)'
    ]


def test_env_reference_in_an_unknown_key_is_not_looked_up() -> None:
    assert problems(APP + ROUTE + 'extra = "${NOPE}"\n') == ["numbers[0].extra: unknown key"]


def test_empty_env_value_is_an_empty_string() -> None:
    assert problems(APP + 'signing_secret = "${S}"\n' + ROUTE, {"S": ""}) == [
        "apps[0].signing_secret: must not be empty"
    ]


def test_secrets_are_not_echoed() -> None:
    found = problems(
        '[http]\naccount_sid = "AC' + "0" * 32 + '"\nauth_token = 987654\n'
        "[api]\ntokens = [123456]\n" + APP + "signing_secret = 24680\n" + ROUTE
    )
    assert len(found) == 3
    for digits in ("987654", "123456", "24680"):
        assert all(digits not in problem for problem in found)


# -- [http], [api], [carriers.twilio] -----------------------------------------------------------


def test_http_and_api() -> None:
    config = parse(
        '[http]\naccount_sid = "AC' + "ab" * 16 + '"\nauth_token = "tok"\n'
        '[api]\ntokens = ["t1", "t2"]\n' + APP + ROUTE
    )
    assert config.http is not None and config.http.account_sid == "AC" + "ab" * 16
    assert config.api is not None and config.api.tokens == ("t1", "t2")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[http]\n",
            ["http.account_sid: missing (required)", "http.auth_token: missing (required)"],
        ),
        (
            '[http]\naccount_sid = "AC12"\nauth_token = "t"\n',
            ['http.account_sid: expected "AC" and 32 hex digits, got "AC12"'],
        ),
        ("[api]\n", ["api.tokens: missing (required)"]),
        ("[api]\ntokens = []\n", ["api.tokens: must hold at least one token"]),
        ('[api]\ntokens = [""]\n', ["api.tokens[0]: must not be empty"]),
        ('[api]\ntokens = "t"\n', ['api.tokens: expected an array, got "t"']),
        ("[carriers.twilio]\n", ["carriers.twilio.account_sid: missing (required)"]),
        ("carriers = 1\n", ["carriers: expected a table, got 1"]),
        (
            '[carriers.twilio]\naccount_sid = "AC' + "0" * 32 + '"\napi_base = "https://x/"\n',
            ["carriers.twilio.api_base: must not end with a slash (routes are appended to it)"],
        ),
    ],
)
def test_http_api_twilio_problems(text: str, expected: list[str]) -> None:
    assert problems(text + APP + ROUTE) == expected


def test_twilio_carrier_defaults_and_warnings() -> None:
    config = parse('[carriers.twilio]\naccount_sid = "AC' + "1" * 32 + '"\n' + APP + ROUTE)
    assert config.twilio == TwilioCarrierConfig("AC" + "1" * 32, None, "https://api.twilio.com")
    assert any("auth_token is not set" in w for w in config.warnings)
    assert any("server.public_url is not" in w for w in config.warnings)
    config = parse(
        '[server]\npublic_url = "https://gw.example"\n[carriers.twilio]\naccount_sid = "AC'
        + "1" * 32
        + '"\nauth_token = "t"\napi_base = "http://127.0.0.1:9999/fake"\n'
        + APP
        + ROUTE
    )
    assert config.twilio is not None and config.twilio.api_base == "http://127.0.0.1:9999/fake"
    assert config.warnings == ()


# -- [server] ca_bundle ----------------------------------------------------------------------------


def _bundle_config(path: str, base_dir: Path) -> Config:
    return parse(f'[server]\nca_bundle = "{path}"\n' + APP + ROUTE, base_dir=base_dir)


def test_ca_bundle_valid_absolute_and_relative(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text(TEST_CA_PEM)
    config = _bundle_config(str(tmp_path / "ca.pem"), tmp_path)
    assert config.server.ca_bundle == str(tmp_path / "ca.pem")
    config = _bundle_config("ca.pem", tmp_path)  # relative to the configuration's directory
    assert config.server.ca_bundle == str((tmp_path / "ca.pem").resolve())


def test_ca_bundle_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_text(TEST_CA_PEM * 3)
    path = tmp_path / "gw.toml"
    path.write_text('[server]\nca_bundle = "certs/ca.pem"\n' + APP + ROUTE)
    assert load_config(path, {}).server.ca_bundle == str(tmp_path / "certs" / "ca.pem")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("", "is empty"),
        ("\n  \n", "is empty"),
        ("hello\n", "holds no PEM certificate"),
        (TEST_CA_PEM.replace("MIIBkDCCATWg", "MIIBkDCCATWX"), "not a valid PEM bundle"),
        (
            TEST_CA_PEM + "-----BEGIN CERTIFICATE-----\nZm9vYmFy\n-----END CERTIFICATE-----\n",
            "not a valid PEM bundle",
        ),
        (TEST_CA_PEM * 17, "holds 17 certificates; at most 16"),
        (TEST_CA_PEM + "#" * (256 * 1024), "at most 262144 are allowed"),
    ],
)
def test_ca_bundle_problems(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_text(content)
    (problem,) = problems(f'[server]\nca_bundle = "{path}"\n' + APP + ROUTE)
    assert problem.startswith("server.ca_bundle: ") and message in problem


def test_ca_bundle_at_the_limits_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "ca.pem"
    path.write_text(TEST_CA_PEM * 16)
    assert _bundle_config(str(path), tmp_path).server.ca_bundle == str(path)


def test_ca_bundle_directory_is_refused(tmp_path: Path) -> None:
    (problem,) = problems(f'[server]\nca_bundle = "{tmp_path}"\n' + APP + ROUTE)
    assert "is not a file" in problem


# -- [sip] -------------------------------------------------------------------------------------


def test_sip_defaults_and_values() -> None:
    config = parse("[sip]\n" + APP + ROUTE)
    assert config.sip is not None
    assert config.sip.listen == ("udp:127.0.0.1:5060", "tcp:127.0.0.1:5060")
    assert config.sip.rtp_ports == (20000, 29999) and config.sip.trunks == ()
    config = parse(
        '[sip]\nlisten = ["udp:[::1]:5070", "tcp:0.0.0.0:5080", "udp:sip.internal:5060"]\n'
        'rtp_ports = [1024, 1025]\npublic_address = "203.0.113.10"\n'
        '[[sip.trunks]]\nname = "t.1"\nhost = "2001:db8::5"\n'
        'allow = ["10.0.0.0/8", "2001:db8::/32", "192.0.2.7"]\n' + APP + ROUTE
    )
    assert config.sip is not None
    assert config.sip.listen[0] == "udp:[::1]:5070" and config.sip.rtp_ports == (1024, 1025)
    assert config.sip.trunks == (
        SipTrunk(
            "t.1",
            "2001:db8::5",
            5060,
            "udp",
            None,
            None,
            ("10.0.0.0/8", "2001:db8::/32", "192.0.2.7"),
        ),
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'listen = ["sctp:1.2.3.4:5060"]',
            [
                'sip.listen[0]: expected "udp:HOST:PORT", "tcp:HOST:PORT" or "tls:HOST:PORT", '
                'got "sctp:1.2.3.4:5060"'
            ],
        ),
        (
            'listen = ["udp:1.2.3.4"]',
            [
                'sip.listen[0]: expected "udp:HOST:PORT", "tcp:HOST:PORT" or "tls:HOST:PORT", '
                'got "udp:1.2.3.4"'
            ],
        ),
        (
            'listen = ["udp:[1.2.3.4]:5060"]',
            [
                'sip.listen[0]: expected "udp:HOST:PORT", "tcp:HOST:PORT" or '
                '"tls:HOST:PORT", got "udp:[1.2.3.4]:5060"'
            ],
        ),
        (
            'listen = ["udp:h:70000"]',
            [
                'sip.listen[0]: expected "udp:HOST:PORT", "tcp:HOST:PORT" or "tls:HOST:PORT", '
                'got "udp:h:70000"'
            ],
        ),
        ("listen = []", ["sip.listen: must hold at least one entry"]),
        ('listen = ["udp:h:1", "udp:h:1"]', ['sip.listen: duplicate entry "udp:h:1"']),
        (
            "rtp_ports = [20000, 20001, 20002]",
            ["sip.rtp_ports: expected two ports [first, last], got 3 values"],
        ),
        (
            "rtp_ports = [20001, 20000]",
            ["sip.rtp_ports: the first port must be below the last, got [20001, 20000]"],
        ),
        (
            "rtp_ports = [20000, 20002]",
            ["sip.rtp_ports: the range must hold an even number of ports, got 3"],
        ),
        (
            "rtp_ports = [1000, 2001]",
            ["sip.rtp_ports[0]: expected an integer 1024-65535, got 1000"],
        ),
        (
            "rtp_ports = [2000, 65536]",
            ["sip.rtp_ports[1]: expected an integer 1024-65535, got 65536"],
        ),
        ('rtp_ports = "20000-29999"', ['sip.rtp_ports: expected an array, got "20000-29999"']),
        (
            'public_address = "not valid!"',
            ['sip.public_address: expected an IP address or host name, got "not valid!"'],
        ),
    ],
)
def test_sip_problems(text: str, expected: list[str]) -> None:
    assert problems(f"[sip]\n{text}\n" + APP + ROUTE) == expected


def test_sip_trunk_problems() -> None:
    found = problems(
        '[[sip.trunks]]\nname = "m"\nhost = "h"\ntransport = "sctp"\npassword = "p"\n'
        'allow = ["1.2.3.4/24", "nonsense", "10.0.0.0/8"]\n'
        '[[sip.trunks]]\nname = "m"\nport = 0\n' + APP + ROUTE
    )
    assert found[0] == 'sip.trunks[0].transport: expected one of "udp", "tcp", "tls", got "sctp"'
    assert found[1] == "sip.trunks[0].password: set without username"
    assert found[2].startswith("sip.trunks[0].allow[0]: expected a network such as 198.51.100.0/24")
    assert found[3].startswith("sip.trunks[0].allow[1]: expected a network")
    assert found[4:] == [
        'sip.trunks[1].name: duplicate trunk name "m" (first at sip.trunks[0])',
        "sip.trunks[1].host: missing (required)",
        "sip.trunks[1].port: expected an integer 1-65535, got 0",
    ]


# -- [[apps]] ----------------------------------------------------------------------------------


def app(extra: str = "", url: str = "wss://app.example.com/s", ref: str = "a") -> str:
    return f'[[apps]]\nref = "{ref}"\nurl = "{url}"\n{extra}\n'


def test_app_fields() -> None:
    config = parse(
        app(
            'protocol = "fonoster"\nsigning_secret = "sek"\nworkspace_ref = "ws-1"\n'
            'speech = { voice = "local/en-GB", language = "en-GB" }\n'
            'audio = { codec = "pcmu" }\nfallback = { message = "Bye." }\n'
            'listeners = [{ url = "wss://l.example/1", tracks = "inbound" },\n'
            '  { url = "ws://10.0.0.9/2" }]\n'
        )
        + ROUTE
    )
    a = config.apps["a"]
    assert a.signing_secret == "sek" and a.workspace_ref == "ws-1"
    assert a.speech == SpeechDefaults("local/en-GB", "en-GB")
    assert a.audio == AudioConfig("pcmu", 8000)  # pcmu defaults to its only rate
    assert a.fallback == Fallback(message="Bye.")
    assert a.listeners == (
        ListenerConfig("wss://l.example/1", "inbound"),
        ListenerConfig("ws://10.0.0.9/2", "both"),
    )


@pytest.mark.parametrize(
    ("audio", "expected"),
    [
        ('{ codec = "pcm16", rate = 8000 }', AudioConfig("pcm16", 8000)),
        ('{ codec = "pcm16", rate = 24000 }', AudioConfig("pcm16", 24000)),
        ("{ rate = 8000 }", AudioConfig("pcm16", 8000)),
        ('{ codec = "pcm16" }', AudioConfig("pcm16", 16000)),
        ('{ codec = "pcmu", rate = 8000 }', AudioConfig("pcmu", 8000)),
    ],
)
def test_audio_formats(audio: str, expected: AudioConfig) -> None:
    assert parse(app(f"audio = {audio}") + ROUTE).apps["a"].audio == expected


@pytest.mark.parametrize(
    ("audio", "problem"),
    [
        (
            '{ codec = "pcmu", rate = 16000 }',
            "apps[0].audio.rate: pcmu is available at 8000 Hz, not 16000",
        ),
        (
            "{ rate = 44100 }",
            "apps[0].audio.rate: pcm16 is available at 8000, 16000, 24000 Hz, not 44100",
        ),
        ('{ codec = "opus" }', 'apps[0].audio.codec: expected one of "pcm16", "pcmu", got "opus"'),
        ('{ rate = "16000" }', 'apps[0].audio.rate: expected an integer 1-192000, got "16000"'),
        ('"pcm16"', 'apps[0].audio: expected a table, got "pcm16"'),
    ],
)
def test_audio_problems(audio: str, problem: str) -> None:
    assert problems(app(f"audio = {audio}") + ROUTE) == [problem]


def test_audio_is_refused_on_twilio_apps() -> None:
    found = problems(app('protocol = "twilio"\naudio = { codec = "pcmu", rate = 8000 }') + ROUTE)
    assert found == [
        'apps[0].audio: not allowed on a "twilio" app (the Twilio dialect is always µ-law at 8 kHz)'
    ]
    assert parse(app('protocol = "twilio"') + ROUTE).apps["a"].protocol == "twilio"


@pytest.mark.parametrize(
    ("ref", "problem"),
    [
        ("", "apps[0].ref: must not be empty"),
        ("has space", "apps[0].ref: expected letters, digits, '.', '_' or '-', got \"has space\""),
        ("x" * 129, "apps[0].ref: longer than 128 characters"),
        ("a/b", "apps[0].ref: expected letters, digits, '.', '_' or '-', got \"a/b\""),
    ],
)
def test_bad_refs(ref: str, problem: str) -> None:
    assert problems(app(ref=ref)) == [problem]


def test_ref_limits_and_duplicates() -> None:
    long_ref = "A-z_0." + "x" * 122
    assert long_ref in parse(app(ref=long_ref)).apps
    found = problems(app() + app(ref="a") + ROUTE)
    assert found == ['apps[1].ref: duplicate app ref "a" (first at apps[0])']
    assert problems('[[apps]]\nurl = "wss://h"\n') == ["apps[0].ref: missing (required)"]


def test_at_least_one_app() -> None:
    assert problems("") == ["apps: at least one [[apps]] entry is required"]
    assert problems("apps = []\n") == ["apps: at least one [[apps]] entry is required"]
    assert problems("apps = [1]\n") == [
        "apps[0]: expected a table, got 1",
        "apps[0].ref: missing (required)",
        "apps[0].url: missing (required)",
    ]


@pytest.mark.parametrize(
    "url",
    [
        "http://app.example.com/s",
        "https://app.example.com/s",
        "app.example.com/s",
        "wss://",
        "wss:///path",
        "wss://h:0/",
    ],
)
def test_app_url_scheme(url: str) -> None:
    (problem,) = problems(app(url=url) + ROUTE)
    assert problem.startswith("apps[0].url: expected a ws:// or wss:// URL with a host")


def test_app_url_fragment() -> None:
    assert problems(app(url="wss://h.example/s#x") + ROUTE) == [
        "apps[0].url: must not have a fragment (RFC 6455 §3)"
    ]


def test_plaintext_rule_on_app_urls() -> None:
    ok = parse(app(url="ws://10.1.2.3:9000/s?k=1") + ROUTE)
    assert ok.apps["a"].url == "ws://10.1.2.3:9000/s?k=1" and ok.warnings == ()
    (problem,) = problems(app(url="ws://app.example.com/s") + ROUTE)
    assert problem.startswith(
        "apps[0].url: ws:// is only allowed for loopback/private hosts (set allow_insecure = true"
    )


def test_allow_insecure_covers_the_app_and_its_listeners_and_warns() -> None:
    text = app(
        'allow_insecure = true\nlisteners = [{ url = "ws://198.51.100.7/l" }]',
        url="ws://203.0.113.5/s",
    )
    config = parse(text + ROUTE)
    assert config.apps["a"].allow_insecure
    assert config.apps["a"].listeners[0].url == "ws://198.51.100.7/l"
    assert len(config.warnings) == 1
    assert config.warnings[0].startswith("apps[0] (a): allow_insecure = true")


def test_listener_urls_follow_the_plaintext_rule() -> None:
    found = problems(
        app('listeners = [{ url = "ws://198.51.100.7/l" }, { url = "ws://[::1]/ok" }]') + ROUTE
    )
    assert len(found) == 1
    assert found[0].startswith("apps[0].listeners[0].url: ws:// is only allowed")


def test_single_label_hosts_warn() -> None:
    config = parse(
        app('listeners = [{ url = "ws://recorder:9000/l" }]', url="ws://agent:8000/s") + ROUTE
    )
    assert [w.split(":")[0] for w in config.warnings] == ["apps[0].url", "apps[0].listeners[0].url"]
    assert "single-label" in config.warnings[0]


def test_listener_limits_and_tracks() -> None:
    five = ", ".join(f'{{ url = "wss://l{i}.example" }}' for i in range(5))
    assert problems(app(f"listeners = [{five}]") + ROUTE) == [
        "apps[0].listeners: at most 4 listeners are allowed, got 5"
    ]
    four = ", ".join(f'{{ url = "wss://l{i}.example", tracks = "outbound" }}' for i in range(4))
    assert len(parse(app(f"listeners = [{four}]") + ROUTE).apps["a"].listeners) == 4
    assert problems(app('listeners = [{ url = "wss://l", tracks = "all" }]') + ROUTE) == [
        'apps[0].listeners[0].tracks: expected one of "inbound", "outbound", "both", got "all"'
    ]
    assert problems(app('listeners = [{ tracks = "both" }]') + ROUTE) == [
        "apps[0].listeners[0].url: missing (required)"
    ]


def test_protocol_values() -> None:
    assert problems(app('protocol = "sip"') + ROUTE) == [
        'apps[0].protocol: expected one of "fonoster", "twilio", got "sip"'
    ]


def test_fallback_rules() -> None:
    # a fallback may name an app defined further down
    config = parse(app('fallback = { app = "b" }') + app(ref="b") + ROUTE)
    assert config.apps["a"].fallback == Fallback(app="b")
    assert problems(app('fallback = { app = "zzz" }') + ROUTE) == [
        'apps[0].fallback.app: unknown app "zzz"'
    ]
    assert problems(app('fallback = { app = "a" }') + ROUTE) == [
        "apps[0].fallback.app: must name another app, not the app itself"
    ]
    assert problems(app('fallback = { app = "a", message = "m" }') + ROUTE) == [
        "apps[0].fallback: set exactly one of app or message"
    ]
    assert problems(app("fallback = {}") + ROUTE) == [
        "apps[0].fallback: set exactly one of app or message"
    ]
    assert problems(app(f'fallback = {{ message = "{"x" * 1001}" }}') + ROUTE) == [
        "apps[0].fallback.message: longer than 1000 characters"
    ]


def test_speech_voice_with_catalog() -> None:
    voices = {"local/en-US", "local/de-DE"}
    config = parse(
        app('speech = { voice = "local/de-DE" }') + ROUTE, known_voice=voices.__contains__
    )
    assert config.apps["a"].speech == SpeechDefaults("local/de-DE", "en-US")
    assert problems(
        app('speech = { voice = "acme/bob" }') + ROUTE, known_voice=voices.__contains__
    ) == ['apps[0].speech.voice: unknown voice "acme/bob"']


def test_speech_voice_without_catalog_checks_the_id_shape() -> None:
    assert parse(app('speech = { voice = "deepgram/aura-2-thalia-en" }') + ROUTE)
    assert problems(app('speech = { voice = "thalia" }') + ROUTE) == [
        'apps[0].speech.voice: expected a catalog id "provider/voice", got "thalia"'
    ]


@pytest.mark.parametrize(
    "tag",
    [
        "en",
        "en-US",
        "es-419",
        "zh-Hant-TW",
        "sr-Latn-RS",
        "de-CH-1996",
        "en-US-x-twain",
        "x-private",
        "i-klingon",
        "zh-min-nan",
        "EN-us",
        "yue",
        "en-a-bbb-x-ccc",
        "sl-rozaj-biske",
    ],
)
def test_bcp47_well_formed(tag: str) -> None:
    assert is_bcp47(tag)


@pytest.mark.parametrize(
    "tag",
    [
        "",
        "en_US",
        "e",
        "englishlanguage-US",
        "en-",
        "-en",
        "en--US",
        "en-US-",
        "123",
        "en-x",
        "en-a",
        "en-US-x-",
        "en-ünï",
        "en-toolongsubtag",
    ],
)
def test_bcp47_malformed(tag: str) -> None:
    assert not is_bcp47(tag)


def test_speech_language_problem() -> None:
    assert problems(app('speech = { language = "en_US" }') + ROUTE) == [
        'apps[0].speech.language: expected a BCP-47 language tag such as en-US, got "en_US"'
    ]


def test_twilio_app_without_workspace_ref_warns_when_rest_is_on() -> None:
    http = '[http]\naccount_sid = "AC' + "0" * 32 + '"\nauth_token = "t"\n'
    config = parse(http + app('protocol = "twilio"') + ROUTE)
    assert any("no workspace_ref" in w for w in config.warnings)
    config = parse(http + app('protocol = "twilio"\nworkspace_ref = "AC' + "0" * 32 + '"') + ROUTE)
    assert config.warnings == ()


def test_allow_insecure_must_be_a_boolean() -> None:
    assert problems(app('allow_insecure = "yes"') + ROUTE) == [
        'apps[0].allow_insecure: expected true or false, got "yes"'
    ]


def test_apps_keep_file_order() -> None:
    config = parse(app(ref="z") + app(ref="m") + app(ref="a") + ROUTE)
    assert list(config.apps) == ["z", "m", "a"]


# -- [[numbers]] and routing -----------------------------------------------------------------------


def test_routing() -> None:
    config = parse(
        app(ref="a")
        + app(ref="b")
        + '[[numbers]]\nnumber = "+15550002222"\napp = "b"\n'
        + '[[numbers]]\nnumber = "*"\napp = "a"\n'
    )
    assert config.route("+15550002222") is config.apps["b"]
    assert config.route("+15550003333") is config.apps["a"]
    assert config.route("") is config.apps["a"]
    config = parse(app() + '[[numbers]]\nnumber = "+15550002222"\napp = "a"\n')
    assert config.route("+15550002222") is config.apps["a"]
    assert config.route("15550002222") is None  # exact match only
    assert config.route("+15550009999") is None


@pytest.mark.parametrize(
    ("number", "ok"),
    [
        ("+12", True),
        ("+" + "1" * 15, True),
        ("+1", False),
        ("+" + "1" * 16, False),
        ("15550001111", False),
        ("+1-555-000", False),
        ("**", False),
        ("+\uff11\uff12\uff13", False),
    ],
)
def test_number_format(number: str, ok: bool) -> None:
    text = app() + f'[[numbers]]\nnumber = "{number}"\napp = "a"\n'
    if ok:
        assert parse(text).numbers == (NumberRoute(number, "a"),)
    else:
        assert problems(text) == [
            f'numbers[0].number: expected E.164 ("+" and 2-15 digits) or "*", got "{number}"'
        ]


def test_number_problems() -> None:
    found = problems(
        app()
        + '[[numbers]]\nnumber = "+15550001111"\napp = "a"\n'
        + '[[numbers]]\nnumber = "+15550001111"\napp = "a"\n'
        + '[[numbers]]\napp = "nope"\n'
    )
    assert found == [
        'numbers[1].number: duplicate number "+15550001111" (first at numbers[0])',
        "numbers[2].number: missing (required)",
        'numbers[2].app: unknown app "nope"',
    ]


def test_no_numbers_warns() -> None:
    config = parse(app())
    assert config.numbers == ()
    assert config.warnings == ("no [[numbers]] entries: every inbound call is rejected",)
    assert config.route("+15550001111") is None


def test_secrets_stay_out_of_repr() -> None:
    config = load_config(EXAMPLE, EXAMPLE_ENV)
    text = repr(config)
    assert "value-of-" not in text
    assert "support-line" in text  # the rest is still there


def test_media_section_bounds_play_fetches() -> None:
    from appbridge.config import MediaConfig

    base = {
        "apps": [{"ref": "a", "url": "ws://127.0.0.1:9/x"}],
        "numbers": [{"number": "*", "app": "a"}],
    }
    assert parse_config(base, {}).media == MediaConfig()
    cfg = parse_config({**base, "media": {"allow_private": True, "max_bytes": 2048}}, {})
    assert cfg.media.allow_private is True and cfg.media.max_bytes == 2048
    with pytest.raises(ConfigError) as err:
        parse_config({**base, "media": {"max_bytes": 1, "colour": "red", "timeout_s": -1}}, {})
    problems = "\n".join(err.value.problems)
    assert "media.max_bytes" in problems
    assert "media.colour: unknown key" in problems
    assert "media.timeout_s" in problems


# -- [speech.deepgram] ---------------------------------------------------------------------------

DEEPGRAM = '[speech.deepgram]\napi_key = "${DEEPGRAM_API_KEY}"\n'
DEEPGRAM_ENV = {"DEEPGRAM_API_KEY": "dg-key-from-env"}


def test_speech_section_is_off_by_default() -> None:
    assert parse(APP + ROUTE).speech is None
    assert default_config().speech is None


def test_deepgram_section_with_defaults() -> None:
    from appbridge.config import DeepgramConfig, SpeechConfig

    config = parse(DEEPGRAM + APP + ROUTE, DEEPGRAM_ENV)
    assert config.speech == SpeechConfig(
        DeepgramConfig(
            api_key="dg-key-from-env",
            base_url="https://api.deepgram.com",
            tts_model="aura-2-thalia-en",
            stt_model="nova-3",
            voices=(),
        )
    )
    assert config.speech.deepgram is not None
    assert config.speech.deepgram.ws_base_url == "wss://api.deepgram.com"
    assert "dg-key-from-env" not in repr(config)
    assert config.warnings == ()


def test_deepgram_section_with_every_key() -> None:
    text = (
        DEEPGRAM
        + 'base_url = "http://127.0.0.1:8911/dg"\n'
        + 'tts_model = "aura-2-andromeda-en"\nstt_model = "nova-2-phonecall"\n'
        + 'voices = ["aura-2-newvoice-fr", "aura-2-other-es"]\n'
        + APP
        + ROUTE
    )
    deepgram = parse(text, DEEPGRAM_ENV).speech.deepgram  # type: ignore[union-attr]
    assert deepgram is not None
    assert deepgram.base_url == "http://127.0.0.1:8911/dg"
    assert deepgram.ws_base_url == "ws://127.0.0.1:8911/dg"
    assert (deepgram.tts_model, deepgram.stt_model) == ("aura-2-andromeda-en", "nova-2-phonecall")
    assert deepgram.voices == ("aura-2-newvoice-fr", "aura-2-other-es")


def test_deepgram_section_problems_name_their_keys() -> None:
    text = (
        '[speech]\ncolour = "red"\n[speech.deepgram]\nbase_url = "https://api.deepgram.com/"\n'
        + 'tts_model = "nova-3"\nstt_model = "Nova 3"\nmodel = "x"\n'
        + 'voices = ["aura-2-thalia-en", "aura-2-thalia-en", "thalia"]\n'
        + APP
        + ROUTE
    )
    assert problems(text) == [
        "speech.colour: unknown key",
        "speech.deepgram.model: unknown key",
        "speech.deepgram.api_key: missing (required)",
        "speech.deepgram.base_url: must not end with a slash (routes are appended to it)",
        "speech.deepgram.tts_model: expected an Aura model ending in its language, such as "
        'aura-2-thalia-en, got "nova-3"',
        'speech.deepgram.stt_model: expected a Deepgram model name such as nova-3, got "Nova 3"',
        'speech.deepgram.voices[1]: duplicate entry "aura-2-thalia-en"',
        'speech.deepgram.voices[2]: expected an Aura model such as aura-2-thalia-en, got "thalia"',
    ]


def test_deepgram_key_comes_from_the_environment() -> None:
    assert problems(DEEPGRAM + APP + ROUTE, {}) == [
        "speech.deepgram.api_key: environment variable DEEPGRAM_API_KEY is not set"
    ]
    found = problems('[speech.deepgram]\napi_key = 42\nbase_url = "ftp://x"\n' + APP + ROUTE)
    assert found == [
        "speech.deepgram.api_key: expected a string, got a number",  # the value is not echoed
        'speech.deepgram.base_url: expected an http:// or https:// URL, got "ftp://x"',
    ]
    assert problems("speech = 3\n" + APP + ROUTE) == ["speech: expected a table, got 3"]


def test_deepgram_plain_http_to_a_public_host_warns() -> None:
    public = parse(DEEPGRAM + 'base_url = "http://dg.example.com"\n' + APP + ROUTE, DEEPGRAM_ENV)
    assert any("plain http://" in w for w in public.warnings)
    private = parse(DEEPGRAM + 'base_url = "http://10.0.0.7:8080"\n' + APP + ROUTE, DEEPGRAM_ENV)
    assert private.warnings == ()


def test_app_may_name_a_deepgram_voice_once_deepgram_is_configured() -> None:
    local = {"local/en-US"}.__contains__
    entry = app('speech = { voice = "deepgram/aura-2-thalia-en" }') + ROUTE
    config = parse(DEEPGRAM + entry, DEEPGRAM_ENV, known_voice=local)
    assert config.apps["a"].speech.voice == "deepgram/aura-2-thalia-en"
    extra = DEEPGRAM + 'voices = ["aura-2-newvoice-fr"]\n'
    entry_fr = app('speech = { voice = "deepgram/aura-2-newvoice-fr" }') + ROUTE
    assert parse(extra + entry_fr, DEEPGRAM_ENV, known_voice=local).apps["a"]
    assert problems(entry, known_voice=local) == [
        'apps[0].speech.voice: unknown voice "deepgram/aura-2-thalia-en"'
    ]
    assert problems(
        DEEPGRAM + app('speech = { voice = "deepgram/aura-9-nobody-en" }') + ROUTE,
        DEEPGRAM_ENV,
        known_voice=local,
    ) == ['apps[0].speech.voice: unknown voice "deepgram/aura-9-nobody-en"']


def test_speech_stt_choice() -> None:
    base = {"numbers": [{"number": "*", "app": "a"}]}
    app = {"ref": "a", "url": "ws://127.0.0.1:9/x"}
    assert parse_config({**base, "apps": [app]}, {}).apps["a"].speech.stt == "auto"
    quiet = {**app, "speech": {"stt": "none"}}
    assert parse_config({**base, "apps": [quiet]}, {}).apps["a"].speech.stt == "none"
    for bad, message in (
        ("whisper", "apps[0].speech.stt: expected one of"),
        ("deepgram", 'apps[0].speech.stt: "deepgram" needs'),
    ):
        with pytest.raises(ConfigError) as err:
            parse_config({**base, "apps": [{**app, "speech": {"stt": bad}}]}, {})
        assert any(p.startswith(message) for p in err.value.problems), err.value.problems
