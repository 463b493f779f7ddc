"""The registration core (carriers/sip/registration.py) in virtual time: every input is fed
``now`` by hand (docs/sip.md, "Registering with a trunk")."""

from __future__ import annotations

import pytest

from appbridge.carriers.sip.auth_header import AuthHeader
from appbridge.carriers.sip.digest import digest_response
from appbridge.carriers.sip.headers import SipUri
from appbridge.carriers.sip.message import Request, Response, make_response, parse_message
from appbridge.carriers.sip.registration import (
    RegistrationCore,
    RegistrationParams,
    RegState,
    SendKeepalive,
    SendRequest,
    refresh_delay,
)

T0 = 1000.0
CONTACT = SipUri(scheme="sip", user="gw", host="192.0.2.10", port=5070)


def params(**overrides: object) -> RegistrationParams:
    base: dict[str, object] = {
        "username": "gw",
        "password": "s3cret",
        "host": "sip.example.net",
        "port": None,
        "contact": CONTACT,
        "via_transport": "UDP",
        "via_sent_by": "192.0.2.10:5070",
        "call_id": "reg-1@192.0.2.10",
        "from_tag": "fromtag",
        "expires_s": 3600,
    }
    base.update(overrides)
    return RegistrationParams(**base)  # type: ignore[arg-type]


def core(rand: float = 1.0, **overrides: object) -> RegistrationCore:
    return RegistrationCore(params(**overrides), random=lambda: rand)


def sent(effects: list[SendRequest | SendKeepalive]) -> Request:
    assert len(effects) == 1 and isinstance(effects[0], SendRequest), effects
    request = effects[0].request
    # What goes on the wire parses back as the same request.
    again = parse_message(request.serialize())
    assert isinstance(again, Request)
    return request


def answer(request: Request, status: int, *headers: tuple[str, str]) -> Response:
    return make_response(request, status, headers=list(headers))


def ok(request: Request, expires: int | None = None, *headers: tuple[str, str]) -> Response:
    contact = f"<{CONTACT}>" + (f";expires={expires}" if expires is not None else "")
    return answer(request, 200, ("Contact", contact), *headers)


def registered(c: RegistrationCore, now: float = T0, expires: int = 3600) -> Request:
    request = sent(c.start(now))
    assert c.on_response(ok(request, expires), now) == []
    assert c.state is RegState.REGISTERED
    return request


def test_first_register_has_the_rfc3261_section_10_2_fields() -> None:
    c = core()
    assert c.state is RegState.UNREGISTERED
    request = sent(c.start(T0))
    assert c.state is RegState.REGISTERING
    assert request.method == "REGISTER"
    assert str(request.uri) == "sip:sip.example.net"
    assert str(request.to.uri) == "sip:gw@sip.example.net"
    assert str(request.from_.uri) == "sip:gw@sip.example.net" and request.from_.tag == "fromtag"
    assert request.to.tag is None
    assert request.call_id == "reg-1@192.0.2.10"
    assert (request.cseq.seq, request.cseq.method) == (1, "REGISTER")
    assert [str(c.uri) for c in request.contacts] == ["sip:gw@192.0.2.10:5070"]
    assert request.headers.get("Expires") == "3600"
    assert request.top_via.transport == "UDP" and request.top_via.branch.startswith("z9hG4bK")


def test_tcp_registrar_uri_carries_the_transport_and_port() -> None:
    tcp_contact = SipUri(
        scheme="sip", user="gw", host="192.0.2.10", port=5070, params=(("transport", "tcp"),)
    )
    c = core(
        via_transport="TCP", port=5080, uri_params=(("transport", "tcp"),), contact=tcp_contact
    )
    request = sent(c.start(T0))
    assert str(request.uri) == "sip:sip.example.net:5080;transport=tcp"
    assert request.top_via.transport == "TCP"
    assert str(request.contacts[0].uri) == "sip:gw@192.0.2.10:5070;transport=tcp"


def test_granted_expiry_from_the_contact_param_wins_over_the_expires_header() -> None:
    c = core()
    request = sent(c.start(T0))
    c.on_response(ok(request, 600, ("Expires", "1200")), T0 + 0.1)
    assert c.expires_at == pytest.approx(T0 + 0.1 + 600)
    assert c.refresh_at == pytest.approx(T0 + 0.1 + 570)  # 30 s before it lapses


