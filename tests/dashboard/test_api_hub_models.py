"""POST /api/v1/decide resolves a command line's model through the HF cache and the hub (a real
local server answering huggingface_hub's file API, tests/hub_server.py), off the event loop,
and names a gated model or a missing revision with their own codes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_server import HubServer, Repo, start_hub
from service_helpers import Api

from turnout.oracle.errors import ErrorCode
from turnout.oracle.sources.hub import forget_hub_failures

CONFIGS = Path(__file__).resolve().parents[2] / "policies" / "reference" / "model_configs"


@pytest.fixture
def hub(api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    monkeypatch.setattr(api.services.settings, "hub_online", True)  # TURNOUT_HUB_ONLINE=1
    moe = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())["config"]
    repo, gated = Repo(), Repo(gated_token="hf_granted")
    repo.add_commit("moe main", {"config.json": moe}, "main", "v2")
    gated.add_commit("gated main", {"config.json": moe}, "main")
    server = start_hub({"acme/moe-from-hub": repo, "acme/gated": gated})
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    forget_hub_failures()
    yield server
    server.stop()
    forget_hub_failures()


def _decide(api: Api, command: str) -> tuple[int, dict[str, object]]:
    r = api.client.post("/api/v1/decide", headers=api.h("viewer"), json={"command": command})
    return r.status_code, r.json()


def test_decide_reads_the_models_config_from_the_hub(api: Api, hub: HubServer) -> None:
    status, body = _decide(api, "vllm serve acme/moe-from-hub --revision v2 -tp 2")
    assert status == 200, body
    assert body["family"] == "qwen3_moe"  # known to the hub alone, not to known_models.yaml


def test_gated_and_missing_revisions_have_their_codes(api: Api, hub: HubServer) -> None:
    status, body = _decide(api, "vllm serve acme/gated")
    assert status == 422 and body["detail"]["code"] == ErrorCode.GATED_MODEL, body  # type: ignore[index]
    status, body = _decide(api, "vllm serve acme/moe-from-hub --revision nope")
    assert status == 422, body
    assert body["detail"]["code"] == ErrorCode.REVISION_NOT_FOUND  # type: ignore[index]
    assert "has no revision 'nope'" in body["detail"]["message"]  # type: ignore[index]


def test_the_service_stays_off_the_hub_unless_told(
    api: Api, hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api.services.settings, "hub_online", False)  # the default
    status, body = _decide(api, "vllm serve acme/moe-from-hub --revision v2")
    assert status == 422 and body["detail"]["code"] == ErrorCode.UNKNOWN_MODEL, body  # type: ignore[index]


@pytest.mark.parametrize(
    "command",
    [
        "vllm serve Qwen/Qwen3-8B --config {secret}",
        "vllm serve Qwen/Qwen3-8B --hf-config-path {json}",
        "vllm serve {json}",
        "vllm serve {dir}",
    ],
)
def test_a_request_never_reads_the_servers_files(api: Api, tmp_path: Path, command: str) -> None:
    # A --config file's keys became flags, and a refusal echoed them (a password in an error).
    secret = tmp_path / "secrets.yaml"
    secret.write_text("db_password: hunter2\n")
    leak = tmp_path / "model" / "config.json"
    leak.parent.mkdir()
    leak.write_text(json.dumps({"architectures": ["TOPSECRET_ARCH"], "model_type": "x"}))
    line = command.format(secret=secret, json=leak, dir=leak.parent)
    status, body = _decide(api, line)
    assert status == 422 and body["detail"]["code"] == ErrorCode.LOCAL_FILE, body  # type: ignore[index]
    assert "hunter2" not in json.dumps(body) and "TOPSECRET" not in json.dumps(body)
