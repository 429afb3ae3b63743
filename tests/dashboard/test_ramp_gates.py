"""The health gates of a ramp over real engine health reports (``dashboard.store.health``), on
SQLite and PostgreSQL, at explicit times: a healthy V2 takes the ramp through every step, a
crashing one rolls it back with the figures in the audit log, and replicas ticking at once
take each step once."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterator

import pytest

from turnout.dashboard import gates
from turnout.dashboard.gates import GateConfig
from turnout.dashboard.health_source import health_reader
from turnout.dashboard.store import advance, audit, canaries, evidence, health, ramps
from turnout.dashboard.store.canaries import CohortDefault
from turnout.dashboard.store.db import Database
from turnout.dashboard.store.health import RunnerHealth
from turnout.oracle.wire import HealthReportIn

T0 = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)
STEPS = [
    {"percentage": 10, "bake_s": 600},
    {"percentage": 50, "bake_s": 600},
    {"percentage": 100, "bake_s": 600},
]
NAMED = {"qwen3": ("qwen3",)}


def _h(
    runner: str, engines: int, requests: int, errors: int, crashes: int, tpot: float | None
) -> RunnerHealth:
    return RunnerHealth(
        runner,
        engines,
        engines,
        requests,
        errors,
        crashes,
        errors / max(requests, 1),
        crashes / max(engines, 1),
        None,
        tpot,
        0.0,
    )


CONFIG = GateConfig(min_engines=2)


@pytest.mark.parametrize(
    ("v1", "v2", "want"),
    [
        (
            _h("v1", 5, 1000, 2, 0, 20.0),
            _h("v2", 2, 1000, 41, 0, 21.0),
            {"v2_error_rate": ("fail", "gate v2_error_rate: v2 4.1% vs v1 0.2% (max ratio 2)")},
        ),
        (
            _h("v1", 5, 1000, 2, 0, 20.0),
            _h("v2", 2, 1000, 4, 0, 21.0),
            {"v2_error_rate": ("pass", "gate v2_error_rate: v2 0.4% vs v1 0.2% (max ratio 2)")},
        ),
        # V1 at 0 %: its rate counts as the 0.1 % floor, so 2 errors in 1,000 pass
        (
            _h("v1", 5, 1000, 0, 0, 20.0),
            _h("v2", 2, 1000, 2, 0, 21.0),
            {"v2_error_rate": ("pass", "gate v2_error_rate: v2 0.2% vs v1 0.0% (max ratio 2)")},
        ),
        (
            _h("v1", 5, 1000, 0, 0, 20.0),
            _h("v2", 2, 1000, 0, 1, 21.0),
            {
                "v2_crash_rate": (
                    "fail",
                    "gate v2_crash_rate: v2 0.50 vs v1 0.00 crashes per engine (max 0.05)",
                )
            },
        ),
        (
            _h("v1", 5, 1000, 0, 0, 20.0),
            _h("v2", 2, 1000, 0, 0, 31.0),
            {"v2_tpot_p99": ("fail", "gate v2_tpot_p99: v2 31.0 ms vs v1 20.0 ms (max ratio 1.5)")},
        ),
        (
            _h("v1", 5, 1000, 0, 0, 20.0),
            _h("v2", 2, 1000, 0, 0, None),
            {"v2_tpot_p99": ("wait", "gate v2_tpot_p99: no TPOT reported by v2")},
        ),
        (
            _h("v1", 5, 1000, 0, 0, 20.0),
            _h("v2", 1, 1000, 999, 1, 99.0),
            {
                "health_engines": (
                    "wait",
                    "gate health_engines: v2 1 vs v1 5 engines reporting (min 2)",
                )
            },
        ),
        (
            None,
            None,
            {
                "health_engines": (
                    "wait",
                    "gate health_engines: v2 0 vs v1 0 engines reporting (min 2)",
                )
            },
        ),
    ],
)
def test_health_gates_compare_v2_with_v1(
    v1: RunnerHealth | None, v2: RunnerHealth | None, want: dict[str, tuple[str, str]]
) -> None:
    results = {r.gate: (r.status, r.message) for r in gates.health_gates(v1, v2, CONFIG)}
    for gate, expected in want.items():
        assert results[gate] == expected


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    database.upgrade()
    with database.write_session() as s:
        canaries.ensure_defaults(session=s, defaults=[CohortDefault("qwen3", False)])
        row = evidence.record_evidence(
            session=s,
            family="qwen3",
            runner_pair="v1:v2",
            suite="tests/parity",
            result="pass",
            details="",
            actor="ci",
        )
        row.recorded_at = T0 - dt.timedelta(hours=1)
        s.commit()
    yield database
    database.dispose()


def _report(
    runner: str,
    deployment: str,
    end: dt.datetime,
    *,
    errors: int = 0,
    crashes: int = 0,
    tpot: float = 20.0,
) -> HealthReportIn:
    return HealthReportIn(
        report_id=uuid.uuid4().hex,
        deployment_id=deployment,
        pack="turnout",
        runner=runner,
        family="qwen3",
        stage="qwen3",
        window_start=end - MIN,
        window_end=end,
        num_requests=100,
        num_errors=errors,
        num_crashes=crashes,
        tpot_p50_ms=tpot / 2,
        tpot_p99_ms=tpot,
        num_output_tokens=1000,
        output_tokens_per_s=50.0,
    )


def _reports(db: Database, end: dt.datetime, *, v2_engines: int = 2, **v2: float) -> None:
    """One minute of health from three V1 engines and ``v2_engines`` V2 ones."""
    made = [_report("v1", f"v1-{i}", end) for i in range(3)]
    made += [_report("v2", f"v2-{i}", end, **v2) for i in range(v2_engines)]  # type: ignore[arg-type]
    with db.write_session() as s:
        health.ingest_reports(session=s, reports=made)
        s.commit()


def _start(db: Database, on_failure: str = "rollback") -> int:
    with db.write_session() as s:
        ramp = ramps.request_ramp(
            session=s,
            cohort="qwen3",
            steps=STEPS,
            gates=GateConfig(min_engines=2),
            on_failure=on_failure,
            reason="parity green",
            actor="alice",
            requester="alice",
            if_version=1,
            needs_approval=False,
            now=T0,
        )
        s.commit()
        return ramp.id


def _tick(db: Database, now: dt.datetime) -> list[advance.RampTick]:
    with db.write_session() as s:
        return advance.advance_ramps(session=s, now=now, named=NAMED, health=health_reader())


def _share(db: Database) -> tuple[bool, int]:
    with db.read_session() as s:
        enabled, share, _version = canaries.read_state(session=s).cohorts["qwen3"]
    return enabled, share


def test_a_healthy_v2_takes_the_ramp_through_every_step(db: Database) -> None:
    ramp_id = _start(db)
    _reports(db, T0 + 2 * MIN)
    [tick] = _tick(db, T0 + 5 * MIN)  # every gate passes, but the step is still baking
    assert tick.outcome == "held" and gates.outcome(list(tick.gates)) == "pass"
    now = T0
    for share in (50, 100):
        now += dt.timedelta(seconds=600)
        [tick] = _tick(db, now)
        assert tick.outcome == "stepped" and _share(db) == (True, share)
        [tick] = _tick(db, now + MIN)  # no V2 report since the step started yet
        assert tick.outcome == "held"
        assert {g.gate: g.status for g in tick.gates}["health_engines"] == "wait"
        _reports(db, now + 2 * MIN)
    [tick] = _tick(db, now + dt.timedelta(seconds=600))
    assert tick.outcome == "completed" and _share(db) == (True, 100)
    with db.read_session() as s:
        assert ramps.get_ramp(session=s, ramp_id=ramp_id).state == "completed"
        actions = [e.action for e in reversed(audit.list_entries(session=s))]
    assert actions == ["ramp.start", "ramp.step", "ramp.step", "ramp.complete"]


def test_a_crashing_v2_rolls_the_stage_back_saying_why(db: Database) -> None:
    ramp_id = _start(db, on_failure="rollback")
    _reports(db, T0 + 2 * MIN, crashes=1)
    [tick] = _tick(db, T0 + 3 * MIN)
    assert tick.outcome == "rolled_back" and _share(db) == (False, 10)
    with db.read_session() as s:
        ramp = ramps.get_ramp(session=s, ramp_id=ramp_id)
        entry = audit.list_entries(session=s, limit=1)[0]
    assert (ramp.state, entry.action) == ("rolled_back", "ramp.rollback")
    assert entry.reason == ("gate v2_crash_rate: v2 1.00 vs v1 0.00 crashes per engine (max 0.05)")
    assert ramp.end_reason == entry.reason


def test_a_v2_error_spike_pauses_and_a_resume_bakes_the_step_again(db: Database) -> None:
    ramp_id = _start(db, on_failure="pause")
    _reports(db, T0 + 2 * MIN, errors=10)
    assert _tick(db, T0 + 3 * MIN)[0].outcome == "paused"
    assert _share(db) == (True, 10)
    with db.write_session() as s:
        ramps.resume_ramp(
            session=s,
            ramp_id=ramp_id,
            actor="bob",
            reason="a bad host",
            if_version=3,
            now=T0 + 20 * MIN,
        )
        s.commit()
    _reports(db, T0 + 22 * MIN)  # V2's window starts at the resume: the spike is behind it
    assert _tick(db, T0 + 25 * MIN)[0].outcome == "held"
    assert _tick(db, T0 + 30 * MIN)[0].outcome == "stepped" and _share(db) == (True, 50)


def test_replicas_ticking_at_once_take_a_step_once(db: Database) -> None:
    _start(db)
    _reports(db, T0 + 2 * MIN)
    now = T0 + dt.timedelta(seconds=600)
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def replica() -> None:
        barrier.wait()
        outcomes.extend(t.outcome for t in _tick(db, now))

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes).count("stepped") == 1, outcomes
    assert _share(db) == (True, 50)
    with db.read_session() as s:
        steps = [e for e in audit.list_entries(session=s) if e.action == "ramp.step"]
    assert len(steps) == 1
