"""A real ``turnout engine serve`` (SmolLM2 on CPU) registers with a real service: it shows in
Prometheus' HTTP SD body with the runner it serves (the same as its ``x-turnout-runner``
header), its /metrics answers at the address the service lists, and SIGTERM's drain ends
the registration, so the target leaves at once."""

from __future__ import annotations

from pathlib import Path

import httpx
from service_helpers import make_tokens, start_service
from serving_helpers import SMOLLM2, start_server


def test_engine_serve_registers_and_leaves(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'turnout.db'}"
    tokens = make_tokens(db_url)
    service = start_service(db_url, tmp_path / "service.log")
    engine = None
    try:
        engine = start_server(
            SMOLLM2,
            tmp_path / "engine.log",
            "--max-model-len",
            "512",
            env={
                "TURNOUT_URL": service.url,
                "TURNOUT_TOKEN": tokens["engine"],
                "TURNOUT_CACHE_DIR": str(tmp_path / "cache"),
                "TURNOUT_DEPLOYMENT_ID": "smol-1",
            },
        )
        runner = httpx.get(engine.base_url + "/models", timeout=10).headers["x-turnout-runner"]
        viewer = {"Authorization": f"Bearer {tokens['viewer']}"}
        groups: list[dict[str, object]] = []
        for _ in range(100):  # the registration goes out from the client's thread
            groups = httpx.get(service.url + "/api/v1/prometheus/targets", headers=viewer).json()
            if groups:
                break
            httpx.get(service.url + "/healthz")  # (a short wait that does some work)
        assert len(groups) == 1, groups
        (group,) = groups
        address = engine.url.removeprefix("http://")
        assert group["targets"] == [address]
        labels = group["labels"]
        assert isinstance(labels, dict)
        assert labels["turnout_deployment"] == "smol-1"
        assert labels["turnout_runner"] == runner
        assert labels["turnout_family"] == "llama"
        assert labels["turnout_engine"] == "turnout"
        scraped = httpx.get(f"http://{address}{labels['__metrics_path__']}", timeout=10)
        assert "vllm:num_requests_running" in scraped.text

        engine.terminate()
        assert engine.proc.wait(60) == 0
        after = httpx.get(service.url + "/api/v1/prometheus/targets", headers=viewer).json()
        assert after == []
        assert "registered with the rollout-control service" in engine.log.read_text()
    finally:
        if engine is not None:
            engine.stop()
        service.stop()
