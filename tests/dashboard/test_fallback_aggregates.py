"""The fallback aggregates (``latest_counts``) kept at ingest, on SQLite and PostgreSQL: equal
to the report recomputed from the raw events of a generated, seeded fleet (out-of-order
delivery, resent batches, equal times, repeated deployments), for every window and filter;
vLLM's start-up lines (``<id>.startup`` follow-ups) are kept with their decisions and count no
second one, and migration 0007 folds those an earlier service stored as decisions; the bulk
loader and migration 0004's backfill leave the same tables; concurrent ingests lose no
counts."""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator

import pytest
from alembic import command
from fleet_events import (
    PACKS,
    Expected,
    batches,
    expected,
    follow_ups,
    generate,
    latest,
    with_follow_ups,
)
from sqlalchemy import select, text

from turnout.dashboard.store import aggregates, bulk, events, latest_counts
from turnout.dashboard.store.aggregates import FallbackReport, FleetFilter
from turnout.dashboard.store.db import Database, alembic_config
from turnout.dashboard.store.models import DailyDecisions, DecisionEvent, Deployment

NOW = dt.datetime(2026, 12, 1, 13, 37, 12, tzinfo=dt.UTC)
FILTERS = [
    FleetFilter(),
    FleetFilter(family="llama"),
    FleetFilter(stage="llama-mistral"),
    FleetFilter(pack=PACKS[1]),
    FleetFilter(include_demo=False),
    FleetFilter(family="granitemoe", include_demo=False),
]


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    database.upgrade()
    yield database
    database.dispose()


def _ingest_batches(
    db: Database, batches_: list[list[events.EventRecord]], now: dt.datetime | None = NOW
) -> int:
    n = 0
    for batch in batches_:
        with db.write_session() as s:
            n += events.ingest(session=s, events=batch, now=now)
            s.commit()
    return n


def _observed(report: FallbackReport) -> Expected:
    over = {
        k: {int(b.timestamp()): n for b, n in zip(report.bins, counts, strict=True) if n}
        for k, counts in report.over_time.items()
    }
    return Expected(
        num_deployments=report.num_deployments,
        num_fallbacks=report.num_fallbacks,
        by_kind=+report.by_kind,
        ranked=report.ranked,
        by_family={f: +c for f, c in report.by_family.items()},
        families={
            f: (c.deployments, c.fallbacks, dict(+c.by_kind)) for f, c in report.families.items()
        },
        over_time={k: v for k, v in over.items() if v},
    )


def _check_reports(db: Database, raw: list[events.EventRecord], now: dt.datetime) -> None:
    with db.read_session() as s:
        for include_demo in (True, False):
            # The overview counts every deployment by stage and runner, from the day buckets.
            ov = aggregates.overview(session=s, include_demo=include_demo)
            kept = [e for e in latest(raw).values() if include_demo or not e.demo]
            by_stage: dict[str, Counter[str]] = defaultdict(Counter)
            for e in kept:
                by_stage[e.stage or "-"][e.runner or "none"] += 1
            assert ov.by_runner == Counter(e.runner or "none" for e in kept)
            assert ov.by_stage == {k: dict(v) for k, v in by_stage.items()}
        for window in aggregates.WINDOWS:
            for f in FILTERS:
                report = aggregates.fallbacks(session=s, window=window, fleet=f, now=now)
                assert _observed(report) == expected(raw, window, f, now), (window, f)
                # The time chart counts what the table counts.
                for key, n in report.ranked:
                    assert sum(report.over_time[key]) == n, (window, f, key)


def _tables(db: Database) -> dict[str, object]:
    with db.engine.connect() as conn:
        deployments = {
            r.deployment_id: tuple(r)
            for r in conn.execute(select(Deployment.__table__).order_by(Deployment.deployment_id))
        }
        return {
            "latest_counts": latest_counts.nonzero_rows(conn),
            "deployments": deployments,
            "daily_decisions": sorted(
                tuple(r) for r in conn.execute(select(DailyDecisions.__table__))
            ),
        }


def test_aggregates_equal_a_recount_of_the_raw_events(db: Database) -> None:
    raw = generate(7, num_events=2500, num_deployments=400, now=NOW)
    assert _ingest_batches(db, batches(raw, 8)) == len(raw)
    assert len(latest(raw)) > 350  # most deployments reported more than once
    _check_reports(db, raw, NOW)
    # Later: the windows move on, the stored counts still answer.
    _check_reports(db, raw, NOW + dt.timedelta(hours=5, minutes=3))


