"""AppBridge: a telephony media gateway for voice apps."""

__version__ = "0.1.0"