def test_granted_expiry_from_the_expires_header_then_what_we_asked() -> None:
    c = core()
    request = sent(c.start(T0))
    c.on_response(answer(request, 200, ("Expires", "120")), T0)
    assert c.expires_at == T0 + 120 and c.refresh_at == T0 + 90
    c2 = core()
    request = sent(c2.start(T0))
    c2.on_response(answer(request, 200), T0)
    assert c2.expires_at == T0 + 3600


def test_refresh_rule() -> None:
    assert refresh_delay(3600) == 3570
    assert refresh_delay(60) == 30
    assert refresh_delay(20) == 10  # short: half-way


def test_refresh_goes_at_its_time_with_a_higher_cseq_and_the_same_call_id() -> None:
    c = core(keepalive_s=None)
    first = registered(c, expires=60)
    assert c.next_deadline() == T0 + 30
    assert c.on_timer(T0 + 29.9) == []
    refresh = sent(c.on_timer(T0 + 30))
    assert refresh.call_id == first.call_id and refresh.cseq.seq == first.cseq.seq + 1
    assert refresh.from_.tag == first.from_.tag
    assert c.state is RegState.REGISTERED  # still bound while the refresh is out
    c.on_response(ok(refresh, 60), T0 + 30.2)
    assert c.expires_at == pytest.approx(T0 + 90.2)


@pytest.mark.parametrize(
    ("algorithm", "qop"), [("MD5", None), ("MD5", "auth"), ("SHA-256", "auth")]
)
def test_digest_challenge_is_answered_once_with_the_right_response(
    algorithm: str, qop: str | None
) -> None:
    c = core()
    first = sent(c.start(T0))
    challenge = f'Digest realm="example.net", nonce="n-1", algorithm={algorithm}'
    if qop:
        challenge += f', qop="{qop}"'
    retry = sent(c.on_response(answer(first, 401, ("WWW-Authenticate", challenge)), T0))
    assert retry.cseq.seq == first.cseq.seq + 1 and retry.call_id == first.call_id
    assert retry.top_via.branch != first.top_via.branch
    header = AuthHeader.parse(retry.headers.get("Authorization") or "")
    assert header.get("algorithm") == algorithm and header.get("uri") == "sip:sip.example.net"
    expected = digest_response(
        algorithm=algorithm,
        username="gw",
        realm="example.net",
        password="s3cret",
        method="REGISTER",
        uri="sip:sip.example.net",
        nonce="n-1",
        qop=qop,
        nc=header.get("nc") or "",
        cnonce=header.get("cnonce") or "",
    )
    assert header.get("response") == expected
    c.on_response(ok(retry, 3600), T0 + 0.2)
    assert c.state is RegState.REGISTERED and c.last_error is None


def test_sha256_preferred_when_both_are_offered_and_407_uses_proxy_authorization() -> None:
    c = core()
    first = sent(c.start(T0))
    response = answer(
        first,
        407,
        ("Proxy-Authenticate", 'Digest realm="r", nonce="a", algorithm=MD5'),
        ("Proxy-Authenticate", 'Digest realm="r", nonce="b", algorithm=SHA-256, qop="auth"'),
    )
    retry = sent(c.on_response(response, T0))
    header = AuthHeader.parse(retry.headers.get("Proxy-Authorization") or "")
    assert header.get("algorithm") == "SHA-256" and header.get("nonce") == "b"
    assert "Authorization" not in retry.headers


def test_second_challenge_with_the_same_nonce_is_a_failure() -> None:
    c = core()
    first = sent(c.start(T0))
    challenge = ("WWW-Authenticate", 'Digest realm="r", nonce="same"')
    retry = sent(c.on_response(answer(first, 401, challenge), T0))
    assert c.on_response(answer(retry, 401, challenge), T0 + 0.1) == []
    assert c.state is RegState.FAILED
    assert c.last_error == "401: the registrar refused our credentials"
    assert c.next_attempt_at() is not None


