"""``[sip] tls``, TLS trunks, ``srtp`` and ``register`` (docs/configuration.md, ``[sip]``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tls_support import make_ca
from tests.unit.test_config import APP, ROUTE, parse, problems


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("certs")
    ca = make_ca(folder)
    leaf = ca.leaf("gw", dns=("gw.test",))
    other = ca.leaf("other", dns=("other.test",))
    return {
        "ca": ca.cert_file,
        "cert": leaf.cert_file,
        "key": leaf.key_file,
        "other_key": other.key_file,
        "folder": folder,
    }


def tls_table(certs: dict[str, Path], key: str = "key", ca: bool = True) -> str:
    ca_part = f', ca_file = "{certs["ca"]}"' if ca else ""
    return f'tls = {{ cert_file = "{certs["cert"]}", key_file = "{certs[key]}"{ca_part} }}\n'


def test_tls_listener_and_files(certs: dict[str, Path]) -> None:
    config = parse(
        '[sip]\nlisten = ["udp:127.0.0.1:5060", "tls:127.0.0.1:5061"]\n'
        + tls_table(certs)
        + APP
        + ROUTE
    )
    assert config.sip is not None and config.sip.tls is not None
    assert config.sip.listen[1] == "tls:127.0.0.1:5061"
    assert config.sip.tls.cert_file == str(certs["cert"].resolve())
    assert config.sip.tls.ca_file == str(certs["ca"].resolve())


def test_relative_tls_paths_are_read_from_the_config_folder(certs: dict[str, Path]) -> None:
    config = parse(
        '[sip]\nlisten = ["tls:127.0.0.1:5061"]\n'
        'tls = { cert_file = "gw.crt", key_file = "gw.key" }\n' + APP + ROUTE,
        base_dir=certs["folder"],
    )
    assert config.sip is not None and config.sip.tls is not None
    assert config.sip.tls.key_file == str((certs["folder"] / "gw.key").resolve())
    assert config.sip.tls.ca_file is None


def test_a_tls_listener_needs_files() -> None:
    assert problems('[sip]\nlisten = ["tls:127.0.0.1:5061"]\n' + APP + ROUTE) == [
        'sip.listen: a "tls:" listener needs [sip] tls (cert_file, key_file)'
    ]


def test_missing_unreadable_and_mismatched_files_fail(certs: dict[str, Path]) -> None:
    found = problems(
        '[sip]\nlisten = ["tls:127.0.0.1:5061"]\n'
        'tls = { cert_file = "/nonexistent/gw.crt", key_file = "k" }\n' + APP + ROUTE,
        base_dir=certs["folder"],
    )
    assert (
        found[0] == "sip.tls.cert_file: cannot read /nonexistent/gw.crt: No such file or directory"
    )
    assert found[1].startswith("sip.tls.key_file: cannot read ")
    mismatched = problems(
        '[sip]\nlisten = ["tls:127.0.0.1:5061"]\n' + tls_table(certs, key="other_key") + APP + ROUTE
    )
    assert len(mismatched) == 1
    assert mismatched[0].startswith("sip.tls: ")
    assert "are not a usable certificate and key" in mismatched[0]
    not_a_ca = problems(
        '[sip]\nlisten = ["tls:127.0.0.1:5061"]\n'
        f'tls = {{ cert_file = "{certs["cert"]}", key_file = "{certs["key"]}", '
        f'ca_file = "{certs["key"]}" }}\n' + APP + ROUTE
    )
    assert not_a_ca == [f"sip.tls.ca_file: {certs['key'].resolve()} holds no PEM certificate"]


def test_trunk_defaults_follow_the_transport() -> None:
    config = parse(
        '[[sip.trunks]]\nname = "plain"\nhost = "h"\n'
        '[[sip.trunks]]\nname = "secure"\nhost = "h"\ntransport = "tls"\n'
        '[[sip.trunks]]\nname = "mixed"\nhost = "h"\nsrtp = "optional"\n' + APP + ROUTE
    )
    assert config.sip is not None
    plain, secure, mixed = config.sip.trunks
    assert (plain.port, plain.srtp, plain.register) == (5060, "off", False)
    assert (secure.port, secure.srtp, secure.transport) == (5061, "required", "tls")
    assert mixed.srtp == "optional"
    assert plain.register_expires_s == 3600


def test_register_needs_credentials_and_a_sane_expiry() -> None:
    found = problems(
        '[[sip.trunks]]\nname = "r"\nhost = "h"\nregister = true\nregister_expires_s = 5\n'
        'srtp = "maybe"\n' + APP + ROUTE
    )
    assert found == [
        'sip.trunks[0].srtp: expected one of "off", "optional", "required", got "maybe"',
        "sip.trunks[0].register: needs username and password",
        "sip.trunks[0].register_expires_s: expected an integer 60-86400, got 5",
    ]
    ok = parse(
        '[[sip.trunks]]\nname = "r"\nhost = "h"\nregister = true\nusername = "u"\n'
        'password = "${P}"\nregister_expires_s = 600\n' + APP + ROUTE,
        {"P": "secret"},
    )
    assert ok.sip is not None
    assert ok.sip.trunks[0].register and ok.sip.trunks[0].register_expires_s == 600
