"""The gateway registering with Kamailio as a registrar (docs/sip.md, "Registering with a
trunk").

Real peers only: the Debian ``kamailio`` with registrar, usrloc, auth and auth_db on db_text (one
subscriber with a plain password, SHA-256 or MD5 digest), ``appbridge serve`` as a subprocess on
127.0.0.2 with one ``register = true`` trunk, and sipp calling the registered AOR through
Kamailio (``lookup("location")``). Kamailio grants at most 10 s, so the refresh comes after 5 s;
``APPBRIDGE_SIP_REGISTER_RETRY_S`` and ``APPBRIDGE_SIP_KEEPALIVE_S`` make the backoff and the
keepalive short enough for a registrar restart to be seen in seconds. Under ``CI=true`` a missing
kamailio or sipp fails; elsewhere these tests skip (deploy/install-test-peers.sh).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from appbridge.testing import FakeApp
from tests.integration.sipp_support import SCENARIOS, SIPP, free_port, scenario_file, sipp_required
from tests.integration.test_kamailio import KAMAILIO, KAMCMD, kamailio_required, until

pytestmark = [sipp_required(), kamailio_required(), pytest.mark.timeout(120)]

SECRET = "register-test-secret"
TOKEN = "register-test-token"
GW_HOST = "127.0.0.2"
USER, PASSWORD = "gwuser", "reg-s3cret"
DIALLED = "+15550002222"

KAMAILIO_CFG = """#!KAMAILIO
debug=2
log_stderror=yes
children=2
auto_aliases=no
alias="localhost:{port}"
listen=udp:127.0.0.1:{port}
listen=tcp:127.0.0.1:{port}
dns=no
rev_dns=no
loadpath "/usr/lib/x86_64-linux-gnu/kamailio/modules/"
loadmodule "ctl.so"
loadmodule "kex.so"
loadmodule "corex.so"
loadmodule "tm.so"
loadmodule "sl.so"
loadmodule "pv.so"
loadmodule "maxfwd.so"
loadmodule "textops.so"
loadmodule "siputils.so"
loadmodule "xlog.so"
loadmodule "db_text.so"
loadmodule "usrloc.so"
loadmodule "registrar.so"
loadmodule "auth.so"
loadmodule "auth_db.so"
modparam("ctl", "binrpc", "{ctl}")
modparam("usrloc", "db_mode", 0)
modparam("registrar", "min_expires", 5)
modparam("registrar", "max_expires", 10)
modparam("auth", "algorithm", "{algorithm}")
modparam("auth_db", "db_url", "text://{db}")
modparam("auth_db", "calculate_ha1", yes)
modparam("auth_db", "password_column", "password")
modparam("auth_db", "use_domain", 0)

request_route {{
    if (!mf_process_maxfwd_header("10")) {{ sl_send_reply("483", "Too Many Hops"); exit; }}
    if (is_method("REGISTER")) {{
        if (!auth_check("$fd", "subscriber", "1")) {{ auth_challenge("$fd", "1"); exit; }}
        if (!save("location")) {{ sl_reply_error(); }}
        exit;
    }}
    if (is_method("OPTIONS") && uri == myself && $rU == $null) {{
        sl_send_reply("200", "OK");
        exit;
    }}
    if (has_totag() || is_method("CANCEL")) {{ t_relay(); exit; }}
    if (is_method("INVITE")) {{
        if (!lookup("location")) {{ sl_send_reply("404", "Not Found"); exit; }}
        xlog("L_INFO", "appbridge-registered-call to $ru\\n");
        t_relay();
        exit;
    }}
    sl_send_reply("405", "Method Not Allowed");
}}
"""

GATEWAY_CONFIG = """
[server]
host = "127.0.0.1"
port = {http_port}
drain_timeout_s = 2

[api]
tokens = ["{token}"]

[sip]
listen = ["udp:{host}:{sip_port}", "tcp:{host}:{sip_port}"]
rtp_ports = [47800, 47999]

[[sip.trunks]]
name = "registrar"
host = "localhost"
port = {kamailio_port}
transport = "{transport}"
username = "{user}"
password = "{password}"
register = true
register_expires_s = 60

[[sip.trunks]]
name = "plain"
host = "127.0.0.9"

[media]
allow_private = true

[[apps]]
ref = "main"
url = "{app_url}"
signing_secret = "${{APP_SECRET}}"

