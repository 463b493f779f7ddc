"""RFC 4475 torture messages against the SIP parser.

The messages of RFC 4475 §3.1.1 (valid) and §3.1.2 (invalid) are written out below from the RFC's
text, plus a few of §3.2-§3.4 whose handling is decided at parse time. The multipart body of
§3.1.1.11 is our own binary part (the RFC's is an S/MIME blob): what matters is that octets
looking like CRLF CRLF and NUL inside a body do not confuse framing.

Each valid one parses (and survives a serialise/parse round trip); each invalid one raises
:class:`SipParseError` with the status RFC 4475 asks for, and ``can_respond`` is False exactly
where no response is possible (a malformed *response* is dropped).
"""

from __future__ import annotations

import pytest

from appbridge.carriers.sip.framing import SipStreamFramer
from appbridge.carriers.sip.headers import SipParseError
from appbridge.carriers.sip.message import (
    Request,
    Response,
    make_response,
    parse_message,
)


def msg(*lines: str, body: bytes = b"") -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body


def sdp(o_ip: str, c_ip: str, *, t: str = "0 0", video: str = "m=video") -> bytes:
    lines = [
        "v=0",
        f"o=mhandley 29739 7272939 IN IP4 {o_ip}",
        "s=-",
        f"c=IN IP4 {c_ip}",
        f"t={t}",
        "m=audio 49217 RTP/AVP 0 12",
        f"{video} 3227 RTP/AVP 31",
        "a=rtpmap:31 LPC",
    ]
    return ("\r\n".join(lines) + "\r\n").encode()


LONG_VIAS = [
    f"{name}: SIP/2.0/TCP sip{n}.example.com"
    for name, n in zip(
        ["Via", "v", "V", "Via", "ViA", "VIa", "VIA", "via", "viA", "vIa", "vIA", "V ", "v ",
         "V  ", "v  ", "Via ", "Via  "] + ["Via"] * 16,
        range(33, 0, -1),
        strict=True,
    )
]  # fmt: skip

MPART_BINARY = bytes(range(256)) + b"\r\n\r\n--not-the-boundary\r\n\x00"
MPART_BODY = (
    b"--7a9cbec02ceef655\r\nContent-Type: text/plain\r\nContent-Transfer-Encoding: binary\r\n"
    b"\r\nHello\r\n--7a9cbec02ceef655\r\nContent-Type: application/octet-stream\r\n"
    b"Content-Transfer-Encoding: binary\r\n\r\n" + MPART_BINARY + b"\r\n--7a9cbec02ceef655--\r\n"
)

