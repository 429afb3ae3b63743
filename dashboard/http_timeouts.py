"""Read timeouts for the service's HTTP connections: a request's line and headers, and then its
body, must arrive within bounded times, or the connection is closed.

uvicorn (0.55) bounds an idle keep-alive connection (``timeout_keep_alive``) but not a request
that arrives slowly: a client sending one header byte every few seconds holds a connection, and
a file descriptor, for as long as it likes. 3,000 such connections stayed open for over 20 s.
:class:`TimedH11Protocol` is uvicorn's own h11 protocol with two timers on top, per request:

- **headers**: from the request's first byte (or from the connection's opening, for the first
  request) until h11 has the request line and every header: ``TURNOUT_HEADER_TIMEOUT_S``;
- **body**: from then until h11 has the whole body: ``TURNOUT_BODY_TIMEOUT_S``.

A pipelined request (sent behind another on the same connection before its answer) is parsed
when the answer before it completes, not when its bytes arrive: its clocks start then.

When one runs out the connection is closed (with a ``408 Request Timeout`` when nothing of an
answer was sent yet); the application sees ``http.disconnect`` as for any client that went away.
A reverse proxy (nginx's ``client_header_timeout``/``client_body_timeout``) does the same in
front of the service; this keeps a service reached directly safe too. The values are the
settings' (:func:`configure`, called by ``create_app`` in every worker process).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_TIMEOUT_ANSWER = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 16\r\n\r\nrequest timeout\n"
)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header and a body read timeout (module docstring)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0

    _read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self._read_timer is None and self.conn.their_state is h11.IDLE:
            self._arm(self.header_timeout_s)  # the first byte of a next request
        before = self.conn.their_state
        super().data_received(data)
        after = self.conn.their_state
        if after is h11.SEND_BODY and before is not h11.SEND_BODY:
            self._arm(self.body_timeout_s)  # headers in: the body's clock starts
        elif after is not h11.IDLE and after is not h11.SEND_BODY:
            self._disarm()  # the request is in (DONE), or the connection is closing

    def on_response_complete(self) -> None:
        super().on_response_complete()  # parses a pipelined request already received, if any
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm(self.body_timeout_s)  # a pipelined request's body: its clock starts now
        elif state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm(self.header_timeout_s)  # part of a pipelined request's headers

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE) and (
            self.cycle is None or not self.cycle.response_started
        ):
            self.transport.write(_TIMEOUT_ANSWER)
        if self.cycle is not None:
            self.cycle.disconnected = True
            self.cycle.message_event.set()  # a handler awaiting the body sees the disconnect
        self.transport.close()


def configure(header_timeout_s: float, body_timeout_s: float) -> None:
    """Set the read timeouts of every connection this process accepts from now on."""
    TimedH11Protocol.header_timeout_s = header_timeout_s
    TimedH11Protocol.body_timeout_s = body_timeout_s