[[numbers]]
number = "*"
app = "main"
"""


@dataclass
class Registrar:
    tmp: Path
    port: int
    ctl: str
    algorithm: str
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0

    @property
    def log(self) -> Path:
        return self.tmp / f"kamailio-{self.starts}.log"

    async def start(self) -> None:
        assert KAMAILIO is not None
        self.starts += 1
        run = self.tmp / f"run{self.starts}"
        run.mkdir()
        with self.log.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                KAMAILIO,
                "-f",
                str(self.tmp / "kamailio.cfg"),
                "-DD",
                "-E",
                "-Y",
                str(run),
                "-P",
                str(run / "kamailio.pid"),
                stdout=out,
                stderr=out,
                cwd=str(self.tmp),
                start_new_session=True,  # its own process group: a kill takes every worker
            )

    async def kill(self) -> None:
        """SIGKILL to Kamailio's whole process group: its sockets close at once."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                pass
        await self.kill()  # any worker left behind

    async def location(self) -> str:
        """``ul.dump`` over the control socket: the location table as text."""
        assert KAMCMD is not None
        if self.proc is None or self.proc.returncode is not None:
            raise AssertionError("kamailio exited: " + self.log.read_text()[-3000:])
        proc = await asyncio.create_subprocess_exec(
            KAMCMD,
            "-s",
            self.ctl,
            "ul.dump",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 5)
        return out.decode(errors="replace")


@dataclass
class Gateway:
    proc: asyncio.subprocess.Process
    http_port: int
    sip_port: int
    app: FakeApp
    log: Path

    async def trunks(self) -> list[dict[str, Any]]:
        async with httpx.AsyncClient() as client:
            response = await client.get(
                f"http://127.0.0.1:{self.http_port}/v1/trunks",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
        assert response.status_code == 200, response.text
        trunks: list[dict[str, Any]] = response.json()["trunks"]
        return trunks

    async def state(self) -> str:
        return str((await self.trunks())[0]["registration"]["state"])


def _registrar_files(tmp: Path, port: int, algorithm: str) -> Registrar:
    db = tmp / "db"
    db.mkdir()
    (db / "version").write_text(
        "id(int,auto) table_name(string) table_version(int) \n0:subscriber:7\n"
    )
    (db / "subscriber").write_text(
        "id(int,auto) username(string) domain(string) password(string) ha1(string) "
        f"ha1b(string) \n1:{USER}:localhost:{PASSWORD}:-:-\n"
    )
    ctl = f"unixs:{tmp / 'kamailio_ctl'}"
    (tmp / "kamailio.cfg").write_text(
        KAMAILIO_CFG.format(port=port, ctl=ctl, db=db, algorithm=algorithm)
    )
    return Registrar(tmp, port, ctl, algorithm)


def _free_both() -> int:
    """A port free for UDP and TCP on 127.0.0.1 (Kamailio listens on both)."""
    for _ in range(50):
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError("no port free for UDP and TCP")


async def _start_gateway(tmp: Path, kamailio_port: int, transport: str) -> Gateway:
    app = FakeApp(secret=SECRET)
    await app.start()
    http_port = free_port(socket.SOCK_STREAM)
    sip_port = _free_both()
    cfg = tmp / "gateway.toml"
    cfg.write_text(
        GATEWAY_CONFIG.format(
            http_port=http_port,
            token=TOKEN,
            host=GW_HOST,
            sip_port=sip_port,
            kamailio_port=kamailio_port,
            transport=transport,
            user=USER,
            password=PASSWORD,
            app_url=app.url,
        )
    )
    log = tmp / "gateway.log"
    env = {
        **os.environ,
        "APP_SECRET": SECRET,
        "APPBRIDGE_LOG_LEVEL": "INFO",
        "APPBRIDGE_SIP_REGISTER_RETRY_S": "1",
        "APPBRIDGE_SIP_KEEPALIVE_S": "1",
    }
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "appbridge",
            "serve",
            "--config",
            str(cfg),
            env=env,
            stdout=out,
            stderr=out,
        )
    return Gateway(proc, http_port, sip_port, app, log)


@asynccontextmanager
async def registered_gateway(
    tmp: Path, *, transport: str, algorithm: str
) -> AsyncIterator[tuple[Registrar, Gateway]]:
    kamailio = _registrar_files(tmp, _free_both(), algorithm)
    await kamailio.start()
    gw = await _start_gateway(tmp, kamailio.port, transport)
    try:
        await until(lambda: _healthy(gw), 30, "the gateway to serve HTTP")
        yield kamailio, gw
    finally:
        if gw.proc.returncode is None:
            gw.proc.kill()
            await gw.proc.wait()
        await gw.app.stop()
        await kamailio.stop()


async def _healthy(gw: Gateway) -> bool:
    if gw.proc.returncode is not None:
        raise AssertionError("gateway exited: " + gw.log.read_text()[-3000:])
    try:
        await gw.trunks()
    except httpx.TransportError:
        return False
    return True


def _cseq(location: str) -> int | None:
    """The CSeq of our binding in an ``ul.dump`` (None when there is none)."""
    if re.search(rf"sip:{USER}-[0-9a-f]{{16}}@{re.escape(GW_HOST)}", location) is None:
        return None
    match = re.search(r"CSeq:\s*(\d+)", location)
    return int(match.group(1)) if match else None