# RFC 4475 §3.1.1: valid messages. name -> (section, octets)
VALID: dict[str, tuple[str, bytes]] = {
    "wsinv": (
        "3.1.1.1",
        msg(
            "INVITE sip:vivekg@chair-dnrc.example.com;unknownparam SIP/2.0",
            "TO :",
            " sip:vivekg@chair-dnrc.example.com ;   tag    = 1918181833n",
            r'from   : "J Rosenberg \\\""       <sip:jdrosen@example.com>',
            "  ;",
            "  tag = 98asjd8",
            "MaX-fOrWaRdS: 0068",
            "Call-ID: wsinv.ndaksdj@192.0.2.1",
            "Content-Length   : 150",
            "cseq: 0009",
            "  INVITE",
            "Via  : SIP  /   2.0",
            " /UDP",
            "    192.0.2.2;branch=390skdjuw",
            "s :",
            "NewFangledHeader:   newfangled value",
            " continued newfangled value",
            "UnknownHeaderWithUnusualValue: ;;,,;;,;",
            "Content-Type: application/sdp",
            "Route:",
            " <sip:services.example.com;lr;unknownwith=value;unknown-no-value>",
            "v:  SIP  / 2.0  / TCP     spindle.example.com   ;",
            "  branch  =   z9hG4bK9ikj8  ,",
            " SIP  /    2.0   / UDP  192.168.255.111   ; branch=",
            " z9hG4bK30239",
            r'm:"Quoted string \"\"" <sip:jdrosen@example.com> ; newparam =',
            "      newvalue ;",
            "  secondparam ; q = 0.33",
            body=sdp("192.0.2.3", "192.0.2.4"),
        ),
    ),
    "intmeth": (
        "3.1.1.2",
        msg(
            "!interesting-Method0123456789_*+`.%indeed'~ sip:1_unusual.URI~(to-be!sure)&isn't+it$"
            "/crazy?,/;;*:&it+has=1,weird!*pas$wo~d_too.(doesn't-it)@example.com SIP/2.0",
            "Via: SIP/2.0/TCP host1.example.com;branch=z9hG4bK-.!%66*_+`'~",
            'To: "BEL:\\\x07 NUL:\\\x00 DEL:\\\x7f" '
            "<sip:1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*@example.com>",
            "From: token1~` token2'+_ token3*%!.- <sip:mundane@example.com>"
            ";fromParam''~+*_!.-%=\"работающий\";tag=_token~1'+`*%!-.",
            "Call-ID: intmeth.word%ZK-!.*_+'@word`~)(><:\\/\"][?}{",
            "CSeq: 139122385 !interesting-Method0123456789_*+`.%indeed'~",
            "Max-Forwards: 255",
            "extensionHeader-!.%*+_`'~:\ufeff大停電",
            "Content-Length: 0",
        ),
    ),
    "esc01": (
        "3.1.1.3",
        msg(
            "INVITE sip:sips%3Auser%40example.com@example.net SIP/2.0",
            "To: sip:%75se%72@example.com",
            "From: <sip:I%20have%20spaces@example.net>;tag=938",
            "Max-Forwards: 87",
            "i: esc01.239409asdfakjkn23onasd0-3234",
            "CSeq: 234234 INVITE",
            "Via: SIP/2.0/UDP host5.example.net;branch=z9hG4bKkdjuw",
            "C: application/sdp",
            "Contact:",
            "  <sip:cal%6Cer@host5.example.net;%6C%72;n%61me=v%61lue%25%34%31>",
            "Content-Length: 150",
            body=sdp("192.0.2.1", "192.0.2.1"),
        ),
    ),
    "escnull": (
        "3.1.1.4",
        msg(
            "REGISTER sip:example.com SIP/2.0",
            "To: sip:null-%00-null@example.com",
            "From: sip:null-%00-null@example.com;tag=839923423",
            "Max-Forwards: 70",
            "Call-ID: escnull.39203ndfvkjdasfkq3w4otrq0adsfdfnavd",
            "CSeq: 14398234 REGISTER",
            "Via: SIP/2.0/UDP host5.example.com;branch=z9hG4bKkdjuw",
            "Contact: <sip:%00@host5.example.com>",
            "Contact: <sip:%00%00@host5.example.com>",
            "L:0",
        ),
    ),
    "esc02": (
        "3.1.1.5",
        msg(
            "RE%47IST%45R sip:registrar.example.com SIP/2.0",
            'To: "%Z%45" <sip:resource@example.com>',
            'From: "%Z%45" <sip:resource@example.com>;tag=f232jadfj23',
            "Call-ID: esc02.asdfnqwo34rq23i34jrjasdcnl23nrlknsdf",
            "Via: SIP/2.0/TCP host.example.com;branch=z9hG4bK209%fzsnel234",
            "CSeq: 29344 RE%47IST%45R",
            "Max-Forwards: 70",
            "Contact: <sip:alias1@host1.example.com>",
            "C%6Fntact: <sip:alias2@host2.example.com>",
            "Contact: <sip:alias3@host3.example.com>",
            "l: 0",
        ),
    ),
    "lwsdisp": (
        "3.1.1.6",
        msg(
            "OPTIONS sip:user@example.com SIP/2.0",
            "To: sip:user@example.com",
            "From: caller<sip:caller@example.com>;tag=323",
            "Max-Forwards: 70",
            "Call-ID: lwsdisp.1234abcd@funky.example.com",
            "CSeq: 60 OPTIONS",
            "Via: SIP/2.0/UDP funky.example.com;branch=z9hG4bKkdjuw",
            "l: 0",
        ),
    ),
    "longreq": (
        "3.1.1.7",
        msg(
            "INVITE sip:user@example.com SIP/2.0",
            'To: "I have a user name of ' + "extreme" * 10 + ' proportion"'
            "<sip:user@example.com:6000;unknownparam1=very"
            + "long" * 20
            + "value;longparam"
            + "name" * 25
            + "=shortvalue;very"
            + "long" * 25
            + "ParameterNameWithNoValue>",
            "F: sip:"
            + "amazinglylongcallername" * 5
            + "@example.net;tag=12"
            + "982" * 50
            + "424;unknownheaderparam"
            + "name" * 20
            + "=unknowheaderparam"
            + "value" * 15
            + ";unknownValueless"
            + "paramname" * 10,
            "Call-ID: longreq.one" + "really" * 20 + "longcallid",
            "CSeq: 3882340 INVITE",
            "Unknown-"
            + "Long" * 20
            + "-Name: unknown-"
            + "long" * 20
            + "-value; unknown-"
            + "long" * 20
            + "-parameter-name = unknown-"
            + "long" * 20
            + "-parameter-value",
            *LONG_VIAS,
            "Via: SIP/2.0/TCP host.example.com;received=192.0.2.5;branch=very"
            + "long" * 50
            + "branchvalue",
            "Max-Forwards: 70",
            "Contact: <sip:" + "amazinglylongcallername" * 5 + "@host5.example.net>",
            "Content-Type: application/sdp",
            "l: 150",
            body=sdp("192.0.2.1", "192.0.2.1"),
        ),
    ),
    "dblreq": (
        "3.1.1.8",
        msg(
            "REGISTER sip:example.com SIP/2.0",
            "To: sip:j.user@example.com",
            "From: sip:j.user@example.com;tag=43251j3j324",
            "Max-Forwards: 8",
            "I: dblreq.0ha0isndaksdj99sdfafnl3lk233412",
            "Contact: sip:j.user@host.example.com",
            "CSeq: 8 REGISTER",
            "Via: SIP/2.0/UDP 192.0.2.125;branch=z9hG4bKkdjuw23492",
            "Content-Length: 0",
        )
        + msg(
            "INVITE sip:joe@example.com SIP/2.0",
            "t: sip:joe@example.com",
            "From: sip:caller@example.net;tag=141334",
            "Max-Forwards: 8",
            "Call-ID: dblreq.0ha0isnda977644900765@192.0.2.15",
            "CSeq: 8 INVITE",
            "Via: SIP/2.0/UDP 192.0.2.15;branch=z9hG4bKkdjuw380234",
            "Content-Type: application/sdp",
            "Content-Length: 150",
            body=sdp("192.0.2.15", "192.0.2.15", video="m =video"),
        ),
    ),
    "semiuri": (
        "3.1.1.9",
        msg(
            "OPTIONS sip:user;par=u%40example.net@example.com SIP/2.0",
            "To: sip:j_user@example.com",
            "From: sip:caller@example.org;tag=33242",
            "Max-Forwards: 3",
            "Call-ID: semiuri.0ha0isndaksdj",
            "CSeq: 8 OPTIONS",
            "Accept: application/sdp, application/pkcs7-mime,",
            "        multipart/mixed, multipart/signed,",
            "        message/sip, message/sipfrag",
            "Via: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKkdjuw",
            "l: 0",
        ),
    ),
    "transports": (
        "3.1.1.10",
        msg(
            "OPTIONS sip:user@example.com SIP/2.0",
            "To: sip:user@example.com",
            "From: <sip:caller@example.com>;tag=323",
            "Max-Forwards: 70",
            "Call-ID:  transports.kijh4akdnaqjkwendsasfdj",
            "Accept: application/sdp",
            "CSeq: 60 OPTIONS",
            "Via: SIP/2.0/UDP t1.example.com;branch=z9hG4bKkdjuw",
            "Via: SIP/2.0/SCTP t2.example.com;branch=z9hG4bKklasjdhf",
            "Via: SIP/2.0/TLS t3.example.com;branch=z9hG4bK2980unddj",
            "Via: SIP/2.0/UNKNOWN t4.example.com;branch=z9hG4bKasd0f3en",
            "Via: SIP/2.0/TCP t5.example.com;branch=z9hG4bK0a9idfnee",
            "l: 0",
        ),
    ),
    "mpart01": (
        "3.1.1.11",
        msg(
            "MESSAGE sip:kumiko@example.org SIP/2.0",
            "Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bK-d87543-4dade06d0bdb11ee-1--d87543-"
            ";rport",
            "Max-Forwards: 70",
            "Route: <sip:127.0.0.1:5080>",
            "Contact: <sip:fluffy@127.0.0.1:5070>",
            "To: <sip:kumiko@example.org>",
            "From: <sip:fluffy@example.com>;tag=2fb0dcc9",
            "Call-ID: 3d9485ad0c49859b@Zmx1ZmZ5LW1hYy0xNi5sb2NhbA..",
            "CSeq: 1 MESSAGE",
            "Content-Transfer-Encoding: binary",
            "Content-Type: multipart/mixed;boundary=7a9cbec02ceef655",
            "Date: Sat, 15 Oct 2005 04:44:56 GMT",
            "User-Agent: SIPimp.org/0.2.5 (curses)",
            f"Content-Length: {len(MPART_BODY)}",
            body=MPART_BODY,
        ),
    ),
    "unreason": (
        "3.1.1.12",
        msg(
            "SIP/2.0 200 = 2**3 * 5**2 но сто девяносто девять - простое",
            "Via: SIP/2.0/UDP 192.0.2.198;branch=z9hG4bK1324923",
            "Call-ID: unreason.1234ksdfak3j2erwedfsASdf",
            "CSeq: 35 INVITE",
            "From: sip:user@example.com;tag=11141343",
            "To: sip:user@example.edu;tag=2229",
            "Content-Length: 154",
            "Content-Type: application/sdp",
            "Contact: <sip:user@host198.example.com>",
            body=sdp("192.0.2.198", "192.0.2.198"),
        ),
    ),
    "noreason": (
        "3.1.1.13",
        msg(
            "SIP/2.0 100 ",
            "Via: SIP/2.0/UDP 192.0.2.105;branch=z9hG4bK2398ndaoe",
            "Call-ID: noreason.asndj203insdf99223ndf",
            "CSeq: 35 INVITE",
            "From: <sip:user@example.com>;tag=39ansfi3",
            "To: <sip:user@example.edu>;tag=902jndnke3",
            "Content-Length: 0",
            "Contact: <sip:user@host105.example.com>",
        ),
    ),
}

