"""RFC 4733 telephone-events: the sip-tester captures, retransmissions, timeouts, sending."""

from __future__ import annotations

import pytest

from appbridge.carriers.sip.dtmf4733 import (
    DIGIT_EVENTS,
    DtmfDigit,
    EventPacket,
    Rfc4733Receiver,
    Rfc4733Sender,
    TelephoneEvent,
    TelephoneEventError,
)
from appbridge.carriers.sip.rtp import RtpPacket, RtpReceiver, RtpSender
from appbridge.clock import VirtualClock

from .media_fixtures import load_captures

PEER = ("192.0.2.10", 7078)


def ev(event: int, duration: int, *, end: bool = False, volume: int = 10) -> bytes:
    return TelephoneEvent(event, end, volume, duration).serialize()


# -- payload format --------------------------------------------------------------------------


def test_payload_round_trip_and_bits() -> None:
    data = ev(11, 0x08C0, end=True, volume=10)
    assert data == bytes.fromhex("0b8a08c0")
    assert TelephoneEvent.parse_all(data) == [TelephoneEvent(11, True, 10, 0x08C0)]
    assert TelephoneEvent.parse_all(data + ev(1, 5)) == [
        TelephoneEvent(11, True, 10, 0x08C0),
        TelephoneEvent(1, False, 10, 5),
    ]


@pytest.mark.parametrize("payload", [b"", b"\x01", b"\x01\x02\x03", b"\x01\x02\x03\x04\x05"])
def test_payload_must_be_whole_events(payload: bytes) -> None:
    with pytest.raises(TelephoneEventError):
        TelephoneEvent.parse_all(payload)


def test_serialize_rejects_out_of_range() -> None:
    with pytest.raises(TelephoneEventError):
        TelephoneEvent(1, False, 64, 0).serialize()
    with pytest.raises(TelephoneEventError):
        TelephoneEvent(1, False, 10, 70000).serialize()


# -- receiving -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "digit"),
    [(f"dtmf_2833_{d}.pcap", d) for d in "0123456789"]
    + [("dtmf_2833_pound.pcap", "#"), ("dtmf_2833_star.pcap", "*")],
)
def test_sipp_captures_give_exactly_one_digit(name: str, digit: str) -> None:
    """The captures sip-tester plays: start with marker, 6 updates, the end packet 3 times."""
    packets = load_captures()[name]
    receiver = RtpReceiver(payload_types={0, 101})
    dtmf = Rfc4733Receiver()
    digits: list[DtmfDigit] = []
    for arrival, data in packets:
        arrived = receiver.receive(data, PEER, 1000.0 + arrival)
        if arrived is None:
            continue  # the end packet's copies reuse its sequence number: RTP duplicates
        p = arrived.packet
        digits += dtmf.receive(p.payload, timestamp=p.timestamp, now=1000.0 + arrival)
    assert [d.digit for d in digits] == [digit]
    assert digits[0].event == DIGIT_EVENTS[digit]
    assert dtmf.stats.events == 1 and dtmf.stats.ended == 1 and dtmf.active_digit is None
    assert receiver.stats.duplicates == 2


def test_sipp_captures_without_rtp_dedup_still_give_one_digit() -> None:
    dtmf = Rfc4733Receiver()
    digits = []
    for arrival, data in load_captures()["dtmf_2833_5.pcap"]:
        p = RtpPacket.parse(data)
        digits += dtmf.receive(p.payload, timestamp=p.timestamp, now=arrival)
    assert [d.digit for d in digits] == ["5"]
    assert dtmf.stats.retransmissions == 2


def test_lost_start_packet_still_reports_the_digit_once() -> None:
    dtmf = Rfc4733Receiver()
    out = dtmf.receive(ev(7, 400), timestamp=8000, now=0.05)
    out += dtmf.receive(ev(7, 800), timestamp=8000, now=0.10)
    out += dtmf.receive(ev(7, 800, end=True), timestamp=8000, now=0.12)
    assert [d.digit for d in out] == ["7"]
    assert out[0].duration_units == 400