async def _bound(kamailio: Registrar) -> bool:
    return _cseq(await kamailio.location()) is not None


async def _call_through_registrar(tmp: Path, kamailio: Registrar, transport: str) -> str:
    assert SIPP is not None
    scenario = scenario_file(
        tmp, (SCENARIOS / "uac_registered_call.xml").read_text(), "call.xml", to=DIALLED
    )
    proc = await asyncio.create_subprocess_exec(
        SIPP,
        f"127.0.0.1:{kamailio.port}",
        "-sf",
        str(scenario),
        "-s",
        USER,
        "-t",
        "t1" if transport == "tcp" else "u1",
        "-i",
        "127.0.0.1",
        "-p",
        str(_free_both()),
        "-mi",
        "127.0.0.1",
        "-mp",
        str(free_port() & ~1),
        "-m",
        "1",
        "-timeout",
        "20s",
        "-timeout_error",
        "-nostdin",
        "-trace_err",
        "-error_file",
        str(tmp / "sipp-errors.log"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=str(tmp),
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 40)
    text = out.decode(errors="replace")[-2000:]
    errors = tmp / "sipp-errors.log"
    if errors.exists():
        text += errors.read_text(errors="replace")[-2000:]
    assert proc.returncode == 0, text
    return text


async def test_registers_refreshes_takes_a_call_and_unregisters(tmp_path: Path) -> None:
    """UDP, SHA-256 digest (Kamailio 5.6's auth ``algorithm``): registered, refreshed within
    Kamailio's 10 s grant, a call to the AOR reaches the app with the dialled number from To,
    and a SIGTERM removes the binding."""
    async with registered_gateway(tmp_path, transport="udp", algorithm="SHA-256") as (kam, gw):
        await until(lambda: _bound(kam), 15, "the gateway's binding in Kamailio")
        await until(lambda: _state_is(gw, "registered"), 5, "registered in /v1/trunks")
        trunk, plain = await gw.trunks()
        assert plain["registration"] == {"state": "disabled"} and plain["register"] is False
        assert trunk["name"] == "registrar" and trunk["register"] is True
        assert trunk["transport"] == "udp" and "password" not in str(trunk)
        registration = trunk["registration"]
        assert re.fullmatch(
            rf"sip:{USER}-[0-9a-f]{{16}}@{GW_HOST}:{gw.sip_port}", registration["contact"]
        )
        assert "expiresAt" in registration
        first = _cseq(await kam.location())
        assert first is not None
        await until(lambda: _refreshed(kam, first), 12, "a refresh within the 10 s grant")
        assert await gw.state() == "registered"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.http_port}") as client:
            assert (await client.get("/v1/trunks")).status_code == 401
            metrics = (await client.get("/metrics")).text
        assert 'appbridge_sip_registrations{state="registered"} 1.0' in metrics

        await _call_through_registrar(tmp_path, kam, "udp")
        assert len(gw.app.sessions) == 1
        start = await gw.app.sessions[0].wait_for("session.start", timeout=5)
        assert start["to"] == DIALLED  # the To header's number, not the Contact user
        assert start["from"] == "+15551230009"

        assert gw.proc.returncode is None
        gw.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(gw.proc.wait(), 15)
        assert _cseq(await kam.location()) is None  # unregistered on the way out


async def test_tcp_registration_survives_a_registrar_restart(tmp_path: Path) -> None:
    """TCP, MD5 digest: Kamailio killed, the gateway shows ``failed`` with a next attempt, then
    is registered again once Kamailio is back; a call still reaches the app."""
    async with registered_gateway(tmp_path, transport="tcp", algorithm="MD5") as (kam, gw):
        await until(lambda: _bound(kam), 15, "the gateway's binding in Kamailio")
        await until(lambda: _state_is(gw, "registered"), 5, "registered in /v1/trunks")
        contact = (await gw.trunks())[0]["registration"]["contact"]
        assert contact.endswith(";transport=tcp")

        await kam.kill()
        await until(lambda: _state_is(gw, "failed"), 10, "failed once the registrar is gone")
        registration = (await gw.trunks())[0]["registration"]
        assert registration["lastError"] and "nextAttemptAt" in registration

        await kam.start()
        await until(lambda: _bound(kam), 20, "a new binding after the restart")
        await until(lambda: _state_is(gw, "registered"), 5, "registered again")
        await _call_through_registrar(tmp_path, kam, "tcp")
        start = await gw.app.sessions[0].wait_for("session.start", timeout=5)
        assert start["to"] == DIALLED


async def _state_is(gw: Gateway, state: str) -> bool:
    if gw.proc.returncode is not None:
        raise AssertionError("gateway exited: " + gw.log.read_text()[-3000:])
    return await gw.state() == state


async def _refreshed(kam: Registrar, first: int) -> bool:
    cseq = _cseq(await kam.location())
    return cseq is not None and cseq > first