DROP = None  # no response is possible: the element drops the message

# RFC 4475 §3.1.2: invalid messages. name -> (section, octets, status to answer or DROP)
INVALID: dict[str, tuple[str, bytes, int | None]] = {
    "badinv01": (
        "3.1.2.1",
        msg(
            "INVITE sip:user@example.com SIP/2.0",
            "To: sip:j.user@example.com",
            "From: sip:caller@example.net;tag=134161461246",
            "Max-Forwards: 7",
            "Call-ID: badinv01.0ha0isndaksdjasdf3234nas",
            "CSeq: 8 INVITE",
            "Via: SIP/2.0/UDP 192.0.2.15;;,;,,",
            'Contact: "Joe" <sip:joe@example.org>;;;;',
            "Content-Length: 152",
            "Content-Type: application/sdp",
            body=sdp("192.0.2.15", "192.0.2.15"),
        ),
        400,
    ),
    "clerr": (
        "3.1.2.2",
        msg(
            "INVITE sip:user@example.com SIP/2.0",
            "Max-Forwards: 80",
            "To: sip:j.user@example.com",
            "From: sip:caller@example.net;tag=93942939o2",
            "Contact: <sip:caller@hungry.example.net>",
            "Call-ID: clerr.0ha0isndaksdjweiafasdk3",
            "CSeq: 8 INVITE",
            "Via: SIP/2.0/UDP host5.example.com;branch=z9hG4bK-39234-23523",
            "Content-Type: application/sdp",
            "Content-Length: 9999",
            body=b"\r\n" + sdp("192.0.2.155", "192.0.2.155"),
        ),
        400,
    ),
    "ncl": (
        "3.1.2.3",
        msg(
            "INVITE sip:user@example.com SIP/2.0",
            "Max-Forwards: 254",
            "To: sip:j.user@example.com",
            "From: sip:caller@example.net;tag=32394234",
            "Call-ID: ncl.0ha0isndaksdj2193423r542w35",
            "CSeq: 0 INVITE",
            "Via: SIP/2.0/UDP 192.0.2.53;branch=z9hG4bKkdjuw",
            "Contact: <sip:caller@example53.example.net>",
            "Content-Type: application/sdp",
            "Content-Length: -999",
            body=sdp("192.0.2.53", "192.0.2.53"),
        ),
        400,
    ),
    "scalar02": (
        "3.1.2.4",
        msg(
            "REGISTER sip:example.com SIP/2.0",
            "Via: SIP/2.0/TCP host129.example.com;branch=z9hG4bK342sdfoi3",
            "To: <sip:user@example.com>",
            "From: <sip:user@example.com>;tag=239232jh3",
            "CSeq: 36893488147419103232 REGISTER",
            "Call-ID: scalar02.23o0pd9vanlq3wnrlnewofjas9ui32",
            "Max-Forwards: 300",
            "Expires: 1" + "0" * 100,
            "Contact: <sip:user@host129.example.com>",
            "  ;expires=280297596632815",
            "Content-Length: 0",
        ),
        400,
    ),
    "scalarlg": (
        "3.1.2.5",
        msg(
            "SIP/2.0 503 Service Unavailable",
            "Via: SIP/2.0/TCP host129.example.com;branch=z9hG4bKzzxdiwo34sw;received=192.0.2.129",
            "To: <sip:user@example.com>",
            "From: <sip:other@example.net>;tag=2easdjfejw",
            "CSeq: 9292394834772304023312 OPTIONS",
            "Call-ID: scalarlg.noase0of0234hn2qofoaf0232aewf2394r",
            "Retry-After: 949302838503028349304023988",
            'Warning: 1812 overture "In Progress"',
            "Content-Length: 0",
        ),
        DROP,
    ),
    "quotbal": (
        "3.1.2.6",
        msg(
            "INVITE sip:user@example.com SIP/2.0",
            'To: "Mr. J. User <sip:j.user@example.com>',
            "From: sip:caller@example.net;tag=93334",
            "Max-Forwards: 10",
            "Call-ID: quotbal.aksdj",
            "Contact: <sip:caller@host59.example.net>",
            "CSeq: 8 INVITE",
            "Via: SIP/2.0/UDP 192.0.2.59:5050;branch=z9hG4bKkdjuw39234",
            "Content-Type: application/sdp",
            "Content-Length: 152",
            body=sdp("192.0.2.15", "192.0.2.15"),
        ),
        400,
    ),
    "ltgtruri": (
        "3.1.2.7",
        msg(
            "INVITE <sip:user@example.com> SIP/2.0",
            "To: sip:user@example.com",
            "From: sip:caller@example.net;tag=39291",
            "Max-Forwards: 23",
            "Call-ID: ltgtruri.1@192.0.2.5",
            "CSeq: 1 INVITE",
            "Via: SIP/2.0/UDP 192.0.2.5",
            "Contact: <sip:caller@host5.example.net>",
            "Content-Type: application/sdp",
            "Content-Length: 159",
            body=sdp("192.0.2.5", "192.0.2.5", t="3149328700 0"),
        ),
        400,
    ),
    "lwsruri": (
        "3.1.2.8",
        msg(
            "INVITE sip:user@example.com; lr SIP/2.0",
            "To: sip:user@example.com;tag=3xfe-9921883-z9f",
            "From: sip:caller@example.net;tag=231413434",
            "Max-Forwards: 5",
            "Call-ID: lwsruri.asdfasdoeoi2323-asdfwrn23-asd834rk423",
            "CSeq: 2130706432 INVITE",
            "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKkdjuw2395",
            "Contact: <sip:caller@host1.example.net>",
            "Content-Type: application/sdp",
            "Content-Length: 159",
            body=sdp("192.0.2.1", "192.0.2.1", t="3149328700 0"),
        ),
        400,
    ),
    "lwsstart": (
        "3.1.2.9",
        msg(
            "INVITE  sip:user@example.com  SIP/2.0",
            "Max-Forwards: 8",
            "To: sip:user@example.com",
            "From: sip:caller@example.net;tag=8814",
            "Call-ID: lwsstart.dfknq234oi243099adsdfnawe3@example.com",
            "CSeq: 1893884 INVITE",
            "Via: SIP/2.0/UDP host1.example.com;branch=z9hG4bKkdjuw3923",
            "Contact: <sip:caller@host1.example.net>",
            "Content-Type: application/sdp",
            "Content-Length: 150",
            body=sdp("192.0.2.1", "192.0.2.1"),
        ),
        400,
    ),
    "trws": (
        "3.1.2.10",
        msg(
            "OPTIONS sip:remote-target@example.com SIP/2.0  ",
            "Via: SIP/2.0/TCP host1.examle.com;branch=z9hG4bK299342093",
            "To: <sip:remote-target@example.com>",
            "From: <sip:local-resource@example.com>;tag=329429089",
            "Call-ID: trws.oicu34958239neffasdhr2345r",
            "Accept: application/sdp",
            "CSeq: 238923 OPTIONS",
            "Max-Forwards: 70",
            "Content-Length: 0",
        ),
        400,
    ),
    "escruri": (
        "3.1.2.11",
        msg(
            "INVITE sip:user@example.com?Route=%3Csip:example.com%3E SIP/2.0",
            "To: sip:user@example.com",
            "From: sip:caller@example.net;tag=341518",
            "Max-Forwards: 7",
            "Contact: <sip:caller@host39923.example.net>",
            "Call-ID: escruri.23940-asdfhj-aje3br-234q098w-fawerh2q-h4n5",
            "CSeq: 149209342 INVITE",
            "Via: SIP/2.0/UDP host-of-the-hour.example.com;branch=z9hG4bKkdjuw",
            "Content-Type: application/sdp",
            "Content-Length: 150",
            body=sdp("192.0.2.1", "192.0.2.1"),
        ),
        400,
    ),
    "baddate": (
        "3.1.2.12",
        msg(
            "INVITE sip:user@example.com SIP/2.0",
            "To: sip:user@example.com",
            "From: sip:caller@example.net;tag=2234923",
            "Max-Forwards: 70",
            "Call-ID: baddate.239423mnsadf3j23lj42--sedfnm234",
            "CSeq: 1392934 INVITE",
            "Via: SIP/2.0/UDP host.example.com;branch=z9hG4bKkdjuw",
            "Date: Fri, 01 Jan 2010 16:00:00 EST",
            "Contact: <sip:caller@host5.example.net>",
            "Content-Type: application/sdp",
            "Content-Length: 150",
            body=sdp("192.0.2.5", "192.0.2.5"),
        ),
        400,
    ),
    "regbadct": (
        "3.1.2.13",
        msg(
            "REGISTER sip:example.com SIP/2.0",
            "To: sip:user@example.com",
            "From: sip:user@example.com;tag=998332",
            "Max-Forwards: 70",
            "Call-ID: regbadct.k345asrl3fdbv@10.0.0.1",
            "CSeq: 1 REGISTER",
            "Via: SIP/2.0/UDP 135.180.130.133:5060;branch=z9hG4bKkdjuw",
            "Contact: sip:user@example.com?Route=%3Csip:sip.example.com%3E",
            "l: 0",
        ),
        400,
    ),
    "badaspec": (
        "3.1.2.14",
        msg(
            "OPTIONS sip:user@example.org SIP/2.0",
            "Via: SIP/2.0/UDP host4.example.com:5060;branch=z9hG4bKkdju43234",
            "Max-Forwards: 70",
            'From: "Bell, Alexander" <sip:a.g.bell@example.com>;tag=433423',
            'To: "Watson, Thomas" < sip:t.watson@example.org >',
            "Call-ID: badaspec.sdf0234n2nds0a099u23h3hnnw009cdkne3",
            "Accept: application/sdp",
            "CSeq: 3923239 OPTIONS",
            "l: 0",
        ),
        400,
    ),
    "baddn": (
        "3.1.2.15",
        msg(
            "OPTIONS sip:t.watson@example.org SIP/2.0",
            "Via:     SIP/2.0/UDP c.example.com:5060;branch=z9hG4bKkdjuw",
            "Max-Forwards:      70",
            "From:    Bell, Alexander <sip:a.g.bell@example.com>;tag=43",
            "To:      Watson, Thomas <sip:t.watson@example.org>",
            "Call-ID: baddn.31415@c.example.com",
            "Accept: application/sdp",
            "CSeq:    3923239 OPTIONS",
            "l: 0",
        ),
        400,
    ),
    "badvers": (
        "3.1.2.16",
        msg(
            "OPTIONS sip:t.watson@example.org SIP/7.0",
            "Via:     SIP/7.0/UDP c.example.com;branch=z9hG4bKkdjuw",
            "Max-Forwards:     70",
            "From:    A. Bell <sip:a.g.bell@example.com>;tag=qweoiqpe",
            "To:      T. Watson <sip:t.watson@example.org>",
            "Call-ID: badvers.31417@c.example.com",
            "CSeq:    1 OPTIONS",
            "l: 0",
        ),
        505,
    ),
    "mismatch01": (
        "3.1.2.17",
        msg(
            "OPTIONS sip:user@example.com SIP/2.0",
            "To: sip:j.user@example.com",
            "From: sip:caller@example.net;tag=34525",
            "Max-Forwards: 6",
            "Call-ID: mismatch01.dj0234sxdfl3",
            "CSeq: 8 INVITE",
            "Via: SIP/2.0/UDP host.example.com;branch=z9hG4bKkdjuw",
            "l: 0",
        ),
        400,
    ),
    "mismatch02": (
        "3.1.2.18",
        msg(
            "NEWMETHOD sip:user@example.com SIP/2.0",
            "To: sip:j.user@example.com",
            "From: sip:caller@example.net;tag=34525",
            "Max-Forwards: 6",
            "Call-ID: mismatch02.dj0234sxdfl3",
            "CSeq: 8 INVITE",
            "Contact: <sip:caller@host.example.net>",
            "Via: SIP/2.0/UDP host.example.net;branch=z9hG4bKkdjuw",
            "Content-Type: application/sdp",
            "l: 138",
            body=b"v=0\r\no=mhandley 29739 7272939 IN IP4 192.0.2.1\r\nc=IN IP4 192.0.2.1\r\n"
            b"m=audio 49217 RTP/AVP 0 12\r\nm=video 3227 RTP/AVP 31\r\na=rtpmap:31 LPC\r\n",
        ),
        400,  # RFC 4475 prefers 501 at proxies and allows 400; a UA answers 400
    ),
    "bigcode": (
        "3.1.2.19",
        msg(
            "SIP/2.0 4294967301 better not break the receiver",
            "Via: SIP/2.0/UDP 192.0.2.105;branch=z9hG4bK2398ndaoe",
            "Call-ID: bigcode.asdof3uj203asdnf3429uasdhfas3ehjasdfas9i",
            "CSeq: 353494 INVITE",
            "From: <sip:user@example.com>;tag=39ansfi3",
            "To: <sip:user@example.edu>;tag=902jndnke3",
            "Content-Length: 0",
            "Contact: <sip:user@host105.example.com>",
        ),
        DROP,
    ),
}

