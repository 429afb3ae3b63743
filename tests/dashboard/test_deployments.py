"""A deployment page's command line rebuilds exactly the inputs its engine reported: for every
deployment of the demo fleet, ``turnout decide`` with the words the page shows gives the same
config and the same decision; ids reach the page whole, whatever they hold."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from turnout.dashboard.deployments import decide_line, deployment_url, explain_url, set_value
from turnout.dashboard.services import Services
from turnout.dashboard.settings import Settings
from turnout.oracle import decide, from_spec, load_pack
from turnout.oracle.cli import app as oracle_app


@pytest.fixture(scope="module")
def demo_specs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, dict]]:
    from turnout.dashboard.demo import demo_events

    url = f"sqlite:///{tmp_path_factory.mktemp('dep') / 'd.db'}"
    services = Services.build(Settings(database_url=url, demo=False))
    services.db.upgrade()
    records, _skipped = demo_events(services)
    latest = {r.deployment_id: r.config for r in records}
    return sorted(latest.items())


def test_the_command_line_of_every_demo_deployment_decides_its_inputs(
    demo_specs: list[tuple[str, dict]],
) -> None:
    pack = load_pack("turnout")
    runner = CliRunner()
    assert len(demo_specs) > 200
    for deployment_id, spec in demo_specs:
        line = decide_line(spec, deployment_id=deployment_id, pack="turnout")
        assert line.missing == [] and line.words[:2] == ["turnout", "decide"]
        result = runner.invoke(oracle_app, [*line.words[1:], "--json"])
        assert result.exit_code in (0, 3), (line.text(), result.output)
        got = json.loads(result.stdout)
        want = decide(from_spec({**spec, "deployment_id": deployment_id}), pack=pack)
        assert (got["runner"], got["reason_code"], [r["rule_id"] for r in got["reasons"]]) == (
            want.runner,
            want.reason_code,
            [r.rule_id for r in want.reasons],
        ), line.text()


def test_set_values_read_back_or_are_named_missing() -> None:
    assert set_value("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    assert [set_value(v) for v in (True, 8, 0.5, None, ["a", "b"], {"k": 1})] == [
        "true",
        "8",
        "0.5",
        "null",
        '["a","b"]',
        '{"k":1}',
    ]
    for text in ("8", "true", "[x]", " padded", ""):  # --set would read these as other values
        assert set_value(text) is None
    line = decide_line(
        {"architecture": "LlamaForCausalLM", "model": "8"},
        deployment_id="d",
        pack="turnout",
        turnout=".venv/bin/turnout",
    )
    assert line.missing == ["model"]
    assert line.text() == (
        ".venv/bin/turnout decide --pack turnout --deployment-id d --architecture LlamaForCausalLM"
    )


def test_ids_and_inputs_travel_in_urls_whole() -> None:
    assert deployment_url("demo/recipe-0008") == "/deployments/demo%2Frecipe-0008"
    assert deployment_url("a/../b?c#d") == "/deployments/a%2F..%2Fb%3Fc%23d"
    assert explain_url({"architecture": "X", "deployment_id": "d"}) == (
        "/explain?config=%7B%22architecture%22%3A+%22X%22%7D"
    )
