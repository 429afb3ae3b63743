"""Engine health in the store, on SQLite and PostgreSQL: migration 0005, ingest idempotent by
report id, and the aggregates per stage and runner (``health_by_runner``, the contract the
rollout's gates read) checked against a recount of the reports in Python."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from turnout.dashboard.store import health
from turnout.dashboard.store.db import Database
from turnout.oracle.wire import HealthReportIn

T0 = dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC)
STAGE = "llama-mistral-dense"


def report(**over: Any) -> HealthReportIn:
    """A one-minute report ending ``over["end"]`` (default T0 + 1 min)."""
    end = over.pop("end", T0 + dt.timedelta(minutes=1))
    fields: dict[str, Any] = {
        "report_id": uuid.uuid4().hex,
        "deployment_id": "d0",
        "host": "h",
        "pack": "turnout",
        "runner": "v2",
        "family": "llama",
        "stage": STAGE,
        "window_start": end - dt.timedelta(minutes=1),
        "window_end": end,
        "num_requests": 10,
        "num_errors": 0,
        "num_crashes": 0,
        "ttft_p50_ms": 10.0,
        "ttft_p99_ms": 20.0,
        "tpot_p50_ms": 5.0,
        "tpot_p99_ms": 8.0,
        "num_output_tokens": 1000,
        "output_tokens_per_s": 100.0,
    }
    return HealthReportIn(**(fields | over))


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    database.upgrade()
    yield database
    database.dispose()


def _ingest(db: Database, reports: list[HealthReportIn]) -> int:
    with db.write_session() as s:
        n = health.ingest_reports(session=s, reports=reports)
        s.commit()
    return n


def _by_runner(db: Database, **kw: Any) -> dict[str, health.RunnerHealth]:
    with db.read_session() as s:
        return health.health_by_runner(s, **({"stage": STAGE, "since": T0} | kw))


def test_ingest_is_idempotent_by_report_id(db: Database) -> None:
    first = report(num_requests=3)
    again = first.model_copy(update={"num_requests": 9})
    assert _ingest(db, [first, again, report()]) == 2  # the first copy wins
    assert _ingest(db, [first, again]) == 0
    got = _by_runner(db)["v2"]
    assert (got.num_reports, got.num_requests) == (2, 13)


def test_health_by_runner_sums_rates_and_weights(db: Database) -> None:
    _ingest(
        db,
        [
            report(
                deployment_id="a",
                runner="v1",
                num_requests=100,
                num_errors=2,
                ttft_p99_ms=30.0,
                tpot_p99_ms=10.0,
                num_output_tokens=6000,
                output_tokens_per_s=200.0,
            ),
            report(
                deployment_id="a",
                runner="v1",
                num_requests=300,
                num_errors=2,
                num_crashes=1,
                ttft_p99_ms=50.0,
                tpot_p99_ms=14.0,
                num_output_tokens=3000,
                output_tokens_per_s=100.0,
                end=T0 + dt.timedelta(minutes=2),
            ),
            report(
                deployment_id="b",
                runner="v1",
                num_requests=0,
                ttft_p50_ms=None,
                ttft_p99_ms=None,
                tpot_p50_ms=None,
                tpot_p99_ms=None,
                num_output_tokens=0,
                output_tokens_per_s=0.0,
            ),  # idle: counts as an engine, weighs nothing
        ],
    )
    v1 = _by_runner(db)["v1"]
    assert v1 == health.RunnerHealth(
        runner="v1",
        num_reports=3,
        num_engines=2,
        num_requests=400,
        num_errors=4,
        num_crashes=1,
        error_rate=4 / 400,
        crash_rate=1 / 2,
        ttft_p99_ms=(30 * 100 + 50 * 300) / 400,
        tpot_p99_ms=(10 * 100 + 14 * 300) / 400,
        tokens_per_s=9000 / (6000 / 200 + 3000 / 100),
    )
    assert "v2" not in _by_runner(db)  # no report: no entry


def test_the_window_stage_and_family_select_the_reports(db: Database) -> None:
    _ingest(
        db,
        [
            report(end=T0, num_requests=1),  # ends at since: in
            report(end=T0 + dt.timedelta(hours=1), num_requests=2),  # ends at until: out
            report(end=T0 - dt.timedelta(seconds=1), num_requests=4),  # before: out
            report(stage="qwen3-canary", num_requests=8),
            report(family="mistral", num_requests=16),
        ],
    )
    until = T0 + dt.timedelta(hours=1)
    assert _by_runner(db, until=until)["v2"].num_requests == 1 + 16
    assert _by_runner(db)["v2"].num_requests == 1 + 2 + 16
    assert _by_runner(db, until=until, family="mistral")["v2"].num_requests == 16
    assert _by_runner(db, stage="qwen3-canary")["v2"].num_requests == 8
    assert _by_runner(db, stage="pooling") == {}
    with db.read_session() as s:
        by_stage = health.health_by_stage(s, since=T0)
    assert {k: v.num_requests for k, v in by_stage.items()} == {
        (STAGE, "v2"): 19,
        ("qwen3-canary", "v2"): 8,
    }


def test_over_time_each_report_counts_in_the_bucket_its_window_ended_in(db: Database) -> None:
    _ingest(
        db,
        [
            report(end=T0 + dt.timedelta(minutes=m), runner=r, num_requests=n)
            for m, r, n in [
                (1, "v1", 1),
                (59, "v1", 2),
                (60, "v1", 4),
                (61, "v2", 8),
                (179, "v2", 16),
            ]
        ],
    )
    with db.read_session() as s:
        series = health.health_over_time(
            s,
            stage=STAGE,
            since=T0 + dt.timedelta(minutes=30),
            until=T0 + dt.timedelta(hours=3),
            bucket_s=3600,
        )
    assert series.bucket_times() == [T0 + dt.timedelta(hours=h) for h in range(3)]
    counts = {r: [b.num_requests if b else None for b in v] for r, v in series.by_runner.items()}
    assert counts == {"v1": [2, 4, None], "v2": [None, 8, 16]}  # 10:01 is before since
    with pytest.raises(ValueError, match="at most 2,000"), db.read_session() as s:
        health.health_over_time(
            s, stage=STAGE, since=T0, until=T0 + dt.timedelta(days=3), bucket_s=60
        )


def _recount(
    reports: list[HealthReportIn], since: dt.datetime, until: dt.datetime
) -> dict[str, health.RunnerHealth]:
    out = {}
    for runner in ("v1", "v2"):
        rs = [
            r
            for r in reports
            if r.runner == runner
            and r.stage == STAGE
            and since <= r.window_end.replace(microsecond=0) < until
        ]
        if not rs:
            continue
        req = sum(r.num_requests for r in rs)
        err = sum(r.num_errors for r in rs)
        crashes = sum(r.num_crashes for r in rs)
        engines = len({r.deployment_id for r in rs})
        timed = [r for r in rs if r.output_tokens_per_s > 0]
        busy = sum(r.num_output_tokens / r.output_tokens_per_s for r in timed)

        def weighted(name: str, rs: list[HealthReportIn] = rs) -> float | None:
            pairs = [(getattr(r, name), r.num_requests) for r in rs if getattr(r, name) is not None]
            w = sum(n for _, n in pairs)
            return sum(p * n for p, n in pairs) / w if w else None

        out[runner] = health.RunnerHealth(
            runner,
            len(rs),
            engines,
            req,
            err,
            crashes,
            err / max(req, 1),
            crashes / max(engines, 1),
            weighted("ttft_p99_ms"),
            weighted("tpot_p99_ms"),
            sum(r.num_output_tokens for r in timed) / busy if busy else 0.0,
        )
    return out


def test_the_aggregates_equal_a_recount_of_the_reports(db: Database) -> None:
    rng = random.Random(7)
    reports = []
    for i in range(300):
        n = rng.choice([0, 0, 1, 5, 50])
        timed = n > 0
        p99 = round(rng.uniform(5, 500), 3) if timed else None
        reports.append(
            report(
                deployment_id=f"d{rng.randrange(12)}",
                runner=rng.choice(["v1", "v2"]),
                stage=rng.choice([STAGE, STAGE, "qwen3-canary", None]),
                end=T0 + dt.timedelta(seconds=rng.randrange(-3600, 7200), microseconds=i),
                num_requests=n,
                num_errors=rng.randrange(n + 1),
                num_crashes=rng.choice([0, 0, 1]),
                ttft_p50_ms=p99 and p99 / 2,
                ttft_p99_ms=p99,
                tpot_p50_ms=p99 and p99 / 20,
                tpot_p99_ms=p99 and p99 / 10,
                num_output_tokens=n * rng.randrange(1, 200),
                output_tokens_per_s=round(rng.uniform(1, 900), 2) if timed else 0.0,
            )
        )
    for start in range(0, 300, 70):  # several batches
        _ingest(db, reports[start : start + 70])
    until = T0 + dt.timedelta(hours=1)
    got = _by_runner(db, until=until)
    want = _recount(reports, T0, until)
    assert got.keys() == want.keys() == {"v1", "v2"}
    for runner, w in want.items():
        g = got[runner]
        assert (g.num_reports, g.num_engines, g.num_requests, g.num_errors, g.num_crashes) == (
            w.num_reports,
            w.num_engines,
            w.num_requests,
            w.num_errors,
            w.num_crashes,
        )
        for name in ("error_rate", "crash_rate", "ttft_p99_ms", "tpot_p99_ms", "tokens_per_s"):
            assert getattr(g, name) == pytest.approx(getattr(w, name), rel=1e-9), name


def test_rows_no_engine_could_send_leave_the_aggregates_readable(db: Database) -> None:
    """Rows ingest refuses now but an older service stored: a denormal rate over 2**53 tokens
    (its busy time is beyond a float: PostgreSQL refused the read, and the gates of every ramp
    with it) and many windows of 2**53 tokens (their sum is beyond 64 bits: SQLite's sum()
    raised). They count for everything but tokens/s."""
    base = report().model_dump()
    odd = [
        HealthReportIn.model_construct(
            **(
                base
                | {
                    "report_id": f"odd{i}",
                    "deployment_id": f"d{i}",
                    "num_output_tokens": 2**53,
                    "output_tokens_per_s": 5e-324 if i == 0 else 1e9,
                }
            )
        )
        for i in range(1100)
    ]
    assert _ingest(db, [*odd, report(deployment_id="sane")]) == 1101
    got = _by_runner(db)["v2"]
    assert (got.num_reports, got.num_engines) == (1101, 1101)
    assert got.tokens_per_s == pytest.approx(100.0)  # the sane report's alone
    with db.read_session() as s:
        assert health.health_by_stage(s, since=T0)[(STAGE, "v2")].tokens_per_s == got.tokens_per_s


def test_migration_0005_goes_down_and_up_again(db: Database) -> None:
    from alembic import command
    from sqlalchemy import inspect

    from turnout.dashboard.store.db import alembic_config

    _ingest(db, [report()])
    cfg = alembic_config(db.url)
    command.downgrade(cfg, "0004")
    assert "engine_health" not in inspect(db.engine).get_table_names()
    command.upgrade(cfg, "head")
    assert _by_runner(db) == {}  # back, empty
    assert _ingest(db, [report()]) == 1
