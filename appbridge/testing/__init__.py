"""Outside peers for tests, the benchmark and ``appbridge call``: a fake Twilio (caller side and
REST API) and a fake fonoster.session.v1 app, plus small audio helpers.

They speak the wire formats independently of the gateway's own codecs (no import of
``appbridge.protocol`` or ``appbridge.media``), so a bug shared by both ends cannot hide.
"""

from appbridge.testing.fake_app import (
    FakeApp,
    FakeSession,
    RejectedHandshake,
    fonoster_headers,
    fonoster_signature,
)
from appbridge.testing.fake_twilio import (
    FakeTwilio,
    FakeTwilioCall,
    FakeTwilioRest,
    LoopbackServer,
    RestRequest,
    new_sid,
    twilio_signature,
)

__all__ = [
    "FakeApp",
    "FakeSession",
    "FakeTwilio",
    "FakeTwilioCall",
    "FakeTwilioRest",
    "LoopbackServer",
    "RejectedHandshake",
    "RestRequest",
    "fonoster_headers",
    "fonoster_signature",
    "new_sid",
    "twilio_signature",
]
