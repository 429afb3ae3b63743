"""CSV exports: ``GET /decisions.csv``, the Decisions page's rows with its filters and time
window, streamed (any number of rows, read in batches)."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from turnout.dashboard.deps import (
    ERROR_RESPONSES,
    ServicesDep,
    ViewerDep,
    heavy_read_slot,
    http_error,
    known_query,
)
from turnout.dashboard.filters import FiltersDep
from turnout.dashboard.services import Services
from turnout.dashboard.store import history
from turnout.dashboard.store.history import Cursor, EventFilter
from turnout.dashboard.window import WindowDep
from turnout.oracle.errors import ErrorCode

router = APIRouter(
    tags=["decisions"], responses=ERROR_RESPONSES, dependencies=[Depends(known_query)]
)

COLUMNS = (
    "at",
    "event_id",
    "deployment_id",
    "host",
    "pack",
    "family",
    "runner",
    "mode",
    "stage",
    "reason_code",
    "rule_ids",
    "policy_digest",
    "demo",
)
# A cell a spreadsheet would run as a formula (OWASP "CSV injection") gets a leading quote.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
BATCH = 1000


def cell(value: Any) -> str:
    """One CSV cell: times in ISO 8601 UTC, ``rule_ids`` space-separated, no runner empty,
    booleans ``true``/``false``; text a spreadsheet would evaluate is prefixed with ``'``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        value = " ".join(value)
    text = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def _write(rows: list[list[str]]) -> str:
    """RFC 4180 lines (quoted where needed, CRLF line ends)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerows(rows)
    return buf.getvalue()


def _batch(
    services: Services, where: EventFilter, after: Cursor | None
) -> tuple[str, Cursor | None]:
    """The CSV lines of the next batch, and where the one after it starts (None: done)."""
    with services.db.read_session() as session:
        rows = history.events_after(session=session, where=where, after=after, limit=BATCH)
        text = _write([[cell(getattr(e, c)) for c in COLUMNS] for e in rows])
    return text, Cursor.of(rows[-1]) if len(rows) == BATCH else None


async def csv_lines(services: Services, where: EventFilter) -> AsyncIterator[str]:
    """The header, then every matching event, newest first; each batch is read in its own
    short session on a worker thread (the event loop never waits on the database)."""
    yield _write([list(COLUMNS)])
    after: Cursor | None = None
    while True:
        text, after = await run_in_threadpool(_batch, services, where, after)
        if text:
            yield text
        if after is None:
            return


@router.get(
    "/decisions.csv",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/csv": {}}, "description": "header line, then one line per decision"}
    },
)
def get_decisions_csv(
    services: ServicesDep, principal: ViewerDep, filters: FiltersDep, window: WindowDep
) -> StreamingResponse:
    """The recorded decisions the Decisions page lists for the same filters (``family``,
    ``runner``, ``reason_code``, ``rule_id``, ``deployment_id``) and time window (``window``:
    1h, 24h, 7d, all, or custom with ``from``/``to``), newest first, as CSV (viewer). A heavy
    read: over ``TURNOUT_MAX_HEAVY_READS`` (or the token's share) it is a 429."""
    if window.error:
        raise http_error(422, ErrorCode.INVALID_REQUEST, window.error)
    who = heavy_read_slot(services, principal)
    return StreamingResponse(
        services.heavy_reads.stream(who, csv_lines(services, filters.where(window))),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": 'attachment; filename="decisions.csv"'},
    )