# RFC 4475 §3.2-§3.4, where the parser's verdict matters: None parses, else the status.
SEMANTIC: dict[str, tuple[str, bytes, int | None]] = {
    "badbranch": (
        "3.2.1",
        msg(
            "OPTIONS sip:user@example.com SIP/2.0",
            "To: sip:user@example.com",
            "From: sip:caller@example.org;tag=33242",
            "Max-Forwards: 3",
            "Via: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bK",
            "Accept: application/sdp",
            "Call-ID: badbranch.sadonfo23i420jv0as0derf3j3n",
            "CSeq: 8 OPTIONS",
            "l: 0",
        ),
        None,
    ),
    "insuf": (
        "3.3.1",
        msg(
            "INVITE sip:user@example.com SIP/2.0",
            "CSeq: 193942 INVITE",
            "Via: SIP/2.0/UDP 192.0.2.95;branch=z9hG4bKkdj.insuf",
            "Content-Type: application/sdp",
            "l: 152",
            body=sdp("192.0.2.95", "192.0.2.95"),
        ),
        400,
    ),
    "unkscm": (
        "3.3.2",
        msg(
            "OPTIONS nobodyKnowsThisScheme:totallyopaquecontent SIP/2.0",
            "To: sip:user@example.com",
            "From: sip:caller@example.net;tag=384",
            "Max-Forwards: 3",
            "Call-ID: unkscm.nasdfasser0q239nwsdfasdkl34",
            "CSeq: 3923423 OPTIONS",
            "Via: SIP/2.0/TCP host9.example.com;branch=z9hG4bKkdjuw39234",
            "Content-Length: 0",
        ),
        None,
    ),
    "unksm2": (
        "3.3.4",
        msg(
            "REGISTER sip:example.com SIP/2.0",
            "To: isbn:2983792873",
            "From: <http://www.example.com>;tag=3234233",
            "Call-ID: unksm2.daksdj@hyphenated-host.example.com",
            "CSeq: 234902 REGISTER",
            "Max-Forwards: 70",
            "Via: SIP/2.0/UDP 192.0.2.21:5060;branch=z9hG4bKkdjuw",
            "Contact: <name:John_Smith>",
            "l: 0",
        ),
        None,
    ),
    "multi01": (
        "3.3.8",
        msg(
            "INVITE sip:user@company.com SIP/2.0",
            "Contact: <sip:caller@host25.example.net>",
            "Via: SIP/2.0/UDP 192.0.2.25;branch=z9hG4bKkdjuw",
            "Max-Forwards: 70",
            "CSeq: 5 INVITE",
            "Call-ID: multi01.98asdh@192.0.2.1",
            "CSeq: 59 INVITE",
            "Call-ID: multi01.98asdh@192.0.2.2",
            "From: sip:caller@example.com;tag=3413415",
            "To: sip:user@example.com",
            "To: sip:other@example.net",
            "From: sip:caller@example.net;tag=2923420123",
            "Content-Type: application/sdp",
            "l: 154",
            "Contact: <sip:caller@host36.example.net>",
            "Max-Forwards: 5",
            body=sdp("192.0.2.25", "192.0.2.25"),
        ),
        400,
    ),
    "mcl01": (
        "3.3.9",
        msg(
            "OPTIONS sip:user@example.com SIP/2.0",
            "Via: SIP/2.0/UDP host5.example.net;branch=z9hG4bK293423",
            "To: sip:user@example.com",
            "From: sip:other@example.net;tag=3923942",
            "Call-ID: mcl01.fhn2323orihawfdoa3o4r52o3irsdf",
            "CSeq: 15932 OPTIONS",
            "Content-Length: 13",
            "Max-Forwards: 60",
            "Content-Length: 5",
            "Content-Type: text/plain",
            body=b"There's no way to know how many octets are supposed to be here.\r\n",
        ),
        400,
    ),
    "zeromf": (
        "3.3.11",
        msg(
            "OPTIONS sip:user@example.com SIP/2.0",
            "Call-ID: zeromf.jfasdlfnm2o2l43r5u0asdfas",
            "CSeq: 39234321 OPTIONS",
            "Via: SIP/2.0/UDP host1.example.com;branch=z9hG4bKkdjuw2349i",
            "Max-Forwards: 0",
            "To: sip:j.user@example.com",
            "From: sip:caller@example.net;tag=3ghsd41",
            "Content-Length: 0",
        ),
        None,
    ),
    "regescrt": (
        "3.3.14",
        msg(
            "REGISTER sip:example.com SIP/2.0",
            "To: sip:user@example.com",
            "From: sip:user@example.com;tag=8",
            "Max-Forwards: 70",
            "Call-ID: regescrt.k345asrl3fdbv@192.0.2.1",
            "CSeq: 14398234 REGISTER",
            "Via: SIP/2.0/UDP host5.example.com;branch=z9hG4bKkdjuw",
            "M: <sip:user@example.com?Route=%3Csip:sip.example.com%3E>",
            "L:0",
        ),
        None,
    ),
    "inv2543": (
        "3.4.1",
        msg(
            "INVITE sip:UserB@example.com SIP/2.0",
            "Via: SIP/2.0/UDP iftgw.example.com",
            "From: <sip:+13035551111@ift.client.example.net;user=phone>",
            "Record-Route: <sip:UserB@example.com;maddr=ss1.example.com>",
            "To: sip:+16505552222@ss1.example.net;user=phone",
            "Call-ID: inv2543.1717@ift.client.example.com",
            "CSeq: 56 INVITE",
            "Content-Type: application/sdp",
            body=b"v=0\r\no=mhandley 29739 7272939 IN IP4 192.0.2.5\r\ns=-\r\n"
            b"c=IN IP4 192.0.2.5\r\nt=0 0\r\nm=audio 49217 RTP/AVP 0\r\n",
        ),
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_message_parses_and_round_trips(name: str) -> None:
    message = parse_message(VALID[name][1])
    again = parse_message(message.serialize())
    assert type(again) is type(message)
    assert again.body == message.body
    assert list(again.headers) == list(message.headers)
    if isinstance(message, Request):
        assert isinstance(again, Request)
        assert (again.method, str(again.uri)) == (message.method, str(message.uri))


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_message_is_rejected_with_the_right_answer(name: str) -> None:
    _, data, status = INVALID[name]
    with pytest.raises(SipParseError) as caught:
        parse_message(data)
    error = caught.value
    if status is DROP:
        assert not error.can_respond
        return
    assert error.can_respond, error.reason
    assert error.status == status
    assert error.message is not None and isinstance(error.message, Request)
    # The shell answers from the raw request, copying the headers as received (§8.2.6.2).
    answer = make_response(error.message, error.status, error.reason, to_tag="gw1")
    wire = answer.serialize()
    assert wire.startswith(f"SIP/2.0 {status} {error.reason}\r\n".encode())
    for via in error.message.headers.get_all("Via"):
        assert f"\r\nVia: {via}\r\n".encode() in wire
    assert "\r" not in error.reason and "\n" not in error.reason


@pytest.mark.parametrize("name", sorted(SEMANTIC))
def test_application_layer_torture(name: str) -> None:
    _, data, status = SEMANTIC[name]
    if status is None:
        parse_message(data)
        return
    with pytest.raises(SipParseError) as caught:
        parse_message(data)
    assert caught.value.status == status
    assert caught.value.can_respond


def test_wsinv_details() -> None:
    m = parse_message(VALID["wsinv"][1])
    assert isinstance(m, Request)
    assert m.method == "INVITE" and m.uri.has_param("unknownparam")
    assert m.uri.user == "vivekg" and m.uri.host == "chair-dnrc.example.com"
    assert m.to.tag == "1918181833n"
    assert m.from_.display_name == 'J Rosenberg \\"'
    assert m.from_.tag == "98asjd8"
    assert m.max_forwards == 68
    assert m.call_id == "wsinv.ndaksdj@192.0.2.1"
    assert (m.cseq.seq, m.cseq.method) == (9, "INVITE")
    vias = m.vias
    assert [(v.transport, v.host, v.branch) for v in vias] == [
        ("UDP", "192.0.2.2", "390skdjuw"),
        ("TCP", "spindle.example.com", "z9hG4bK9ikj8"),
        ("UDP", "192.168.255.111", "z9hG4bK30239"),
    ]
    assert m.headers.get("Subject") == ""
    assert m.headers.get("NewFangledHeader") == "newfangled value continued newfangled value"
    assert m.headers.get("UnknownHeaderWithUnusualValue") == ";;,,;;,;"
    (contact,) = m.contacts
    assert contact.display_name == 'Quoted string ""'
    assert contact.param("newparam") == "newvalue"
    assert contact.has_param("secondparam") and contact.param("q") == "0.33"
    (route,) = m.routes
    assert route.uri.has_param("lr") and route.uri.param("unknownwith") == "value"
    assert len(m.body) == 150 and m.content_type == "application/sdp"


def test_intmeth_details() -> None:
    m = parse_message(VALID["intmeth"][1])
    assert isinstance(m, Request)
    assert m.method == "!interesting-Method0123456789_*+`.%indeed'~"
    assert m.uri.user == "1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*"
    assert m.uri.password == "&it+has=1,weird!*pas$wo~d_too.(doesn't-it)"
    assert m.to.display_name == "BEL:\x07 NUL:\x00 DEL:\x7f"
    assert m.from_.display_name == "token1~` token2'+_ token3*%!.-"
    assert m.from_.param("fromParam''~+*_!.-%") == '"работающий"'
    assert m.from_.tag == "_token~1'+`*%!-."
    assert m.top_via.branch == "z9hG4bK-.!%66*_+`'~"
    assert m.call_id == "intmeth.word%ZK-!.*_+'@word`~)(><:\\/\"][?}{"
    assert m.headers.get("extensionHeader-!.%*+_`'~") == "\ufeff大停電"


def test_escapes_are_kept_and_decoded_once() -> None:
    m = parse_message(VALID["esc01"][1])
    assert isinstance(m, Request)
    assert m.uri.user_unescaped == "sips:user@example.com"
    assert m.to.uri.user_unescaped == "user"
    assert m.from_.uri.user_unescaped == "I have spaces"
    (contact,) = m.contacts
    assert contact.uri.param("n%61me") == "v%61lue%25%34%31"
    assert m.call_id.startswith("esc01.")  # "i" is Call-ID
    assert m.content_type == "application/sdp"  # "C" is Content-Type
    null = parse_message(VALID["escnull"][1])
    assert null.to.uri.user_unescaped == "null-\x00-null"
    assert [c.uri.user for c in null.contacts] == ["%00", "%00%00"]


def test_percent_in_method_and_header_name_is_not_an_escape() -> None:
    m = parse_message(VALID["esc02"][1])
    assert isinstance(m, Request)
    assert m.method == "RE%47IST%45R"
    assert m.to.display_name == "%Z%45"
    assert [c.uri.user for c in m.contacts] == ["alias1", "alias3"]
    assert m.headers.get("C%6Fntact") == "<sip:alias2@host2.example.com>"


def test_long_values_and_34_vias() -> None:
    m = parse_message(VALID["longreq"][1])
    vias = m.vias
    assert len(vias) == 34 and vias[0].host == "sip33.example.com"
    assert vias[-1].branch == "very" + "long" * 50 + "branchvalue"
    assert m.to.uri.port == 6000
    assert m.from_.tag == "12" + "982" * 50 + "424"


def test_extra_datagram_octets_are_ignored() -> None:
    m = parse_message(VALID["dblreq"][1])
    assert isinstance(m, Request) and m.method == "REGISTER" and m.body == b""
    assert m.contacts[0].uri.user == "j.user"


def test_semicolon_in_user_part() -> None:
    m = parse_message(VALID["semiuri"][1])
    assert isinstance(m, Request)
    assert m.uri.user_unescaped == "user;par=u@example.net" and m.uri.host == "example.com"
    assert m.headers.values("Accept")[-1] == "message/sipfrag"


def test_unknown_transports_and_binary_multipart_body() -> None:
    m = parse_message(VALID["transports"][1])
    assert [v.transport for v in m.vias] == ["UDP", "SCTP", "TLS", "UNKNOWN", "TCP"]
    mp = parse_message(VALID["mpart01"][1])
    assert mp.body == MPART_BODY and MPART_BINARY in mp.body


def test_reason_phrases() -> None:
    unusual = parse_message(VALID["unreason"][1])
    assert isinstance(unusual, Response)
    assert unusual.status == 200
    assert unusual.reason == "= 2**3 * 5**2 но сто девяносто девять - простое"
    empty = parse_message(VALID["noreason"][1])
    assert isinstance(empty, Response) and (empty.status, empty.reason) == (100, "")


def test_unknown_schemes_stay_opaque() -> None:
    m = parse_message(SEMANTIC["unkscm"][1])
    assert isinstance(m, Request)
    assert (m.uri.scheme, m.uri.opaque) == ("nobodyknowsthisscheme", "totallyopaquecontent")
    assert str(m.uri) == "nobodyknowsthisscheme:totallyopaquecontent"
    m2 = parse_message(SEMANTIC["unksm2"][1])
    assert m2.to.uri.scheme == "isbn" and m2.contacts[0].uri.opaque == "John_Smith"


def test_clerr_over_a_stream_waits_for_more_octets() -> None:
    # RFC 4475 §3.1.2.2: over TCP nothing is wrong yet; the shell times the connection out.
    framer = SipStreamFramer()
    assert framer.feed(INVALID["clerr"][1]) == []
    assert framer.pending == len(INVALID["clerr"][1]) and not framer.broken


def test_ncl_over_a_stream_is_a_fatal_framing_error() -> None:
    # RFC 4475 §3.1.2.3: the framing error is not recoverable; answer, then close.
    framer = SipStreamFramer()
    (error,) = framer.feed(INVALID["ncl"][1] + VALID["lwsdisp"][1])
    assert isinstance(error, SipParseError)
    assert error.fatal and error.kind == "framing" and error.can_respond
    assert framer.broken and framer.feed(VALID["lwsdisp"][1]) == []
