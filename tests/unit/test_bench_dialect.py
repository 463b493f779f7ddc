"""The Twilio dialect in the benchmark (bench/pipecat_app.py, ``--dialect twilio``).

The Pipecat-style app's pacing schedule and ticker are driven with virtual instants (no clock
is read, nothing is timed); its checks of the gateway's messages are fed by the gateway's own
writer (``appbridge.protocol.twilio_streams.TwilioStreamWriter``), the thing it benchmarks; the
signed upgrade and the frames it puts on the wire are checked with a real websockets client
over loopback; the gateway configuration is rendered and loaded by the real config loader.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any, cast

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from appbridge.config import load_config
from appbridge.protocol.twilio_streams import TwilioStreamWriter
from appbridge.testing.fake_app import fonoster_headers
from bench.analysis import analyse_calls
from bench.gateway_proc import GatewaySpec, render_config
from bench.lean_app import LeanApp
from bench.lean_twilio import LeanTwilio, LeanTwilioCall
from bench.measure import caller_jitter_ms
from bench.options import build_parser
from bench.pipecat_app import (
    AppTicker,
    BurstPacer,
    PipecatPlan,
    TwilioAppSession,
    TwilioDialectApp,
    tone_payloads,
)
from bench.talker import AppScript, Burst

ACCOUNT = "AC" + "be" * 16
MS = 0.001


# ---------------------------------------------------------------------- the pacing schedule
def _run(pacer: BurstPacer, start: float, end: float, step_s: float = 0.010) -> list[Any]:
    """(tick instant, action, n) for every action of ticks at ``step_s`` in [start, end)."""
    out = []
    ticks = round((end - start) / step_s)
    for k in range(ticks):
        now = start + k * step_s
        out += [(round(now, 6), action, n) for action, n in pacer.step(now)]
    return out


def test_an_uncleared_burst_is_100_chunks_at_2x_then_a_mark() -> None:
    pacer = BurstPacer(PipecatPlan(), first_at=1.0)
    actions = _run(pacer, 0.0, 4.0)
    assert actions[0] == (1.0, "burst", 0)
    media = [a for a in actions if a[1] == "media"]
    assert [n for _, _, n in media] == list(range(100))
    # One chunk per 10 ms tick: 2 s of audio in 1 s.
    assert [t for t, _, _ in media] == [round(1.0 + k * 0.010, 6) for k in range(100)]
    assert actions[-1] == (round(1.0 + 99 * 0.010, 6), "mark", 0)
    assert not pacer.bursting and pacer.next_at == pytest.approx(6.0)


def test_every_other_burst_is_cleared_300_ms_in_after_its_mark() -> None:
    pacer = BurstPacer(PipecatPlan(), first_at=0.0)
    actions = _run(pacer, 0.0, 5.0) + _run(pacer, 5.0, 10.0)
    second = [a for a in actions if a[0] >= 5.0]
    assert second[0] == (5.0, "burst", 1)
    assert sum(1 for a in second if a[1] == "media") == 30  # 300 ms of ticks: 600 ms of audio
    assert second[-2:] == [(5.3, "mark", 1), (5.3, "clear", 1)]  # the rest is never sent
    assert pacer.next_at == pytest.approx(10.0)
    third = _run(pacer, 10.0, 11.0)
    assert third[0] == (10.0, "burst", 2) and ("clear", 2) not in [(a, n) for _, a, n in third]


def test_a_pacer_far_behind_skips_rather_than_piling_bursts_up() -> None:
    pacer = BurstPacer(PipecatPlan(), first_at=0.0)
    _run(pacer, 0.0, 1.0)  # burst 0 sent by 0.99
    assert pacer.next_at == pytest.approx(5.0)
    # The ticker stalls for 7 s: the next burst starts now, and the one after a period later.
    assert pacer.step(12.0)[0] == ("burst", 1)
    assert pacer.step(12.3) == [("mark", 1), ("clear", 1)]
    assert pacer.next_at == pytest.approx(17.0)


def test_a_late_tick_delays_the_chunks_it_does_not_send_twice() -> None:
    pacer = BurstPacer(PipecatPlan(), first_at=0.0)
    assert pacer.step(0.0) == [("burst", 0), ("media", 0)]
    assert pacer.step(0.05) == [("media", 1)]  # 40 ms late: still one chunk, as a sleep paces


def test_the_tone_is_100_chunks_of_20_ms_ulaw() -> None:
    payloads = tone_payloads(PipecatPlan())
    assert len(payloads) == 100
    assert {len(base64.b64decode(p)) for p in payloads} == {160}


# ---------------------------------------------------------------------- the gateway's messages
class _Wire:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def frames(self) -> list[dict[str, Any]]:
        """The text frames written (unmasked, server side; every one under 126 bytes or not)."""
        out, data = [], bytes(self.data)
        while data:
            assert data[0] == 0x81  # FIN + text
            size, at = data[1] & 0x7F, 2
            if size == 126:
                size, at = int.from_bytes(data[2:4], "big"), 4
            out.append(json.loads(data[at : at + size]))
            data = data[at + size :]
        return out


def _session(
    app: TwilioDialectApp | None = None,
) -> tuple[TwilioAppSession, _Wire, TwilioStreamWriter]:
    app = app or TwilioDialectApp(secret=None, account_sid=ACCOUNT, autostart=False)
    session = cast(TwilioAppSession, app.new_session())
    wire = _Wire()
    session.connection_made(cast(asyncio.Transport, wire))
    return session, wire, TwilioStreamWriter()


def _open(session: TwilioAppSession, writer: TwilioStreamWriter, now: float = 1.0) -> None:
    session._on_text(writer.connected(), now)
    start = writer.start(ACCOUNT, "5e55-10n", "CA1", {"from": "+1", "to": "+2"})
    session._on_text(start, now)


def test_the_gateways_own_writer_passes_every_check() -> None:
    session, _, writer = _session()
    _open(session, writer)
    for k in range(5):
        session._on_text(writer.media(b"\xff" * 160), 2.0 + k * 0.02)
    session._on_text(writer.dtmf("5"), 3.0)
    session._on_text(writer.mark("b0"), 3.1)
    session._on_text(writer.stop(), 4.0)
    assert session.protocol_errors == []
    assert session.stream_sid == "5e55-10n" and session.call_sid == "CA1"
    assert list(session.audio_times) == pytest.approx([2.0 + k * 0.02 for k in range(5)])
    assert set(session.audio_tracks) == {1}  # what bench.analysis reads as the caller's track
    assert session.marks_echoed == ["b0"]
    assert [m["event"] for m in session.messages] == ["connected", "start", "dtmf", "mark", "stop"]
    script = session.app.scripts["CA1"]
    assert script.session is session and [m for _, m in script.events("mark")] == [
        session.messages[3]
    ]


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        (b'{"event":"media","sequenceNumber":"3","streamSid":"5e55-10n","media":{}}', "after 1"),
        (b'{"event":"mark","sequenceNumber":"2","streamSid":"MZother","mark":{"name":"x"}}', "not"),
        (b'{"event":"clear","sequenceNumber":"2","streamSid":"5e55-10n"}', "unknown event"),
        (b"not json", "not a Twilio message"),
        (
            b'{"event":"media","sequenceNumber":"2","streamSid":"5e55-10n","media":'
            b'{"track":"outbound","chunk":"1","timestamp":"0","payload":"/w=="}}',
            "track",
        ),
        (
            b'{"event":"media","sequenceNumber":"2","streamSid":"5e55-10n","media":'
            b'{"track":"inbound","chunk":"2","timestamp":"0","payload":"/w=="}}',
            "chunk",
        ),
        (
            b'{"event":"media","sequenceNumber":"2","streamSid":"5e55-10n","media":'
            b'{"track":"inbound","chunk":"1","timestamp":"0","payload":"%%%"}}',
            "base64",
        ),
    ],
)
def test_a_message_out_of_place_or_malformed_is_a_protocol_error(
    frame: bytes, problem: str
) -> None:
    session, _, writer = _session()
    _open(session, writer)
    session._on_text(frame, 2.0)
    assert len(session.protocol_errors) == 1 and problem in session.protocol_errors[0]
    assert len(session.audio_times) == 0


def test_start_must_come_second_and_carry_the_workspace_ref() -> None:
    session, _, writer = _session()
    session._on_text(writer.connected(), 1.0)
    session._on_text(writer.start("ACsomeoneelse", "s1", "CA1", {}), 1.0)
    assert "workspace_ref" in session.protocol_errors[0] and session.app.scripts == {}
    early, _, writer2 = _session()
    writer2.connected()
    early._on_text(writer2.start(ACCOUNT, "s1", "CA1", {}), 1.0)
    assert "out of order" in early.protocol_errors[0]
    session._on_binary(b"\x01\x00", 2.0)
    assert "binary" in session.protocol_errors[-1]


# ---------------------------------------------------------------------- the ticker
def test_one_ticker_paces_every_session_and_records_the_bursts() -> None:
    app = TwilioDialectApp(secret=None, account_sid=ACCOUNT, seed=3, autostart=False)
    app.clock = lambda: 42.0  # the instant a clear "is sent", read from the app's clock
    sessions = []
    for k in range(3):
        session, wire, writer = _session(app)
        session._on_text(writer.connected(), 0.0)
        session._on_text(writer.start(ACCOUNT, f"s{k}", f"CA{k}", {}), 0.0)
        sessions.append((session, wire))
    assert len(app.ticker.waiting) == 3 and app.ticker.active == []
    for k in range(1600):  # 16 s of 10 ms ticks, virtual: bursts 0-2 whole for any phase
        app.ticker.tick(k * 0.010)
    for session, wire in sessions:
        script = app.scripts[str(session.call_sid)]
        assert [b.index for b in script.bursts[:3]] == [0, 1, 2]
        assert [b.clear_at for b in script.bursts[:3]] == [None, 42.0, None]
        assert all(b.audio_ms == 2000 and b.kind == "audio" for b in script.bursts)
        frames = wire.frames()
        frames = frames[: frames.index({"event": "mark", "streamSid": session.stream_sid,
                                        "mark": {"name": "b2"}}) + 1]  # fmt: skip
        media = [f for f in frames if f["event"] == "media"]
        # Pipecat's shape: no track, chunk or timestamp; the session's streamSid.
        assert media[0] == {
            "event": "media",
            "streamSid": session.stream_sid,
            "media": {"payload": app.payloads[0]},
        }
        assert len(media) == 100 + 30 + 100
        marks = [f["mark"]["name"] for f in frames if f["event"] == "mark"]
        assert marks == ["b0", "b1", "b2"] == session.marks_sent[:3]
        assert [f["event"] for f in frames if f["event"] != "media"] == [
            "mark",
            "mark",
            "clear",
            "mark",
        ]
    starts = {app.scripts[str(s.call_sid)].bursts[0].sent_at for s, _ in sessions}
    assert len(starts) == 3  # random phases: the bursts do not line up


def test_a_closed_session_leaves_the_ticker() -> None:
    ticker = AppTicker(0.010, autostart=False)
    app = TwilioDialectApp(secret=None, account_sid=ACCOUNT, autostart=False)
    app.ticker = ticker
    session, wire, writer = _session(app)
    _open(session, writer, now=0.0)
    session._set_closed()
    for k in range(700):
        ticker.tick(k * 0.010)
    assert wire.data == b"" and ticker.active == [] and ticker.waiting == []


# ---------------------------------------------------------------------- the figures
def test_caller_jitter_skips_a_lead_built_over_several_ticks() -> None:
    at_once = [0.0, 0.0, 0.0] + [k * 20 * MS for k in range(1, 60)]
    assert caller_jitter_ms(at_once, lead_building=True) == caller_jitter_ms(at_once)
    # The pacer catching up on a 2x stream: two frames in the 2nd and 3rd ticks.
    trickle = [0.0, 20 * MS, 20 * MS, 40 * MS, 40 * MS] + [(60 + 20 * k) * MS for k in range(40)]
    assert max(caller_jitter_ms(trickle)) == pytest.approx(20.0)  # the plain rule: a false 20
    steady = caller_jitter_ms(trickle, lead_building=True)
    assert len(steady) == 40 and max(steady) < 1e-6
    # A late tick after the lead is built still counts.
    late = [*trickle[:20], trickle[19] + 40 * MS]
    assert max(caller_jitter_ms(late, lead_building=True)) == pytest.approx(20.0)
    # A run that never gets ahead is measured after MAX_LEAD_ARRIVALS anyway.
    slow = [k * 20 * MS for k in range(30)]
    assert len(caller_jitter_ms(slow, lead_building=True)) == 20


async def test_analysis_counts_twilio_dialect_mark_echoes() -> None:
    twilio = LeanTwilio("http://127.0.0.1:1", account_sid=ACCOUNT, auth_token="t", client=None)  # type: ignore[arg-type]
    twilio.ticker.autostart = False
    call = LeanTwilioCall(twilio, "CA1", "+1", "+2")
    for k in range(100):
        call.recv_times.append(10.0 + 0.02 * k)
        call.recv_bytes.append(160)
    for k in range(90):  # burst 1: cleared 300 ms in
        call.recv_times.append(15.0 + 0.02 * k)
        call.recv_bytes.append(160)
    played = [(10.0 + 0.02 * k, 160) for k in range(100)]
    played += [(15.0 + 0.02 * k, 160) for k in range(15)] + [(15.3, 8), (15.32, 0)]
    for t, n in played:
        call.heard_times.append(t)
        call.heard_bytes.append(n)
    call.clear_times = [15.301]
    session, _, _ = _session()
    session.messages = [
        {"event": "mark", "streamSid": "s", "mark": {"name": "b0"}},
        {"event": "mark", "streamSid": "s", "mark": {"name": "b1"}},
        {"event": "mark", "streamSid": "s", "mark": {"name": "b1"}},
    ]
    session.message_times = [12.0, 15.302, 15.303]
    script = AppScript("CA1", session, 5.0)
    script.bursts = [
        Burst(0, "audio", 9.99, "b0", None, 2000),
        Burst(1, "audio", 14.99, "b1", None, 2000, clear_at=15.3),
    ]
    figures = analyse_calls([(call, script)], (9.0, 20.0))
    assert (figures.marks_sent, figures.marks_echoed, figures.marks_duplicated) == (2, 2, 1)
    assert figures.marks_missing == 0
    assert (figures.frames_expected, figures.frames_lost) == (100, 0)
    assert (figures.clears_sent, figures.clears_at_caller) == (1, 1)
    # Playout went silent 1 ms after the clear (8 bytes of the frame at 15.3 played).
    assert figures.clear_to_silence_ms == pytest.approx([1.0])


# ---------------------------------------------------------------------- configuration
def test_dialect_twilio_renders_twilio_apps_the_gateway_accepts(tmp_path: Path) -> None:
    spec = GatewaySpec(
        port=18080,
        rest_base_url="http://127.0.0.1:18081",
        app_urls=("ws://127.0.0.1:18082/session", "ws://127.0.0.1:18083/session"),
        account_sid=ACCOUNT,
        dialect="twilio",
    )
    text = render_config(spec)
    assert "audio" not in text and "speech" not in text  # docs/protocol-twilio.md
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    config = load_config(path, {"BENCH_TWILIO_TOKEN": "t", "BENCH_APP_SECRET": "s"})
    for ref in ("bench-0", "bench-1"):
        app = config.apps[ref]
        assert app.protocol == "twilio" and app.workspace_ref == ACCOUNT
        assert app.signing_secret == "s"
    path.write_text(render_config(GatewaySpec(1, "http://x", ("ws://127.0.0.1:2/s",), ACCOUNT)))
    fonoster = load_config(path, {"BENCH_TWILIO_TOKEN": "t", "BENCH_APP_SECRET": "s"})
    assert fonoster.apps["bench-0"].protocol == "fonoster"
    with pytest.raises(ValueError):
        render_config(GatewaySpec(1, "http://x", ("ws://y",), ACCOUNT, dialect="sip"))


def test_options_and_workers_for_the_dialect() -> None:
    from bench.soak_worker import SoakWorker
    from bench.worker import Worker

    assert build_parser().parse_args([]).dialect == "fonoster"
    args = build_parser().parse_args(["--dialect", "twilio"])
    assert args.dialect == "twilio"
    keys = {"app_secret": "s", "twilio_token": "t", "account_sid": ACCOUNT}
    worker = Worker(0, dialect="twilio", **keys)
    assert isinstance(worker.app, TwilioDialectApp) and worker.talker is worker.app
    assert worker.app.account_sid == ACCOUNT
    assert isinstance(SoakWorker(0, **keys).app, LeanApp)  # the soak plays lean peers too
    with pytest.raises(ValueError):
        Worker(0, dialect="sip", **keys)


# ---------------------------------------------------------------------- over loopback
async def test_the_app_checks_the_signed_upgrade_and_streams_pipecat_frames() -> None:
    app = TwilioDialectApp(secret="s3cret", account_sid=ACCOUNT, seed=1, autostart=False)
    await app.start()
    try:
        with pytest.raises(InvalidStatus) as refused:
            await connect(app.url, additional_headers=fonoster_headers("wrong", app.url))
        assert refused.value.response.status_code == 401
        ws = await connect(app.url, additional_headers=fonoster_headers("s3cret", app.url))
        writer = TwilioStreamWriter()
        await ws.send(writer.connected().decode())
        await ws.send(writer.start(ACCOUNT, "sess-1", "CA9", {"from": "+1"}).decode())
        await ws.send(writer.media(b"\x7f" * 160).decode())
        await asyncio.wait_for(_until(lambda: "CA9" in app.scripts), 5.0)
        session = cast(TwilioAppSession, app.sessions[0])
        assert session.pacer is not None
        first = session.pacer.next_at
        app.ticker.tick(first)
        app.ticker.tick(first + 0.01)
        got = [json.loads(await asyncio.wait_for(ws.recv(), 5.0)) for _ in range(2)]
        assert [m["event"] for m in got] == ["media", "media"]
        assert {m["streamSid"] for m in got} == {"sess-1"}
        assert base64.b64decode(got[1]["media"]["payload"]) == base64.b64decode(app.payloads[1])
        await asyncio.wait_for(_until(lambda: len(session.audio_times) == 1), 5.0)
        assert session.protocol_errors == [] and app.rejected == [(401, "signature mismatch")]
        await ws.close()
    finally:
        await app.stop()


async def _until(condition: Any) -> None:
    while not condition():  # noqa: ASYNC110 - a test helper bounded by wait_for
        await asyncio.sleep(0.005)