def _daily_recount(raw: list[events.EventRecord]) -> list[tuple[object, ...]]:
    """``daily_decisions`` recomputed from the decisions: events per day and key."""
    counts = Counter(
        (e.at.astimezone(dt.UTC).date(), e.family, e.runner or "", e.reason_code, e.demo)
        for e in raw
    )
    return sorted((*k, n) for k, n in counts.items())


def test_follow_ups_carry_vllms_line_and_count_no_second_decision(db: Database) -> None:
    raw = generate(13, num_events=1500, num_deployments=200, now=NOW)
    extra = follow_ups(raw, 14)
    assert len(extra) > 400
    assert _ingest_batches(db, with_follow_ups(batches(raw, 15), extra, 16)) == len(raw)
    with db.read_session() as s:
        assert events.count_events(session=s) == len(raw)
        lines = {
            e.event_id: e.startup["runner"]
            for e in s.scalars(select(DecisionEvent))
            if e.startup is not None
        }
    assert lines == {
        f.event_id.removesuffix(".startup"): f.launch.startup.runner  # type: ignore[union-attr]
        for f in extra
    }
    # Counted against a recount of the decisions alone: days, deployments, every window.
    assert _tables(db)["daily_decisions"] == _daily_recount(raw)
    _check_reports(db, raw, NOW)
    with db.write_session() as s, pytest.raises(bulk.FollowUpEvent):
        bulk.bulk_ingest(session=s, events=extra[:1], now=NOW)


def test_migration_0007_folds_the_follow_ups_an_earlier_service_stored(db: Database) -> None:
    now = dt.datetime.now(dt.UTC)
    # One config per deployment: the events table keeps none, so a deployment whose latest
    # decision was a folded row keeps the config that row reported.
    raw = [
        events.EventRecord(**{**e.__dict__, "config": {"id": e.deployment_id}})
        for e in generate(17, num_events=1200, num_deployments=150, now=now, days=1.5)
    ]
    _ingest_batches(db, batches(raw, 18), now=None)
    kept = _tables(db)
    # A service before 0007 dropped the launch part: each follow-up was a decision of its own.
    plain = [events.EventRecord(**{**f.__dict__, "launch": None}) for f in follow_ups(raw, 19)]
    _ingest_batches(db, batches(plain, 20), now=None)
    assert _tables(db) != kept
    with db.engine.begin() as conn:
        cfg = alembic_config(db.url)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0006")
    db.upgrade()
    assert _tables(db) == kept
    with db.read_session() as s:
        assert events.count_events(session=s) == len(raw)
    _check_reports(db, raw, now)


def test_a_window_counts_whole_5_minute_buckets_and_names_its_start(db: Database) -> None:
    e = generate(1, num_events=1, num_deployments=1, now=NOW)[0]
    at = dt.datetime(2026, 12, 1, 12, 33, 40, tzinfo=dt.UTC)  # in the bucket 12:30-12:35
    _ingest_batches(
        db,
        [
            [
                events.EventRecord(
                    **{
                        **e.__dict__,
                        "at": at,
                        "runner": "v1",
                        "rule_ids": ("dbo",),
                        "reason_code": "X",
                    }
                )
            ]
        ],
    )
    with db.read_session() as s:
        hour = aggregates.fallbacks(session=s, window="1h", now=NOW)  # 12:37:12 - 1 h
        later = aggregates.fallbacks(session=s, window="1h", now=NOW + dt.timedelta(minutes=3))
    assert hour.since == dt.datetime(2026, 12, 1, 12, 35, tzinfo=dt.UTC)
    assert hour.num_deployments == 0 and hour.ranked == []
    assert later.since == dt.datetime(2026, 12, 1, 12, 40, tzinfo=dt.UTC)
    with db.read_session() as s:
        day = aggregates.fallbacks(session=s, window="24h", now=NOW)
    assert day.ranked == [("dbo", 1)] and day.bin_s == 3600
    assert day.bins[0] == dt.datetime(2026, 11, 30, 13, tzinfo=dt.UTC)  # the start's hour
    assert day.over_time["dbo"][day.bins.index(at.replace(minute=0, second=0))] == 1


