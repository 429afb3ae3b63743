"""The store on SQLite and PostgreSQL: migrations, canary flips with versions, the append-only
audit log, idempotent ingest with its roll-ups, tokens."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from turnout.dashboard.store import aggregates, audit, canaries, events, tokens
from turnout.dashboard.store.canaries import CohortDefault
from turnout.dashboard.store.db import Database
from turnout.dashboard.store.errors import InvalidChange, NotFound, VersionConflict
from turnout.dashboard.store.events import EventRecord
from turnout.dashboard.store.models import Base
from turnout.oracle.errors import ErrorCode

DEFAULTS = [CohortDefault("qwen3", False), CohortDefault("llama-mistral", False, 50)]


def _prepared(url: str) -> Database:
    """A migrated store holding DEFAULTS."""
    database = Database(url)
    database.upgrade()
    with database.write_session() as s:
        canaries.ensure_defaults(session=s, defaults=DEFAULTS)
        s.commit()
    return database


@pytest.fixture
def db(db_url: str) -> Database:
    database = _prepared(db_url)
    yield database
    database.dispose()


def test_migrations_match_the_models_and_rerun_cleanly(db: Database) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from turnout.dashboard.store.db import alembic_config

    db.upgrade()  # a second upgrade is a no-op
    head = ScriptDirectory.from_config(alembic_config(db.url)).get_current_head()
    assert head is not None and db.current_revision() == head
    with db.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_sqlite_runs_in_wal_mode(tmp_path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'w.db'}")
    with database.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"


def test_defaults_are_inserted_once_and_keep_existing_state(db: Database) -> None:
    with db.write_session() as s:
        canaries.flip_canary(
            session=s, cohort="qwen3", enabled=True, reason="go", actor="t", if_version=1
        )
        s.commit()
    with db.write_session() as s:
        added = canaries.ensure_defaults(
            session=s, defaults=[*DEFAULTS, CohortDefault("pooling", True)]
        )
        s.commit()
    assert added == ["pooling"]
    with db.read_session() as s:
        state = canaries.read_state(session=s)
    assert state.cohorts == {
        "qwen3": (True, 100, 2),
        "llama-mistral": (False, 50, 1),
        "pooling": (True, 100, 1),
    }


def test_flip_checks_version_and_writes_one_audit_entry(db: Database) -> None:
    with db.write_session() as s:
        flip = canaries.flip_canary(
            session=s,
            cohort="qwen3",
            enabled=True,
            percentage=25,
            reason="parity suite green",
            actor="alice",
            if_version=1,
        )
        s.commit()
    assert flip.changed
    assert (flip.canary.enabled, flip.canary.percentage, flip.canary.version) == (True, 25, 2)
    with db.write_session() as s, pytest.raises(VersionConflict) as err:
        canaries.flip_canary(
            session=s, cohort="qwen3", enabled=False, reason="x", actor="bob", if_version=1
        )
    assert err.value.current_version == 2
    with db.read_session() as s:
        entries = audit.list_entries(session=s)
    assert len(entries) == 1
    e = entries[0]
    assert (e.actor, e.action, e.target, e.reason) == (
        "alice",
        "canary.flip",
        "cohort:qwen3",
        "parity suite green",
    )
    assert e.before == {"enabled": False, "percentage": 100, "version": 1}
    assert e.after == {"enabled": True, "percentage": 25, "version": 2}
    assert e.at.tzinfo is not None


@pytest.mark.parametrize(
    ("cohort", "enabled", "percentage"),
    [
        ("qwen3", False, None),  # off, asked off
        ("qwen3", False, 100),  # off at its stored 100%
        ("llama-mistral", False, 50),  # the stored share, stated
    ],
)
def test_a_flip_to_the_current_state_changes_nothing(
    db: Database, cohort: str, enabled: bool, percentage: int | None
) -> None:
    with db.write_session() as s:
        flip = canaries.flip_canary(
            session=s,
            cohort=cohort,
            enabled=enabled,
            percentage=percentage,
            reason="again",
            actor="alice",
            if_version=1,
        )
        s.commit()
    assert not flip.changed and flip.canary.version == 1
    with db.read_session() as s:
        assert audit.list_entries(session=s) == []
        before = canaries.read_state(session=s)
    assert before.cohorts[cohort][2] == 1
    # A stale version is still a conflict, whatever the state asked for.
    with db.write_session() as s, pytest.raises(VersionConflict):
        canaries.flip_canary(
            session=s, cohort=cohort, enabled=enabled, reason="again", actor="alice", if_version=7
        )


def test_a_flip_that_changes_only_the_share_is_a_change(db: Database) -> None:
    with db.write_session() as s:
        on = canaries.flip_canary(
            session=s,
            cohort="qwen3",
            enabled=True,
            percentage=50,
            reason="half",
            actor="a",
            if_version=1,
        )
        s.commit()
    with db.write_session() as s:
        same = canaries.flip_canary(
            session=s, cohort="qwen3", enabled=True, reason="again", actor="a", if_version=2
        )  # percentage None: keep 50%
        s.commit()
    with db.write_session() as s:
        more = canaries.flip_canary(
            session=s,
            cohort="qwen3",
            enabled=True,
            percentage=100,
            reason="all",
            actor="a",
            if_version=2,
        )
        s.commit()
    assert (on.changed, same.changed, more.changed) == (True, False, True)
    assert more.canary.version == 3
    with db.read_session() as s:
        assert [e.reason for e in audit.list_entries(session=s)] == ["all", "half"]


@pytest.fixture
def pg_db(pg_schema_url: str) -> Database:
    database = _prepared(pg_schema_url)
    yield database
    database.dispose()


def test_a_flip_is_checked_against_the_row_it_locks_not_an_earlier_read(pg_db: Database) -> None:
    """PostgreSQL reads committed rows: a flip whose transaction read the cohort before another
    writer committed must see that change, not the copy its session loaded (``turnout canary``
    reads the version, then flips). Before, both flips wrote version 2 and an audit entry."""
    with pg_db.write_session() as a:
        read = canaries.get_canary(session=a, cohort="qwen3")
        with pg_db.write_session() as b:
            canaries.flip_canary(
                session=b, cohort="qwen3", enabled=True, reason="b", actor="b", if_version=1
            )
            b.commit()
        with pytest.raises(VersionConflict) as err:
            canaries.flip_canary(
                session=a,
                cohort="qwen3",
                enabled=True,
                reason="a",
                actor="a",
                if_version=read.version,
            )
        assert err.value.current_version == 2
    with pg_db.write_session() as a:
        ks = canaries.get_kill_switch(session=a)
        with pg_db.write_session() as b:
            canaries.set_kill_switch(session=b, engaged=True, reason="b", actor="b")
            b.commit()
        with pytest.raises(VersionConflict):
            canaries.set_kill_switch(
                session=a, engaged=True, reason="a", actor="a", if_version=ks.version
            )
    with pg_db.read_session() as s:
        assert [e.actor for e in audit.list_entries(session=s)] == ["b", "b"]


def test_a_locking_read_holds_the_cohort_until_the_flip_commits(pg_db: Database) -> None:
    """``turnout canary`` reads the version it flips from with the row locked, so another
    writer waits instead of changing the cohort in between."""
    with pg_db.write_session() as a:
        assert canaries.get_canary(session=a, cohort="qwen3", for_update=True).version == 1
        with pg_db.write_session() as b, pytest.raises(DBAPIError, match="could not obtain lock"):
            b.execute(text("SELECT version FROM canaries WHERE cohort = 'qwen3' FOR UPDATE NOWAIT"))


@pytest.mark.parametrize("reason", ["", "   "])
def test_flip_without_reason_is_refused_and_changes_nothing(db: Database, reason: str) -> None:
    with db.write_session() as s, pytest.raises(InvalidChange) as err:
        canaries.flip_canary(
            session=s, cohort="qwen3", enabled=True, reason=reason, actor="t", if_version=1
        )
    assert err.value.code == ErrorCode.REASON_REQUIRED
    with db.read_session() as s:
        assert canaries.read_state(session=s).cohorts["qwen3"] == (False, 100, 1)


def test_unknown_cohort_and_bad_percentage(db: Database) -> None:
    with db.write_session() as s, pytest.raises(NotFound):
        canaries.flip_canary(
            session=s, cohort="nope", enabled=True, reason="r", actor="t", if_version=1
        )
    with db.write_session() as s, pytest.raises(InvalidChange):
        canaries.flip_canary(
            session=s,
            cohort="qwen3",
            enabled=True,
            reason="r",
            actor="t",
            if_version=1,
            percentage=101,
        )


def test_audit_log_refuses_update_and_delete_in_the_database(db: Database) -> None:
    with db.write_session() as s:
        canaries.set_kill_switch(session=s, engaged=True, reason="incident 42", actor="root")
        s.commit()
    for sql in ("UPDATE audit_log SET reason = 'rewritten'", "DELETE FROM audit_log"):
        with db.engine.connect() as conn, pytest.raises(DBAPIError, match="append-only"):
            conn.execute(text(sql))
    with db.read_session() as s:
        assert [e.reason for e in audit.list_entries(session=s)] == ["incident 42"]


@pytest.mark.parametrize(
    "reason, code",
    [
        ("\u200b\u200b", ErrorCode.REASON_REQUIRED),  # zero-width spaces only
        (" \u2060\t\ufeff ", ErrorCode.REASON_REQUIRED),  # word joiner, BOM, blanks
        ("x" * (audit.MAX_REASON_CHARS + 1), ErrorCode.REASON_TOO_LONG),
    ],
)
def test_a_reason_must_be_visible_and_bounded(db: Database, reason: str, code: str) -> None:
    # The CLI passes reasons straight to the store: the same bounds as the API's schema.
    for change in (
        lambda s: canaries.flip_canary(
            session=s, cohort="qwen3", enabled=False, reason=reason, actor="t", if_version=1
        ),
        lambda s: canaries.set_kill_switch(session=s, engaged=True, reason=reason, actor="t"),
    ):
        with db.write_session() as s, pytest.raises(InvalidChange) as err:
            change(s)
        assert err.value.code == code
    with db.write_session() as s:
        ok = canaries.set_kill_switch(
            session=s, engaged=True, actor="t", reason="é" * audit.MAX_REASON_CHARS
        )
        s.commit()
    assert ok.changed
    with db.read_session() as s:
        assert [len(e.reason) for e in audit.list_entries(session=s)] == [audit.MAX_REASON_CHARS]


def test_kill_switch_to_its_current_state_is_no_change(db: Database) -> None:
    with db.write_session() as s:
        same = canaries.set_kill_switch(session=s, engaged=False, reason="r", actor="t")
        s.commit()
    assert (same.changed, same.kill_switch.version) == (False, 1)
    with db.write_session() as s:
        first = canaries.set_kill_switch(session=s, engaged=True, reason="a", actor="t")
        s.commit()
        assert (first.changed, first.kill_switch.version) == (True, 2)
    with db.write_session() as s:
        again = canaries.set_kill_switch(session=s, engaged=True, reason="b", actor="u")
        s.commit()
        assert (again.changed, again.kill_switch.version, again.kill_switch.updated_by) == (
            False,
            2,
            "t",
        )
    with db.write_session() as s, pytest.raises(VersionConflict):
        canaries.set_kill_switch(session=s, engaged=True, reason="c", actor="t", if_version=1)
    with db.read_session() as s:
        assert [e.reason for e in audit.list_entries(session=s)] == ["a"]


def test_etag_changes_with_any_version(db: Database) -> None:
    with db.read_session() as s:
        before = canaries.read_state(session=s).etag
    with db.write_session() as s:
        canaries.set_kill_switch(session=s, engaged=True, reason="r", actor="t")
        s.commit()
    with db.read_session() as s:
        after = canaries.read_state(session=s)
    assert after.etag != before and after.kill_switch is True


def test_etag_differs_for_different_states_at_the_same_versions(tmp_path) -> None:
    # Two fresh stores whose rollout.yaml defaults differ (or one restored from a backup) sit
    # at the same versions: an engine's If-None-Match from one must not get 304 from the other.
    states = []
    for name, enabled in (("a", True), ("b", False)):
        store = Database(f"sqlite:///{tmp_path / name}.db")
        store.upgrade()
        with store.write_session() as s:
            canaries.ensure_defaults(session=s, defaults=[CohortDefault("qwen3", enabled)])
            s.commit()
        with store.read_session() as s:
            states.append(canaries.read_state(session=s))
        store.dispose()
    mine, theirs = states
    assert mine.cohorts["qwen3"][2] == theirs.cohorts["qwen3"][2] == 1
    assert mine.etag != theirs.etag


def _event(
    i: int,
    deployment: str,
    at: dt.datetime,
    runner: str | None = "v1",
    rules: tuple[str, ...] = ("spec_ngram",),
    demo: bool = False,
) -> EventRecord:
    return EventRecord(
        event_id=f"ev-{i}",
        at=at,
        deployment_id=deployment,
        pack="turnout",
        family="qwen3",
        runner=runner,
        mode="auto",
        reason_code="STATIC" if runner == "v1" else "DEFAULT",
        rule_ids=rules if runner == "v1" else (),
        stage="qwen3",
        config={"architecture": "Qwen3ForCausalLM"},
        demo=demo,
    )


def test_ingest_is_idempotent_and_keeps_the_latest_decision(db: Database) -> None:
    t0 = dt.datetime(2026, 11, 28, 12, tzinfo=dt.UTC)
    batch = [
        _event(1, "a", t0),
        _event(2, "a", t0 + dt.timedelta(hours=1), runner="v2"),
        _event(3, "b", t0),
        _event(4, "b", t0 + dt.timedelta(days=1), rules=("dbo",)),
    ]
    with db.write_session() as s:
        assert events.ingest(session=s, events=batch) == 4
        s.commit()
    # A resend (lost acknowledgement) and an old, out-of-order event for "a".
    with db.write_session() as s:
        late = _event(5, "a", t0 - dt.timedelta(days=1), rules=("cpu_offload",))
        assert events.ingest(session=s, events=[*batch, late]) == 1
        s.commit()
    with db.read_session() as s:
        assert events.count_events(session=s) == 5
        report = aggregates.fallbacks(session=s, now=t0 + dt.timedelta(days=1))
        ov = aggregates.overview(session=s, today=dt.date(2026, 11, 29))
    assert report.num_deployments == 2
    assert report.ranked == [("dbo", 1)]  # "a" is on V2 now; "b"'s latest carries dbo
    # The time chart counts the same deployments, by the day of their latest decision.
    assert report.bins == [dt.datetime(2026, 11, 29, tzinfo=dt.UTC)]
    assert report.over_time == {"dbo": [1]}
    assert ov.by_runner == {"v2": 1, "v1": 1}
    assert ov.by_day["2026-11-28"] == {"v1": 2, "v2": 1}


@pytest.mark.parametrize(
    "at",
    [
        dt.datetime(999, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC),
        dt.datetime(2026, 11, 30, 23, 59, 59, 999999, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    ],
)
def test_event_times_read_back_exactly(db: Database, at: dt.datetime) -> None:
    # Found by schemathesis: the SQLite path wrote year 999 as "999-..." (unpadded).
    with db.write_session() as s:
        events.ingest(session=s, events=[_event(1, "a", at)])
        s.commit()
    with db.read_session() as s:
        (row,) = events.list_events(session=s)
    assert row.at == at and row.at.tzinfo is not None


def test_an_event_repeated_inside_one_batch_counts_once(db: Database) -> None:
    t0 = dt.datetime(2026, 11, 28, tzinfo=dt.UTC)
    e = _event(1, "a", t0)
    with db.write_session() as s:
        assert events.ingest(session=s, events=[e, e, e]) == 1
        s.commit()
    with db.read_session() as s:
        report = aggregates.fallbacks(session=s, now=t0)
        ov = aggregates.overview(session=s, today=dt.date(2026, 11, 28))
    assert report.ranked == [("spec_ngram", 1)] and report.over_time == {"spec_ngram": [1]}
    assert ov.by_day == {"2026-11-28": {"v1": 1}}


def test_demo_rows_are_removed_with_their_rollups(db: Database) -> None:
    t0 = dt.datetime(2026, 11, 28, tzinfo=dt.UTC)
    with db.write_session() as s:
        events.ingest(session=s, events=[_event(1, "real", t0), _event(2, "demo/x", t0, demo=True)])
        s.commit()
    with db.write_session() as s:
        assert events.remove_demo(session=s) == 1
        s.commit()
    with db.read_session() as s:
        assert events.count_events(session=s) == 1
        report = aggregates.fallbacks(session=s, now=t0)
        ov = aggregates.overview(session=s, today=dt.date(2026, 11, 28))
    assert report.num_deployments == 1
    assert report.over_time == {"spec_ngram": [1]} and ov.by_runner == {"v1": 1}
    assert ov.by_day == {"2026-11-28": {"v1": 1}}


def test_tokens_are_stored_hashed_and_revocable(db: Database) -> None:
    with db.write_session() as s:
        row, token = tokens.create_token(session=s, name="ci", role=tokens.Role.operator, actor="t")
        s.commit()
    assert token.startswith("tok_") and len(token) > 40
    with db.engine.connect() as conn:
        stored = conn.execute(text("SELECT token_hash FROM api_tokens")).scalar_one()
    assert token not in stored and stored == tokens.hash_token(token)
    with db.read_session() as s:
        found = tokens.verify_token(session=s, token=token)
        assert found is not None and found.role == "operator"
        assert tokens.verify_token(session=s, token=token + "x") is None
    with db.write_session() as s:
        tokens.revoke_token(session=s, token_id=row.id, actor="t", reason="leaked")
        s.commit()
    with db.read_session() as s:
        assert tokens.verify_token(session=s, token=token) is None
