"""FastAPI dependencies as ``Annotated`` aliases: services, sessions, the caller and its role.

HTTP errors are raised here and in the routes only.
"""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any, NoReturn

from fastapi import Depends, HTTPException, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from turnout.dashboard.auth import COOKIE_NAME, Principal, Refusal, bearer_token
from turnout.dashboard.heavy_reads import RETRY_AFTER_S, TooManyHeavyReads
from turnout.dashboard.policy import Snapshot
from turnout.dashboard.services import Services
from turnout.dashboard.store.errors import (
    Conflict,
    InvalidChange,
    NotAllowed,
    NotFound,
    StoreError,
    VersionConflict,
)
from turnout.dashboard.store.tokens import Role
from turnout.oracle.errors import ErrorCode


async def get_services(request: Request) -> Services:
    # async: a sync dependency would cost a thread-pool hop on every request.
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def read_session(services: ServicesDep) -> Iterator[Session]:
    with services.db.read_session() as session:
        yield session


def write_session(services: ServicesDep) -> Iterator[Session]:
    """A write transaction; the route commits (nothing is kept when it raises)."""
    with services.db.write_session() as session:
        yield session


ReadSessionDep = Annotated[Session, Depends(read_session)]
WriteSessionDep = Annotated[Session, Depends(write_session)]


def http_error(
    status: int, code: ErrorCode, message: str, headers: dict[str, str] | None = None
) -> HTTPException:
    return HTTPException(status, detail={"code": code, "message": message}, headers=headers)


def heavy_read_slot(services: Services, principal: Principal) -> str:
    """Take a heavy-read slot (``dashboard.heavy_reads``) for ``principal``'s token; returns
    the key to release it with.

    Raises:
        HTTPException: 429 ``too_many_requests`` with ``Retry-After`` when none is free.
    """
    who = f"token:{principal.token_id}"
    try:
        services.heavy_reads.acquire(who)
    except TooManyHeavyReads as err:
        raise http_error(
            429,
            ErrorCode.TOO_MANY_REQUESTS,
            str(err),
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    return who


_QUERY_NAMES: dict[int, frozenset[str]] = {}


def _query_names(dependant: Dependant) -> frozenset[str]:
    """The query parameters a route takes, its dependencies' included."""
    names = {f.alias for f in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return frozenset(names)


async def known_query(request: Request) -> None:
    """422 for a query parameter the route does not take (``?deployment=`` for
    ``?deployment_id=`` would otherwise be ignored, and a filtered list come back unfiltered).
    A router dependency of the API: the plain ``POST /decide`` route does not run it."""
    if not request.query_params:
        return
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    known = _QUERY_NAMES.get(id(route))
    if known is None:
        known = _QUERY_NAMES[id(route)] = _query_names(dependant)
    check_query(request, known)


def check_query(request: Request, known: set[str] | frozenset[str]) -> None:
    """422 (RequestValidationError) naming each query parameter not in ``known``."""
    unknown = sorted(set(request.query_params) - known)
    if not unknown:
        return
    takes = f"it takes {', '.join(sorted(known))}" if known else "it takes none"
    raise RequestValidationError(
        [
            {
                "type": "unknown_query_parameter",
                "loc": ("query", name),
                "msg": "not a parameter of this route"
                + "".join(
                    f" (did you mean {m}?)" for m in difflib.get_close_matches(name, known, 1)
                )
                + f"; {takes}",
                "input": request.query_params[name],
            }
            for name in unknown
        ]
    )


def raise_store_error(err: StoreError) -> NoReturn:
    """Map a store error to its HTTP status."""
    if isinstance(err, NotFound):
        raise http_error(404, err.code, str(err)) from err
    if isinstance(err, VersionConflict):
        raise http_error(409, err.code, str(err), {"ETag": f'"{err.current_version}"'}) from err
    if isinstance(err, InvalidChange):
        raise http_error(422, err.code, str(err)) from err
    if isinstance(err, Conflict):
        raise http_error(409, err.code, str(err)) from err
    if isinstance(err, NotAllowed):
        raise http_error(403, err.code, str(err)) from err
    raise http_error(400, err.code, str(err)) from err


# Request bodies above these sizes get 413 (a decide body is well under a kilobyte; an ingest
# batch of 5,000 events with their configs a few megabytes). Set per router, so the hot path
# (POST /decide, a plain route that reads its body with ``bounded_body``) pays no middleware.
MAX_BODY = 1024 * 1024
MAX_INGEST_BODY = 32 * 1024 * 1024


async def bounded_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The request body, 413 once it exceeds ``limit`` bytes (announced or streamed)."""
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length) > limit:
        raise http_error(413, ErrorCode.BODY_TOO_LARGE, f"the body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise http_error(413, ErrorCode.BODY_TOO_LARGE, f"the body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


# Ids in paths and queries fit the databases' 64-bit integers (larger ones are a 422, not a
# driver overflow).
MAX_ID = 2**63 - 1

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="turnout"'}


async def _principal(request: Request, services: Services) -> Principal:
    token = bearer_token(request.headers.get("authorization"))
    if token is None and request.method in ("GET", "HEAD"):
        # A signed-in page session is good for reads; API changes need the header (no CSRF
        # surface).
        session_id = request.cookies.get(COOKIE_NAME)
        if session_id:
            principal = await run_in_threadpool(services.verifier.session_principal, session_id)
            if principal is None:
                raise http_error(
                    401,
                    ErrorCode.BAD_TOKEN,
                    "the page session ended or expired: sign in again",
                    _CHALLENGE,
                )
            return principal
    if token is None:
        raise http_error(
            401, ErrorCode.UNAUTHENTICATED, "send Authorization: Bearer <token>", _CHALLENGE
        )
    hit, result = services.verifier.cached(token)
    if not hit:
        result = await run_in_threadpool(services.verifier.authenticate, token)
    if isinstance(result, Refusal):
        raise http_error(401, result.code, result.message, _CHALLENGE)
    return result


async def authorize(request: Request, role: Role) -> Principal:
    """The caller, if it has at least ``role`` (401 / 403 otherwise). The header is read
    directly, not as a FastAPI Header parameter: this runs on every request, and the security
    scheme is documented once in the OpenAPI document."""
    principal = await _principal(request, request.app.state.services)
    if not principal.role.allows(role):
        raise http_error(
            403,
            ErrorCode.FORBIDDEN,
            f"this needs the {role.value} role; the token has {principal.role}",
        )
    return principal


def require(role: Role) -> Callable[..., Awaitable[Principal]]:
    """A dependency that authenticates the caller and checks it has at least ``role``."""

    async def dependency(request: Request) -> Principal:
        return await authorize(request, role)

    return dependency


ViewerDep = Annotated[Principal, Depends(require(Role.viewer))]
EngineDep = Annotated[Principal, Depends(require(Role.engine))]
OperatorDep = Annotated[Principal, Depends(require(Role.operator))]
AdminDep = Annotated[Principal, Depends(require(Role.admin))]

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "no token, or an unknown, revoked or expired one"},
    403: {"description": "the token's role is too low"},
}


async def current_snapshot(services: Services) -> Snapshot:
    """The cached canary snapshot; a stale one is re-read off the event loop."""
    snap = services.policy.cached_snapshot()
    return snap if snap is not None else await run_in_threadpool(services.policy.snapshot)
