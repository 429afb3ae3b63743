"""The API's one error shape, for every error of every route, whatever the request held.

Every error answers ``{"detail": {"code": ..., "message": ...}}`` (a validation error also
``errors``, the validator's list) as JSON that can always be encoded: what an error echoes of
the request is bounded (strings cut at ``MAX_ECHO_CHARS``, lists and objects at a few items,
numbers of any size written as text) and made encodable (lone surrogates become U+FFFD,
NaN and Infinity their names). Starlette's own errors (404 for an unknown path, 405, a body
that cannot be parsed) get the shape too (an unexpected exception: dashboard.security).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY

from turnout.dashboard.echo import MAX_ECHO_CHARS, clip, echo
from turnout.oracle.errors import ErrorCode

__all__ = [
    "MAX_ECHO_CHARS",
    "clip",
    "echo",
    "error_body",
    "error_response",
    "http_error",
    "invalid_request",
    "invalid_request_message",
    "unstorable",
]

MAX_MESSAGE_CHARS = 2_000  # of an error message
MAX_LISTED_ERRORS = 5  # named in the message
MAX_ERRORS = 20  # kept in ``errors``

_PLACES = {
    "body": "body field",
    "query": "query parameter",
    "header": "header",
    "path": "path parameter",
    "cookie": "cookie",
}
# Statuses Starlette raises with a plain text detail, and the code each gets.
_CODES = {
    400: ErrorCode.INVALID_REQUEST,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.BODY_TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
}


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """``{"detail": {"code", "message", ...}}`` with the message bounded and encodable."""
    return {"detail": {"code": str(code), "message": clip(message, MAX_MESSAGE_CHARS), **extra}}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse(error_body(code, message, **extra), status_code=status, headers=headers)


def _where(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """``("body", "events", 3, "at")`` → ``body field events[3].at``."""
    if not loc:
        return "the request"
    place, rest = str(loc[0]), loc[1:]
    if not rest:
        return "the body" if place == "body" else place
    name = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in rest).lstrip(".")
    return f"{_PLACES.get(place, place)} {clip(name)}"


def invalid_request_message(errors: list[dict[str, Any]], total: int | None = None) -> str:
    """One readable sentence for the validator's errors (``total`` of them, default all):
    where, then what is wrong."""
    parts = []
    for err in errors[:MAX_LISTED_ERRORS]:
        where, msg = _where(err.get("loc", ())), str(err.get("msg", "invalid"))
        if err.get("type") == "json_invalid":  # its loc ends with a character offset
            ctx = err.get("ctx")
            where, msg = (
                "the body",
                "not valid JSON"
                + (f" ({ctx['error']})" if isinstance(ctx, dict) and ctx.get("error") else ""),
            )
        parts.append(f"{where}: {msg}")
    more = (len(errors) if total is None else total) - MAX_LISTED_ERRORS
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _bounded_error(err: dict[str, Any]) -> dict[str, Any]:
    """One validator error for the answer: its input echoed bounded, raw bytes left out
    (a body that is not JSON: megabytes, or not UTF-8), its context made encodable."""
    out: dict[str, Any] = {}
    for key, value in err.items():
        if key == "input" and isinstance(value, bytes | bytearray):
            continue
        if key == "loc":
            out[key] = [p if isinstance(p, int) else clip(str(p)) for p in value]
        elif key == "url":
            continue
        else:
            out[key] = echo(value) if key in ("input", "ctx") else clip(str(value))
    return out


async def invalid_request(_request: Request, exc: Exception) -> Response:
    """Every request that does not validate: 422 ``invalid_request`` with one readable message
    and the validator's errors (at most ``MAX_ERRORS``) for programs."""
    raw = exc.errors() if isinstance(exc, RequestValidationError) else []
    errors = [_bounded_error(dict(e)) for e in raw[:MAX_ERRORS]]
    message = invalid_request_message(errors, total=len(raw))
    return error_response(422, ErrorCode.INVALID_REQUEST, message, errors=errors)


async def http_error(request: Request, exc: Exception) -> Response:
    """An HTTPException of a route (its detail is already ``{code, message}``) or of Starlette
    (a plain text detail: the code comes from the status)."""
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code in (204, 304) or exc.status_code < 400:
        return Response(status_code=exc.status_code, headers=headers)
    detail = exc.detail
    if isinstance(detail, dict) and "code" in detail and "message" in detail:
        extra = {k: echo(v) for k, v in detail.items() if k not in ("code", "message")}
        return error_response(
            exc.status_code, str(detail["code"]), str(detail["message"]), headers, **extra
        )
    code = _CODES.get(exc.status_code, ErrorCode.INVALID_REQUEST)
    message = str(detail)
    if exc.status_code == 413:  # Starlette's body limit: "Content Too Large"
        limit = request.scope.get(MAX_BODY_SIZE_SCOPE_KEY)
        message = f"the body exceeds {limit} bytes" if isinstance(limit, int) else message
    return error_response(exc.status_code, code, message, headers)


async def unstorable(_request: Request, exc: Exception) -> Response:
    """A value the database refuses (PostgreSQL: a NUL character in a text field or a JSON
    string, a non-finite number in JSON) is bad input, 422, not a server error; the
    transaction is rolled back with its session, nothing of the request is kept."""
    orig = getattr(exc, "orig", None) or exc
    reason = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return error_response(
        422, ErrorCode.UNSTORABLE_VALUE, f"the database refuses a value: {clip(reason)}"
    )
