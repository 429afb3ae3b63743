"""The ``launch`` part of decision events and vLLM's start-up line, in-process on SQLite and
PostgreSQL: the part is stored and read back; the ``<id>.startup`` follow-up attaches vLLM's
line to its decision instead of counting a second decision (day counts, fallback buckets,
history, ``turnout_decisions_total``), whatever the order and however often it is sent; a
follow-up whose decision never arrived stands in for it, once; a line that names another
runner than the decision is flagged."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import time_machine
from service_helpers import Api

from turnout.dashboard.store import aggregates

AT = dt.datetime(2026, 11, 30, 12, 4, 50, tzinfo=dt.UTC)
LATER = AT + dt.timedelta(seconds=40)  # vLLM's line: in the next 5-minute bucket
RUNNER = "VLLM_USE_V2_MODEL_RUNNER"
V1_LINE = "INFO 11-30 12:05:30 [gpu_model_runner.py:2034] Starting to load model Qwen/Qwen3-8B..."
V2_LINE = "INFO 11-30 12:05:30 [gpu_worker.py:101] Using V2 Model Runner"


@pytest.fixture(autouse=True)
def _clock_at_the_events() -> Any:
    """The service reads the real clock at its edges (what "the last 2 days" of 5-minute
    buckets keeps, what lies in the future): the process clock travels to just after the
    events, so the file means the same on any day (it once failed two days after it was
    written)."""
    with time_machine.travel(AT + dt.timedelta(minutes=1), tick=True):
        yield


def _launch(**over: Any) -> dict[str, Any]:
    return {
        "vllm_version": "0.31.0",
        "vllm_pack": "vllm-0.31",
        "has_pack": True,
        "env": {RUNNER: "0"},
        "operator_pin": None,
        "snapshot_source": "service",
        **over,
    }


def _event(
    event_id: str = "ev-1",
    *,
    at: dt.datetime = AT,
    runner: str = "v1",
    launch: dict[str, Any] | None = None,
    **over: Any,
) -> dict[str, Any]:
    e = {
        "event_id": event_id,
        "at": at.isoformat(),
        "deployment_id": "prod/qwen3-a",
        "host": "h1",
        "pack": "turnout",
        "family": "qwen3",
        "runner": runner,
        "mode": "auto",
        "stage": "qwen3-canary",
        "reason_code": "DISABLED",
        "rule_ids": ["rollout.stage_off"],
        "config": {"architecture": "Qwen3ForCausalLM", "model": "Qwen/Qwen3-8B"},
        **over,
    }
    if launch is not None:
        e["launch"] = launch
    return e


def _follow_up(
    base: str = "ev-1", *, said: str = "v1", line: str = V1_LINE, **over: Any
) -> dict[str, Any]:
    """What ``turnout launch --report-startup`` sends once vLLM names its runner: the same
    decision, ``<id>.startup``, at the time of the line, with ``launch.startup``."""
    return _event(
        f"{base}.startup", at=LATER, launch=_launch(startup={"runner": said, "line": line}), **over
    )


def _post(api: Api, *events: dict[str, Any]) -> dict[str, Any]:
    r = api.client.post(
        "/api/v1/decisions", json={"events": list(events)}, headers=api.h("operator")
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def _decisions(api: Api) -> list[dict[str, Any]]:
    r = api.client.get("/api/v1/decisions?deployment_id=prod/qwen3-a", headers=api.h("viewer"))
    assert r.status_code == 200, r.text
    return list(r.json())


def _counted_once_at(api: Api, at: dt.datetime) -> None:
    """The day count, the overview and the fallback buckets hold one decision, at ``at``."""
    now = AT + dt.timedelta(minutes=30)
    with api.services.db.read_session() as s:
        ov = aggregates.overview(session=s, today=AT.date())
        hour = aggregates.fallbacks(session=s, window="1h", now=now)
    assert ov.by_day == {AT.date().isoformat(): {"v1": 1}}
    assert ov.by_runner == {"v1": 1}
    assert hour.num_deployments == 1 and hour.ranked == [("rollout.stage_off:qwen3-canary", 1)]
    [bins] = hour.over_time.values()
    bucket = at.replace(minute=at.minute - at.minute % 5, second=0)
    assert {b: n for b, n in zip(hour.bins, bins, strict=True) if n} == {bucket: 1}


def test_the_launch_part_is_stored_and_read_back(api: Api) -> None:
    assert _post(api, _event(launch=_launch()))["inserted"] == 1
    [got] = _decisions(api)
    assert got["launch"] == {**_launch(), "startup": None}
    plain = _event("ev-2", deployment_id="prod/engine")
    _post(api, plain)
    r = api.client.get("/api/v1/decisions?deployment_id=prod/engine", headers=api.h("viewer"))
    assert r.json()[0]["launch"] is None


def test_a_follow_up_attaches_vllms_line_to_its_decision(api: Api) -> None:
    _post(api, _event(launch=_launch()))
    answer = _post(api, _follow_up())
    assert (answer["accepted"], answer["inserted"]) == (1, 0)
    assert _post(api, _follow_up())["inserted"] == 0  # a resend changes nothing
    [got] = _decisions(api)
    assert (got["event_id"], got["at"]) == ("ev-1", AT.isoformat().replace("+00:00", "Z"))
    assert got["launch"]["startup"] == {
        "runner": "v1",
        "line": V1_LINE,
        "at": LATER.isoformat().replace("+00:00", "Z"),
        "event_id": "ev-1.startup",
        "agrees": True,
    }
    _counted_once_at(api, AT)
    metrics = api.client.get("/metrics").text
    assert (
        'turnout_decisions_total{reason_code="DISABLED",runner="v1",source="ingest"} 1.0' in metrics
    )
    assert 'turnout_startup_lines_total{outcome="agrees"} 1.0' in metrics


@pytest.mark.parametrize("order", ["decision first", "follow-up first"])
def test_a_decision_sent_with_its_follow_up_is_stored_once(api: Api, order: str) -> None:
    batch = [_event(launch=_launch()), _follow_up()]
    answer = _post(api, *(batch if order == "decision first" else batch[::-1]))
    assert (answer["accepted"], answer["inserted"]) == (2, 1)
    [got] = _decisions(api)
    assert got["at"] == AT.isoformat().replace("+00:00", "Z")  # the decision's own time
    assert got["launch"]["startup"]["agrees"] is True
    _counted_once_at(api, AT)


def test_a_follow_up_whose_decision_is_missing_stands_in_for_it(api: Api) -> None:
    assert _post(api, _follow_up())["inserted"] == 1  # the decision's event was lost
    assert _post(api, _event(launch=_launch()))["inserted"] == 0  # it arrives after all
    [got] = _decisions(api)
    assert got["event_id"] == "ev-1" and got["launch"]["startup"]["line"] == V1_LINE
    _counted_once_at(api, LATER)


def test_a_line_naming_another_runner_is_flagged(api: Api) -> None:
    _post(api, _event(launch=_launch()))
    _post(api, _follow_up(said="v2", line=V2_LINE))
    [got] = _decisions(api)
    assert got["runner"] == "v1"
    assert got["launch"]["startup"]["runner"] == "v2"
    assert got["launch"]["startup"]["agrees"] is False
    assert 'turnout_startup_lines_total{outcome="differs"} 1.0' in api.client.get("/metrics").text


def test_an_event_id_ending_in_startup_without_a_line_is_a_decision(api: Api) -> None:
    _post(api, _event(launch=_launch()))
    # No launch.startup: not a follow-up (any id of the wire's alphabet is an event's own).
    assert _post(api, _event("ev-1.startup", at=LATER))["inserted"] == 1
    assert [e["event_id"] for e in _decisions(api)] == ["ev-1.startup", "ev-1"]


def test_a_follow_up_naming_another_deployments_decision_attaches_nothing(api: Api) -> None:
    _post(api, _event(launch=_launch()))
    answer = _post(api, _follow_up(deployment_id="prod/other"))
    assert (answer["accepted"], answer["inserted"]) == (1, 0)
    [got] = _decisions(api)
    assert got["launch"]["startup"] is None
    r = api.client.get("/api/v1/decisions?deployment_id=prod/other", headers=api.h("viewer"))
    assert r.json() == []
