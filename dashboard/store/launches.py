"""How ``turnout launch`` started vLLM, and what vLLM said at start-up, kept with the decision.

A decision event may carry a ``launch`` part (``oracle.wire.LaunchIn``: the vLLM version and
the pack that stood for its selection, the variables launch set, the operator's pin, where the
canaries came from). It is stored with the event, without its ``startup``, in
``decision_events.launch``.

vLLM's own start-up line comes later: ``turnout launch --report-startup`` reports it as a
follow-up event, ``<decision event id>.startup``, that repeats the decision with
``launch.startup`` set. A follow-up is not a decision of its own: stored as one, it counted the
deployment's one start twice (in the day counts, the history, ``turnout_decisions_total``) and
moved its latest decision to the time vLLM logged a line. Ingest attaches the line to the
decision's row instead (``decision_events.startup``: ``runner``, ``line``, ``at`` and
``event_id`` of the follow-up), the first line reported winning (a resend changes nothing).
Where the decision's row is not stored (its event was lost, or is still in another spool), the
follow-up stands in for it: it is stored under the decision's id, counted once, and the
decision's own event arriving later is a duplicate. Clients need no change: the wire is the
same, the service reads it differently.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam, func, update

from turnout.dashboard.store.models import DecisionEvent, JSONType

if TYPE_CHECKING:
    from turnout.dashboard.store.events import EventLike

FOLLOW_UP_SUFFIX = ".startup"


def follows(e: EventLike) -> str | None:
    """The id of the decision event that ``e`` follows up (``X`` for an event ``X.startup``
    whose ``launch`` has a ``startup``); None for a decision event."""
    if e.launch is None or e.launch.startup is None:
        return None
    if not e.event_id.endswith(FOLLOW_UP_SUFFIX):
        return None
    return e.event_id[: -len(FOLLOW_UP_SUFFIX)] or None


def launch_json(e: EventLike) -> str | None:
    """The event's ``launch`` part as stored (compact JSON, without ``startup``), or None."""
    if e.launch is None:
        return None
    return json.dumps(
        e.launch.model_dump(mode="json", exclude={"startup"}), separators=(",", ":"), sort_keys=True
    )


@dataclass(frozen=True)
class StartupLine:
    """vLLM's start-up line, to attach to the decision event ``event_id``."""

    event_id: str  # the decision's event
    deployment_id: str  # a line is attached to a decision of its own deployment only
    runner: str
    line: str
    at: dt.datetime  # the time of the event that reported it
    reported_as: str  # that event's id (``X.startup``)
    launch: dict[str, Any] | None  # its launch part (sets a row's missing one)

    def to_json(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "line": self.line,
            "at": self.at.isoformat(),
            "event_id": self.reported_as,
        }


def _line_of(e: EventLike, event_id: str) -> StartupLine:
    assert e.launch is not None and e.launch.startup is not None
    part = e.launch.model_dump(mode="json", exclude={"startup"})
    return StartupLine(
        event_id,
        e.deployment_id,
        e.launch.startup.runner,
        e.launch.startup.line,
        e.at.astimezone(dt.UTC),
        e.event_id,
        part,
    )


def stand_in(e: EventLike, event_id: str) -> EventLike:
    """A follow-up as the decision event it follows (its id, the rest as reported)."""
    from turnout.dashboard.store.events import EventRecord

    return EventRecord(
        event_id=event_id,
        at=e.at,
        deployment_id=e.deployment_id,
        pack=e.pack,
        family=e.family,
        runner=e.runner,
        mode=e.mode,
        reason_code=e.reason_code,
        host=e.host,
        stage=e.stage,
        rule_ids=tuple(e.rule_ids),
        policy_digest=e.policy_digest,
        config=e.config,
        demo=e.demo,
        launch=e.launch,
    )


def split(events: Sequence[EventLike]) -> tuple[list[EventLike], list[StartupLine]]:
    """A batch's decisions and the start-up lines to attach. A follow-up adds a stand-in for
    its decision after the batch's own decision events (the first copy of an id is the one
    stored, so a decision sent with its follow-up is stored as its engine sent it)."""
    decisions: list[EventLike] = []
    stand_ins: list[EventLike] = []
    lines: list[StartupLine] = []
    for e in events:
        base = follows(e)
        if base is not None:
            stand_ins.append(stand_in(e, base))
            lines.append(_line_of(e, base))
            continue
        decisions.append(e)
        if e.launch is not None and e.launch.startup is not None:  # the line came with it
            lines.append(_line_of(e, e.event_id))
    return decisions + stand_ins, lines


@dataclass(frozen=True)
class Attached:
    """A line attached now (not before): whether vLLM's runner is the decision's."""

    line: StartupLine
    decided: str | None  # the decision's runner

    @property
    def agrees(self) -> bool:
        return self.line.runner == self.decided


def attach(conn: Connection, lines: Sequence[StartupLine]) -> list[Attached]:
    """Attach each line to its decision's row, where the row has none yet (in id order, so
    concurrent ingests lock rows in one order) and is of the line's deployment (a follow-up
    naming another deployment's decision attaches nothing); the row's ``launch`` is set from
    the line's event where it has none. The rows exist: the batch stored its stand-ins
    first."""
    t = DecisionEvent
    stmt = (
        update(t)
        .where(
            t.event_id == bindparam("b_event_id"),
            t.startup.is_(None),
            t.deployment_id == bindparam("b_deployment_id"),
        )
        .values(
            startup=bindparam("b_startup", type_=JSONType),
            launch=func.coalesce(t.launch, bindparam("b_launch", type_=JSONType)),
        )
        .returning(t.runner)
    )
    out = []
    for line in sorted(lines, key=lambda x: (x.event_id, x.reported_as)):
        row = conn.execute(
            stmt,
            {
                "b_event_id": line.event_id,
                "b_startup": line.to_json(),
                "b_launch": line.launch,
                "b_deployment_id": line.deployment_id,
            },
        ).first()
        if row is not None:
            out.append(Attached(line, row[0]))
    return out


@dataclass(frozen=True)
class LaunchRecord:
    """A stored decision's launch part and start-up line, as the pages and the API show them."""

    vllm_version: str
    vllm_pack: str
    has_pack: bool
    env: dict[str, str]
    operator_pin: str | None
    snapshot_source: str
    decided: str | None  # the decision's runner
    startup: dict[str, Any] | None  # {"runner", "line", "at", "event_id"}

    @property
    def agrees(self) -> bool | None:
        """vLLM's runner is the decided one; None while vLLM's line is not reported."""
        return None if self.startup is None else self.startup.get("runner") == self.decided

    @property
    def env_text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))

    @classmethod
    def of(cls, row: DecisionEvent | None) -> LaunchRecord | None:
        """The launch of a stored event; None for an event without one."""
        if row is None or row.launch is None:
            return None
        part = row.launch
        return cls(
            str(part.get("vllm_version", "")),
            str(part.get("vllm_pack", "")),
            bool(part.get("has_pack", True)),
            dict(part.get("env") or {}),
            part.get("operator_pin"),
            str(part.get("snapshot_source", "")),
            row.runner,
            row.startup,
        )
