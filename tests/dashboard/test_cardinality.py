"""``turnout db cardinality``: what the fallback counts hold, and ``--compact`` folding the reasons
no shipped pack names (stored before ingest checked rule ids) into ``unknown_rule`` with the
totals kept, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

from cli_helpers import cli_app
from typer.testing import CliRunner

from turnout.dashboard.services import Services
from turnout.dashboard.settings import Settings
from turnout.dashboard.store import aggregates, latest_counts
from turnout.dashboard.store.events import EventRecord, ingest


def _event(i: int, rules: tuple[str, ...], at: dt.datetime) -> EventRecord:
    return EventRecord(
        event_id=f"ev-{i}",
        at=at,
        deployment_id=f"dep-{i % 40}",
        pack="turnout",
        family="qwen3",
        runner="v1",
        mode="auto",
        reason_code="TARGETING_MATCH",
        rule_ids=rules,
        stage="qwen3-canary",
        config={"architecture": "Qwen3ForCausalLM"},
    )


def _run(url: str, *args: str) -> dict:
    result = CliRunner(env={"TURNOUT_URL": None, "TURNOUT_DATABASE_URL": url}).invoke(
        cli_app(), ["db", "cardinality", "--json", *args]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _ranked(services: Services) -> dict[str, int]:
    with services.db.read_session() as session:
        return dict(aggregates.fallbacks(session=session, window="all").ranked)


def test_compact_folds_made_up_reasons_and_keeps_the_totals(db_url: str) -> None:
    services = Services.build(Settings(database_url=db_url, demo=False))
    services.db.upgrade()
    now = dt.datetime.now(dt.UTC)
    # The store as an attacked service left it: 40 deployments, each last reported with
    # made-up rule ids beside a real one; earlier decisions of theirs moved to zero rows.
    earlier = [_event(i, ("ngram_speculation",), now - dt.timedelta(hours=3)) for i in range(40)]
    latest = [
        _event(40 + i, ("ngram_speculation", f"made.up.{i}", f"made.up.{i}b"), now)
        for i in range(40)
    ]
    for batch in (earlier, latest):  # the store prunes zero rows once an hour: one left
        with services.db.write_session() as session:
            ingest(session=session, events=batch, now=now)
            session.commit()
    before = _ranked(services)
    assert before["ngram_speculation"] == 40 and len(before) == 81

    seen = _run(db_url)["before"]
    assert seen["num_foreign_reasons"] == 80
    assert seen["foreign_sample"] and all(r.startswith("made.up.") for r in seen["foreign_sample"])
    assert seen["num_zero_rows"] > 0 and seen["num_rows"]["86400"] > 0
    assert _ranked(services) == before  # reading changes nothing

    done = _run(db_url, "--compact")
    assert done["folded"] == 80
    after = done["after"]
    assert after["num_foreign_reasons"] == 0 and after["num_zero_rows"] == 0
    assert after["num_reasons"] == 3  # "", ngram_speculation, unknown_rule
    # each deployment that named made-up ids counted once under unknown_rule
    assert _ranked(services) == {"ngram_speculation": 40, "unknown_rule": 40}
    assert _run(db_url, "--compact")["folded"] == 0  # nothing left to fold
    # The deployments move on (V2 now): the counts they leave go to zero, none below (before:
    # the made-up keys came back at -1, their deployments' old state still naming them).
    moved = [
        dataclasses.replace(_event(80 + i, (), now + dt.timedelta(minutes=1)), runner="v2")
        for i in range(40)
    ]
    with services.db.write_session() as session:
        ingest(session=session, events=moved, now=now)
        rows = latest_counts.nonzero_rows(session.connection())
        session.commit()
    assert all(n > 0 for n in rows.values()), {k: n for k, n in rows.items() if n <= 0}
    assert _ranked(services) == {}  # every deployment on V2 now: no fallback left
    services.db.dispose()


def test_only_the_per_stage_keys_carry_a_suffix() -> None:
    known = frozenset({"pin.v1", "STATIC", "rollout.stage_off"})
    assert not latest_counts._foreign("rollout.stage_off:qwen3-canary", known)
    for reason in ("pin.v1:junk", "STATIC:zzz", "select.error:x:y", "made.up"):
        assert latest_counts._foreign(reason, known), reason
    assert not latest_counts._foreign("", known) and not latest_counts._foreign("pin.v1", known)
