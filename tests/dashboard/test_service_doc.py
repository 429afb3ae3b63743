"""docs/service.md says what the service does: its API table names real routes, its curl
example works on a database where flips already happened; README.md's curl example sets the
token it sends."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from service_helpers import Api, LiveService, make_tokens, start_service

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "service.md").read_text()


def _section(title: str) -> str:
    start = DOC.index(title)
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end != -1 else None]


def test_every_route_of_the_api_table_is_under_api_v1(api: Api) -> None:
    paths = api.client.get("/api/v1/openapi.json").json()["paths"]
    table = _section("## API (`/api/v1`")
    rows = re.findall(r"^\| (`[^|]+`) \|", table, re.M)
    assert len(rows) > 10
    for row in rows:
        for method_path in re.findall(r"`([^`]+)`", row):
            methods, _, path = method_path.partition(" ")
            full = "/api/v1" + path.split("?")[0].replace("{id}", "{token_id}")
            assert full in paths, (row, full)
            for method in methods.split("/"):
                assert method.lower() in paths[full], (row, method)


def test_the_patch_example_reads_the_version_first(tmp_path: Path, live: list[LiveService]) -> None:
    import httpx

    url = f"sqlite:///{tmp_path / 'doc.db'}"
    token = make_tokens(url)["operator"]
    svc = start_service(url, tmp_path / "svc.log")
    live.append(svc)
    cohort = f"{svc.url}/api/v1/canaries/llama-mistral-dense"
    auth = {"Authorization": f"Bearer {token}"}
    for enabled in (True, False):  # the cohort is at version 3 now, not 1
        r = httpx.patch(
            cohort,
            headers={**auth, "If-Match": httpx.get(cohort, headers=auth).headers["ETag"]},
            json={"enabled": enabled, "reason": "before the doc's example"},
        )
        assert r.status_code == 200, r.text
    flipping = _section("## Flipping a canary")
    block = re.findall(r"```bash\n(.*?)```", flipping, re.S)[-1]
    assert "If-Match" in block
    out = subprocess.run(
        ["bash", "-c", block.replace("http://127.0.0.1:8000", svc.url)],
        env={"TOKEN": token, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    answer = json.loads(out)
    assert answer["enabled"] is True and answer["version"] == 4, out


def test_the_readme_curl_example_creates_the_token_it_sends(
    tmp_path: Path, live: list[LiveService]
) -> None:
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", readme, re.S) if "curl" in b)
    lines = [line for line in block.splitlines() if "turnout decide" not in line]
    assert lines[0].startswith("TOKEN=$(.venv/bin/turnout token create"), lines
    # The checkout's var/ (git ignores it), where make run's database lies: the snapshot goes
    # there, not into the repository root where git status shows it.
    url = f"sqlite:///{tmp_path / 'var' / 'readme.db'}"
    admin = make_tokens(url)["admin"]  # the one the first start prints, which README exports
    svc = start_service(url, tmp_path / "svc.log")
    live.append(svc)
    turnout = f"{sys.executable} -c 'from turnout.oracle.cli import main; main()'"
    script = (
        "\n".join(lines)
        .replace(".venv/bin/turnout", turnout)
        .replace("http://127.0.0.1:8000", svc.url)
    )
    subprocess.run(
        ["bash", "-euc", script],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        env={
            "TURNOUT_URL": svc.url,
            "TURNOUT_TOKEN": admin,
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT / "src"),
        },
    )
    snapshot = json.loads((tmp_path / "var" / "canaries.json").read_text())
    assert snapshot["pack"] == "turnout" and snapshot["cohorts"]


def test_the_settings_table_gives_the_real_ramp_gate_defaults() -> None:
    """TURNOUT_RAMP_GATES's default read "(below)" beside an example (min_engines 3, a day)
    that looked like the defaults and was not (1 engine, 7 days)."""
    from turnout.dashboard.gates import GateConfig

    row = next(line for line in DOC.splitlines() if line.startswith("| `TURNOUT_RAMP_GATES` |"))
    default = row.split(" | ")[1]
    for name, value in GateConfig().model_dump().items():
        assert f"`{name}` {value}" in default, (name, value, default)


def test_the_readme_counts_of_the_demo_fleet_are_the_ones_it_records(tmp_path: Path) -> None:
    """README.md relates make run's "recorded 463 demo decisions" to the 331 recipes and the
    upgrade preview's 235 deployments: the lines that are not bad input are the deployments,
    each started one to three times."""
    from turnout.dashboard import demo
    from turnout.dashboard.app import prepare
    from turnout.dashboard.services import Services
    from turnout.dashboard.settings import Settings
    from turnout.dashboard.upgrade import upgrade_preview

    services = Services.build(Settings(database_url=f"sqlite:///{tmp_path / 'demo.db'}", demo=True))
    num_recorded = prepare(services)  # what make run prints
    records, num_skipped = demo.demo_events(services)
    assert num_recorded == len(records)
    num_recipes = len(demo.RECIPES.read_text().splitlines())
    num_deployments = len({r.deployment_id for r in records})
    assert num_deployments == num_recipes - num_skipped
    assert upgrade_preview(services).num_deployments == num_deployments
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (
        f"of its {num_recipes} recipes the {num_deployments} that are not bad input become "
        "deployments, each started one to three times"
    ) in readme
    assert f"`recorded {num_recorded} demo decisions`" in readme
    assert f"the upgrade preview counts {num_deployments} deployments" in readme


def test_every_image_of_the_doc_is_one_the_screenshot_script_makes() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "screenshots", ROOT / "scripts" / "screenshots.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shown = re.findall(r"!\[[^\]]*\]\(images/([a-z-]+)\.png\)", DOC)
    made = [*script.SHOTS, "canaries-kill-switch"]
    assert sorted(shown) == sorted(made)
    for name in shown:
        assert (ROOT / "docs" / "images" / f"{name}.png").is_file(), name