def test_same_digit_twice_needs_a_new_timestamp() -> None:
    dtmf = Rfc4733Receiver()
    out = []
    for ts, t in ((1000, 0.0), (3000, 0.5)):
        out += dtmf.receive(ev(1, 0), timestamp=ts, now=t)
        out += dtmf.receive(ev(1, 800, end=True), timestamp=ts, now=t + 0.1)
        out += dtmf.receive(ev(1, 800, end=True), timestamp=ts, now=t + 0.12)
    assert [d.digit for d in out] == ["1", "1"]


def test_event_without_end_times_out() -> None:
    clock = VirtualClock()
    dtmf = Rfc4733Receiver(event_timeout_s=0.5)
    assert [d.digit for d in dtmf.receive(ev(12, 0), timestamp=50, now=clock.now())] == ["A"]
    assert dtmf.active_digit == "A"
    clock.advance(0.05)
    dtmf.receive(ev(12, 400), timestamp=50, now=clock.now())
    deadline = dtmf.next_deadline()
    assert deadline == pytest.approx(clock.now() + 0.5)
    clock.advance(0.49)
    assert dtmf.poll(clock.now()) == []
    clock.advance(0.02)
    assert dtmf.poll(clock.now()) == [DtmfDigit("A", 12, 50, 400)]
    assert dtmf.active_digit is None and dtmf.stats.timed_out == 1
    assert dtmf.next_deadline() is None
    # A straggler of the timed-out event does not start a new one.
    assert dtmf.receive(ev(12, 800, end=True), timestamp=50, now=clock.now()) == []


def test_new_event_ends_the_previous_one_whose_end_was_lost() -> None:
    dtmf = Rfc4733Receiver()
    out = dtmf.receive(ev(2, 0), timestamp=100, now=0.0)
    out += dtmf.receive(ev(3, 0), timestamp=1900, now=0.2)
    assert [d.digit for d in out] == ["2", "3"]
    assert dtmf.stats.ended == 1 and dtmf.active_digit == "3"


def test_stale_packets_of_an_older_event_are_ignored() -> None:
    dtmf = Rfc4733Receiver()
    dtmf.receive(ev(4, 0), timestamp=2**32 - 100, now=0.0)
    dtmf.receive(ev(5, 0), timestamp=60, now=0.2)  # wraps: newer
    assert dtmf.receive(ev(4, 800, end=True), timestamp=2**32 - 100, now=0.25) == []
    assert dtmf.stats.stale == 1 and dtmf.active_digit == "5"


def test_reused_timestamp_after_end_is_a_new_press() -> None:
    """Some devices stop their RTP clock when no audio flows and reuse the timestamp."""
    dtmf = Rfc4733Receiver(reuse_guard_s=0.25)
    out = dtmf.receive(ev(9, 0), timestamp=500, now=0.0)
    out += dtmf.receive(ev(9, 800, end=True), timestamp=500, now=0.1)
    out += dtmf.receive(ev(9, 0), timestamp=500, now=0.15)  # too soon: a straggler
    out += dtmf.receive(ev(9, 0), timestamp=500, now=0.6)
    assert [d.digit for d in out] == ["9", "9"]


def test_flash_and_invalid_payloads_are_counted_not_reported() -> None:
    dtmf = Rfc4733Receiver()
    assert dtmf.receive(ev(16, 0), timestamp=10, now=0.0) == []
    assert dtmf.receive(b"\x01\x02", timestamp=20, now=0.0) == []
    assert dtmf.stats.non_digit == 1 and dtmf.stats.invalid == 1


def test_multiple_events_in_one_packet() -> None:
    dtmf = Rfc4733Receiver()
    out = dtmf.receive(ev(1, 800, end=True) + ev(2, 800, end=True), timestamp=0, now=0.0)
    assert [(d.digit, d.timestamp) for d in out] == [("1", 0), ("2", 800)]


# -- sending ---------------------------------------------------------------------------------


def drive(
    sender: Rfc4733Sender, until_s: float, start_s: float = 0.0
) -> list[tuple[float, EventPacket]]:
    """Polls on a 10 ms grid; the RTP clock runs at 8 kHz from timestamp 1000."""
    out = []
    t = start_s
    while t <= until_s + 1e-9:
        ts = 1000 + round(t * 8000)
        out += [(t, p) for p in sender.poll(t, ts)]
        t = round(t + 0.01, 6)
    return out