def test_a_stale_nonce_gets_one_more_try() -> None:
    c = core()
    first = sent(c.start(T0))
    retry = sent(
        c.on_response(answer(first, 401, ("WWW-Authenticate", 'Digest realm="r", nonce="1"')), T0)
    )
    stale = ("WWW-Authenticate", 'Digest realm="r", nonce="1", stale=true')
    again = sent(c.on_response(answer(retry, 401, stale), T0))
    assert again.cseq.seq == retry.cseq.seq + 1


def test_423_retries_at_once_with_min_expires() -> None:
    c = core(expires_s=60)
    first = sent(c.start(T0))
    retry = sent(c.on_response(answer(first, 423, ("Min-Expires", "300")), T0))
    assert retry.headers.get("Expires") == "300" and retry.cseq.seq == 2
    c.on_response(answer(retry, 200), T0)
    assert c.expires_at == T0 + 300


def test_423_without_a_larger_min_expires_fails() -> None:
    c = core(expires_s=600)
    first = sent(c.start(T0))
    assert c.on_response(answer(first, 423, ("Min-Expires", "300")), T0) == []
    assert c.state is RegState.FAILED


def test_backoff_doubles_to_its_cap_and_success_resets_it() -> None:
    c = core(rand=1.0, keepalive_s=None)  # random() == 1: no jitter taken off
    now = T0
    request = sent(c.start(now))
    waits = []
    for _ in range(9):
        c.on_response(answer(request, 500), now)
        assert c.state is RegState.FAILED and c.last_error == "500 Server Internal Error"
        assert c.retry_at is not None
        waits.append(c.retry_at - now)
        assert c.on_timer(c.retry_at - 0.01) == []
        now = c.retry_at
        request = sent(c.on_timer(now))
        assert c.state is RegState.REGISTERING
    assert waits == [5, 10, 20, 40, 80, 160, 300, 300, 300]
    c.on_response(ok(request, 3600), now)
    request = sent(c.on_timer(c.refresh_at or 0))
    now = c.expires_at or 0
    c.on_response(answer(request, 503), now)
    assert c.retry_at == now + 5


def test_jitter_comes_from_the_injected_random_source() -> None:
    c = core(rand=0.0)
    request = sent(c.start(T0))
    c.on_response(answer(request, 480), T0)
    assert c.retry_at == pytest.approx(T0 + 4.0)  # 5 s * 0.8


def test_retry_after_is_honoured() -> None:
    c = core()
    request = sent(c.start(T0))
    c.on_response(answer(request, 503, ("Retry-After", "120 (maintenance);duration=60")), T0)
    assert c.retry_at == T0 + 120
    assert c.next_attempt_at() == T0 + 120


def test_retry_after_is_bounded_and_garbage_falls_back_to_the_backoff() -> None:
    c = core()
    request = sent(c.start(T0))
    c.on_response(answer(request, 503, ("Retry-After", "99999999")), T0)
    assert c.retry_at == T0 + 3600
    request = sent(c.on_timer(T0 + 3600))
    c.on_response(answer(request, 503, ("Retry-After", "soon")), T0 + 3600)
    assert c.retry_at == T0 + 3600 + 10  # the second failure in a row


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ((), "401: no usable Digest challenge"),
        ((("WWW-Authenticate", "Basic realm=x"),), "401: no usable Digest challenge"),
        ((("WWW-Authenticate", 'Digest realm="r"'),), "401: no usable Digest challenge"),
        (
            (("WWW-Authenticate", 'Digest realm="r", nonce="n", algorithm=SHA-512'),),
            "401: no usable Digest challenge",
        ),
    ],
)
def test_a_challenge_we_cannot_answer_is_a_failure(
    headers: tuple[tuple[str, str], ...], error: str
) -> None:
    c = core()
    request = sent(c.start(T0))
    assert c.on_response(answer(request, 401, *headers), T0) == []
    assert c.state is RegState.FAILED and c.last_error == error


def test_a_malformed_contact_in_the_200_falls_back_to_expires() -> None:
    c = core()
    request = sent(c.start(T0))
    c.on_response(answer(request, 200, ("Contact", "<<<"), ("Expires", "90")), T0)
    assert c.state is RegState.REGISTERED and c.expires_at == T0 + 90


