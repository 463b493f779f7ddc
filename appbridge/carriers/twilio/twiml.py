"""The TwiML documents the gateway answers Twilio with, and the stream URL they point at.

The voice webhook answers ``<Connect><Stream>`` (or ``<Say>``/``<Hangup>``/``<Reject>`` when
the call cannot reach an app); a cold transfer replaces the live call's TwiML with ``<Dial>``
(docs/protocol-twilio.md, "Carrier side"; docs/ARCHITECTURE.md, "A call from Twilio, step by
step"). Every value is escaped as XML text or quoted as an attribute.
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit
from xml.sax.saxutils import escape, quoteattr


def twiml_stream(stream_url: str, params: dict[str, str]) -> str:
    inner = "".join(
        f"<Parameter name={quoteattr(name)} value={quoteattr(value)}/>"
        for name, value in params.items()
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Response><Connect><Stream url={quoteattr(stream_url)}>{inner}</Stream>"
        "</Connect></Response>"
    )


def twiml_dial(target: str, headers: dict[str, str] | None) -> str:
    """``<Dial>`` to an E.164 number, or to a SIP URI with custom headers as URI parameters
    (Twilio's ``<Sip>`` takes ``X-`` headers in the URI's query)."""
    if target.startswith("sip:"):
        uri = target
        if headers:
            query = "&".join(f"{name}={quote(value, safe='')}" for name, value in headers.items())
            uri = f"{uri}{'&' if '?' in uri else '?'}{query}"
        inner = f"<Sip>{escape(uri)}</Sip>"
    else:
        inner = f"<Number>{escape(target)}</Number>"
    return f'<?xml version="1.0" encoding="UTF-8"?><Response><Dial>{inner}</Dial></Response>'


def twiml_say_hangup(text: str) -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Response><Say>{escape(text)}</Say><Hangup/></Response>"
    )


def twiml_hangup() -> str:
    return '<?xml version="1.0" encoding="UTF-8"?><Response><Hangup/></Response>'


def twiml_reject(reason: str = "busy") -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Response><Reject reason={quoteattr(reason)}/></Response>"
    )


def stream_url(base_url: str) -> str:
    """``WS /twilio/stream`` under ``server.public_url`` (docs/configuration.md, ``[server]``),
    ``wss`` when the gateway is public over https: the URL the TwiML names and the stream's
    signature covers."""
    parts = urlsplit(base_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return f"{scheme}://{parts.netloc}{parts.path}/twilio/stream"