def test_send_one_digit_start_updates_and_three_ends() -> None:
    s = Rfc4733Sender()
    s.send("5", now=0.0)
    assert s.busy and s.next_deadline() == 0.0
    sent = drive(s, 0.5)
    events = [(t, TelephoneEvent.parse_all(p.payload)[0], p.marker, p.timestamp) for t, p in sent]
    assert [round(t, 3) for t, *_ in events] == [0.0, 0.05, 0.1, 0.12, 0.14]
    assert [e.duration_units for _, e, _, _ in events] == [0, 400, 800, 800, 800]
    assert [e.end for _, e, _, _ in events] == [False, False, True, True, True]
    assert [m for _, _, m, _ in events] == [True, False, False, False, False]
    assert {ts for *_, ts in events} == {1000}
    assert {e.event for _, e, _, _ in events} == {5}
    assert {e.volume for _, e, _, _ in events} == {10}
    assert not s.busy and s.digits_sent == 1 and s.next_deadline() is None


def test_send_several_digits_in_order_with_gaps_and_pause() -> None:
    s = Rfc4733Sender(tone_ms=100, gap_ms=50, pause_ms=500)
    s.send("1#,9", now=0.0)
    sent = drive(s, 2.0)
    starts = [(round(t, 3), p.timestamp, p.payload[0]) for t, p in sent if p.marker]
    # Digit length 140 ms (tone + end repeats) + 50 ms gap; ',' adds 500 ms.
    assert starts == [(0.0, 1000, 1), (0.19, 1000 + 1520, 11), (0.88, 1000 + 7040, 9)]
    ends = [p for _, p in sent if p.end]
    assert len(ends) == 9


def test_updates_follow_the_50_ms_schedule_even_on_a_20_ms_tick() -> None:
    s = Rfc4733Sender(tone_ms=200)
    s.send("0", now=0.0)
    out = []
    for k in range(30):
        out += s.poll(k * 0.02, k * 160)
    durations = [TelephoneEvent.parse_all(p.payload)[0].duration_units for p in out]
    assert durations == [0, 400, 800, 1200, 1600, 1600, 1600]


def test_invalid_digits_queue_nothing() -> None:
    s = Rfc4733Sender()
    with pytest.raises(ValueError):
        s.send("12x", now=0.0)
    assert not s.busy


def test_cancel_lets_a_started_digit_finish() -> None:
    s = Rfc4733Sender()
    s.send("12", now=0.0)
    s.poll(0.0, 0)
    s.cancel()
    rest = drive(s, 1.0, start_s=0.01)
    assert [p.payload[0] for _, p in rest] == [1, 1, 1, 1]
    assert rest[-1][1].end and not s.busy


def test_late_poll_shifts_the_digit_instead_of_bursting() -> None:
    s = Rfc4733Sender()
    s.send("3", now=0.0)
    first = s.poll(0.3, 2400)
    assert len(first) == 1 and first[0].marker and first[0].timestamp == 2400


def test_sender_and_receiver_agree_through_rtp() -> None:
    """A digit sent through RtpSender reaches a receiver as exactly one keypress."""
    rtp = RtpSender(payload_type=0, event_payload_type=101, ssrc=5, initial_timestamp=0)
    dtmf_out = Rfc4733Sender()
    rx = RtpReceiver(payload_types={0, 101})
    dtmf_in = Rfc4733Receiver()
    dtmf_out.send("*7", now=0.0)
    got: list[str] = []
    for k in range(40):
        now = k * 0.02
        for e in dtmf_out.poll(now, rtp.timestamp):
            arrived = rx.receive(
                rtp.event(e.payload, timestamp=e.timestamp, marker=e.marker), PEER, now
            )
            assert arrived is not None
            got += [
                d.digit
                for d in dtmf_in.receive(
                    arrived.packet.payload, timestamp=arrived.packet.timestamp, now=now
                )
            ]
        rtp.skip()
    assert got == ["*", "7"]
    assert rx.stats.lost == 0


def test_sender_parameter_validation() -> None:
    with pytest.raises(ValueError):
        Rfc4733Sender(tone_ms=9000)
    with pytest.raises(ValueError):
        Rfc4733Sender(end_repeats=0)
