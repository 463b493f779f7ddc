"""Kamailio in front of three gateway nodes (deploy/kamailio/kamailio.cfg; docs/scaling.md,
"SIP in front: Kamailio").

Real peers only: the Debian ``kamailio`` with the deployed configuration (its top-level settings
given with ``-A``: loopback port, a 1 s probing interval, a 1 s transaction timeout), three
``appbridge serve`` subprocesses with ``[sip]`` on 127.0.0.2, .3 and .4 (same port), each dialing
its own loopback :class:`FakeApp` (so a session on that app is a call on that node), and sipp as
the caller. Under ``CI=true`` a missing kamailio or sipp fails; elsewhere these tests skip
(deploy/install-test-peers.sh installs them).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import pytest

from appbridge.testing import FakeApp
from tests.integration.sipp_support import SCENARIOS, SIPP, free_port, scenario_file, sipp_required

_SBIN_PATH = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin"
KAMAILIO = shutil.which("kamailio", path=_SBIN_PATH)
KAMCMD = shutil.which("kamcmd", path=_SBIN_PATH)
CFG = Path(__file__).parents[2] / "deploy" / "kamailio" / "kamailio.cfg"
PCAP = "/usr/share/sip-tester/g711a.pcap"
SECRET = "kamailio-test-secret"
NODE_HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
PROBE_INTERVAL_S = 1
FR_TIMER_MS = 1000
DRAIN_TIMEOUT_S = 20
DISPATCH = re.compile(r"appbridge-dispatch (\d+\.\d+) to sip:([\d.]+):\d+")
# The log prefix of kamailio.cfg names the message: "{1 <CSeq> <Call-ID>}".
CALL_TO_NODE = re.compile(r"\{1 1 INVITE (\S+)\} <script>: appbridge-dispatch \S+ to sip:([\d.]+)")
BYE_TO_NODE = re.compile(
    r"\{1 2 BYE (\S+)\} <script>: appbridge-bye \S+ from \S+ to sip:\S*@([\d.]+)"
)


def kamailio_required() -> pytest.MarkDecorator:
    """Skipped where kamailio (or its kamcmd) is missing; under CI=true a missing peer fails the
    run at collection."""
    missing = KAMAILIO is None or KAMCMD is None
    if missing and os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(
            "CI=true and kamailio is missing: run deploy/install-test-peers.sh", pytrace=False
        )
    return pytest.mark.skipif(missing, reason="kamailio missing: run deploy/install-test-peers.sh")


pytestmark = [sipp_required(), kamailio_required(), pytest.mark.timeout(150)]

NODE_CONFIG = """
[server]
host = "127.0.0.1"
port = {http_port}
drain_timeout_s = {drain}
max_calls = {max_calls}

[sip]
listen = ["udp:{host}:{sip_port}"]
rtp_ports = [{rtp_low}, {rtp_high}]

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
class Node:
    host: str
    http_port: int
    app: FakeApp
    proc: asyncio.subprocess.Process
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


@dataclass
class Cluster:
    tmp: Path
    sip_port: int
    kamailio_port: int
    kamailio: asyncio.subprocess.Process
    kamailio_log: Path
    ctl: str
    nodes: list[Node] = field(default_factory=list)
    callers: list[asyncio.subprocess.Process] = field(default_factory=list)  # sipp runs

    def dispatches(self) -> list[tuple[float, str]]:
        """Every INVITE Kamailio sent to a node: (its wall-clock time, the node's address)."""
        text = self.kamailio_log.read_text(errors="replace")
        return [(float(t), host) for t, host in DISPATCH.findall(text)]

    def routed(self, pattern: re.Pattern[str]) -> dict[str, str]:
        """Call-ID → the node Kamailio sent the matching request of that call to (the last)."""
        return dict(pattern.findall(self.kamailio_log.read_text(errors="replace")))

    def sessions(self) -> list[int]:
        return [len(node.app.sessions) for node in self.nodes]

    async def kamcmd(self, *command: str) -> tuple[int, str]:
        """A command over the control socket of the configuration's ``CTL_SOCKET``."""
        assert KAMCMD is not None
        proc = await asyncio.create_subprocess_exec(
            KAMCMD,
            "-s",
            self.ctl,
            *command,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 5)
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace")

    async def node_state(self, host: str) -> str:
        """The dispatcher's FLAGS of ``host`` (``AP`` active, ``IP`` inactive; both probed)."""
        _, text = await self.kamcmd("dispatcher.list")
        match = re.search(
            rf"URI:\s*sip:{re.escape(host)}:\d+\s*FLAGS:\s*(\w+)", text.replace("\n", " ")
        )
        return match.group(1) if match else "?"


