"""Webhook subscriptions and the outbox (admin)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query

from turnout.dashboard.api.schemas import ErrorResponse
from turnout.dashboard.api.schemas_rollout import (
    OutboxOut,
    OutboxStatusOut,
    ReasonIn,
    WebhookCreated,
    WebhookIn,
    WebhookOut,
)
from turnout.dashboard.bodies import JsonRoute
from turnout.dashboard.deps import (
    ERROR_RESPONSES,
    MAX_BODY,
    MAX_ID,
    AdminDep,
    ReadSessionDep,
    ServicesDep,
    WriteSessionDep,
    known_query,
    raise_store_error,
)
from turnout.dashboard.store import webhooks
from turnout.dashboard.store.errors import StoreError
from turnout.dashboard.store.models_rollout import OutboxEntry, Webhook

router = APIRouter(
    tags=["webhooks"],
    responses=ERROR_RESPONSES,
    max_body_size=MAX_BODY,
    route_class=JsonRoute,
    strict_content_type=False,
    dependencies=[Depends(known_query)],
)
IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
SECRET_SHOWN = 10  # characters of a secret a listing shows


def webhook_out(row: Webhook) -> WebhookOut:
    return WebhookOut(
        id=row.id,
        url=row.url,
        kinds=row.kinds,
        description=row.description,
        created_at=row.created_at,
        created_by=row.created_by,
        removed_at=row.removed_at,
        secret_prefix=row.secret[:SECRET_SHOWN],
    )


def outbox_out(row: OutboxEntry) -> OutboxOut:
    return OutboxOut.model_validate(row, from_attributes=True)


@router.get("/webhooks", response_model=list[WebhookOut])
def get_webhooks(
    session: ReadSessionDep, _who: AdminDep, removed: bool = False
) -> list[WebhookOut]:
    """Subscriptions (``removed``: the removed ones too); never a secret, only its start."""
    return [
        webhook_out(w) for w in webhooks.list_webhooks(session=session, include_removed=removed)
    ]


@router.post(
    "/webhooks",
    response_model=WebhookCreated,
    status_code=201,
    responses={422: {"model": ErrorResponse}},
)
def post_webhook(
    body: WebhookIn, session: WriteSessionDep, who: AdminDep, services: ServicesDep
) -> WebhookCreated:
    """Subscribe a URL to event kinds (admin). The answer is the only place the secret
    appears (made by the service when the body has none); each delivery is signed with it
    (docs/service.md, "Verifying a delivery")."""
    try:
        row, secret = webhooks.add_webhook(
            session=session,
            url=body.url,
            kinds=list(body.kinds),
            actor=who.actor,
            egress=services.settings.egress,
            secret=body.secret,
            description=body.description,
        )
        session.commit()
    except StoreError as err:
        raise_store_error(err)
    return WebhookCreated(**webhook_out(row).model_dump(), secret=secret)


@router.post(
    "/webhooks/{webhook_id}/remove",
    response_model=WebhookOut,
    responses={404: {"model": ErrorResponse}},
)
def remove_webhook(
    webhook_id: IdPath, body: ReasonIn, session: WriteSessionDep, who: AdminDep
) -> WebhookOut:
    """End a subscription (admin); its pending deliveries become dead."""
    try:
        row = webhooks.remove_webhook(
            session=session, webhook_id=webhook_id, actor=who.actor, reason=body.reason
        )
        session.commit()
    except StoreError as err:
        raise_store_error(err)
    return webhook_out(row)


@router.get("/webhooks/outbox", response_model=OutboxStatusOut)
def get_outbox(
    session: ReadSessionDep,
    _who: AdminDep,
    state: Literal["pending", "delivered", "dead"] | None = None,
    webhook_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> OutboxStatusOut:
    """Deliveries by state, and the latest ones (newest first), with each one's attempts
    and last error."""
    rows = webhooks.list_outbox(session=session, state=state, limit=limit, webhook_id=webhook_id)
    return OutboxStatusOut(
        counts=webhooks.outbox_counts(session=session), entries=[outbox_out(r) for r in rows]
    )


@router.post(
    "/webhooks/outbox/{entry_id}/retry",
    response_model=OutboxOut,
    responses={404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}},
)
def retry_delivery(entry_id: IdPath, session: WriteSessionDep, who: AdminDep) -> OutboxOut:
    """Send a dead delivery again (admin): due now, its attempts counted afresh."""
    try:
        row = webhooks.retry_dead(session=session, entry_id=entry_id, actor=who.actor)
        session.commit()
    except StoreError as err:
        raise_store_error(err)
    return outbox_out(row)
