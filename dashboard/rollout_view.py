"""What the Canaries page shows of the closed loop: each live ramp with its steps and its
gates' last results, the changes waiting for approval (and whether the signed-in operator may
approve each), the scheduled flips that have not run, and how far the kill switch reaches; and
what the Overview shows of it: each stage's latest ramp."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from turnout.dashboard.auth import Principal
from turnout.dashboard.services import Services
from turnout.dashboard.store import approvals, ramps, schedule
from turnout.dashboard.store import canaries as canary_store
from turnout.dashboard.store.models_rollout import Ramp, ScheduledFlip
from turnout.dashboard.store.tokens import Role


@dataclass
class RampView:
    ramp: Ramp
    label: str
    next_step_at: dt.datetime | None
    gates: list[dict[str, Any]]

    @property
    def share(self) -> int | None:
        i = self.ramp.step_index
        return self.ramp.steps[i]["percentage"] if 0 <= i < len(self.ramp.steps) else None

    def gates_in(self, status: str) -> list[str]:
        """The gates whose last result was ``status`` (``fail``, ``wait``, ``pass``)."""
        return [g.get("gate", "?") for g in self.gates if g.get("status") == status]


@dataclass
class PendingView:
    item: approvals.Pending
    label: str
    can_approve: bool  # an operator other than the requester


@dataclass
class Reach:
    """How many still run V2 while the kill switch is engaged."""

    decided_before: int = 0
    decided_after: int = 0
    engines_reporting: int = 0


@dataclass
class RolloutView:
    ramps: list[RampView] = field(default_factory=list)
    pending: list[PendingView] = field(default_factory=list)
    scheduled: list[ScheduledFlip] = field(default_factory=list)
    reach: Reach = field(default_factory=Reach)

    def ramp_of(self, cohort: str) -> RampView | None:
        return next((r for r in self.ramps if r.ramp.cohort == cohort), None)


def stage_ramps(services: Services) -> dict[str, RampView]:
    """Cohort → its latest ramp (live, or how it ended), as the Overview shows it beside the
    stage's progress."""
    labels = services.policy.cohort_labels()
    with services.db.read_session() as session:
        latest = ramps.latest_per_cohort(session=session)
    return {
        c: RampView(r, labels.get(c, c), ramps.next_step_at(r), r.last_gates or [])
        for c, r in latest.items()
    }


def rollout_view(services: Services, user: Principal) -> RolloutView:
    labels = services.policy.cohort_labels()
    operator = user.role.allows(Role.operator)
    with services.db.read_session() as session:
        live = ramps.list_ramps(session=session, live_only=True)
        pending = approvals.list_pending(session=session)
        flips = [
            f
            for f in schedule.list_flips(session=session, open_only=True)
            if f.state == schedule.FlipState.scheduled
        ]
        ks = canary_store.get_kill_switch(session=session)
        reach = Reach()
        if ks.engaged:
            before, after = ramps.v2_reach(session=session, since=ks.updated_at)
            reach = Reach(
                before, after, ramps.v2_engines_reporting(session=session, since=ks.updated_at)
            )
    return RolloutView(
        ramps=[
            RampView(r, labels.get(r.cohort, r.cohort), ramps.next_step_at(r), r.last_gates or [])
            for r in live
        ],
        pending=[
            PendingView(p, labels.get(p.cohort, p.cohort), operator and p.requester != user.name)
            for p in pending
        ],
        scheduled=sorted(flips, key=lambda f: (f.run_at or f.requested_at, f.id)),
        reach=reach,
    )
