"""Twilio Programmable Voice as a carrier (docs/protocol-twilio.md, "Carrier side").

A call from Twilio (docs/ARCHITECTURE.md, "A call from Twilio, step by step"): the voice webhook
arrives; the gateway routes the called number, dials the app (Twilio plays ringback meanwhile,
through the 2.5 s retry window) and answers the webhook with TwiML ``<Connect><Stream>`` once the
app is connected or the fallback is chosen. Twilio then opens the Media Stream; its ``start``
message binds the stream to the call by CallSid, and ``session.start`` goes to the app.

One concept per module:

* ``webhook.py``: ``POST /twilio/voice``, from the signature check to the TwiML answer.
* ``twiml.py``: the TwiML documents the gateway answers with, and the stream URL they name.
* ``stream.py``: the Media Stream session, on the WebSocket fast path or behind ASGI.
* ``leg.py``: the carrier leg a call talks to; every frame toward Twilio passes through it.
* ``rest.py``: the part of Twilio's REST API the gateway calls (hang-up, transfer, new calls).
* ``status.py``: ``POST /twilio/status``, the status callback of the calls the gateway placed.

Calls the gateway places through Twilio (``POST /v1/calls``, transfer parties) are in
``carriers/twilio_outbound.py``; their streams arrive at ``stream.py`` too and are claimed by
their token first. ``leg.py`` and ``stream.py`` are compiled with mypyc (appbridge/compiled.py;
docs/ARCHITECTURE.md, "The compiled media path").
"""
