"""The engine client's HTTP calls: each request under one total deadline, and acknowledgements
checked against the batch they acknowledge.

httpx's timeouts bound each network operation (connect, one read, one write), not a request: a
server that sends a byte every 0.3 s never trips a 0.5 s read timeout and holds the request for
as long as it likes. :func:`request_within` therefore arms a timer for the whole request; when
it fires, the request's socket is shut down (found through httpcore's ``trace`` extension, which
reports each new connection), so the blocked read returns at once and the request fails with
:class:`DeadlineExceeded`. Connections are not kept alive between requests (the client makes
about one a second), so every request opens the socket the timer can reach.

An acknowledgement is the service's JSON answer for this very batch (``oracle.wire.IngestAck``:
``accepted`` equal to the number sent and ``batch_digest`` equal to
:func:`oracle.wire.batch_digest` of the ids sent): a ``200`` with an HTML page from a proxy, an
empty body or the answer to another batch is no acknowledgement, and the batch stays spooled.
Health reports are acknowledged the same way (``oracle.wire.HealthAck``), with the positions
of the reports the service refused alone.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import httpx
from pydantic import ValidationError

from turnout.oracle import bounded_json
from turnout.oracle.errors import ErrorCode
from turnout.oracle.wire import HealthAck, IngestAck, batch_digest

log = logging.getLogger("turnout.client")


class DeadlineExceeded(httpx.TimeoutException):
    """The request did not complete within its total deadline."""


class _Watch:
    """The sockets of one request, and whether its deadline passed (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.expired = False

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace callback: keep the socket of each connection the request opens."""
        if event not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sockets.append(sock)
                late = self.expired
            if late:  # connected after the deadline: cut it at once
                _shutdown(sock)

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    # socket.socket.shutdown, not SSLSocket.shutdown: the plain socket call is safe while
    # another thread is blocked reading (it only makes that read return).
    with contextlib.suppress(OSError):  # closed already
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


@contextlib.contextmanager
def _deadline(deadline_s: float) -> Iterator[_Watch]:
    """A watch whose sockets are cut ``deadline_s`` seconds from now; what fails inside, or
    ends after the deadline, raises DeadlineExceeded."""
    watch = _Watch()
    timer = threading.Timer(deadline_s, watch.expire)
    timer.daemon = True
    timer.start()
    try:
        yield watch
    except Exception as err:
        if watch.expired:
            raise DeadlineExceeded(f"no complete answer within {deadline_s:g} s") from err
        raise
    finally:
        timer.cancel()
    if watch.expired:  # answered, but only after the deadline (a transport with no socket)
        raise DeadlineExceeded(f"no complete answer within {deadline_s:g} s")


def request_within(
    http: httpx.Client, method: str, url: str, *, deadline_s: float, **kwargs: Any
) -> httpx.Response:
    """``http.request(method, url, **kwargs)`` (the body read whole) completed within
    ``deadline_s`` seconds in all.

    Raises:
        DeadlineExceeded: the deadline passed first (the connection is cut).
        httpx.HTTPError: any other failure of the request.
    """
    with _deadline(deadline_s) as watch:
        return http.request(method, url, extensions={"trace": watch.trace}, **kwargs)


def status_within(
    http: httpx.Client, method: str, url: str, *, deadline_s: float, **kwargs: Any
) -> int:
    """The HTTP status of ``http.request(method, url, **kwargs)``, its status line and
    headers received within ``deadline_s`` seconds in all; the body is not read (an answer
    whose body never ends holds nothing). ``extensions`` (httpx's, e.g. ``sni_hostname``) are
    passed on beside the deadline's trace.

    Raises:
        DeadlineExceeded: the deadline passed first (the connection is cut).
        httpx.HTTPError: any other failure of the request.
    """
    extensions = {**kwargs.pop("extensions", {})}
    with _deadline(deadline_s) as watch:
        extensions["trace"] = watch.trace
        with http.stream(method, url, extensions=extensions, **kwargs) as resp:
            return resp.status_code


def acknowledged(resp: httpx.Response, ids: Sequence[str]) -> bool:
    """Whether a ``200`` of ``POST /api/v1/decisions`` acknowledges exactly the events ``ids``
    (in the order sent); logs why not."""
    try:
        ack = IngestAck.model_validate_json(resp.content)
    except ValidationError:
        log.warning(
            "a 200 that is not the service's acknowledgement (%s, %d bytes: %r): "
            "%d events stay spooled",
            resp.headers.get("content-type", "no type"),
            len(resp.content),
            resp.content[:80],
            len(ids),
        )
        return False
    if ack.accepted != len(ids) or ack.batch_digest != batch_digest(ids):
        log.warning(
            "an acknowledgement of another batch (%d accepted, digest %s; sent %d, "
            "digest %s): the events stay spooled",
            ack.accepted,
            ack.batch_digest,
            len(ids),
            batch_digest(ids),
        )
        return False
    return True


def health_rejects(resp: httpx.Response, ids: Sequence[str]) -> frozenset[int] | None:
    """The positions the service refused of a health batch acknowledged by ``resp`` (a
    ``200`` of ``POST /api/v1/health``), or None when ``resp`` acknowledges no such batch."""
    try:
        ack = HealthAck.model_validate_json(resp.content)
    except ValidationError:
        log.warning(
            "a 200 that is not the service's acknowledgement (%s, %d bytes): %d "
            "health reports stay spooled",
            resp.headers.get("content-type", "no type"),
            len(resp.content),
            len(ids),
        )
        return None
    refused = frozenset(r.index for r in ack.rejected)
    if (
        ack.batch_digest != batch_digest(ids)
        or ack.accepted + len(refused) != len(ids)
        or any(not 0 <= i < len(ids) for i in refused)
    ):
        log.warning("an acknowledgement of another batch of health reports: they stay spooled")
        return None
    for r in ack.rejected:
        log.error(
            "the service refused health report %s: %s (%s)",
            ids[r.index],
            r.detail.message,
            r.detail.code,
        )
    return refused


_SERVICE_CODES = frozenset(code.value for code in ErrorCode if code.area == "service")


def is_service_refusal(resp: httpx.Response) -> bool:
    """True when ``resp`` is the turnout service's own error answer: a JSON body
    ``{"detail": {"code": ..., "message": ...}}`` whose code is one of the service's
    (``ErrorCode`` of area ``service``). A proxy's 413 or 422 page, an empty body or another
    program's JSON is not: what the client would set aside on the service's word, it keeps and
    resends on anyone else's."""
    try:
        detail = bounded_json.loads(resp.content)["detail"]  # a proxy's body may nest deep
    except (ValueError, KeyError, TypeError):
        return False
    return (
        isinstance(detail, dict)
        and detail.get("code") in _SERVICE_CODES
        and isinstance(detail.get("message"), str)
    )


#: Refusals that can pass later, unchanged: an event dated ahead of the service's clock is
#: taken once the clocks agree (the engine host's clock fixed, or time caught up).
LATER_REFUSALS = frozenset({"event_in_future"})


def _refusal_types(resp: httpx.Response) -> set[str]:
    """The ``type`` of each error the service listed (``detail.errors``); empty when none."""
    try:
        errors = bounded_json.loads(resp.content)["detail"]["errors"]
    except (ValueError, KeyError, TypeError):
        return set()
    if not isinstance(errors, list):
        return set()
    return {str(e.get("type")) for e in errors if isinstance(e, dict)}


def whole_batch_refused(
    what: str, resp: httpx.Response, num_items: int
) -> Literal["reject", "later", "split", "retry"]:
    """What the spool does with a batch answered 413 or 422 (``client_spool.SendResult``).

    The service's own refusal (``is_service_refusal``): ``"reject"``, split the batch down to
    single items and set aside the ones it refuses; ``"later"`` when every error it lists can
    pass later (:data:`LATER_REFUSALS`): split it the same, and keep such a single item to send
    again. Anything else, a proxy's page or a body of another shape: a 413 is ``"split"``
    (smaller batches may pass; a single item it still refuses stays spooled), a 422
    ``"retry"`` (nothing is set aside on a stranger's word)."""
    if is_service_refusal(resp):
        types = _refusal_types(resp)
        if types and types <= LATER_REFUSALS:
            log.warning(
                "the service refused %d %s for now (HTTP %d): %s",
                num_items,
                what,
                resp.status_code,
                resp.text[:500],
            )
            return "later"
        log.error(
            "the service rejected %d %s (HTTP %d): %s",
            num_items,
            what,
            resp.status_code,
            resp.text[:500],
        )
        return "reject"
    log.warning(
        "%d %s stay spooled: HTTP %d without the service's error body (a proxy in the way?): %s",
        num_items,
        what,
        resp.status_code,
        resp.text[:200],
    )
    return "split" if resp.status_code == 413 else "retry"


def refusal(resp: httpx.Response) -> str:
    """``HTTP 403: <the service's message>`` for an error answer of the service (its
    ``detail.message``, cut at 200 characters); ``HTTP 403`` alone for a body without one (a
    proxy's page)."""
    try:
        message = bounded_json.loads(resp.content)["detail"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {resp.status_code}"
    return f"HTTP {resp.status_code}: {str(message)[:200]}"


class RefusalLog:
    """Logs the service's refusals of the client's token (401, 403) with the service's reason,
    each distinct one once as a warning and its repeats at debug level: the client retries
    every second or so, and the reason stays the same until the token is changed."""

    MAX_SEEN = 32

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, what: str, resp: httpx.Response, num_spooled: int) -> None:
        text = refusal(resp)
        level = logging.DEBUG if text in self._seen else logging.WARNING
        if len(self._seen) < self.MAX_SEEN:
            self._seen.add(text)
        log.log(
            level,
            "%s deferred (%s): %d spooled, kept until the service takes the token",
            what,
            text,
            num_spooled,
        )
