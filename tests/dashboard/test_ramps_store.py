"""Ramps, scheduled flips and approvals in the store, on SQLite and PostgreSQL, at explicit
times: requests, the two-person rule, versions, the audit entry and webhook deliveries each
change writes in its own transaction, and the evidence and kill-switch gates."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from service_helpers import LOOPBACK_EGRESS

from turnout.dashboard.gates import GateConfig
from turnout.dashboard.health_source import health_reader
from turnout.dashboard.store import advance, approvals, audit, canaries, evidence, ramps, schedule
from turnout.dashboard.store import webhooks as hooks
from turnout.dashboard.store.canaries import CohortDefault
from turnout.dashboard.store.db import Database
from turnout.dashboard.store.errors import Conflict, InvalidChange, NotAllowed, VersionConflict
from turnout.dashboard.store.models_rollout import OutboxEntry
from turnout.oracle.errors import ErrorCode

T0 = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)
STEPS = [
    {"percentage": 10, "bake_s": 600},
    {"percentage": 50, "bake_s": 600},
    {"percentage": 100, "bake_s": 600},
]
NAMED = {"qwen3": ("qwen3",), "llama": ("llama", "mistral")}


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    database.upgrade()
    with database.write_session() as s:
        canaries.ensure_defaults(
            session=s, defaults=[CohortDefault("qwen3", False), CohortDefault("llama", False)]
        )
        hooks.add_webhook(
            egress=LOOPBACK_EGRESS,
            session=s,
            url="http://127.0.0.1:9/hook",
            actor="t",
            kinds=[k.value for k in hooks.Kind],
        )
        s.commit()
    yield database
    database.dispose()


def _request(
    db: Database,
    *,
    approval: bool = False,
    on_failure: str = "pause",
    cohort: str = "qwen3",
    requester: str = "alice",
) -> int:
    with db.write_session() as s:
        version = canaries.get_canary(session=s, cohort=cohort).version
        ramp = ramps.request_ramp(
            session=s,
            cohort=cohort,
            steps=STEPS,
            gates=GateConfig(),
            on_failure=on_failure,
            reason="parity green",
            actor=f"{requester} (token 1)",
            requester=requester,
            if_version=version,
            needs_approval=approval,
            now=T0,
        )
        s.commit()
        return ramp.id


def _state(db: Database, cohort: str = "qwen3") -> tuple[bool, int, int]:
    with db.read_session() as s:
        return canaries.read_state(session=s).cohorts[cohort]


def _actions(db: Database) -> list[str]:
    with db.read_session() as s:
        return [
            e.action
            for e in reversed(audit.list_entries(session=s))
            if not e.action.startswith("webhook.")
        ]


def _outbox_kinds(db: Database) -> list[str]:
    with db.read_session() as s:
        return [e.kind for e in reversed(hooks.list_outbox(session=s))]


def test_a_ramp_starts_at_its_first_step_with_one_audit_entry_and_delivery(db: Database) -> None:
    ramp_id = _request(db)
    assert _state(db) == (True, 10, 2)
    with db.read_session() as s:
        ramp = ramps.get_ramp(session=s, ramp_id=ramp_id)
        assert (ramp.state, ramp.step_index, ramp.step_started_at) == ("active", 0, T0)
        assert ramps.next_step_at(ramp) == T0 + dt.timedelta(seconds=600)
    assert _actions(db) == ["ramp.start"]
    assert _outbox_kinds(db) == ["ramp_step"]


def test_a_second_live_ramp_and_a_stale_version_are_refused(db: Database) -> None:
    _request(db)
    with pytest.raises(Conflict) as err:
        _request(db)
    assert err.value.code == ErrorCode.RAMP_EXISTS
    with db.write_session() as s, pytest.raises(VersionConflict):
        ramps.request_ramp(
            session=s,
            cohort="llama",
            steps=STEPS,
            gates=GateConfig(),
            on_failure="pause",
            reason="r",
            actor="a",
            requester="a",
            if_version=7,
            needs_approval=False,
            now=T0,
        )
    assert _state(db, "llama") == (False, 100, 1)


@pytest.mark.parametrize(
    ("steps", "what"),
    [
        ([], "1 to 20 steps"),
        ([{"percentage": 50, "bake_s": 1}, {"percentage": 50, "bake_s": 1}], "does not rise"),
        ([{"percentage": 0, "bake_s": 1}], "not in 1..100"),
        ([{"percentage": 10, "bake_s": -1}], "bake_s -1"),
    ],
)
def test_bad_steps_are_refused_saying_which(
    db: Database, steps: list[dict[str, int]], what: str
) -> None:
    with db.write_session() as s, pytest.raises(InvalidChange, match=what):
        ramps.request_ramp(
            session=s,
            cohort="qwen3",
            steps=steps,
            gates=GateConfig(),
            on_failure="pause",
            reason="r",
            actor="a",
            requester="a",
            if_version=1,
            needs_approval=False,
            now=T0,
        )


def test_an_approval_is_needed_from_another_operator(db: Database) -> None:
    ramp_id = _request(db, approval=True)
    assert _state(db) == (False, 100, 1)
    with db.read_session() as s:
        [pending] = approvals.list_pending(session=s)
    assert (pending.subject, pending.id, pending.requester) == ("ramp", ramp_id, "alice")
    assert pending.summary == "ramp 10 → 50 → 100 %, 10 min each"
    with db.write_session() as s, pytest.raises(NotAllowed) as err:
        approvals.approve(
            session=s,
            subject="ramp",
            item_id=ramp_id,
            actor="alice (token 9)",
            approver="alice",
            reason="me",
            now=T0,
        )
    assert err.value.code == ErrorCode.SELF_APPROVAL
    with db.write_session() as s:
        approvals.approve(
            session=s,
            subject="ramp",
            item_id=ramp_id,
            actor="bob (token 2)",
            approver="bob",
            reason="looks right",
            now=T0,
        )
        s.commit()
    assert _state(db) == (True, 10, 2)
    assert _actions(db) == ["ramp.request", "ramp.approve", "ramp.start"]
    assert _outbox_kinds(db) == ["approval", "approval", "ramp_step"]
    with db.read_session() as s:
        assert ramps.get_ramp(session=s, ramp_id=ramp_id).approved_by == "bob (token 2)"
        assert approvals.list_pending(session=s) == []


def test_an_approval_after_the_cohort_moved_is_refused(db: Database) -> None:
    ramp_id = _request(db, approval=True)
    with db.write_session() as s:
        canaries.flip_canary(
            session=s,
            cohort="qwen3",
            enabled=False,
            percentage=30,
            reason="meanwhile",
            actor="c",
            if_version=1,
        )
        s.commit()
    with db.read_session() as s:  # a flip supersedes the pending ramp
        assert ramps.get_ramp(session=s, ramp_id=ramp_id).state == "cancelled"
    with db.write_session() as s, pytest.raises(Conflict):
        approvals.approve(
            session=s,
            subject="ramp",
            item_id=ramp_id,
            actor="b",
            approver="b",
            reason="late",
            now=T0,
        )


def test_a_flip_by_hand_ends_the_live_ramp(db: Database) -> None:
    ramp_id = _request(db)
    with db.write_session() as s:
        canaries.flip_canary(
            session=s, cohort="qwen3", enabled=False, reason="INC-1", actor="c", if_version=2
        )
        s.commit()
    with db.read_session() as s:
        ramp = ramps.get_ramp(session=s, ramp_id=ramp_id)
    assert (ramp.state, ramp.end_reason) == ("cancelled", "superseded by a flip (INC-1)")
    assert _actions(db) == ["ramp.start", "canary.flip", "ramp.cancel"]


def test_cancel_and_resume_name_the_ramp_version(db: Database) -> None:
    ramp_id = _request(db)
    with db.write_session() as s, pytest.raises(Conflict):
        ramps.resume_ramp(session=s, ramp_id=ramp_id, actor="a", reason="r", if_version=2)
    with db.write_session() as s, pytest.raises(VersionConflict):
        ramps.cancel_ramp(session=s, ramp_id=ramp_id, actor="a", reason="r", if_version=1)
    with db.write_session() as s:
        ramp = ramps.cancel_ramp(
            session=s, ramp_id=ramp_id, actor="a", reason="enough", if_version=2, now=T0
        )
        s.commit()
    assert (ramp.state, ramp.version) == ("cancelled", 3)
    assert _state(db) == (True, 10, 2)  # the cohort keeps its share


def _evidence(db: Database, family: str, result: str, at: dt.datetime) -> None:
    with db.write_session() as s:
        row = evidence.record_evidence(
            session=s,
            family=family,
            runner_pair="v1:v2",
            suite="tests/parity",
            result=result,
            details="",
            actor="ci",
            counts=evidence.Counts(120, 3, 0, 1),
        )
        row.recorded_at = at
        s.commit()


def _tick(db: Database, now: dt.datetime) -> list[advance.RampTick]:
    with db.write_session() as s:
        return advance.advance_ramps(session=s, now=now, named=NAMED, health=health_reader())


@pytest.mark.parametrize(
    ("on_failure", "state", "canary"),
    [("pause", "paused", (True, 10, 2)), ("rollback", "rolled_back", (False, 10, 3))],
)
def test_red_parity_evidence_fails_the_gate(
    db: Database, on_failure: str, state: str, canary: tuple[bool, int, int]
) -> None:
    ramp_id = _request(db, on_failure=on_failure)
    _evidence(db, "qwen3", "fail", T0)
    [tick] = _tick(db, T0 + dt.timedelta(seconds=60))
    assert tick.outcome == ("paused" if on_failure == "pause" else "rolled_back")
    assert _state(db) == canary
    with db.read_session() as s:
        ramp = ramps.get_ramp(session=s, ramp_id=ramp_id)
        entry = audit.list_entries(session=s, limit=1)[0]
        outbox = hooks.list_outbox(session=s, limit=1)[0]
    assert ramp.state == state
    assert entry.action == f"ramp.{'pause' if on_failure == 'pause' else 'rollback'}"
    assert entry.reason == (
        "gate parity_evidence: qwen3 fail 1 min ago (tests/parity, 3 failed of 120)"
    )
    assert outbox.kind == "gate_failure" and outbox.payload["reason"] == entry.reason
    assert [g["gate"] for g in outbox.payload["gates"]][:2] == ["kill_switch", "parity_evidence"]
    assert _tick(db, T0 + dt.timedelta(seconds=120)) == []  # no longer active


def test_a_gate_failing_over_many_families_still_pauses_the_ramp(db: Database) -> None:
    """A stage whose families come from the fleet (all-dense: dozens) and one red run: the
    gate's message names every family, over the 2,000 characters an audit reason holds.
    The pause raised REASON_TOO_LONG inside the tick before: the ramp stepped on never, and
    paused never, and every tick failed."""
    many = tuple(f"family_with_a_long_name_{i:02d}" for i in range(60))
    ramp_id = _request(db)
    for family in many:
        _evidence(db, family, "fail" if family.endswith("57") else "pass", T0)
    with db.write_session() as s:
        [tick] = advance.advance_ramps(
            session=s,
            now=T0 + dt.timedelta(seconds=60),
            named={"qwen3": many},
            health=health_reader(),
        )
    assert tick.outcome == "paused"
    with db.read_session() as s:
        entry = audit.list_entries(session=s, limit=1)[0]
        ramp = ramps.get_ramp(session=s, ramp_id=ramp_id)
    assert entry.action == "ramp.pause" and len(entry.reason) <= audit.MAX_REASON_CHARS
    # the red family first (it would be cut otherwise), then the others
    assert entry.reason.startswith("gate parity_evidence: family_with_a_long_name_57 fail")
    assert "; family_with_a_long_name_00 pass" in entry.reason
    assert "more characters: every gate in full in the ramp's last_gates" in entry.reason
    assert ramp.last_gates is not None and "_59 pass" in ramp.last_gates[1]["message"]


@pytest.mark.parametrize("scheduled", [False, True])
def test_a_flip_with_the_longest_reason_ends_the_live_ramp(db: Database, scheduled: bool) -> None:
    """A reason of 2,000 characters takes the cohort from its ramp: the ramp's cancel entry
    says "superseded by a flip (…)" within 2,000 too. It raised REASON_TOO_LONG before: the
    operator's disable refused, a scheduled one failing every tick (and every flip and ramp
    after it in the pass)."""
    _request(db)
    reason = "x" * audit.MAX_REASON_CHARS
    with db.write_session() as s:
        if scheduled:
            schedule.request_flip(
                session=s,
                cohort="qwen3",
                enabled=False,
                percentage=None,
                reason=reason,
                actor="a",
                requester="a",
                run_at=T0 + dt.timedelta(hours=1),
                if_version=None,
                needs_approval=False,
                now=T0,
            )
        else:
            canaries.flip_canary(
                session=s, cohort="qwen3", enabled=False, reason=reason, actor="bob", if_version=2
            )
        s.commit()
    if scheduled:
        with db.write_session() as s:
            [run] = schedule.run_scheduled(session=s, now=T0 + dt.timedelta(hours=1))
        assert run.changed
    assert _state(db)[:1] == (False,)
    with db.read_session() as s:
        live = ramps.live_ramp(session=s, cohort="qwen3")
        entry = audit.list_entries(session=s, limit=1)[0]
    assert live is None
    assert entry.action == "ramp.cancel" and len(entry.reason) <= audit.MAX_REASON_CHARS
    assert entry.reason.startswith("superseded by a flip (xxx")


def test_stale_evidence_and_the_kill_switch_hold_the_ramp(db: Database) -> None:
    ramp_id = _request(db)
    _evidence(db, "qwen3", "pass", T0 - dt.timedelta(days=8))
    with db.write_session() as s:
        canaries.set_kill_switch(session=s, engaged=True, reason="incident", actor="op")
        s.commit()
    [tick] = _tick(db, T0 + dt.timedelta(hours=1))
    statuses = {g.gate: g.status for g in tick.gates}
    assert tick.outcome == "held"
    assert statuses["kill_switch"] == "wait" and statuses["parity_evidence"] == "wait"
    with db.read_session() as s:
        ramp = ramps.get_ramp(session=s, ramp_id=ramp_id)
    assert ramp.state == "active" and ramp.last_checked_at == T0 + dt.timedelta(hours=1)
    assert "older than 7 d" in ramp.last_gates[1]["message"]  # type: ignore[index]


def test_a_ramp_listed_before_another_replica_moved_it_is_left_alone(db: Database) -> None:
    ramp_id = _request(db)
    with db.write_session() as s:
        ramps.cancel_ramp(session=s, ramp_id=ramp_id, actor="a", reason="r", if_version=2)
        s.commit()
    with db.write_session() as s:
        tick = advance.advance_ramp(
            session=s, ramp_id=ramp_id, seen_version=2, now=T0, named=NAMED, health=health_reader()
        )
    assert tick.outcome == "skipped"


def test_a_scheduled_flip_runs_once_when_due(db: Database) -> None:
    with db.write_session() as s:
        flip = schedule.request_flip(
            session=s,
            cohort="llama",
            enabled=True,
            percentage=25,
            reason="Monday 9:00",
            actor="a",
            requester="a",
            run_at=T0 + dt.timedelta(hours=1),
            if_version=None,
            needs_approval=False,
            now=T0,
        )
        s.commit()
    with db.write_session() as s:
        assert schedule.run_scheduled(session=s, now=T0 + dt.timedelta(minutes=59)) == []
    with db.write_session() as s:
        [run] = schedule.run_scheduled(session=s, now=T0 + dt.timedelta(hours=1))
    assert (run.flip_id, run.applied, run.changed) == (flip.id, True, True)
    with db.write_session() as s:
        assert schedule.run_scheduled(session=s, now=T0 + dt.timedelta(hours=2)) == []
    assert _state(db, "llama") == (True, 25, 2)
    assert _actions(db) == ["flip.schedule", "canary.flip"]
    assert _outbox_kinds(db) == ["scheduled_flip", "scheduled_flip"]
    with db.read_session() as s:
        assert schedule.get_flip(session=s, flip_id=flip.id).state == "done"


def test_a_scheduled_flip_that_finds_its_state_there_already_is_audited_and_notified(
    db: Database,
) -> None:
    """Its run changes no cohort, but the flip did run: before, nothing said so (no audit
    entry, no scheduled_flip delivery), though the flip was done and its version moved."""
    with db.write_session() as s:
        flip = schedule.request_flip(
            session=s,
            cohort="llama",
            enabled=False,
            percentage=None,
            reason="off for the freeze",
            actor="a",
            requester="a",
            run_at=T0 + dt.timedelta(hours=1),
            if_version=None,
            needs_approval=False,
            now=T0,
        )
        s.commit()
    with db.write_session() as s:
        [run] = schedule.run_scheduled(session=s, now=T0 + dt.timedelta(hours=1))
    assert (run.applied, run.changed) == (True, False)
    assert _state(db, "llama") == (False, 100, 1)
    assert _actions(db) == ["flip.schedule", "flip.done"]
    assert _outbox_kinds(db) == ["scheduled_flip", "scheduled_flip"]
    with db.read_session() as s:
        entry = audit.list_entries(session=s)[0]
        done = schedule.get_flip(session=s, flip_id=flip.id)
    assert entry.reason == "the cohort had that state already" and entry.at == done.done_at
    assert entry.after is not None and entry.after["state"] == "done"


def test_a_flip_in_the_past_is_refused(db: Database) -> None:
    with db.write_session() as s, pytest.raises(InvalidChange, match="not between now"):
        schedule.request_flip(
            session=s,
            cohort="llama",
            enabled=True,
            percentage=None,
            reason="r",
            actor="a",
            requester="a",
            run_at=T0,
            if_version=None,
            needs_approval=False,
            now=T0,
        )


def test_an_enable_waiting_for_approval_applies_when_approved(db: Database) -> None:
    with db.write_session() as s:
        pending = schedule.flip_or_request(
            session=s,
            cohort="llama",
            enabled=True,
            percentage=40,
            reason="go",
            actor="alice (token 1)",
            requester="alice",
            if_version=1,
            require_approval=True,
        )
        s.commit()
    assert not isinstance(pending, canaries.Flip) and pending.state == "pending_approval"
    assert _state(db, "llama") == (False, 100, 1)
    with db.write_session() as s:  # a disable never waits
        done = schedule.flip_or_request(
            session=s,
            cohort="qwen3",
            enabled=False,
            percentage=None,
            reason="no",
            actor="a",
            requester="a",
            if_version=1,
            require_approval=True,
        )
    assert isinstance(done, canaries.Flip) and not done.changed
    with db.write_session() as s:
        approvals.approve(
            session=s,
            subject="flip",
            item_id=pending.id,
            actor="bob",
            approver="bob",
            reason="ok",
            now=T0,
        )
        s.commit()
    assert _state(db, "llama") == (True, 40, 2)
    assert _actions(db) == ["flip.request", "flip.approve", "canary.flip"]
    assert _outbox_kinds(db) == ["approval", "approval", "flip"]


def test_an_approval_after_the_cohort_moved_is_a_version_conflict(db: Database) -> None:
    with db.write_session() as s:
        pending = schedule.flip_or_request(
            session=s,
            cohort="llama",
            enabled=True,
            percentage=None,
            reason="go",
            actor="alice",
            requester="alice",
            if_version=1,
            require_approval=True,
        )
        s.commit()
        canaries.flip_canary(
            session=s,
            cohort="llama",
            enabled=False,
            percentage=20,
            reason="meanwhile",
            actor="carol",
            if_version=1,
        )
        s.commit()
    with db.write_session() as s, pytest.raises(VersionConflict, match="moved since"):
        approvals.approve(
            session=s,
            subject="flip",
            item_id=pending.id,
            actor="bob",
            approver="bob",
            reason="ok",
            now=T0,
        )
    assert _state(db, "llama") == (False, 20, 2)


def test_a_rejected_request_changes_nothing(db: Database) -> None:
    ramp_id = _request(db, approval=True)
    with db.write_session() as s:
        approvals.reject(
            session=s, subject="ramp", item_id=ramp_id, actor="alice", reason="withdrawn", now=T0
        )
        s.commit()
    assert _state(db) == (False, 100, 1)
    with db.read_session() as s:
        assert ramps.get_ramp(session=s, ramp_id=ramp_id).state == "rejected"
    _request(db)  # the cohort has no live ramp any more


def test_deliveries_commit_with_their_event_or_not_at_all(db: Database) -> None:
    with db.write_session() as s:
        canaries.flip_canary(
            session=s, cohort="qwen3", enabled=True, reason="r", actor="a", if_version=1
        )
        s.rollback()
    with db.read_session() as s:
        assert s.query(OutboxEntry).count() == 0
    with db.write_session() as s:
        hooks.add_webhook(
            egress=LOOPBACK_EGRESS,
            session=s,
            url="https://example.com/only-flips",
            actor="t",
            kinds=["flip"],
        )
        canaries.flip_canary(
            session=s, cohort="qwen3", enabled=True, reason="r", actor="a", if_version=1
        )
        s.commit()
    assert _outbox_kinds(db) == ["flip", "flip"]
