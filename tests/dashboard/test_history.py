"""The decision history on SQLite and PostgreSQL: filtered counts, keyset pages that neither
skip nor repeat an event (ties in time included, new events arriving while paging), the rule
filter in SQL, the time window, and the export's batches; the time-window parser."""

from __future__ import annotations

import datetime as dt

import pytest

from turnout.dashboard.store import events, history
from turnout.dashboard.store.db import Database
from turnout.dashboard.store.events import EventRecord
from turnout.dashboard.store.history import Cursor, EventFilter
from turnout.dashboard.window import TimeWindow, page_window, read_window

T0 = dt.datetime(2026, 11, 20, 12, tzinfo=dt.UTC)


def _event(n: int, *, minutes: int, **over: object) -> EventRecord:
    fields: dict[str, object] = {
        "event_id": f"e{n:04d}",
        "at": T0 + dt.timedelta(minutes=minutes),
        "deployment_id": f"d{n % 7}",
        "pack": "turnout",
        "family": "qwen3" if n % 2 else "llama",
        "runner": "v1",
        "mode": "auto",
        "reason_code": "TARGETING_MATCH",
        "rule_ids": ("ngram_speculation",) if n % 3 == 0 else (),
        "stage": "qwen3-canary",
    }
    fields.update(over)
    return EventRecord(**fields)  # type: ignore[arg-type]


@pytest.fixture
def db(db_url: str) -> Database:
    database = Database(db_url)
    database.upgrade()
    # 60 events, several sharing one time (ties are broken by the event id)
    batch = [_event(n, minutes=n // 3) for n in range(60)]
    batch.append(_event(900, minutes=5, rule_ids=(), reason_code="DEFAULT", runner=None))
    with database.write_session() as s:
        events.ingest(session=s, events=batch)
        s.commit()
    yield database
    database.dispose()


def _walk(db: Database, where: EventFilter, size: int) -> list[str]:
    """Every id, page by page through the older links, then back through the newer ones."""
    seen: list[str] = []
    pages = []
    with db.read_session() as s:
        page = history.page_events(session=s, where=where, size=size)
        while True:
            pages.append(page)
            seen += [e.event_id for e in page.rows]
            assert page.first == (len(seen) - len(page.rows) + 1 if page.rows else 0)
            if page.older is None:
                break
            page = history.page_events(session=s, where=where, size=size, after=page.older)
        back = pages[-1]
        for expected in reversed(pages[:-1]):
            assert back.newer is not None
            back = history.page_events(session=s, where=where, size=size, before=back.newer)
            assert [e.event_id for e in back.rows] == [e.event_id for e in expected.rows]
            assert back.first == expected.first
        assert back.newer is None
    return seen


def test_pages_cover_every_event_once_in_order(db: Database) -> None:
    with db.read_session() as s:
        total = history.count_events(session=s, where=EventFilter())
        every: list[tuple[dt.datetime, str]] = []
        after = None
        while True:
            rows = history.events_after(session=s, where=EventFilter(), after=after, limit=7)
            every += [(e.at, e.event_id) for e in rows]
            if len(rows) < 7:
                break
            after = Cursor.of(rows[-1])
    assert total == 61 == len(every)
    assert every == sorted(every, key=lambda t: (-t[0].timestamp(), t[1]))
    assert _walk(db, EventFilter(), 8) == [i for _at, i in every]


def test_filters_count_and_page_alike(db: Database) -> None:
    cases = {
        EventFilter(family="qwen3"): 30,
        EventFilter(rule_id="ngram_speculation"): 20,
        EventFilter(rule_id="ngram_speculation", family="qwen3"): 10,
        EventFilter(rule_id="DEFAULT"): 1,  # a reason code, for decisions without a rule
        EventFilter(rule_id="ngram_speculation:qwen3-canary"): 20,
        EventFilter(rule_id="ngram_speculation:other-stage"): 0,
        EventFilter(runner="none"): 1,
        EventFilter(deployment_id="d3"): 9,
        EventFilter(start=T0 + dt.timedelta(minutes=5), end=T0 + dt.timedelta(minutes=10)): 16,
    }
    for where, want in cases.items():
        with db.read_session() as s:
            assert history.count_events(session=s, where=where) == want, where
            page = history.page_events(session=s, where=where, size=500)
        assert page.total == len(page.rows) == want, where
        assert len(_walk(db, where, 4)) == want


def test_a_page_does_not_shift_when_newer_events_arrive(db: Database) -> None:
    with db.read_session() as s:
        first = history.page_events(session=s, where=EventFilter(), size=10)
    with db.write_session() as s:
        events.ingest(session=s, events=[_event(n, minutes=500) for n in range(1000, 1005)])
        s.commit()
    with db.read_session() as s:
        second = history.page_events(session=s, where=EventFilter(), size=10, after=first.older)
    assert second.rows[0].event_id != first.rows[-1].event_id
    assert second.first == 16 and second.total == 66  # 5 newer events are ahead of it now
    assert len({e.event_id for e in first.rows} | {e.event_id for e in second.rows}) == 20


def test_page_arguments_are_checked(db: Database) -> None:
    c = Cursor(T0, "e0001")
    assert Cursor.decode(c.encode()) == c
    for bad in ("", "x", "2026-11-20T12:00:00~", "2026-11-20T12:00:00~e1"):  # no zone
        with pytest.raises(ValueError, match="not a page position"):
            Cursor.decode(bad)
    with db.read_session() as s:
        with pytest.raises(ValueError, match="page size 0"):
            history.page_events(session=s, where=EventFilter(), size=0)
        with pytest.raises(ValueError, match="not both"):
            history.page_events(session=s, where=EventFilter(), after=c, before=c)


def test_time_windows() -> None:
    now = dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC)
    assert read_window("24h", now=now) == TimeWindow("24h", now - dt.timedelta(hours=24))
    assert read_window(now=now) == TimeWindow("all")
    w = read_window("", "2026-11-01", "2026-11-02T06:30")
    assert (w.key, w.start, w.end) == (
        "custom",
        dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
        dt.datetime(2026, 11, 2, 6, 30, tzinfo=dt.UTC),
    )
    assert w.query() == {"window": "custom", "from": "2026-11-01", "to": "2026-11-02T06:30"}
    assert read_window("custom", "2026-11-01T12:00+02:00").start == dt.datetime(
        2026, 11, 1, 10, tzinfo=dt.UTC
    )
    assert read_window("7d").query() == {"window": "7d"} and read_window().query() == {}
    for args, message in [
        (("2d",), "window: '2d' is not a window; use 1h, 24h, 7d, all or custom"),
        (("24h", "2026-11-01"), "from/to go with window=custom"),
        (("custom", "yesterday"), "from: 'yesterday' is not a time"),
        (("custom", "2026-11-02", "2026-11-01"), "must be before to"),
    ]:
        with pytest.raises(ValueError, match=message):
            read_window(*args)
    bad = page_window("custom", "soon", "")
    assert bad.error.startswith("from: 'soon' is not a time") and bad.from_text == "soon"
