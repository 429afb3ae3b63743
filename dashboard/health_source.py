"""Where the ramp gates read engine health from.

Engine health reports are stored by ``dashboard.store.health``; until this build has that
store, no engine health is known and every health gate waits (a ramp holds at its step).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from sqlalchemy.orm import Session

from dashboard.gates import RunnerHealthLike
from dashboard.store.advance import HealthReader


def _no_reports(session: Session, *, stage: str, since: dt.datetime,
                until: dt.datetime | None = None) -> Mapping[str, RunnerHealthLike]:
    return {}


def health_reader() -> HealthReader:
    """``dashboard.store.health.health_by_runner`` (none known yet: see the module doc)."""
    return _no_reports
