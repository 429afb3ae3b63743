"""Tokens (admin), parity evidence, health."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from sqlalchemy import text

from turnout.dashboard.api.schemas import (
    ErrorResponse,
    EvidenceIn,
    EvidenceOut,
    RevokeIn,
    TokenCreated,
    TokenIn,
    TokenOut,
)
from turnout.dashboard.bodies import JsonRoute
from turnout.dashboard.deps import (
    ERROR_RESPONSES,
    MAX_BODY,
    MAX_ID,
    AdminDep,
    OperatorDep,
    ReadSessionDep,
    ServicesDep,
    ViewerDep,
    WriteSessionDep,
    http_error,
    known_query,
    raise_store_error,
)
from turnout.dashboard.invocation import turnout_here
from turnout.dashboard.store import evidence, tokens
from turnout.dashboard.store.errors import StoreError
from turnout.dashboard.store.models import ApiToken
from turnout.dashboard.store.tokens import Role
from turnout.oracle.errors import ErrorCode

router = APIRouter(
    responses=ERROR_RESPONSES,
    max_body_size=MAX_BODY,
    route_class=JsonRoute,
    strict_content_type=False,
    dependencies=[Depends(known_query)],
)


def _token_out(row: ApiToken) -> TokenOut:
    return TokenOut(
        id=row.id,
        name=row.name,
        role=row.role,
        prefix=row.prefix,
        created_at=row.created_at,
        created_by=row.created_by,
        revoked=row.revoked_at is not None,
        revoked_at=row.revoked_at,
        expires_at=row.expires_at,
    )


@router.get("/tokens", response_model=list[TokenOut], tags=["tokens"])
def get_tokens(session: ReadSessionDep, _who: AdminDep) -> list[TokenOut]:
    """Every token (never the token itself: only its prefix)."""
    return [_token_out(r) for r in tokens.list_tokens(session=session)]


@router.post("/tokens", response_model=TokenCreated, status_code=201, tags=["tokens"])
def post_token(body: TokenIn, session: WriteSessionDep, who: AdminDep) -> TokenCreated:
    """Create a token (admin); the answer is the only place the token appears. A name with
    nothing but whitespace (as Python reads it: ``\x1f`` too) is a 422 ``name_required``;
    ``expires_in`` (``30d``) that is not a duration a 422 ``invalid_change``."""
    try:
        lifetime = tokens.parse_duration(body.expires_in) if body.expires_in else None
        row, token = tokens.create_token(
            session=session,
            name=body.name,
            role=Role(body.role),
            actor=who.actor,
            expires_in=lifetime,
        )
    except StoreError as err:
        raise_store_error(err)
    session.commit()
    return TokenCreated(**_token_out(row).model_dump(), token=token)


@router.post(
    "/tokens/{token_id}/revoke",
    response_model=TokenOut,
    tags=["tokens"],
    responses={404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}},
)
def revoke_token(
    token_id: Annotated[int, Path(ge=1, le=MAX_ID)],
    body: RevokeIn,
    services: ServicesDep,
    session: WriteSessionDep,
    who: AdminDep,
) -> TokenOut:
    """Revoke a token (admin); every process stops accepting it within the token cache TTL.
    A token cannot revoke itself (409): that would lock its holder out by accident."""
    if token_id == who.token_id:
        raise http_error(
            409,
            ErrorCode.SELF_REVOKE,
            "this is the token making the call; revoke it with another admin token (one "
            f"made on the service's database: `{turnout_here()} token create --role admin`)",
        )
    try:
        row = tokens.revoke_token(
            session=session, token_id=token_id, actor=who.actor, reason=body.reason
        )
        session.commit()
    except StoreError as err:
        raise_store_error(err)
    services.verifier.forget_all()
    return _token_out(row)


@router.get("/evidence", response_model=list[EvidenceOut], tags=["evidence"])
def get_evidence(
    session: ReadSessionDep,
    _who: ViewerDep,
    family: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[EvidenceOut]:
    """Parity-suite results per family, newest first."""
    rows = evidence.list_evidence(session=session, family=family, limit=limit)
    return [EvidenceOut.model_validate(r, from_attributes=True) for r in rows]


@router.post(
    "/evidence",
    response_model=EvidenceOut,
    status_code=201,
    tags=["evidence"],
    responses={422: {"model": ErrorResponse}},
)
def post_evidence(
    body: EvidenceIn, services: ServicesDep, session: WriteSessionDep, who: OperatorDep
) -> EvidenceOut:
    """Record a parity-suite result for a family of the pack (operator); another name (a
    cohort id, a family in another case) is a 422 ``unknown_family`` that names the closest
    family, and nothing is stored."""
    if body.family not in services.policy.pack.families:
        raise http_error(
            422, ErrorCode.UNKNOWN_FAMILY, services.policy.unknown_family_message(body.family)
        )
    row = evidence.record_evidence(
        session=session,
        family=body.family,
        runner_pair=body.runner_pair,
        suite=body.suite,
        result=body.result,
        details=body.details,
        actor=who.actor,
        counts=evidence.Counts(
            body.num_tests, body.num_failures, body.num_errors, body.num_skipped
        ),
    )
    session.commit()
    return EvidenceOut.model_validate(row, from_attributes=True)


health_router = APIRouter(tags=["health"])


@health_router.get("/healthz")
def healthz(session: ReadSessionDep, services: ServicesDep) -> dict[str, str]:
    """Liveness and database reachability (no token needed)."""
    session.execute(text("SELECT 1"))
    return {
        "status": "ok",
        "pack": services.policy.pack_name,
        "database": services.db.engine.dialect.name,
    }
