"""The embedded default configuration (docs/configuration.md, "The embedded default").

The gateway runs this when no file is given: loopback only, the built-in demo app answering every
number, SIP on udp and tcp 127.0.0.1:5060 and the Twilio routes without signature checks.
"""

from __future__ import annotations

from appbridge.config.model import (
    DEFAULT_RTP_PORTS,
    DEMO_ACCOUNT_SID,
    DEMO_FALLBACK_MESSAGE,
    AppConfig,
    Config,
    Fallback,
    NumberRoute,
    ServerConfig,
    SipConfig,
    TwilioCarrierConfig,
)


def default_config(port: int = 8080, *, sip_port: int | None = 5060) -> Config:
    """The embedded default with HTTP on 127.0.0.1:``port`` and SIP on udp and tcp
    127.0.0.1:``sip_port`` (``None``: no SIP listener, for tests)."""
    demo = AppConfig(
        ref="demo",
        url=f"ws://127.0.0.1:{port}/demo/session",
        fallback=Fallback(message=DEMO_FALLBACK_MESSAGE),
    )
    return Config(
        server=ServerConfig(host="127.0.0.1", port=port),
        http=None,
        api=None,
        twilio=TwilioCarrierConfig(account_sid=DEMO_ACCOUNT_SID, auth_token=None),
        sip=(
            SipConfig(
                listen=(f"udp:127.0.0.1:{sip_port}", f"tcp:127.0.0.1:{sip_port}"),
                rtp_ports=DEFAULT_RTP_PORTS,
                public_address=None,
                trunks=(),
            )
            if sip_port is not None
            else None
        ),
        apps={"demo": demo},
        numbers=(NumberRoute("*", "demo"),),
    )
