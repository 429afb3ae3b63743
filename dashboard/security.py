"""Security headers on every response (pages, API, static files, errors), as a plain ASGI
middleware (no per-request task or body copy: the ``POST /decide`` hot path pays a header
append).

The Content-Security-Policy is one the pages satisfy: scripts and styles only from the service
itself (``/static``; the pages' data blocks are ``<script type="application/json">``, which
are not run), images from the service or ``data:`` URLs (Swagger UI's icons), no plugins, no
framing by any site (``frame-ancestors 'none'`` and ``X-Frame-Options: DENY`` for browsers
without CSP 2), forms posting to the service only.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from turnout.oracle.errors import ErrorCode

log = logging.getLogger("turnout.service")

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
HEADERS: dict[str, str] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: a form's POST then carries its Origin (no-referrer makes
    # it "null"), which the sign-in form checks.
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
HSTS = ("Strict-Transport-Security", "max-age=31536000")


class SecurityHeadersMiddleware:
    """Adds :data:`HEADERS` to every response (HSTS too when ``https``); gives the plain text
    413 of Starlette's body limit the API's error shape; answers an unexpected exception with
    a 500 in that shape (logged with its traceback), headers included. A client that leaves
    before its body arrived gets nothing and is logged at INFO, not as a failure."""

    def __init__(self, app: ASGIApp, *, https: bool = False) -> None:
        self.app = app
        pairs = dict(HEADERS) | (dict([HSTS]) if https else {})
        self._headers = [(k.lower().encode(), v.encode()) for k, v in pairs.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        response = _Response(scope, send, self._headers)
        try:
            await self.app(scope, receive, response.send)
        except ClientDisconnect:
            # The client left before its body arrived (an engine stopped mid-report): nothing
            # failed here and nobody is left to answer. Its report is still in its spool.
            log.info("%s %s: the client left before its body arrived", scope.get("method"),
                     scope.get("path"))  # fmt: skip
        except Exception as exc:
            if response.started:
                raise
            log.error("%s %s failed", scope.get("method"), scope.get("path"), exc_info=exc)
            await response.send_json(
                500,
                {
                    "detail": {
                        "code": ErrorCode.INTERNAL_ERROR.value,
                        "message": "the service failed on this request; its log says why",
                    }
                },
            )


class _Response:
    """One response on its way out: headers added, a plain text 413 replaced."""

    def __init__(self, scope: Scope, send: Send, headers: list[tuple[bytes, bytes]]) -> None:
        self.scope = scope
        self._send = send
        self._headers = headers
        self.started = False
        self._replacement: bytes | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            headers = list(message.get("headers", []))
            if message["status"] == 413 and _is_plain_text(headers):
                self._replacement = _too_large(self.scope)
                headers = _json_headers(headers, len(self._replacement))
            present = {k.lower() for k, _v in headers}
            message = {
                **message,
                "headers": headers + [h for h in self._headers if h[0] not in present],
            }
        elif self._replacement is not None and message["type"] == "http.response.body":
            if message.get("more_body", False):
                return  # the plain text is dropped; ours goes with its last part
            message = {"type": "http.response.body", "body": self._replacement}
        await self._send(message)

    async def send_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        await self.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": _json_headers([], len(data)),
            }
        )
        await self.send({"type": "http.response.body", "body": data})


def _json_headers(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in headers if k.lower() not in (b"content-type", b"content-length")]
    return [
        *kept,
        (b"content-type", b"application/json"),
        (b"content-length", str(length).encode()),
    ]


def _is_plain_text(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/plain") for k, v in headers)


def _too_large(scope: Scope) -> bytes:
    limit = scope.get(MAX_BODY_SIZE_SCOPE_KEY)
    bound = f"{limit} bytes" if isinstance(limit, int) else "the bound of this route"
    return json.dumps(
        {"detail": {"code": ErrorCode.BODY_TOO_LARGE.value, "message": f"the body exceeds {bound}"}}
    ).encode()
