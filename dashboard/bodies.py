"""Request bodies: one strict JSON reader for every route, and the route class that uses it.

A JSON body is read by pydantic-core, which refuses what is not JSON (RFC 8259) or what the
service could neither store nor answer with: ``NaN`` and ``Infinity``, a lone surrogate escape
(``"\\ud800"``: no character, and no UTF-8), bytes that are not UTF-8, values nested deeper
than 200 levels, numbers of more than 4,300 digits. Each is a 422 ``invalid_request``,
``the body: not valid JSON (...)``. A body sent with a Content-Type other than JSON is a 415
``unsupported_media_type``; one sent without a Content-Type is read as JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import ValidationError

from turnout.dashboard.deps import http_error
from turnout.oracle.errors import ErrorCode

_AT = re.compile(r" at line (\d+) column (\d+)$")
_NOT_NUMBERS = ("NaN", "-NaN", "+NaN", "Infinity", "-Infinity", "+Infinity")


class JsonBodyError(ValueError):
    """A body that is not JSON; the message says why, and where."""


def read_json(raw: bytes) -> Any:
    """The JSON value of ``raw``. Raises JsonBodyError saying what is wrong (see the module
    doc for what is refused)."""
    try:
        return pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as err:
        raise JsonBodyError(_why(raw, str(err))) from None


def _why(raw: bytes, reason: str) -> str:
    """The parser's ``reason``, with what the body held at that place when it is one of the
    usual suspects (the parser says only "expected value" for NaN)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"not UTF-8: byte 0x{raw[err.start]:02x} at offset {err.start}"
    found = _AT.search(reason)
    if found is None:
        return reason
    line, column = int(found.group(1)), int(found.group(2))
    lines = text.splitlines() or [""]
    at = lines[line - 1] if line <= len(lines) else ""
    rest = at[max(column - 2, 0) :] if at[column - 2 : column - 1] in "-+" else at[column - 1 :]
    token = next((t for t in _NOT_NUMBERS if rest.startswith(t)), None)
    if token is not None:
        return f"{token} is not a JSON number{found.group(0)}"
    if "surrogate" in reason or "hex escape" in reason:
        return f"a lone surrogate escape (such as \\ud800) is not a character{found.group(0)}"
    if "recursion limit" in reason:
        return f"nested deeper than 200 levels{found.group(0)}"
    if "number out of range" in reason:
        return f"a number too large to read{found.group(0)}"
    return reason


def json_error(err: JsonBodyError) -> RequestValidationError:
    """The 422 of a body that is not JSON (the body itself is not echoed)."""
    return RequestValidationError(
        [
            {
                "type": "json_invalid",
                "loc": ("body",),
                "msg": f"Invalid JSON: {err}",
                "ctx": {"error": str(err)},
            }
        ]
    )


def body_validation_error(err: ValidationError) -> RequestValidationError:
    """FastAPI's 422 for a body validated from its JSON value; each error's ``loc`` starts
    with ``"body"``, as FastAPI's own."""
    return RequestValidationError(
        [
            {k: v for k, v in e.items() if not (k == "input" and isinstance(v, bytes | bytearray))}
            | {"loc": ("body", *e["loc"])}
            for e in err.errors(include_url=False)
        ]
    )


def is_json_media_type(content_type: str | None) -> bool:
    """True for no Content-Type (read as JSON) and for ``application/json`` or ``*+json``."""
    if not content_type:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def check_media_type(request: Request, body: bytes) -> None:
    """415 for a non-empty body whose Content-Type is not JSON."""
    content_type = request.headers.get("content-type")
    if body and not is_json_media_type(content_type):
        raise http_error(
            415,
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            f"send the body as JSON (Content-Type: application/json), not {content_type!r}",
        )


def parse_body(request: Request, raw: bytes) -> Any:
    """The JSON value of a route's raw body, or its 415 / 422."""
    check_media_type(request, raw)
    try:
        return read_json(raw)
    except JsonBodyError as err:
        raise json_error(err) from None


class JsonRequest(Request):
    """A request whose ``json()`` is :func:`read_json` (FastAPI turns the JSONDecodeError into
    its 422 ``json_invalid``)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = read_json(await self.body())
            except JsonBodyError as err:
                raise json.JSONDecodeError(str(err), "", 0) from None
        return self._json


class JsonRoute(APIRoute):
    """The API's route class: bodies are read with :class:`JsonRequest`, and a body of
    another media type is a 415 before FastAPI looks at it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def route_handler(request: Request) -> Response:
            request = JsonRequest(request.scope, request.receive)
            if takes_body and not is_json_media_type(request.headers.get("content-type")):
                check_media_type(request, await request.body())
            return await handler(request)

        return route_handler