def test_the_bulk_loader_leaves_the_tables_batched_ingest_leaves(db_url: str, tmp_path) -> None:
    raw = generate(11, num_events=3000, num_deployments=300, now=NOW, days=20)
    one = Database(db_url)
    one.upgrade()
    _ingest_batches(one, batches(raw, 12, resend=0.0))
    if one.is_sqlite:
        two = Database(f"sqlite:///{tmp_path / 'bulk.db'}")
    else:  # a second schema beside the fixture's
        two = Database(db_url.replace("search_path%3D", "search_path%3Dbulk_"))
        with one.engine.begin() as conn:
            schema = conn.execute(text("SELECT current_schema()")).scalar_one()
            conn.execute(text(f'CREATE SCHEMA "bulk_{schema}"'))
    try:
        two.upgrade()
        with two.write_session() as s:
            assert bulk.bulk_ingest(session=s, events=iter(raw), now=NOW, chunk=700) == len(raw)
            s.commit()
        assert _tables(two) == _tables(one)
        _check_reports(two, raw, NOW)
        with two.write_session() as s, pytest.raises(bulk.DuplicateEvents):
            bulk.bulk_ingest(session=s, events=raw[:5], now=NOW)
    finally:
        one.dispose()
        if not two.is_sqlite:
            with two.engine.begin() as conn:
                conn.execute(text(f'DROP SCHEMA "bulk_{schema}" CASCADE'))
        two.dispose()


def test_migration_0004_backfills_what_ingest_keeps(db: Database) -> None:
    now = dt.datetime.now(dt.UTC)
    # Within the 5-minute buckets' retention (2 days): the backfill runs at a later clock
    # than the ingests, and a bucket at the edge of retention may be kept by one, not the other.
    raw = generate(3, num_events=1500, num_deployments=200, now=now, days=1.5)
    _ingest_batches(db, batches(raw, 4), now=None)
    kept = _tables(db)
    assert kept["latest_counts"]
    with db.engine.begin() as conn:
        cfg = alembic_config(db.url)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0004-1")  # the revision before 0004
    with db.engine.connect() as conn:
        assert not db.engine.dialect.has_table(conn, "latest_counts")
    db.upgrade()
    assert _tables(db) == kept
    _check_reports(db, raw, now)


def test_two_ingests_at_once_lose_no_counts(db: Database) -> None:
    raw = generate(5, num_events=2400, num_deployments=60, now=NOW)
    # Four threads, each with its own batches of the same events: every deployment and most
    # events are written by several transactions at once.
    parts = [batches(raw, seed, max_batch=25, resend=0.3) for seed in range(4)]
    errors: list[BaseException] = []

    def run(part: list[list[events.EventRecord]]) -> None:
        try:
            _ingest_batches(db, part)
        except BaseException as err:  # reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(p,)) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with db.read_session() as s:
        assert events.count_events(session=s) == len(raw)
    _check_reports(db, raw, NOW)
    with db.engine.begin() as conn:
        maintained = latest_counts.nonzero_rows(conn)
        latest_counts.rebuild(conn, NOW)
        assert latest_counts.nonzero_rows(conn) == maintained


def test_a_later_decision_moves_the_counts_and_an_older_one_does_not(db: Database) -> None:
    e = generate(2, num_events=1, num_deployments=1, now=NOW)[0]
    old = events.EventRecord(
        **{
            **e.__dict__,
            "event_id": "b",
            "at": NOW - dt.timedelta(days=2),
            "runner": "v1",
            "rule_ids": ("dbo",),
            "reason_code": "X",
        }
    )
    new = events.EventRecord(
        **{
            **old.__dict__,
            "event_id": "c",
            "at": NOW,
            "rule_ids": ("rollout.stage_off",),
            "reason_code": "DISABLED",
        }
    )
    tie = events.EventRecord(**{**new.__dict__, "event_id": "a", "runner": "v2", "rule_ids": ()})
    stage = e.stage
    _ingest_batches(db, [[old], [new], [tie], [old]])
    with db.read_session() as s:
        report = aggregates.fallbacks(session=s, now=NOW)
        week = aggregates.fallbacks(session=s, window="24h", now=NOW)
    key = f"rollout.stage_off:{stage}" if stage else "rollout.stage_off"
    # "a" ties "c" in time and loses on its id: the latest decision is "c".
    assert report.ranked == [(key, 1)] and dict(report.by_kind) == {"waiting": 1}
    assert week.ranked == [(key, 1)]


@pytest.mark.parametrize(
    "key, kind",
    [
        ("spec_ngram", "blocked"),
        ("ERROR", "blocked"),
        ("rollout.stage_off:qwen3", "waiting"),
        ("rollout.split_out:moe", "waiting"),
        ("rollout.no_stage", "waiting"),
        ("rollout.kill_switch", "held"),
        ("pin.v1", "held"),
        ("DISABLED", "waiting"),
    ],
)
def test_reason_kinds(key: str, kind: str) -> None:
    assert latest_counts.reason_kind(key) == kind


