"""Alertmanager's webhook receiver (``POST /alertmanager``) and the receipts of the alerts it
took (``GET /alertmanager/receipts``).

A notification is Alertmanager's webhook body, version 4
(https://prometheus.io/docs/alerting/latest/configuration/#webhook_config;
``dashboard/api/schemas_alerts.py``), sent with the bearer token of one receiver of
``TURNOUT_ALERTMANAGER_CONFIG`` (``dashboard/alertmanager.py``); its alerts act through
``dashboard/store/alerts.py``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from turnout.dashboard.alertmanager import (
    DEPLOYMENT_LABEL,
    FAMILY_LABEL,
    STAGE_LABEL,
    ReceiverConfig,
)
from turnout.dashboard.api.schemas import ErrorResponse
from turnout.dashboard.api.schemas_alerts import (
    AlertActionOut,
    AlertmanagerAlert,
    AlertmanagerPayload,
    AlertReceiptOut,
    AlertsAck,
)
from turnout.dashboard.auth import bearer_token
from turnout.dashboard.bodies import JsonRoute, body_validation_error, parse_body
from turnout.dashboard.deps import (
    ERROR_RESPONSES,
    ReadSessionDep,
    ServicesDep,
    ViewerDep,
    http_error,
    known_query,
)
from turnout.dashboard.services import Services
from turnout.dashboard.store import alerts
from turnout.oracle.errors import ErrorCode

router = APIRouter(
    tags=["alertmanager"],
    responses=ERROR_RESPONSES,
    route_class=JsonRoute,
    strict_content_type=False,
    dependencies=[Depends(known_query)],
)
# MAX_ALERTS alerts of a kilobyte and more (Alertmanager's are a few hundred bytes each).
MAX_ALERTMANAGER_BODY = 8 * 1024 * 1024
_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/AlertmanagerPayload"}}
        },
    }
}
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="turnout-alertmanager"'}


def _receiver(services: Services, request: Request, name: str | None) -> ReceiverConfig:
    """The receiver of the request's bearer token (and ``name``); 401 otherwise."""
    token = bearer_token(request.headers.get("authorization"))
    if token is None:
        raise http_error(
            401,
            ErrorCode.UNAUTHENTICATED,
            "send Authorization: Bearer <token> with a receiver's token "
            "(webhook_configs http_config.authorization.credentials)",
            _CHALLENGE,
        )
    receiver = services.alerts.authenticate(token, name)
    if receiver is None:
        configured = "" if services.alerts.receivers else " (this service has none configured)"
        raise http_error(
            401,
            ErrorCode.BAD_TOKEN,
            f"the token is no Alertmanager receiver's of TURNOUT_ALERTMANAGER_CONFIG{configured}"
            + (" of that name" if name is not None and configured == "" else ""),
            _CHALLENGE,
        )
    return receiver


def received(
    services: Services, receiver: ReceiverConfig, alert: AlertmanagerAlert, stages: set[str]
) -> alerts.ReceivedAlert:
    """An alert of the payload as the store takes it: the action of the receiver's first
    matching rule, and the stage its labels name (a family label is read as the stage the
    pack's rollout lists it in first)."""
    labels = alert.labels
    family = labels.get(FAMILY_LABEL)
    family_stage = services.policy.resolve_cohort(family) if family else None
    return alerts.ReceivedAlert(
        fingerprint=alert.fingerprint,
        status=alert.status,
        starts_at=alert.starts_at,
        ends_at=alert.ended_at,
        labels=dict(labels),
        generator_url=alert.generator_url,
        action=receiver.action_for(labels) if alert.status == "firing" else None,
        stage=labels.get(STAGE_LABEL) or None,
        deployment=labels.get(DEPLOYMENT_LABEL) or None,
        family_stage=family_stage if family_stage in stages else None,
    )


@router.post(
    "/alertmanager",
    response_model=AlertsAck,
    openapi_extra=_BODY,
    responses={422: {"model": ErrorResponse}},
    max_body_size=MAX_ALERTMANAGER_BODY,
)
async def post_alertmanager(
    request: Request,
    services: ServicesDep,
    receiver: Annotated[str | None, Query(max_length=64)] = None,
) -> AlertsAck:
    """Alertmanager's webhook (version 4), with the bearer token of a receiver of
    ``TURNOUT_ALERTMANAGER_CONFIG`` (``?receiver=`` also names it). Each firing alert acts
    once for its firing (receiver, fingerprint, startsAt), as the receiver's first rule
    matching its labels says: pause the stage's ramp, roll the stage back, or engage the kill
    switch; the stage is its ``turnout_stage`` label, else its ``turnout_deployment``'s
    recorded stage, else its ``turnout_family``'s stage. A storm acts once per stage. A
    resolved alert is recorded and resumes nothing. Every action is audited by
    ``alertmanager:<receiver>`` with the alert's name, generatorURL and labels. A token that
    is no receiver's is a 401; a body that is not such a notification (more than 5,000
    alerts, a label over 1,024 characters) a 422, and nothing is recorded."""
    found = _receiver(services, request, receiver)
    body = await request.body()
    # Parsing and validating 5,000 alerts takes about half a second: off the event loop, so
    # that a storm does not stall the other requests (health checks, engine heartbeats).
    payload, items = await run_in_threadpool(_read, services, found, request, body)
    report = await run_in_threadpool(_receive, services, found.name, items)
    if report.rollout_changed:
        services.policy.invalidate()
    for alert in payload.alerts:
        services.metrics.alerts_received.labels(found.name, alert.status).inc()
    for taken in report.actions:
        services.metrics.alert_actions.labels(taken.action.value).inc()
    return AlertsAck(
        receiver=found.name,
        num_alerts=len(items),
        outcomes=dict(sorted(report.outcomes.items())),
        actions=[
            AlertActionOut(
                action=t.action.value,
                cohort=t.cohort,
                audit_id=t.audit_id,
                fingerprint=t.fingerprint,
            )
            for t in report.actions
        ],
    )


def _read(
    services: Services, found: ReceiverConfig, request: Request, body: bytes
) -> tuple[AlertmanagerPayload, list[alerts.ReceivedAlert]]:
    """The notification and its alerts as the store takes them; 400/422 for a bad body."""
    value = parse_body(request, body)
    try:
        payload = AlertmanagerPayload.model_validate(value)
    except ValidationError as err:
        raise body_validation_error(err) from err
    stages = set(services.policy.cohort_families())
    return payload, [received(services, found, a, stages) for a in payload.alerts]


def _receive(services: Services, receiver: str, items: list[alerts.ReceivedAlert]) -> alerts.Report:
    with services.db.write_session() as session:
        report = alerts.receive(session=session, receiver=receiver, alerts=items)
        session.commit()
    return report


@router.get("/alertmanager/receipts", response_model=list[AlertReceiptOut])
def get_receipts(
    session: ReadSessionDep,
    _who: ViewerDep,
    receiver: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[AlertReceiptOut]:
    """The alerts received, newest first (one per receiver and firing), each with the action
    its rule named, the stage, what came of it (``acted``, ``no_change``, ``no_ramp``,
    ``no_stage``, ``unknown_stage``, ``no_rule``, ``resolved``) and its audit entry."""
    rows = alerts.list_receipts(session=session, receiver=receiver, limit=limit)
    return [AlertReceiptOut.model_validate(r) for r in rows]
