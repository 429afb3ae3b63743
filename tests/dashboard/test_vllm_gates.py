"""The default PromQL gates read metrics vLLM exports, under the names, types and labels of
its own metrics code (``policies/reference/vllm-*/metrics.json``, written by ``python -m
referee metrics`` from each release's vllm/v1/metrics/loggers.py), and turnout's engine
exports them too; each gate renders for a stage and validates as a ramp's gates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnout.dashboard.gates import GateConfig
from turnout.dashboard.vllm_gates import VLLM_DEFAULT_GATES, metric_names

REFERENCE = Path(__file__).resolve().parents[2] / "policies" / "reference"
TABLES = sorted(REFERENCE.glob("vllm-*/metrics.json"))


def test_every_release_a_pack_covers_has_a_table() -> None:
    packs = sorted(p.name for p in REFERENCE.parent.glob("vllm-*") if p.is_dir())
    assert packs and [t.parent.name for t in TABLES] == packs
    for table in TABLES:
        release = json.loads(table.read_text())["vllm_version"]
        assert table.parent.name == "vllm-" + ".".join(release.split(".")[:2])


@pytest.mark.parametrize("table", TABLES, ids=lambda p: p.parent.name)
def test_every_metric_is_vllms(table: Path) -> None:
    metrics = {m["name"]: m for m in json.loads(table.read_text())["metrics"]}
    kinds = {"time_to_first_token_seconds": "histogram", "inter_token_latency_seconds":
             "histogram", "request_success": "counter", "num_preemptions": "counter",
             "num_requests_running": "gauge"}  # fmt: skip
    for gate in VLLM_DEFAULT_GATES:
        for name in metric_names(gate.query):
            assert name in metrics, f"{gate.name}: {name} is not in {table}"
            assert metrics[name]["type"] == kinds[name.removeprefix("vllm:")]
        if "finished_reason" in gate.query:
            assert "finished_reason" in metrics["vllm:request_success"]["labelnames"]


def test_turnouts_engine_exports_them() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from turnout.serving.metrics import ServingMetrics

    metrics = ServingMetrics("m", 512, {"runner": "v2"})
    exported = {
        f.name for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
    }
    for gate in VLLM_DEFAULT_GATES:
        for name in metric_names(gate.query):
            assert name in exported, f"{gate.name}: turnout's engine does not export {name}"


def test_they_render_and_validate() -> None:
    config = GateConfig.model_validate({"promql": [g.model_dump() for g in VLLM_DEFAULT_GATES]})
    for gate in config.promql:
        query = gate.render("qwen3-canary")
        assert "$" not in query
        assert 'turnout_stage="qwen3-canary",turnout_cohort="canary"' in query
        assert 'turnout_cohort="baseline"' in query
        assert query.count("(") == query.count(")")


def test_the_cli_reads_promql_gates_from_a_file_or_the_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import typer

    from turnout.dashboard.cli_rollout import promql_gates

    assert [g["name"] for g in promql_gates("vllm-defaults")] == [
        g.name for g in VLLM_DEFAULT_GATES
    ]
    good = tmp_path / "gates.yaml"
    good.write_text("- {name: up, query: 'sum(up)', comparison: '>=', threshold: 1}\n")
    assert promql_gates(str(good))[0]["window"] == "5m"
    cases = {
        "- {name: up\n  query: [\n": "gates.yaml:",  # YAML that does not parse: file:line
        "{name: up}\n": "a list of gates",
        "- {name: up, query: '$nope', comparison: '<', threshold: 1}\n": "unknown placeholder",
        "- {name: up, query: up, comparison: '=', threshold: 1}\n": "comparison",
    }
    for text, says in cases.items():
        good.write_text(text)
        with pytest.raises(typer.Exit) as exited:
            promql_gates(str(good))
        assert exited.value.exit_code == 2
        error = capsys.readouterr().err
        assert error.startswith("error: --promql ") and says in error, (text, error)
