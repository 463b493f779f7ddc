"""Calls from a browser over WebRTC (docs/webrtc.md): signalling, the leg, its media."""
