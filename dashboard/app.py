"""The FastAPI application: JSON API under /api/v1, pages, static files, /healthz, /metrics.

``create_app()`` builds one from settings; start-up applies migrations, adds canary rows for
the pack's cohorts and (on an empty database) records the demo fleet.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import DataError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from turnout.dashboard import errors, http_timeouts
from turnout.dashboard.api import (
    admin,
    alertmanager,
    decisions,
    engines,
    exports,
    health,
    ramps,
    rollout,
    upgrade,
    webhooks,
)
from turnout.dashboard.invocation import turnout_here
from turnout.dashboard.metrics import CONTENT_TYPE_LATEST, MetricsMiddleware
from turnout.dashboard.security import SecurityHeadersMiddleware
from turnout.dashboard.services import Services
from turnout.dashboard.settings import Settings, get_settings

log = logging.getLogger("turnout.service")
STATIC = Path(__file__).resolve().parent / "static"
API_PREFIX = "/api/v1"


def prepare(services: Services, *, as_service: bool = True) -> int:
    """Idempotent start-up work: migrations, the pack's canary defaults, the demo fleet and,
    for a starting service (not a command-line tool), its approval setting.
    Returns the number of demo decisions recorded now (0 unless the database was empty)."""
    from turnout.dashboard import demo
    from turnout.dashboard.store import approval_setting, canaries

    services.db.upgrade()
    with services.db.write_session() as session:
        services.db.lock_startup(session)
        added = canaries.ensure_defaults(
            session=session, defaults=services.policy.cohort_defaults()
        )
        if as_service:
            approval_setting.record(session=session, required=services.settings.require_approval)
        session.commit()
    if added:
        log.info("canary defaults from pack %s: %s", services.policy.pack_name, ", ".join(added))
    num = demo.seed_if_empty(services) if services.settings.demo else 0
    if num:
        log.info("recorded %d demo decisions (remove with `%s demo remove`)", num, turnout_here())
    return num


class _PlainRoute(Route):
    """A Starlette route that records itself in the scope (for the metrics' route label)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = self
        await super().handle(scope, receive, send)


def _finish_openapi(app: FastAPI) -> None:
    """Declare the bearer scheme once in the OpenAPI document (the role checks read the header
    directly, so no per-route security dependency documents it), and the bodies of the routes
    that validate their raw bytes themselves (``/decide``, ``/explain``, ``/decisions``,
    ``POST /health``, ``POST /alertmanager``)."""
    from turnout.dashboard.api.schemas import DeploymentIn, IngestIn, InvalidRequestResponse
    from turnout.dashboard.api.schemas_alerts import AlertmanagerPayload
    from turnout.oracle.wire import HealthIngestIn

    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            models = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (DeploymentIn, IngestIn, HealthIngestIn, AlertmanagerPayload):
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                models.update(body.pop("$defs", {}))
                models[model.__name__] = body
            # Every 422 FastAPI documents refers to this name: it gets the shape the
            # service answers (``_invalid_request``).
            invalid = InvalidRequestResponse.model_json_schema(
                ref_template="#/components/schemas/{model}"
            )
            models.update(invalid.pop("$defs", {}))
            models["HTTPValidationError"] = invalid
            schema["components"]["securitySchemes"] = {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": f"a token from `{turnout_here()} token create --role ...`",
                }
            }
            schema["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(
    settings: Settings | None = None,
    services: Services | None = None,
    *,
    freeze_heap: bool = False,
) -> FastAPI:
    """The application for ``services`` (built from ``settings``, or the environment).

    ``freeze_heap``: the process is the server's own (``turnout serve``), so that once started
    it may freeze its heap (:func:`freeze_startup_heap`, unless ``TURNOUT_FREEZE_HEAP=0``);
    never in a process that builds many apps (a test run: what they leave in cycles would
    never be collected)."""
    services = services or Services.build(settings or get_settings())
    http_timeouts.configure(services.settings.header_timeout_s, services.settings.body_timeout_s)
    sys.setswitchinterval(services.settings.switch_interval_ms / 1000)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        from turnout.dashboard import background

        await run_in_threadpool(prepare, services)
        workers = background.start(services) if services.settings.background else None
        if freeze_heap and services.settings.freeze_heap:
            log.info(
                "heap frozen: %d objects in the collector's permanent generation",
                freeze_startup_heap(),
            )
        yield
        if workers is not None:
            await workers.stop()
        services.db.dispose()

    app = FastAPI(
        title="turnout rollout control",
        version="1",
        summary="Canary store, decisions and fallback reasons for the V1 → V2 runner rollout.",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=None,  # served below with the vendored Swagger UI (no CDN)
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.services = services
    app.add_exception_handler(DataError, errors.unstorable)
    app.add_exception_handler(RequestValidationError, errors.invalid_request)
    app.add_exception_handler(StarletteHTTPException, errors.http_error)
    _finish_openapi(app)
    _add_api(app, services)
    _add_pages(app)
    app.add_middleware(MetricsMiddleware, metrics=services.metrics)
    app.add_middleware(SecurityHeadersMiddleware, https=services.settings.https)
    return app


def create_served_app() -> FastAPI:
    """:func:`create_app` from the environment for ``turnout serve`` (uvicorn's factory, one
    call per worker process), freezing the heap once started."""
    return create_app(freeze_heap=True)


def freeze_startup_heap() -> int:
    """Collect, then move every object alive into the collector's permanent generation
    (``gc.freeze``); returns how many. Python's full collections walk every tracked object:
    with the pack, the oracle's tables and the libraries that is ~160,000 objects and tens of
    milliseconds, taken by whichever request's allocation triggered it. Frozen, they are
    skipped; objects made later are collected as before. vLLM does the same after start-up
    (``freeze_gc_heap``, vllm/utils/gc_utils.py, since 0.11.1)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _add_api(app: FastAPI, services: Services) -> None:
    # The hot path: the same endpoint as a plain Starlette route ahead of every other route,
    # so a decide request skips FastAPI's per-request dependency solving (the APIRoute below
    # still documents it in the OpenAPI; it is never reached).
    app.router.routes.insert(
        0, _PlainRoute(f"{API_PREFIX}/decide", decisions.post_decide, methods=["POST"])
    )
    app.router.routes.insert(
        1, _PlainRoute(f"{API_PREFIX}/canaries", rollout.get_canaries_fast, methods=["GET"])
    )
    app.include_router(decisions.router, prefix=API_PREFIX)
    app.include_router(rollout.router, prefix=API_PREFIX)
    app.include_router(ramps.router, prefix=API_PREFIX)
    app.include_router(webhooks.router, prefix=API_PREFIX)
    app.include_router(admin.router, prefix=API_PREFIX)
    app.include_router(upgrade.router, prefix=API_PREFIX)
    app.include_router(exports.router, prefix=API_PREFIX)
    app.include_router(health.router, prefix=API_PREFIX)
    app.include_router(alertmanager.router, prefix=API_PREFIX)
    app.include_router(engines.router, prefix=API_PREFIX)
    app.include_router(admin.health_router)

    @app.get(f"{API_PREFIX}/docs", include_in_schema=False)
    def api_docs() -> Response:
        """The API browser, with Swagger UI served from dashboard/static/vendor (no CDN, and
        no inline script: swagger-init.js starts it)."""
        return HTMLResponse(_SWAGGER_PAGE)

    @app.get("/metrics", tags=["health"], include_in_schema=True)
    def metrics() -> Response:
        """Prometheus metrics (no token needed, counts only)."""
        return Response(services.metrics.render(), media_type=CONTENT_TYPE_LATEST)


_SWAGGER_PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>turnout API</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/vendor/swagger-ui-5.35.0.css">
<script src="/static/vendor/swagger-ui-bundle-5.35.0.js" defer></script>
<script src="/static/swagger-init.js" defer></script>
</head>
<body><div id="swagger-ui" data-openapi="{API_PREFIX}/openapi.json"></div></body>
</html>
"""


def _add_pages(app: FastAPI) -> None:
    from fastapi.responses import RedirectResponse

    from turnout.dashboard.pages import SignIn
    from turnout.dashboard.pages import router as pages_router
    from turnout.dashboard.pages_fleet import router as fleet_router
    from turnout.dashboard.pages_health import router as health_router
    from turnout.dashboard.pages_rollout import router as rollout_router
    from turnout.dashboard.signin import router as signin_router

    async def sign_in(_request: object, _exc: Exception) -> Response:
        return RedirectResponse("/login", status_code=303)

    app.add_exception_handler(SignIn, sign_in)
    app.include_router(signin_router)
    app.include_router(pages_router)
    app.include_router(fleet_router)
    app.include_router(rollout_router)
    app.include_router(health_router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
