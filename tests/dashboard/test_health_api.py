"""``POST /api/v1/health`` and ``GET /api/v1/health`` on both backends: a batch is acknowledged
by its digest, a bad report is refused alone with the API's error shape while the others are
stored, a body that is no batch is a 422, and the read compares V1 with V2 in one stage; the
engine-health gauges of ``/metrics``."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from service_helpers import Api

from turnout.oracle.errors import ErrorCode
from turnout.oracle.wire import batch_digest

STAGE = "llama-mistral-dense"


def item(**over: Any) -> dict[str, Any]:
    """A report (JSON) whose one-minute window ended a minute ago."""
    end = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    return {
        "report_id": uuid.uuid4().hex,
        "deployment_id": "d0",
        "host": "h",
        "pack": "turnout",
        "runner": "v2",
        "family": "llama",
        "stage": STAGE,
        "window_start": (end - dt.timedelta(minutes=1)).isoformat(),
        "window_end": end.isoformat(),
        "num_requests": 10,
        "num_errors": 1,
        "num_crashes": 0,
        "ttft_p50_ms": 12.5,
        "ttft_p99_ms": 40.0,
        "tpot_p50_ms": 4.0,
        "tpot_p99_ms": 9.0,
        "num_output_tokens": 800,
        "output_tokens_per_s": 160.0,
    } | over


def _post(api: Api, body: Any, role: str = "operator") -> Any:
    return api.client.post("/api/v1/health", json=body, headers=api.h(role))


def _get(api: Api, query: str) -> Any:
    return api.client.get(f"/api/v1/health?{query}", headers=api.h("viewer"))


def test_a_batch_is_stored_once_and_acknowledged_by_its_digest(api: Api) -> None:
    batch = [item(deployment_id=f"d{i}", runner=("v1", "v2")[i % 2]) for i in range(6)]
    ids = [r["report_id"] for r in batch]
    r = _post(api, {"reports": batch})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "accepted": 6,
        "inserted": 6,
        "rejected": [],
        "batch_digest": batch_digest(ids),
    }
    assert _post(api, {"reports": batch}).json()["inserted"] == 0  # a resend stores nothing
    body = _get(api, f"stage={STAGE}").json()
    assert {
        k: (v["num_reports"], v["num_engines"], v["num_requests"], v["num_errors"])
        for k, v in body["by_runner"].items()
    } == {"v1": (3, 3, 30, 3), "v2": (3, 3, 30, 3)}
    assert body["by_runner"]["v2"]["ttft_p99_ms"] == 40.0
    assert body["by_runner"]["v2"]["tokens_per_s"] == pytest.approx(160.0)
    assert body["over_time"]["bucket_s"] == 900  # a day in 15-minute buckets
    assert len(body["over_time"]["buckets"]) == len(body["over_time"]["by_runner"]["v1"])
    assert sum(b["num_reports"] for b in body["over_time"]["by_runner"]["v1"] if b) == 3


BAD = [
    ("wrong_pack", {"pack": "vllm-0.31"}),
    ("unknown_family", {"family": "Llama"}),
    ("unknown_stage", {"stage": "llama-mistral-dens"}),
    (
        "event_in_future",
        {"window_start": "2100-01-01T00:00:00Z", "window_end": "2100-01-01T00:01:00Z"},
    ),
    (
        "event_in_future",
        {
            "window_start": "9999-12-31T23:00:00Z",  # a day later overflows
            "window_end": "9999-12-31T23:30:00Z",
        },
    ),
    (
        "event_too_old",
        {"window_start": "2019-01-01T00:00:00Z", "window_end": "2019-01-01T00:01:00Z"},
    ),
    ("invalid_request", {"deployment_id": "nul\x00"}),  # on every backend (no control char)
    ("invalid_request", {"num_errors": 11}),  # more errors than requests
    ("invalid_request", {"ttft_p99_ms": 1.0}),  # p50 above p99
    ("invalid_request", {"num_requests": "10"}),  # a string, not a number
    ("invalid_request", {"runner": "v3"}),
    ("invalid_request", {"extra": 1}),
    ("invalid_request", {"window_end": "2026-12-01T10:00:00"}),  # no time zone
    # A rate that means generating for longer than a window can last (a denormal rate over
    # many tokens made the aggregate's busy time overflow on PostgreSQL).
    ("invalid_request", {"num_output_tokens": 2**53, "output_tokens_per_s": 5e-324}),
    ("invalid_request", {"num_output_tokens": 10**12, "output_tokens_per_s": 1.0}),
]


def test_a_bad_report_is_refused_alone_and_the_others_stored(api: Api) -> None:
    batch: list[Any] = [item()]
    for _code, over in BAD:
        batch.append(item(**over))
    batch += ["not a report", {"report_id": 7}, item()]
    r = _post(api, {"reports": batch})
    assert r.status_code == 200, r.text
    ack = r.json()
    assert ack["accepted"] == 2 and ack["inserted"] == 2
    want = [(i + 1, code) for i, (code, _) in enumerate(BAD)]
    want += [(len(BAD) + 1, "invalid_request"), (len(BAD) + 2, "invalid_request")]
    assert [(x["index"], x["detail"]["code"]) for x in ack["rejected"]] == want
    assert all(x["detail"]["message"] for x in ack["rejected"])
    assert ack["rejected"][0]["report_id"] == batch[1]["report_id"]
    assert "did you mean 'llama-mistral-dense'" in ack["rejected"][2]["detail"]["message"]
    assert ack["rejected"][-1]["report_id"] is None  # 7 is no report id
    ids = [
        x["report_id"] if isinstance(x, dict) and isinstance(x.get("report_id"), str) else ""
        for x in batch
    ]
    assert ack["batch_digest"] == batch_digest(ids)
    assert _get(api, f"stage={STAGE}").json()["by_runner"]["v2"]["num_reports"] == 2


@pytest.mark.parametrize(
    "body, status",
    [
        ({"reports": []}, 422),
        ({"events": [item()]}, 422),
        ({"reports": item()}, 422),
        ([item()], 422),
        ({"reports": [item()], "more": 1}, 422),
    ],
)
def test_a_body_that_is_no_batch_is_a_422_and_stores_nothing(
    api: Api, body: Any, status: int
) -> None:
    r = _post(api, body)
    assert r.status_code == status
    assert r.json()["detail"]["code"] == ErrorCode.INVALID_REQUEST
    assert _get(api, f"stage={STAGE}").json()["by_runner"] == {}


def test_bytes_that_are_not_json_are_refused_whole(api: Api) -> None:
    r = api.client.post(
        "/api/v1/health",
        content=b'{"reports": [NaN]}',
        headers=api.h("operator") | {"Content-Type": "application/json"},
    )
    assert r.status_code == 422 and "NaN is not a JSON number" in r.json()["detail"]["message"]
    r = api.client.post(
        "/api/v1/health",
        content=b"reports",
        headers=api.h("operator") | {"Content-Type": "text/plain"},
    )
    assert r.status_code == 415


def test_reporting_health_needs_an_operator(api: Api) -> None:
    assert _post(api, {"reports": [item()]}, role="viewer").status_code == 403
    assert api.client.post("/api/v1/health", json={"reports": [item()]}).status_code == 401


@pytest.mark.parametrize(
    "query, status, code",
    [
        ("", 422, "invalid_request"),
        ("stage=llama-dense", 422, "unknown_cohort"),
        (f"stage={STAGE}&family=Llama", 422, "unknown_family"),
        (f"stage={STAGE}&since=yesterday", 422, "invalid_request"),
        (f"stage={STAGE}&since=2026-12-02&until=2026-12-01", 422, "invalid_request"),
        (f"stage={STAGE}&since=0001-01-01", 422, "invalid_request"),
        (f"stage={STAGE}&window=24h", 422, "invalid_request"),  # not a parameter here
    ],
)
def test_a_read_it_cannot_answer_is_a_422_saying_why(
    api: Api, query: str, status: int, code: str
) -> None:
    r = _get(api, query)
    assert r.status_code == status, r.text
    assert r.json()["detail"]["code"] == code


@pytest.mark.parametrize(
    "query, says",
    [
        # times a datetime holds but not in UTC: the message said only "date value out of range"
        ("since=0001-01-01T00:00:00%2B14:00", "since: '0001-01-01T00:00:00+14:00' is out of range"),
        ("until=9999-12-31T23:59:59-23:59", "until: '9999-12-31T23:59:59-23:59' is out of range"),
        ("until=0001-01-01T10:00:00Z", "since: 24 hours before until (0001-01-01T10:00:00+00:00)"),
    ],
)
def test_a_time_out_of_range_is_named(api: Api, query: str, says: str) -> None:
    r = _get(api, f"stage={STAGE}&{query}")
    assert r.status_code == 422, r.text
    assert says in r.json()["detail"]["message"], r.text


def test_a_range_of_its_own_and_a_family(api: Api) -> None:
    old = dt.datetime(2026, 11, 1, 12, tzinfo=dt.UTC)
    _post(
        api,
        {
            "reports": [
                item(
                    window_start=(old - dt.timedelta(minutes=1)).isoformat(),
                    window_end=old.isoformat(),
                    family="mistral",
                ),
                item(),
            ]
        },
    )
    body = _get(api, f"stage={STAGE}&since=2026-11-01&until=2026-11-02").json()
    assert body["by_runner"]["v2"]["num_reports"] == 1
    assert body["over_time"]["bucket_s"] == 900
    assert (
        _get(api, f"stage={STAGE}&since=2026-11-01&until=2026-11-02&family=llama").json()[
            "by_runner"
        ]
        == {}
    )


def test_metrics_show_health_per_stage_and_runner(api: Api) -> None:
    _post(
        api,
        {
            "reports": [
                item(runner="v1", num_crashes=2, tpot_p99_ms=11.0),
                item(runner="v2", deployment_id="d1"),
                item(pack="other"),
            ]
        },
    )
    text = api.client.get("/metrics").text
    labels = f'{{runner="v1",stage="{STAGE}"}}'
    assert f"turnout_engine_crashes{labels} 2.0" in text
    assert f"turnout_engine_tpot_p99_ms{labels} 11.0" in text
    assert f"turnout_engine_error_rate{labels} 0.1" in text
    assert f'turnout_engines_reporting{{runner="v2",stage="{STAGE}"}} 1.0' in text
    assert 'turnout_health_reports_total{outcome="rejected"} 1.0' in text
