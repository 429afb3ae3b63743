"""Parity evidence per family: which suite passed or failed on which runner pair, and when."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from turnout.dashboard.store.models import ParityEvidence, utcnow


@dataclass(frozen=True)
class Counts:
    """A run's test counts (a JUnit report's), each None when not given."""

    num_tests: int | None = None
    num_failures: int | None = None
    num_errors: int | None = None
    num_skipped: int | None = None


def record_evidence(
    *,
    session: Session,
    family: str,
    runner_pair: str,
    suite: str,
    result: str,
    details: str,
    actor: str,
    counts: Counts = Counts(),
) -> ParityEvidence:
    row = ParityEvidence(
        family=family,
        runner_pair=runner_pair,
        suite=suite,
        result=result,
        details=details,
        recorded_at=utcnow(),
        recorded_by=actor,
        num_tests=counts.num_tests,
        num_failures=counts.num_failures,
        num_errors=counts.num_errors,
        num_skipped=counts.num_skipped,
    )
    session.add(row)
    session.flush()
    return row


def list_evidence(
    *, session: Session, family: str | None = None, limit: int = 100
) -> list[ParityEvidence]:
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
