"""The gateway under test, run as a separate process pinned to one core.

``appbridge serve --config FILE`` (docs/operations.md) with a configuration written for the run: the
Twilio carrier pointed at the fake REST API, one app per worker (fonoster, pcm16 16 kHz; or a
Twilio-dialect app with ``--dialect twilio``), every number routed to one. Secrets go through
``${NAME}`` environment references, as an operator would write them (docs/configuration.md,
"General rules").

The child is pinned with ``sched_setaffinity`` before it executes the gateway, so every thread it
starts later (the eSpeak worker included) inherits the core, and it is told to die with its parent
(``PR_SET_PDEATHSIG``, prctl(2)) so a crashed benchmark never leaves a gateway behind. Stopping
follows docs/operations.md: SIGINT stops at once; SIGKILL if it has not exited in a few seconds.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.report import parse_proc_stat_split, parse_proc_stat_ticks, parse_vmrss_bytes

__all__ = [
    "BENCH_NODE_ID",
    "GatewayProcess",
    "GatewaySpec",
    "child_setup",
    "free_loopback_port",
    "free_loopback_udp_port",
    "free_rtp_range",
    "loop_env",
    "render_config",
    "worker_number",
]

_PR_SET_PDEATHSIG = 1
#: The gateway's ``[cluster] node_id`` with ``--cluster`` (bench/directory_cost.py).
BENCH_NODE_ID = "bench-node"
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def free_loopback_udp_port() -> int:
    """A UDP port on 127.0.0.1 that was free a moment ago (for the gateway's SIP listener)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


#: Below Linux's ephemeral range (32768-60999), where no client socket lands by chance.
RTP_AREA = (20000, 32766)


def free_rtp_range(calls: int, rng: random.Random | None = None) -> tuple[int, int]:
    """An even-sized block of UDP ports for the gateway's ``[sip] rtp_ports``, free right now.

    The machine is shared (other benchmarks and sipp tests hold RTP ports), and the gateway
    gives up a call after 20 ports in use: the block is placed at random below the ephemeral
    range, with room for twice the calls, and every one of its even ports is checked.
    """
    rng = rng or random.Random()
    size = max(200, 4 * calls)
    for _ in range(50):
        low = rng.randrange(RTP_AREA[0], RTP_AREA[1] - size) & ~1
        if all(_udp_port_free(port) for port in range(low, low + size, 2)):
            return (low, low + size - 1)
    raise RuntimeError(f"no free block of {size} UDP ports in {RTP_AREA}")


def _udp_port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_loopback_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (closed again, so the gateway can bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def worker_number(index: int) -> str:
    """The called number whose calls go to worker ``index``'s app (E.164)."""
    return f"+1555200{index:04d}"


@dataclass(frozen=True)
class GatewaySpec:
    """What the gateway's configuration needs: where the fakes listen."""

    port: int
    rest_base_url: str
    app_urls: tuple[str, ...]  # one fake app per load-generator worker
    account_sid: str
    max_calls: int = 5000
    #: The gateway's SIP listener (UDP on 127.0.0.1) and RTP port range; None: no ``[sip]``.
    sip_port: int | None = None
    rtp_ports: tuple[int, int] = (20000, 20399)
    #: The apps' protocol: "fonoster" (pcm16 16 kHz, local speech) or "twilio" (Media Streams,
    #: µ-law 8 kHz, no ``audio`` or ``speech``; ``workspace_ref`` = the bench's AccountSid).
    dialect: str = "fonoster"
    #: ``--cluster``: the redis-server of the step, for a ``[cluster]`` section; None: one node.
    cluster_redis_url: str | None = None
    #: ``--sip-transport tls``: the ``tls:`` listener's port and ``[sip] tls`` as
    #: (cert_file, key_file, ca_file) (bench/sip_secure.py); None: UDP alone.
    sip_tls_port: int | None = None
    tls_files: tuple[str, str, str] | None = None
    #: ``--srtp``: a trunk for the callers' address with ``srtp = "required"``.
    srtp: bool = False
    #: ``speech.stt`` of the fonoster apps: "none" measures the media path alone; ``--stt
    #: local`` has the offline recogniser transcribe every caller (bench/stt_load.py).
    stt: str = "none"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def render_config(spec: GatewaySpec) -> str:
    """The TOML the gateway runs with; secrets are ``${BENCH_*}`` environment references.

    Worker ``k`` calls :func:`worker_number` ``(k)``, routed to its own app ``bench-k``; any
    other number goes to ``bench-0``.
    """
    head = f"""\
# Written by bench/load.py for one benchmark step; secrets come from the environment.
[server]
host = "127.0.0.1"
port = {spec.port}
public_url = "{spec.base_url}"
max_calls = {spec.max_calls}
drain_timeout_s = 5.0

[carriers.twilio]
account_sid = "{spec.account_sid}"
auth_token = "${{BENCH_TWILIO_TOKEN}}"
api_base = "{spec.rest_base_url}"
"""
    if spec.dialect == "twilio":
        # docs/protocol-twilio.md: a twilio app has no ``audio`` (always µ-law 8 kHz) and no
        # speech; its workspace_ref is the AccountSid its calls' ``start`` carries
        # (docs/configuration.md).
        body = f'protocol = "twilio"\nworkspace_ref = "{spec.account_sid}"\n'
    elif spec.dialect == "fonoster":
        body = (
            'protocol = "fonoster"\n'
            f'speech = {{ voice = "local/en-US", language = "en-US", stt = "{spec.stt}" }}\n'
            'audio = { codec = "pcm16", rate = 16000 }\n'
        )
    else:
        raise ValueError(f"unknown dialect {spec.dialect!r}")
    apps = [
        f"""
[[apps]]
ref = "bench-{k}"
url = "{url}"
signing_secret = "${{BENCH_APP_SECRET}}"
{body}"""
        for k, url in enumerate(spec.app_urls)
    ]
    numbers = [
        f'\n[[numbers]]\nnumber = "{worker_number(k)}"\napp = "bench-{k}"\n'
        for k in range(len(spec.app_urls))
    ]
    numbers.append('\n[[numbers]]\nnumber = "*"\napp = "bench-0"\n')
    sip = ""
    if spec.sip_port is not None:
        low, high = spec.rtp_ports
        sip = f"""
[sip]
listen = ["udp:127.0.0.1:{spec.sip_port}"{_tls_listen(spec)}]
rtp_ports = [{low}, {high}]
""" + _secure_sip(spec)
    cluster = ""
    if spec.cluster_redis_url is not None:
        # docs/scaling.md: the node reaches the others at internal_url; here it is alone.
        cluster = f"""
[cluster]
node_id = "{BENCH_NODE_ID}"
redis_url = "{spec.cluster_redis_url}"
internal_url = "{spec.base_url}"
secret = "${{BENCH_CLUSTER_SECRET}}"
"""
    return head + sip + cluster + "".join(apps) + "".join(numbers)


def _tls_listen(spec: GatewaySpec) -> str:
    return "" if spec.sip_tls_port is None else f', "tls:127.0.0.1:{spec.sip_tls_port}"'


def _secure_sip(spec: GatewaySpec) -> str:
    """``[sip] tls`` and the callers' trunk of a secure run (docs/configuration.md): the bench's
    callers come from 127.0.0.1, so that trunk's ``srtp`` is the policy of their calls."""
    out = ""
    if spec.tls_files is not None:
        cert, key, ca = spec.tls_files
        out += f'tls = {{ cert_file = "{cert}", key_file = "{key}", ca_file = "{ca}" }}\n'
    if spec.srtp or spec.tls_files is not None:
        transport = "tls" if spec.tls_files is not None else "udp"
        srtp = "required" if spec.srtp else "off"
        out += (
            f'\n[[sip.trunks]]\nname = "bench"\nhost = "127.0.0.1"\n'
            f'transport = "{transport}"\nsrtp = "{srtp}"\n'
        )
    return out


def loop_env(loop: str, shim_root: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The gateway's environment for event loop ``loop`` ("uvloop" as shipped, or "asyncio").

    ``appbridge serve`` runs on uvloop when it imports (appbridge/server.py, ``serve``) and on
    the stdlib loop otherwise. For "asyncio" a module named ``uvloop`` that raises ImportError is
    put first on the child's ``PYTHONPATH``: the gateway's own code is untouched, and only its
    loop changes (so the two loops can be compared, or one worked around while it is broken).
    """
    out = dict(env)
    if loop == "uvloop":
        return out
    if loop != "asyncio":
        raise ValueError(f"unknown event loop {loop!r}")
    shim = shim_root / "no-uvloop"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "uvloop.py").write_text(
        '"""Written by bench/gateway_proc.py: hides uvloop so the gateway uses asyncio."""\n'
        'raise ImportError("uvloop hidden by the benchmark (--gateway-loop asyncio)")\n'
    )
    previous = out.get("PYTHONPATH")
    out["PYTHONPATH"] = str(shim) + (os.pathsep + previous if previous else "")
    return out


def child_setup(cpu: int | None) -> Callable[[], None]:
    """What a child of the benchmark does between fork and exec: take its core, and ask the
    kernel to kill it when the benchmark dies (prctl(2) ``PR_SET_PDEATHSIG``)."""

    def setup() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass

    return setup


class GatewayProcess:
    """One ``appbridge serve`` child: start, wait for ``/readyz``, sample /proc, stop."""

    def __init__(
        self,
        executable: str,
        config_path: Path,
        *,
        env: Mapping[str, str],
        cpu: int | None,
        log_path: Path,
    ) -> None:
        self.executable = executable
        self.config_path = config_path
        self.env = dict(env)
        self.cpu = cpu
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "gateway not started"
        return self.proc.pid

    async def start(self, base_url: str, timeout_s: float = 30.0) -> None:
        """Spawn the gateway and wait (bounded) until ``GET /readyz`` answers 200."""
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(  # noqa: ASYNC220 - a fork/exec, it does not block
                [self.executable, "serve", "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=child_setup(self.cpu),
                close_fds=True,
            )
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"gateway exited with {self.proc.returncode}; see {self.log_path}"
                    )
                try:
                    response = await client.get(base_url + "/readyz")
                    if response.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError(f"gateway not ready within {timeout_s:g} s; see {self.log_path}")

    def affinity(self) -> list[int]:
        return sorted(os.sched_getaffinity(self.pid))

    def cpu_seconds(self) -> float:
        """User + system CPU of every thread so far (``/proc/<pid>/stat`` utime + stime)."""
        text = Path(f"/proc/{self.pid}/stat").read_text()
        return parse_proc_stat_ticks(text) / CLOCK_TICKS_PER_S

    def cpu_split_seconds(self) -> tuple[float, float]:
        """(user, system) CPU of every thread so far: the interpreter and its C libraries
        against the kernel's work for the process (system calls, the loopback path)."""
        user, system = parse_proc_stat_split(Path(f"/proc/{self.pid}/stat").read_text())
        return user / CLOCK_TICKS_PER_S, system / CLOCK_TICKS_PER_S

    def rss_bytes(self) -> int:
        return parse_vmrss_bytes(Path(f"/proc/{self.pid}/status").read_text())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGINT (stop at once, docs/operations.md), then SIGKILL after ``timeout_s``. Returns the
        exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 - polls a child
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
        return proc.returncode

    def kill_now(self) -> None:
        """Last resort from a ``finally``: no waiting on the loop."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
