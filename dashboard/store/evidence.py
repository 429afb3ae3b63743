"""Parity evidence per family: which suite passed or failed on which runner pair, and when."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from dashboard.store.models import ParityEvidence, utcnow


def record_evidence(*, session: Session, family: str, runner_pair: str, suite: str,
                    result: str, details: str, actor: str) -> ParityEvidence:
    row = ParityEvidence(family=family, runner_pair=runner_pair, suite=suite, result=result,
                         details=details, recorded_at=utcnow(), recorded_by=actor)
    session.add(row)
    session.flush()
    return row


def list_evidence(*, session: Session, family: str | None = None,
                  limit: int = 100) -> list[ParityEvidence]:
    stmt = select(ParityEvidence).order_by(ParityEvidence.id.desc()).limit(limit)
    if family:
        stmt = stmt.where(ParityEvidence.family == family)
    return list(session.scalars(stmt))


def latest_per_family(*, session: Session) -> dict[str, ParityEvidence]:
    """Each family's most recent parity result."""
    out: dict[str, ParityEvidence] = {}
    for row in session.scalars(select(ParityEvidence).order_by(ParityEvidence.id.desc())):
        out.setdefault(row.family, row)
    return out
