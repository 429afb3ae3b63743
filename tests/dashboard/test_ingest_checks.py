"""Ingest stores only what its pack knows, on SQLite and PostgreSQL: events of another pack,
families and stages the pack does not have, configs over the size bound and times more than
the allowed clock skew ahead are refused with a 422 naming the event, the field and the value,
and the batch is refused whole (nothing stored), as for any bad event."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_helpers import Api, ack, api_events, role_tokens

from turnout.dashboard.app import create_app
from turnout.dashboard.services import Services
from turnout.dashboard.settings import Settings
from turnout.oracle.errors import ErrorCode


def _post(api: Api, events: list[dict[str, Any]]) -> Any:
    return api.client.post("/api/v1/decisions", json={"events": events}, headers=api.h("operator"))


def _stored(api: Api) -> int:
    return len(api.client.get("/api/v1/decisions?limit=1000", headers=api.h("viewer")).json())


def _refused(api: Api, r: Any, kind: str, loc: list[Any], message: str) -> dict[str, Any]:
    assert r.status_code == 422, r.text
    detail: dict[str, Any] = r.json()["detail"]
    assert detail["code"] == ErrorCode.INVALID_REQUEST
    (err,) = detail["errors"]
    assert (err["type"], err["loc"]) == (kind, ["body", *loc]), err
    assert detail["message"].startswith(message), detail["message"]
    assert _stored(api) == 0  # the good events of the batch are not stored either
    return err


@pytest.mark.parametrize(
    "family, message",
    [
        ("Qwen3", "body field events[1].family: unknown family 'Qwen3' (did you mean 'qwen3'?)"),
        (
            "qwen3-canary",
            "body field events[1].family: 'qwen3-canary' is a cohort id, not a family",
        ),
        (
            "nonesuch",
            "body field events[1].family: unknown family 'nonesuch'; the pack's families: afmoe, ",
        ),
    ],
)
def test_a_family_the_pack_does_not_have_is_refused(api: Api, family: str, message: str) -> None:
    # Before: stored, and counted in the fallback ranking under a family no page lists.
    batch = api_events(3)
    batch[1]["family"] = family
    err = _refused(
        api, _post(api, batch), ErrorCode.UNKNOWN_FAMILY, ["events", 1, "family"], message
    )
    assert err["input"] == family


def test_the_unknown_family_of_an_unplaceable_deployment_is_taken(api: Api) -> None:
    # oracle.client reports "unknown" when the oracle placed a deployment in no family.
    batch = api_events(1, family="unknown", runner=None, reason_code="ERROR")
    assert _post(api, batch).json() == ack(batch, 1)


def test_a_stage_the_pack_does_not_have_is_refused(api: Api) -> None:
    r = _post(api, api_events(2, stage="qwen3-canery"))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert [e["loc"] for e in detail["errors"]] == [["body", "events", i, "stage"] for i in (0, 1)]
    assert detail["message"].startswith(
        "body field events[0].stage: unknown stage 'qwen3-canery' (did you mean "
        "'qwen3-canary'?); the stages of pack turnout: qwen3-canary, "
    )
    assert _stored(api) == 0
    assert _post(api, api_events(2, stage="qwen3-canary")).json()["inserted"] == 2


def test_an_event_of_another_pack_is_refused(api: Api) -> None:
    _refused(
        api,
        _post(api, api_events(1, pack="vllm-0.31")),
        "wrong_pack",
        ["events", 0, "pack"],
        "body field events[0].pack: 'vllm-0.31' is not the pack this service runs ('turnout')",
    )


def test_a_config_over_the_bound_is_refused_and_one_at_it_stored(api: Api) -> None:
    # Before: a 31 MiB config was stored, and /impact then took a second and 86 MiB.
    limit = api.services.settings.max_config_bytes
    padding = limit - len(json.dumps({"model": ""}, separators=(",", ":")))
    big = {"model": "m" * (padding + 1)}
    err = _refused(
        api,
        _post(api, api_events(1, config=big)),
        "config_too_large",
        ["events", 0, "config"],
        f"body field events[0].config: the config is "
        f"{limit + 1} bytes as JSON; at most {limit} are stored "
        "(TURNOUT_MAX_CONFIG_BYTES)",
    )
    assert err["input"] == f"{limit + 1} bytes"  # not the config itself
    at_limit = {"model": "m" * padding}
    assert _post(api, api_events(1, config=at_limit)).json()["inserted"] == 1


def test_a_config_with_a_number_beyond_a_float_is_refused(api: Api) -> None:
    body = json.dumps({"events": api_events(1, config={"cpu_offload_gb": "@"})}).replace(
        '"@"', "1e400"
    )
    r = api.client.post("/api/v1/decisions", content=body, headers=api.h("operator"))
    _refused(
        api,
        r,
        "non_finite_number",
        ["events", 0, "config"],
        "body field events[0].config: the config holds a number too large",
    )


def test_a_time_beyond_the_clock_skew_is_refused_and_one_within_it_stored(api: Api) -> None:
    # Before: up to 24 h ahead was taken, and one such event pinned its deployment's latest
    # decision (and the fallback pages) for a day.
    now = dt.datetime.now(dt.UTC)
    ahead = (now + dt.timedelta(minutes=10)).isoformat()
    r = _post(api, api_events(1, at=ahead))
    # The service reads its clock while handling the request, so on a busy machine the lead it
    # states is 600 s less the seconds the request took to reach it (CI once measured 597 s).
    elapsed_s = (dt.datetime.now(dt.UTC) - now).total_seconds()
    _refused(
        api, r, "event_in_future", ["events", 0, "at"], f"body field events[0].at: {ahead} is "
    )
    message = r.json()["detail"]["message"]
    found = re.search(r" is (\d+) s ahead of the service's clock \(", message)
    assert found, message
    assert 600 - elapsed_s - 1 <= int(found.group(1)) <= 600, (message, elapsed_s)
    assert message.endswith(
        "at most 300 s are taken (TURNOUT_MAX_CLOCK_SKEW_S): check the engine host's clock"
    )
    soon = (now + dt.timedelta(minutes=4)).isoformat()
    assert _post(api, api_events(1, at=soon)).json()["inserted"] == 1


def test_a_time_before_2020_is_refused(api: Api) -> None:
    _refused(
        api,
        _post(api, api_events(1, at="2019-12-31T23:59:59+00:00")),
        "event_too_old",
        ["events", 0, "at"],
        "body field events[0].at: 2019-12-31T23:59:59+00:00 is before 2020-01-01",
    )


@pytest.fixture
def strict_api(db_url: str) -> Iterator[Api]:
    settings = Settings(database_url=db_url, demo=False, max_clock_skew_s=0, max_config_bytes=2048)
    services = Services.build(settings)
    with TestClient(create_app(services=services)) as client:
        yield Api(client, services, role_tokens(services.db))


def test_the_skew_and_the_config_bound_are_settings(strict_api: Api) -> None:
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)).isoformat()
    r = _post(strict_api, api_events(1, at=later))
    assert "at most 0 s are taken" in r.json()["detail"]["message"]
    r = _post(strict_api, api_events(1, config={"model": "m" * 3000}))
    assert "at most 2048 are stored" in r.json()["detail"]["message"]
    assert _stored(strict_api) == 0


def test_a_rule_id_the_pack_cannot_produce_is_refused(api: Api) -> None:
    # Before: any text was taken; 5,000 events of 200 made-up ids made 1,000,000 fallback
    # keys (4 M latest_counts rows) that nothing removed.
    batch = api_events(3)
    batch[2]["rule_ids"] = ["ngram_speculation", "ngram_speculaton", "made.up.1", "made.up.2"]
    err = _refused(
        api,
        _post(api, batch),
        "unknown_rule",
        ["events", 2, "rule_ids", 1],
        "body field events[2].rule_ids[1]: rule id 'ngram_speculaton' "
        "(did you mean 'ngram_speculation'?) and 2 more unknown: not a rule id of pack turnout",
    )
    assert err["input"] == "ngram_speculaton"


def test_a_million_made_up_rule_ids_add_no_fallback_key(api: Api) -> None:
    made_up = [f"made.up.{i:03d}" for i in range(200)]
    r = _post(api, api_events(5000, rule_ids=made_up))
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert {e["type"] for e in detail["errors"]} == {"unknown_rule"}
    listed = detail["message"].count("rule id 'made.up.000' and 199 more unknown")
    more = re.search(r"; and (\d+) more$", detail["message"])
    assert more and listed + int(more.group(1)) == 5000  # one finding per event, not per id
    fb = api.client.get("/api/v1/fallbacks?window=all", headers=api.h("viewer")).json()
    assert fb["num_deployments"] == 0 and fb["ranked"] == []
    # every id a real decision carries is taken: rules, steps, pins, errors, the rollout's
    real = ["ngram_speculation", "pin.v1", "error.unknown_architecture", "rollout.stage_off"]
    assert _post(api, api_events(2, rule_ids=real)).status_code == 200


def _launch(vllm_pack: str) -> dict[str, Any]:
    return {"vllm_version": "0.31.0", "vllm_pack": vllm_pack, "snapshot_source": "service"}


def test_a_launch_event_may_name_its_release_packs_rule_ids(api: Api) -> None:
    # turnout launch decides with the vLLM release's pack and reports under the service's:
    # a rule of vllm-0.31 only (not of the turnout pack) is taken from such an event.
    taken = api_events(1, rule_ids=["dbo_with_hybrid"], launch=_launch("vllm-0.31"))
    assert _post(api, taken).status_code == 200
    plain = api_events(1, rule_ids=["dbo_with_hybrid"])  # from a plain engine: not ours
    r = _post(api, plain)
    assert r.status_code == 422 and "not a rule id of pack turnout (" in r.text
    unknown = api_events(1, rule_ids=["dbo_with_hybrid"], launch=_launch("vllm-9.9"))
    r = _post(api, unknown)
    assert r.status_code == 422
    assert "'vllm-9.9' (the launch's vllm_pack), a pack this service does not ship" in r.text