def test_timeout_and_transport_error_fail_with_their_text() -> None:
    c = core()
    request = sent(c.start(T0))
    c.on_failure(request, T0 + 32, "no response from the registrar")
    assert c.state is RegState.FAILED and c.last_error == "no response from the registrar"
    assert c.retry_at == T0 + 32 + 5
    retry = sent(c.on_timer(T0 + 37))
    c.on_failure(retry, T0 + 37, "transport: connection refused")
    assert c.last_error == "transport: connection refused" and c.retry_at == T0 + 37 + 10


def test_late_and_foreign_responses_are_ignored() -> None:
    c = core()
    first = sent(c.start(T0))
    retry = sent(
        c.on_response(answer(first, 401, ("WWW-Authenticate", 'Digest realm="r", nonce="1"')), T0)
    )
    assert c.on_response(answer(first, 500), T0) == []  # to the old CSeq
    assert c.on_response(answer(retry, 100), T0) == []
    assert c.state is RegState.REGISTERING
    assert c.on_failure(first, T0, "late") == [] and c.state is RegState.REGISTERING


def test_unregister_on_stop_sends_expires_zero_and_is_done_on_its_200() -> None:
    c = core()
    registered(c)
    bye = sent(c.stop(T0 + 10))
    assert bye.headers.get("Expires") == "0"
    assert str(bye.contacts[0].uri) == str(CONTACT) and bye.cseq.seq == 2
    assert c.next_deadline() is None and not c.done
    challenge = ("WWW-Authenticate", 'Digest realm="r", nonce="x"')
    again = sent(c.on_response(answer(bye, 401, challenge), T0 + 10))
    assert again.headers.get("Expires") == "0" and again.headers.get("Authorization")
    c.on_response(answer(again, 200), T0 + 10.1)
    assert c.done and c.state is RegState.UNREGISTERED
    assert c.stop(T0 + 11) == []


def test_stop_without_a_binding_is_done_at_once_and_a_failed_unregister_ends_too() -> None:
    c = core()
    request = sent(c.start(T0))
    c.on_response(answer(request, 403), T0)
    assert c.stop(T0) == [] and c.done
    c2 = core()
    registered(c2)
    bye = sent(c2.stop(T0))
    c2.on_failure(bye, T0 + 2, "no response")
    assert c2.done and c2.on_timer(T0 + 1000) == []


def test_udp_keepalive_is_an_options_every_interval_and_its_timeout_re_registers() -> None:
    c = core(keepalive_s=30.0, expires_s=3600)
    reg = registered(c)
    assert c.next_deadline() == T0 + 30
    ka = sent(c.on_timer(T0 + 30))
    assert ka.method == "OPTIONS" and ka.call_id == reg.call_id and ka.cseq.seq == 2
    c.on_response(answer(ka, 404), T0 + 30.1)  # any final answer keeps it alive
    assert c.state is RegState.REGISTERED and c.next_deadline() == T0 + 60
    ka2 = sent(c.on_timer(T0 + 60))
    again = sent(c.on_failure(ka2, T0 + 92, "no response from the registrar"))
    assert again.method == "REGISTER" and c.state is RegState.REGISTERED
    assert c.last_error == "keepalive: no response from the registrar"


def test_tcp_keepalive_is_a_double_crlf_and_a_lost_flow_re_registers() -> None:
    c = core(via_transport="TCP", keepalive_s=30.0)
    registered(c)
    assert c.on_timer(T0 + 30) == [SendKeepalive()]
    assert c.next_deadline() == T0 + 60
    request = sent(c.keepalive_failed(T0 + 31, "connection lost"))
    assert request.method == "REGISTER" and request.headers.get("Expires") == "3600"
    assert c.keepalive_failed(T0 + 31, "again") == []  # one REGISTER at a time


def test_no_keepalive_when_not_registered_or_turned_off() -> None:
    c = core(keepalive_s=None)
    registered(c)
    assert c.next_deadline() == c.refresh_at
    c2 = core()
    request = sent(c2.start(T0))
    c2.on_response(answer(request, 500), T0)
    assert c2.keepalive_at is None and c2.keepalive_failed(T0, "x") == []


def test_a_200_without_our_binding_is_a_failure() -> None:
    c = core()
    request = sent(c.start(T0))
    c.on_response(ok(request, 0), T0)
    assert c.state is RegState.FAILED
    assert c.last_error == "the registrar kept no binding for our Contact"
