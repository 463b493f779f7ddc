"""The test callers of ``appbridge call``: Twilio's part or a SIP phone's, against a gateway.

Both play the carrier from outside the gateway and only meet it on the wire (docs/caller.md):
:mod:`.twilio` posts the voice webhook and runs the Media Stream (through
:mod:`.twilio_carrier` and :mod:`.twilio_stream`), :mod:`.sip` places a real SIP call on the
gateway's own SIP cores, and :mod:`.cli` is the command line. The package imports nothing from
:mod:`appbridge.testing`; the tests' fake Twilio builds on it instead.

The Twilio caller's API is re-exported here (``from appbridge.caller import place_test_call``);
the SIP caller's is :mod:`appbridge.caller.sip`.
"""

from appbridge.caller.common import CallerUsageError
from appbridge.caller.twilio import CallPlan, CallReport, load_wav_ulaw, place_test_call

__all__ = ["CallPlan", "CallReport", "CallerUsageError", "load_wav_ulaw", "place_test_call"]
