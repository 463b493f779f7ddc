"""Loads the RTP captures of tests/unit/sip/fixtures/sipp_rtp.txt.

The fixture holds the UDP payloads of the RFC 4733 captures that Debian's sip-tester ships
(/usr/share/sip-tester/dtmf_2833_*.pcap) and the first packets of its g711a.pcap, as hex, so the
tests need no package at run time. `pcap_udp_payloads` reads a classic pcap with struct, to check
the fixture against the real files where sip-tester is installed.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "sipp_rtp.txt"
SIPP_DIR = Path("/usr/share/sip-tester")


def load_captures() -> dict[str, list[tuple[float, bytes]]]:
    """pcap name -> [(arrival seconds from its first packet, RTP datagram)]."""
    out: dict[str, list[tuple[float, bytes]]] = defaultdict(list)
    for line in FIXTURE.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        name, arrival, hexdata = line.split()
        out[name].append((float(arrival), bytes.fromhex(hexdata)))
    return dict(out)


def pcap_udp_payloads(path: Path) -> list[tuple[float, bytes]]:
    """UDP payloads of an Ethernet/IPv4 classic pcap (libpcap format, either byte order)."""
    data = path.read_bytes()
    endian = "<" if struct.unpack("<I", data[:4])[0] == 0xA1B2C3D4 else ">"
    offset = 24
    out: list[tuple[float, bytes]] = []
    first: float | None = None
    while offset + 16 <= len(data):
        sec, usec, incl, _orig = struct.unpack(endian + "IIII", data[offset : offset + 16])
        offset += 16
        frame = data[offset : offset + incl]
        offset += incl
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 17:  # UDP only
            continue
        udp = ip[ihl:]
        length = struct.unpack("!H", udp[4:6])[0]
        t = sec + usec / 1e6
        first = t if first is None else first
        out.append((t - first, udp[8:length]))
    return out