def _port_free_on_all(port: int) -> bool:
    for host in ("127.0.0.1", *NODE_HOSTS):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def shared_sip_port() -> int:
    for _ in range(50):
        port = free_port()
        if _port_free_on_all(port):
            return port
    raise AssertionError("no UDP port free on every node address")


def _free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def until(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll ``condition`` (sync, or returning an awaitable) every 50 ms until it holds, for at
    most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def _start_node(
    tmp: Path, index: int, sip_port: int, max_calls: int, drain_timeout_s: float
) -> Node:
    host = NODE_HOSTS[index]
    app = FakeApp(secret=SECRET)
    await app.start()
    http_port = _free_tcp_port()
    cfg = tmp / f"node{index}.toml"
    rtp_low = 47000 + 400 * index
    cfg.write_text(
        NODE_CONFIG.format(
            http_port=http_port,
            drain=drain_timeout_s,
            max_calls=max_calls,
            host=host,
            sip_port=sip_port,
            rtp_low=rtp_low,
            rtp_high=rtp_low + 199,
            app_url=app.url,
        )
    )
    log = tmp / f"node{index}.log"
    env = {**os.environ, "APP_SECRET": SECRET, "APPBRIDGE_LOG_LEVEL": "INFO"}
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
    return Node(host, http_port, app, proc, log)


async def _healthy(node: Node) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(600):
            if node.proc.returncode is not None:
                raise AssertionError(f"{node.host} exited: " + node.log.read_text()[-2000:])
            try:
                if (await client.get(node.base + "/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{node.host} never became healthy")


async def start_kamailio(tmp: Path, sip_port: int, max_calls: int) -> Cluster:
    assert KAMAILIO is not None
    dispatcher_list = tmp / "dispatcher.list"
    dispatcher_list.write_text(
        "".join(
            f"1 sip:{host}:{sip_port} 0 0 duid=node{i};maxload={max_calls}\n"
            for i, host in enumerate(NODE_HOSTS)
        )
    )
    run = tmp / "kamailio-run"
    run.mkdir()
    port = shared_sip_port()
    ctl = f"unixs:{run / 'kamailio_ctl'}"
    log = tmp / "kamailio.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            KAMAILIO,
            "-f",
            str(CFG),
            "-DD",
            "-E",
            "-n",
            "2",
            "-Y",
            str(run),
            "-P",
            str(run / "kamailio.pid"),
            "-A",
            "LISTEN_IP=127.0.0.1",
            "-A",
            f"LISTEN_PORT={port}",
            "-A",
            f'DISPATCHER_LIST="{dispatcher_list}"',
            "-A",
            f"PROBE_INTERVAL={PROBE_INTERVAL_S}",
            "-A",
            f"FR_TIMER_MS={FR_TIMER_MS}",
            "-A",
            f'CTL_SOCKET="{ctl}"',
            "-A",
            f'RPC_FIFO="{run / "kamailio_rpc.fifo"}"',
            stdout=out,
            stderr=out,
            cwd=str(tmp),
        )
    return Cluster(tmp, sip_port, port, proc, log, ctl)


@asynccontextmanager
async def cluster(
    tmp: Path, max_calls: int = 20, drain_timeout_s: float = DRAIN_TIMEOUT_S
) -> AsyncIterator[Cluster]:
    """Three nodes behind Kamailio, all probed up; everything is stopped afterwards."""
    sip_port = shared_sip_port()
    nodes = [
        await _start_node(tmp, i, sip_port, max_calls, drain_timeout_s)
        for i in range(len(NODE_HOSTS))
    ]
    kam: Cluster | None = None
    try:
        for node in nodes:
            await _healthy(node)
        kam = await start_kamailio(tmp, sip_port, max_calls)
        kam.nodes = nodes
        for node in nodes:
            await until(partial(state_is, kam, node.host, "AP"), 15, f"{node.host} probed up")
        yield kam
    finally:
        for caller in kam.callers if kam is not None else []:
            if caller.returncode is None:
                caller.kill()
            await caller.communicate()
        if kam is not None:
            if kam.kamailio.returncode is None:
                kam.kamailio.terminate()
            try:
                await asyncio.wait_for(kam.kamailio.wait(), 10)
            except TimeoutError:
                kam.kamailio.kill()
                await kam.kamailio.wait()
        for node in nodes:
            if node.proc.returncode is None:
                node.proc.kill()
                await node.proc.wait()
            await node.app.stop()


async def state_is(kam: Cluster, host: str, state: str) -> bool:
    if kam.kamailio.returncode is not None:
        raise AssertionError("kamailio exited: " + kam.kamailio_log.read_text()[-3000:])
    return await kam.node_state(host) == state


async def sipp_calls(
    kam: Cluster,
    scenario: str,
    calls: int,
    rate: float,
    *,
    tag: str,
    timeout_s: float = 40,
    target: str | None = None,
    **fill: str,
) -> asyncio.subprocess.Process:
    """sipp placing ``calls`` calls at ``rate`` per second through Kamailio (or straight to the
    ``target`` host of a node)."""
    assert SIPP is not None
    path = scenario_file(kam.tmp, (SCENARIOS / scenario).read_text(), f"{tag}-{scenario}", **fill)
    proc = await asyncio.create_subprocess_exec(
        SIPP,
        f"{target}:{kam.sip_port}" if target else f"127.0.0.1:{kam.kamailio_port}",
        "-sf",
        str(path),
        "-s",
        "+15550007777",
        "-i",
        "127.0.0.1",
        "-p",
        str(free_port()),
        "-mi",
        "127.0.0.1",
        "-mp",
        str(free_port() & ~1),
        "-m",
        str(calls),
        "-l",
        str(calls),
        "-r",
        f"{rate:g}",
        "-timeout",
        f"{timeout_s:g}s",
        "-timeout_error",
        "-nostdin",
        "-trace_err",
        "-error_file",
        str(kam.tmp / f"{tag}-errors.log"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=str(kam.tmp),
    )
    kam.callers.append(proc)
    return proc


async def sipp_result(kam: Cluster, proc: asyncio.subprocess.Process, tag: str) -> tuple[int, str]:
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    text = out.decode(errors="replace")[-3000:]
    errors = kam.tmp / f"{tag}-errors.log"
    if errors.exists():
        text += "\n" + errors.read_text(errors="replace")[-3000:]
    assert proc.returncode is not None
    return proc.returncode, text


async def test_calls_spread_over_the_nodes_and_dialogs_stay_on_their_node(tmp_path: Path) -> None:
    async with cluster(tmp_path) as kam:
        # Nine calls at once: call load puts three on each node; every BYE (sent to the answer's
        # Contact with the Record-Route set) reaches the node holding the call and gets its 200.
        proc = await sipp_calls(
            kam, "uac_proxy_call.xml", 9, 20, tag="spread", pcap=PCAP, pause_ms="2500"
        )
        rc, log = await sipp_result(kam, proc, "spread")
        assert rc == 0, log
        assert kam.sessions() == [3, 3, 3], kam.sessions()
        for node in kam.nodes:
            for session in node.app.sessions:
                end = await session.wait_for("session.end", timeout=5)
                assert end["reason"] == "caller_hangup"
                assert len(session.audio) > 0  # RTP went straight to the node
        assert {host for _, host in kam.dispatches()} == set(NODE_HOSTS)
        invites, byes = kam.routed(CALL_TO_NODE), kam.routed(BYE_TO_NODE)
        assert len(invites) == 9 and byes == invites  # each BYE went to the node of its call

        # The app hangs up: the node's BYE goes out through Kamailio (its Route set) to sipp.
        before = kam.sessions()
        proc = await sipp_calls(kam, "uac_proxy_gateway_bye.xml", 1, 1, tag="gwbye", pcap=PCAP)
        await until(lambda: sum(kam.sessions()) > sum(before), 10, "the call's session")
        node = next(n for n, b in zip(kam.nodes, before, strict=True) if len(n.app.sessions) > b)
        session = node.app.sessions[-1]
        await session.wait_for("session.start", timeout=5)
        await session.send({"type": "hangup", "id": "bye"})
        rc, log = await sipp_result(kam, proc, "gwbye")
        assert rc == 0, log
        assert re.search(
            rf"appbridge-bye \S+ from {re.escape(node.host)}:", kam.kamailio_log.read_text()
        )
        # The control socket works: the list reloads and every node is probed up again.
        rc, out = await kam.kamcmd("dispatcher.reload")
        assert rc == 0, out
        for host in NODE_HOSTS:
            await until(partial(state_is, kam, host, "AP"), 5, f"{host} up after the reload")


async def test_drained_node_keeps_its_calls_and_a_killed_node_is_routed_around(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as kam:
        drain_last_invite_s, drain_probe_s = await _drain_first_node(kam)
        kill_last_invite_s, kill_probe_s = await _kill_second_node(kam)
        print(
            f"\nstop-receiving times: drain {drain_last_invite_s:.2f} s (marked down after "
            f"{drain_probe_s:.2f} s), kill {kill_last_invite_s:.2f} s (marked down after "
            f"{kill_probe_s:.2f} s)"
        )
        bound = PROBE_INTERVAL_S + FR_TIMER_MS / 1000 + 1.5
        assert drain_last_invite_s <= bound
        assert kill_last_invite_s <= bound


async def _drain_first_node(kam: Cluster) -> tuple[float, float]:
    """SIGTERM node A with two live calls on it: they go on to their end, new calls land on the
    others, A exits 0. Returns the seconds from SIGTERM to the last INVITE Kamailio sent to A
    and to A marked down."""
    a = kam.nodes[0]
    long_calls = await sipp_calls(
        kam, "uac_proxy_call.xml", 6, 20, tag="long", pcap=PCAP, pause_ms="6000"
    )
    await until(lambda: kam.sessions() == [2, 2, 2], 10, "two calls on each node")
    await until(
        lambda: all(len(s.audio) > 5 for n in kam.nodes for s in n.app.sessions),
        10,
        "caller audio",
    )
    a_sessions = list(a.app.sessions)
    heard = [len(s.audio) for s in a_sessions]
    drained_at = time.time()
    a.proc.send_signal(signal.SIGTERM)
    async with httpx.AsyncClient() as client:
        await until(lambda: http_status_is(client, a.base + "/readyz", 503), 5, "A's /readyz 503")
    short = await sipp_calls(
        kam, "uac_proxy_call.xml", 10, 10, tag="drain", pcap=PCAP, pause_ms="300"
    )
    await until(lambda: state_is(kam, a.host, "IP"), 2 * PROBE_INTERVAL_S + 3, "A down")
    marked_s = time.time() - drained_at
    rc, log = await sipp_result(kam, short, "drain")
    assert rc == 0, log
    assert len(a.app.sessions) == 2  # no new call was placed on A
    # A's calls were not cut: audio kept flowing until sipp's BYE, which got its 200.
    rc, log = await sipp_result(kam, long_calls, "long")
    assert rc == 0, log
    for session, before in zip(a_sessions, heard, strict=True):
        end = await session.wait_for("session.end", timeout=5)
        assert end["reason"] == "caller_hangup"
        assert len(session.audio) > before + 50
    assert await asyncio.wait_for(a.proc.wait(), 10) == 0
    to_a = [t for t, host in kam.dispatches() if host == a.host and t >= drained_at]
    return max(to_a, default=drained_at) - drained_at, marked_s


async def _kill_second_node(kam: Cluster) -> tuple[float, float]:
    """SIGKILL node B in the middle of a stream of calls: from then on they go to C. Returns
    the seconds from the kill to the last INVITE Kamailio sent to B and to B marked down."""
    a, b, c = kam.nodes
    stream = await sipp_calls(
        kam, "uac_proxy_call.xml", 40, 8, tag="kill", pcap=PCAP, pause_ms="200"
    )
    await until(lambda: len(b.app.sessions) > 2, 10, "a call of the stream on B")
    killed_at = time.time()
    b.proc.kill()
    await b.proc.wait()
    await until(lambda: state_is(kam, b.host, "IP"), 2 * PROBE_INTERVAL_S + 3, "B down")
    marked_s = time.time() - killed_at
    c_before = len(c.app.sessions)
    await sipp_result(kam, stream, "kill")  # a call up on B when it died fails: no rc check
    to_b = [t for t, host in kam.dispatches() if host == b.host and t >= killed_at]
    last_s = max(to_b, default=killed_at) - killed_at
    later = [host for t, host in kam.dispatches() if t > killed_at + last_s]
    assert later and set(later) == {c.host}, later
    assert len(c.app.sessions) > c_before
    assert a.proc.returncode == 0
    return last_s, marked_s


async def http_status_is(client: httpx.AsyncClient, url: str, status: int) -> bool:
    try:
        return (await client.get(url)).status_code == status
    except httpx.TransportError:
        return False


async def test_sigterm_drain_keeps_live_calls_refuses_new_ones_and_exits_0(tmp_path: Path) -> None:
    """Straight to one node (docs/operations.md, "Signals"): after SIGTERM its probes and new
    INVITEs get 503, a live call keeps its RTP until the caller hangs up, a call still up at
    ``drain_timeout_s`` is ended by the node's BYE, and the process exits 0."""
    drain_s = 4.0
    async with cluster(tmp_path, drain_timeout_s=drain_s) as kam:
        a = kam.nodes[0]
        hung_up = await sipp_calls(
            kam, "uac_proxy_call.xml", 1, 1, tag="direct", target=a.host, pcap=PCAP, pause_ms="3000"
        )
        await until(lambda: len(a.app.sessions) == 1, 10, "the first call on A")
        outlives = await sipp_calls(
            kam, "uac_proxy_gateway_bye.xml", 1, 1, tag="outlives", target=a.host, pcap=PCAP
        )
        await until(lambda: len(a.app.sessions) == 2, 10, "the second call on A")
        first, second = a.app.sessions
        await until(lambda: len(first.audio) > 5, 10, "caller audio")
        heard = len(first.audio)
        drained_at = time.monotonic()
        a.proc.send_signal(signal.SIGTERM)
        async with httpx.AsyncClient() as client:
            await until(
                lambda: http_status_is(client, a.base + "/readyz", 503), 5, "A's /readyz 503"
            )
        for scenario in ("uac_options_503.xml", "uac_503.xml"):
            proc = await sipp_calls(kam, scenario, 1, 1, tag=scenario[:-4], target=a.host)
            rc, log = await sipp_result(kam, proc, scenario[:-4])
            assert rc == 0, log
        assert len(a.app.sessions) == 2  # the refused INVITE reached no app
        rc, log = await sipp_result(kam, hung_up, "direct")
        assert rc == 0, log
        end = await first.wait_for("session.end", timeout=5)
        assert end["reason"] == "caller_hangup"
        assert len(first.audio) > heard + 50  # RTP kept flowing during the drain
        rc, log = await sipp_result(kam, outlives, "outlives")  # the node's BYE at the deadline
        assert rc == 0, log
        assert await asyncio.wait_for(a.proc.wait(), drain_s + 10) == 0
        assert time.monotonic() - drained_at >= drain_s - 0.5
        end = await second.wait_for("session.end", timeout=1)
        assert end["reason"] == "timeout"