def test_fine_buckets_past_their_retention_are_pruned(db: Database) -> None:
    e = events.EventRecord(
        **{**generate(9, num_events=1, num_deployments=1, now=NOW)[0].__dict__, "at": NOW}
    )
    _ingest_batches(db, [[e]])
    with db.engine.connect() as conn:
        sizes = sorted({k[0] for k in latest_counts.nonzero_rows(conn)})
    assert sizes == [300, 3600, 21600, 86400]
    later = NOW + dt.timedelta(days=11)  # past the fine sizes' retention (2 and 9 days)
    f = events.EventRecord(
        **{**e.__dict__, "event_id": "later", "at": later, "deployment_id": "other"}
    )
    _ingest_batches(db, [[f]], now=later)
    with db.engine.connect() as conn:
        rows = latest_counts.nonzero_rows(conn)
    assert {k[0] for k in rows if k[1] < int(later.timestamp()) - 10 * 86400} == {86400}
    # The deployment moves on: its old buckets come to zero, and the next hour's prune
    # deletes them (reads would only skip them).
    g = events.EventRecord(**{**e.__dict__, "event_id": "moved", "at": later})
    _ingest_batches(db, [[g]], now=later)
    with db.engine.connect() as conn:
        zeros = conn.execute(
            text("SELECT count(*) FROM latest_counts WHERE num_deployments = 0")
        ).scalar_one()
    assert zeros > 0
    h = events.EventRecord(
        **{**e.__dict__, "event_id": "third", "deployment_id": "third", "at": later}
    )
    _ingest_batches(db, [[h]], now=later + dt.timedelta(hours=1))
    with db.engine.connect() as conn:
        zeros = conn.execute(
            text("SELECT count(*) FROM latest_counts WHERE num_deployments = 0")
        ).scalar_one()
    assert zeros == 0


def _set_day_retention(db: Database, days: int | None, now: dt.datetime) -> None:
    with db.write_session() as s:
        latest_counts.set_day_retention(s.connection(), days, now)
        s.commit()


def test_day_buckets_past_the_databases_retention_leave_the_counts(db: Database) -> None:
    raw = generate(23, num_events=1500, num_deployments=300, now=NOW, days=30)
    _ingest_batches(db, batches(raw, 24))
    _set_day_retention(db, 8, NOW)
    first = latest_counts.first_day_kept(NOW, 8 * 86400)
    assert first is not None and first % 86400 == 0

    def kept(events_: list[events.EventRecord]) -> list[events.EventRecord]:
        last = latest(events_)
        return [e for e in events_ if last[e.deployment_id].at.timestamp() >= first]

    def check(events_: list[events.EventRecord], now: dt.datetime) -> None:
        with db.read_session() as s:
            for f in FILTERS:
                report = aggregates.fallbacks(session=s, window="all", fleet=f, now=now)
                assert _observed(report) == expected(kept(events_), "all", f, now), f
                assert report.since == dt.datetime.fromtimestamp(first, dt.UTC)
                for window in ("1h", "24h", "7d"):  # within the retention: as before
                    part = aggregates.fallbacks(session=s, window=window, fleet=f, now=now)
                    assert _observed(part) == expected(events_, window, f, now), (window, f)
                    assert part.since is not None and report.since <= part.since  # all ⊇ 7d
        with db.engine.connect() as conn:
            rows = latest_counts.nonzero_rows(conn)
        assert min(rows.values()) > 0  # no count taken off a pruned bucket
        assert min(k[1] for k in rows if k[0] == 86400) >= first - 2 * 86400  # pruned (+ margin)

    check(raw, NOW)
    assert len(kept(raw)) < len(raw)  # some deployments left the counts
    # Deployments whose old decisions left the counts decide again: counted once, nothing
    # taken off the pruned buckets.
    moved = [
        events.EventRecord(**{**e.__dict__, "event_id": f"again-{e.event_id}", "at": NOW})
        for e in list(latest(raw).values())[:120]
    ]
    _ingest_batches(db, [moved])
    check(raw + moved, NOW)
    # Kept for good again: the table is recounted, every deployment counts.
    _set_day_retention(db, None, NOW)
    with db.read_session() as s:
        report = aggregates.fallbacks(session=s, window="all", now=NOW)
    assert _observed(report) == expected(raw + moved, "all", FleetFilter(), NOW)
    for bad in (0, 7, 36_501):  # "all" narrower than "7d"; dates out of range
        with pytest.raises(ValueError, match="give 8 to 36500"):
            _set_day_retention(db, bad, NOW)
