"""``GET /api/v1/decisions.csv`` on SQLite and PostgreSQL: RFC 4180 quoting of whatever an
engine reported (commas, quotes, text a spreadsheet would run as a formula), the
Decisions page's filters and time window, roles, and what it refuses."""

from __future__ import annotations

import csv
import datetime as dt
import io

from service_helpers import Api, api_events

from turnout.dashboard.api.exports import COLUMNS

# (A line break or any other control character no longer reaches a cell: the API refuses it
# in every text field of an event, tests/dashboard/test_api_bad_input.py.)
AWKWARD = ['prod,"eu"', 'say "hi"', '=HYPERLINK("http://x")', "+1", "plain/id"]


def _ingest(api: Api, events: list[dict[str, object]]) -> None:
    r = api.client.post("/api/v1/decisions", json={"events": events}, headers=api.h("operator"))
    assert r.status_code == 200, r.text


def _csv(api: Api, role: str | None = "viewer", **params: str) -> list[list[str]]:
    r = api.client.get("/api/v1/decisions.csv", params=params, headers=api.h(role))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/csv; charset=utf-8"
    assert r.headers["content-disposition"] == 'attachment; filename="decisions.csv"'
    return list(csv.reader(io.StringIO(r.text, newline="")))


def test_every_cell_reads_back_as_reported(api: Api) -> None:
    events = api_events(len(AWKWARD), rule_ids=["ngram_speculation", "suffix_speculation"])
    for e, name in zip(events, AWKWARD, strict=True):
        e["deployment_id"] = name
        e["host"] = 'h "1"'
    _ingest(api, events)
    rows = _csv(api)
    assert rows[0] == list(COLUMNS)
    got = {r[2]: r for r in rows[1:]}
    assert sorted(got) == sorted(['\'=HYPERLINK("http://x")', "'+1", *AWKWARD[:2], "plain/id"])
    row = dict(zip(COLUMNS, got['prod,"eu"'], strict=True))
    assert row["host"] == 'h "1"' and row["rule_ids"] == "ngram_speculation suffix_speculation"
    assert row["runner"] == "v1" and row["demo"] == "false" and row["stage"] == ""
    assert dt.datetime.fromisoformat(row["at"]) == dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC)


def test_filters_and_window_select_what_the_page_lists(api: Api) -> None:
    now = dt.datetime.now(dt.UTC)
    recent = api_events(3, at=(now - dt.timedelta(minutes=10)).isoformat(), family="llama")
    old = api_events(4, at=(now - dt.timedelta(days=3)).isoformat())
    for i, e in enumerate(recent + old):
        e["deployment_id"] = f"dep-{i}"
    _ingest(api, recent + old)
    assert len(_csv(api)) == 1 + 7
    assert len(_csv(api, window="1h")) == 1 + 3
    assert len(_csv(api, window="7d", family="qwen3")) == 1 + 4
    assert len(_csv(api, window="custom", to=(now - dt.timedelta(days=1)).isoformat())) == 1 + 4
    assert len(_csv(api, rule_id="ngram_speculation", runner="v1")) == 1 + 7
    assert [r[2] for r in _csv(api, deployment_id="dep-5")[1:]] == ["dep-5"]
    rows = _csv(api)[1:]
    assert [r[0] for r in rows] == sorted((r[0] for r in rows), reverse=True)  # newest first


def test_bad_requests_are_refused(api: Api) -> None:
    assert api.client.get("/api/v1/decisions.csv").status_code == 401
    for params, words in [
        ({"window": "2d"}, "window: '2d' is not a window"),
        ({"window": "24h", "from": "2026-01-01"}, "from/to go with window=custom"),
        ({"from": "soon"}, "from: 'soon' is not a time"),
        ({"windows": "24h"}, "not a parameter of this route"),
        ({"runner": "v3"}, "runner"),
    ]:
        r = api.client.get("/api/v1/decisions.csv", params=params, headers=api.h("viewer"))
        assert r.status_code == 422, (params, r.text)
        assert words in r.json()["detail"]["message"], (params, r.text)
