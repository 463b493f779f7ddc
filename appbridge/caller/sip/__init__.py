"""``appbridge call sip:...``: a SIP test caller (UAC) built on the gateway's own SIP cores.

Why it exists: a newcomer should be able to place a real SIP call through the gateway's own stack
from the terminal, see its events and keep what it heard (docs/caller.md), and the SDK's SIP
tests need a caller they can drive from Python. Everything on the
wire comes from the sans-I/O cores in :mod:`appbridge.carriers.sip`: messages
(:mod:`~.message`), the RFC 3261 §17 transactions with their retransmissions
(:mod:`~.transaction`), the dialog, its ACK and BYE (:mod:`~.dialog`, §12, §13.2.2.4), the SDP
offer/answer (:mod:`~.offer_answer`, RFC 3264 §5 and §7) and the media of :class:`~.leg.SipLeg` (RTP
with one SSRC, symmetric latching, a jitter buffer, RFC 4733 both ways). This package is only the
asyncio edge: one UDP socket or TCP connection for signalling (:mod:`.link`), one RTP socket,
a 20 ms clock (:mod:`.uac`); :mod:`.call` is the scripted call of ``appbridge call sip:...``
(whose command line is :mod:`appbridge.caller.cli`).

Library use (the API the SDK's SIP tests build on)::

    async with SipTestCaller("sip:+15550002222@127.0.0.1:5060") as caller:
        await caller.call()                       # INVITE .. 200 .. ACK; raises SipCallFailed
        await caller.send_audio(pcm16_8k)         # sent in real time, 20 ms per packet
        await caller.send_digits("12#")           # RFC 4733 events, returns once sent
        await caller.wait_for("dtmf_received", timeout_s=5)
        heard = caller.heard()                    # pcm16 8 kHz mono, everything heard so far
        await caller.hangup()                     # BYE (CANCEL before the answer)

- ``SipTestCaller(uri, *, from_user=..., emit=None, headers=None, codecs=("PCMU", "PCMA"))``:
  ``uri`` is ``sip:user@host[:port][;transport=tcp|tls]`` (UDP by default); the user part is the
  called number the gateway routes on. ``emit`` receives one printable line per event (the
  CLI prints them); ``headers`` are extra INVITE header fields; ``codecs`` is the offer, in
  order of preference (telephone-event is always offered), ``"G722"`` allowed.
- ``await call(timeout_s=30)``: returns the 2xx status once answered (media is then flowing:
  silence unless audio was queued); raises :class:`SipCallFailed` (``.status``, ``.reason``) on
  a final non-2xx answer, no answer in time (we CANCEL, status 408) or a transport failure.
- ``await send_audio(pcm16_8k, wait=True)``: queue 16-bit 8 kHz mono audio; with ``wait`` it
  returns once the last frame went out. ``queued_audio_s`` says how much is still to go.
- ``await send_digits(digits, interval_s=None, wait=True)``: ``0-9 * # A-D``; all at once with
  the RFC 4733 sender's own spacing (100 ms tone, 50 ms gap), or one per ``interval_s``.
- ``heard() -> bytes``; ``received_digits``; ``events`` (an :class:`asyncio.Queue` of
  :class:`CallEvent`) and ``history`` (every event, in order); ``await wait_for(kind)`` finds
  the first event of that kind in the history, waiting if needed; ``await wait_ended()``;
  ``await wait_until(condition, timeout_s)`` re-checks ``condition()`` after every media tick
  and event (e.g. ``lambda: rms_pcm16(caller.heard()[-1600:]) > 1000``).
- ``answered``, ``ended``, ``status``/``reason`` (the INVITE's final answer), ``hung_up_by``
  (``"caller"`` or ``"remote"``), ``duration_s``, ``stats()`` (RTP ``sent``/``received``/
  ``lost``), ``leg`` (the :class:`~appbridge.carriers.sip.leg.SipLeg`: negotiated codec, ...).
- ``await hangup()``: BYE and wait for its answer; CANCEL while ringing. Safe to call twice;
  ``close()`` (and leaving the ``async with``) hangs up and frees the sockets.

Event kinds: ``provisional`` (1xx, ``status``), ``answered``, ``failed`` (``status``),
``digit_sent`` / ``dtmf_received`` (``digit``), ``remote_hangup`` (their BYE), ``hangup`` (our
BYE or CANCEL), ``ended``.

Limits (a test caller talking straight to a gateway): in-dialog requests go over the same
socket or connection as the INVITE (no Record-Route hops), no digest authentication, the 200 of
a re-INVITE from the far end is sent once (no retransmission until its ACK).
"""

from appbridge.caller.sip.call import (
    SipCallPlan,
    SipCallReport,
    load_wav_pcm16_8k,
    place_sip_call,
)
from appbridge.caller.sip.link import SipLink, SipTarget, parse_sip_target
from appbridge.caller.sip.uac import (
    OFFER_CODECS,
    CallEvent,
    SipCallFailed,
    SipTestCaller,
)

__all__ = [
    "OFFER_CODECS",
    "CallEvent",
    "SipCallFailed",
    "SipCallPlan",
    "SipCallReport",
    "SipLink",
    "SipTarget",
    "SipTestCaller",
    "load_wav_pcm16_8k",
    "parse_sip_target",
    "place_sip_call",
]
