"""The SIP carrier: sans-I/O signalling cores (RFC 3261) and, beside them, SDP/RTP media.

Signalling, from the wire up (each module documents its API):

- :mod:`.headers` - header values: URIs (sip, sips, tel), name-addr, Via, CSeq, auth params.
- :mod:`.message` - parse/serialise/frame messages, build responses, ``rport``.
- :mod:`.transaction` - the four RFC 3261 §17 transactions and a matching layer.
- :mod:`.dialog` - dialogs (§12), in-dialog requests, 2xx retransmission and ACK (§13).
- :mod:`.digest` - HTTP digest authentication for outbound calls (RFC 2617 / RFC 7616).
- :mod:`.numbers` - caller and callee numbers for ``session.start``.
- :mod:`.registration` - keeping a registration with a trunk (RFC 3261 §10).

None of them does I/O or reads a clock: the asyncio shell owns the sockets and passes ``now``.
What the shell does with them, per datagram or stream chunk:

1. UDP: ``parse_message(data)``; TCP and TLS: ``SipStreamFramer.feed`` then
   ``parse_message(chunk, datagram=False)``. On :class:`~.headers.SipParseError`: answer
   ``make_response(err.message, err.status, err.reason)`` when ``err.can_respond`` (and, on
   UDP, ``err.kind != "too_large"``), else drop and count; close a stream when
   ``err.fatal``.
2. ``apply_received(request, src_ip, src_port)`` on every request, then
   ``TransactionLayer.receive``; carry out the effects (``Send`` to ``peer``, ``Deliver`` to
   the call logic, ``Timeout``/``TransportError`` as 408/503 to the call logic).
3. Keep one timer at ``min(layer.next_deadline(), retransmitters' next_deadline())`` and call
   ``on_timer(now)`` when it passes.
4. Responses over UDP go to ``response_address(request.top_via)``; over TCP or TLS back on
   the request's connection.

Media cores: :mod:`.sdp` (offer/answer, RFC 3264), :mod:`.rtp`, :mod:`.jitter`,
:mod:`.dtmf4733`, :mod:`.g722`; :mod:`.refer` holds the REFER/NOTIFY core (RFC 3515).

The shell: :mod:`.transport` (UDP/TCP/TLS sockets, the one timer), :mod:`.tls` (its OpenSSL
contexts), :mod:`.contact` (our Via and Contact per transport), :mod:`.inbound` (the UAS call
flow, ``SipService``), :mod:`.uac` (the one UAC INVITE flow), :mod:`.outbound`
(``POST /v1/calls``), :mod:`.party` (a transfer's party leg and REFER for a call) and
:mod:`.leg` (``SipLeg``, the carrier leg on RTP); :mod:`.register_client` keeps the trunks'
registrations.
"""
