"""Hypothesis-driven ingest bodies, on SQLite and PostgreSQL: batches built from valid events
with fields replaced by hostile values, dropped or added, repeated event ids within and across
batches. Whatever the body:

- the answer is 200 or a 4xx in the API's error shape, never a 5xx;
- a 200 stores every event of the batch (the first copy of a repeated id), and its
  ``accepted`` and ``inserted`` count them;
- anything else stores nothing;
- after every batch the fallback counts (``latest_counts``) equal a recount from each
  deployment's latest decision.

The examples share one database per backend (seeded, ``derandomize``), so later batches move
deployments that earlier ones stored."""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_helpers import Api
from sqlalchemy import func, select

from turnout.dashboard.store import latest_counts
from turnout.dashboard.store.models import DecisionEvent
from turnout.oracle import load_pack

PACK = load_pack("turnout")
RULES = sorted(r for r in PACK.rule_ids if "." not in r)[:20]
NOW = dt.datetime.now(dt.UTC)

HOSTILE: list[Any] = [
    None,
    0,
    -1,
    2**70,
    1.5,
    math.nan,
    True,
    "",
    " ",
    "x" * 300,
    "\x00",
    "a\x00b",
    "\ud800",
    "\u200b",
    "../../etc/passwd",
    "'; DROP TABLE decision_events; --",
    [],
    {},
    ["x"] * 250,
    [[[[[]]]]],
    {"$gt": ""},
]


def _at(minutes: int) -> str:
    return (NOW - dt.timedelta(minutes=minutes)).isoformat()


VALID: dict[str, st.SearchStrategy[Any]] = {
    "event_id": st.one_of(
        st.uuids().map(lambda u: u.hex), st.sampled_from(["same-1", "same-2", "same-3"])
    ),
    "at": st.integers(0, 20 * 60).map(_at),  # the last 20 hours: every bucket size kept
    "deployment_id": st.sampled_from([f"dep-{i}" for i in range(12)]),
    "host": st.sampled_from(["gpu-1", "gpu-2"]),
    "pack": st.just("turnout"),
    "family": st.sampled_from(["qwen3", "llama", "mixtral"]),
    "runner": st.sampled_from(["v1", "v2", None]),
    "mode": st.sampled_from(["auto", "pinned"]),
    "reason_code": st.sampled_from(["STATIC", "DEFAULT", "SPLIT"]),
    "rule_ids": st.lists(st.sampled_from(RULES), max_size=3),
}


@st.composite
def _event(draw: st.DrawFn) -> dict[str, Any]:
    event = {name: draw(strategy) for name, strategy in VALID.items()}
    if event["runner"] == "v2":
        event["rule_ids"] = []
    return event


@st.composite
def _spoil(draw: st.DrawFn, event: dict[str, Any]) -> dict[str, Any]:
    """``event`` with one field replaced by a hostile value, dropped, or one added."""
    event = dict(event)
    name = draw(st.sampled_from(sorted(event)))
    how = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
    if how == "replace":
        event[name] = draw(st.sampled_from(HOSTILE))
    elif how == "drop":
        del event[name]
    else:
        event[draw(st.sampled_from(["extra", "__proto__", "event_id "]))] = 1
    return event


@st.composite
def _batch(draw: st.DrawFn) -> dict[str, Any]:
    """Half the batches valid, half with one to three spoiled events."""
    events = draw(st.lists(_event(), min_size=1, max_size=8))
    if draw(st.booleans()):
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, len(events) - 1))
            events[i] = draw(_spoil(events[i]))
    return {"events": events}


BODIES = st.one_of(
    _batch(),
    st.sampled_from([{"events": []}, {"events": None}, {}, [], {"events": [{}]}, "x", None]),
)


def _num_stored(api: Api) -> int:
    with api.services.db.read_session() as s:
        return int(s.scalar(select(func.count()).select_from(DecisionEvent)) or 0)


def _stored_ids(api: Api, ids: list[str]) -> set[str]:
    with api.services.db.read_session() as s:
        return set(s.scalars(select(DecisionEvent.event_id).where(DecisionEvent.event_id.in_(ids))))


def _counts_agree_with_a_recount(api: Api) -> None:
    db = api.services.db
    with db.engine.connect() as conn:
        kept = latest_counts.nonzero_rows(conn)
    with db.write_session() as s:
        conn = s.connection()
        latest_counts.rebuild(conn, dt.datetime.now(dt.UTC))
        recounted = latest_counts.nonzero_rows(conn)
        s.rollback()
    assert kept == recounted


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=BODIES)
def test_any_ingest_body_is_stored_whole_or_not_at_all(api: Api, body: Any) -> None:
    before = _num_stored(api)
    # Written by hand: NaN as its literal, lone surrogates as escapes (httpx refuses both).
    raw = json.dumps(body).encode()
    headers = {**api.h("operator"), "Content-Type": "application/json"}
    r = api.client.post("/api/v1/decisions", content=raw, headers=headers)
    assert r.status_code < 500, r.text
    answer = r.json()
    if r.status_code != 200:
        assert 400 <= r.status_code < 500 and "detail" in answer, r.text
        assert _num_stored(api) == before
        _counts_agree_with_a_recount(api)
        return
    events = body["events"]
    ids = [str(e["event_id"]) for e in events]
    assert answer["accepted"] == len(events)
    assert _stored_ids(api, ids) == set(ids)
    assert _num_stored(api) - before == answer["inserted"] <= len(set(ids))
    _counts_agree_with_a_recount(api)
