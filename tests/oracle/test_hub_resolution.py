"""Model ids resolved as vLLM resolves them: a local directory, the HF cache, the hub (a real
HTTP server on 127.0.0.1 answering huggingface_hub's file API, tests/hub_server.py),
then policies/known_models.yaml. huggingface_hub itself runs unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_server import HubServer, Repo, commit_of, start_hub

from turnout.oracle import ConfigError, ErrorCode, from_command
from turnout.oracle.sources.command import command_to_fields
from turnout.oracle.sources.hub import forget_hub_failures, resolve_model_config

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = json.loads((ROOT / "policies/reference/model_configs/qwen3-8b.json").read_text())["config"]
DSV2 = json.loads((ROOT / "policies/reference/model_configs/deepseek-v2-lite.json").read_text())
MAIN = commit_of("tiny main")
V1 = commit_of("tiny v1")


def _repos() -> dict[str, Repo]:
    tiny = Repo()
    tiny.add_commit("tiny main", {"config.json": QWEN3}, "main")
    tiny.add_commit("tiny v1", {"config.json": DSV2["config"]}, "v1")
    gated = Repo(gated_token="hf_granted")
    gated.add_commit("gated main", {"config.json": QWEN3}, "main")
    weights_only = Repo()
    weights_only.add_commit("gguf main", {"model.gguf": b"GGUF"}, "main")
    known_gated = Repo(gated_token="hf_granted")  # also in known_models.yaml
    known_gated.add_commit("llama main", {"config.json": QWEN3}, "main")
    return {
        "acme/tiny": tiny,
        "acme/gated": gated,
        "acme/weights-only": weights_only,
        "meta-llama/Llama-3.1-8B-Instruct": known_gated,
    }


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    server = start_hub(_repos())
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    forget_hub_failures()
    yield server
    server.stop()
    forget_hub_failures()


def test_online_download_then_the_cache_with_the_hub_offline_and_stopped(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = resolve_model_config("acme/tiny")
    assert (got.source, got.commit, got.revision) == ("hub", MAIN, None)
    assert got.fields()["architecture"] == "Qwen3ForCausalLM"
    assert got.path is not None and Path(got.path).is_relative_to(os.environ["HF_HUB_CACHE"])
    assert ("HEAD", "/acme/tiny/resolve/main/config.json", None) in hub.requests
    assert any(m == "GET" for m, _, _ in hub.requests)
    hub.stop()
    seen = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cached = resolve_model_config("acme/tiny")
    assert (cached.source, cached.commit, cached.config) == ("hf_cache", MAIN, got.config)
    assert len(hub.requests) == seen


def test_the_cache_comes_before_the_hub(hub: HubServer) -> None:
    resolve_model_config("acme/tiny")
    seen = len(hub.requests)
    assert resolve_model_config("acme/tiny").source == "hf_cache"
    assert len(hub.requests) == seen


def test_a_pinned_revision_reads_that_revision_online_and_from_the_cache(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = command_to_fields("vllm serve acme/tiny --revision v1 -tp 2", {})
    assert parsed.model_source is not None
    assert (parsed.model_source.source, parsed.model_source.commit) == ("hub", V1)
    assert parsed.fields["architecture"] == "DeepseekV2ForCausalLM"
    assert parsed.fields["use_mla"] is True and parsed.fields["tensor_parallel_size"] == 2
    assert "_revision" not in parsed.fields and parsed.ignored == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for revision in ("v1", V1):  # the tag through the cache's refs/, and the commit itself
        got = resolve_model_config("acme/tiny", revision)
        assert (got.source, got.commit, got.fields()["is_moe"]) == ("hf_cache", V1, True)
    assert resolve_model_config("meta-llama/Llama-3.1-8B-Instruct", "v1").source == "known_models"


def test_a_revision_the_hub_does_not_have_is_named(hub: HubServer) -> None:
    with pytest.raises(ConfigError) as info:
        from_command("vllm serve acme/tiny --revision no-such-branch")
    assert info.value.code is ErrorCode.REVISION_NOT_FOUND
    assert info.value.message == (
        f"model 'acme/tiny': the hub {hub.url} has no revision 'no-such-branch' of it; pass "
        "--revision with one of its branches, tags or commits"
    )


def test_a_model_the_hub_lacks_falls_back_to_known_models_then_to_the_unknown_error(
    hub: HubServer,
) -> None:
    known = resolve_model_config("Qwen/Qwen3-8B")
    assert known.source == "known_models" and known.fields()["architecture"] == "Qwen3ForCausalLM"
    assert f"the hub {hub.url} has no such model (or it is private to other tokens)" in known.notes
    with pytest.raises(ConfigError) as info:
        from_command("vllm serve arcee-ai/Trinity-Large-Thinking", hint_for="cli")
    assert info.value.code is ErrorCode.UNKNOWN_MODEL
    cache = os.environ["HF_HUB_CACHE"]
    assert info.value.message == (
        "model 'arcee-ai/Trinity-Large-Thinking' is not in policies/known_models.yaml and its "
        f"config.json was not found (not a local directory; not in the HF cache {cache} at "
        f"revision main; the hub {hub.url} has no such model (or it is private to other "
        "tokens)); by its name it may be AfmoeForCausalLM (AFMoE (Trinity)) (check the model's "
        "config.json); pass --architecture ARCH or --config path/to/config.json, or add "
        '--hf-overrides \'{"architectures": ["ARCH"]}\' to the command'
    )


def test_a_refusal_is_remembered_and_not_asked_again(hub: HubServer) -> None:
    resolve_model_config("Qwen/Qwen3-8B")
    seen = len(hub.requests)
    assert resolve_model_config("Qwen/Qwen3-8B").source == "known_models"
    assert len(hub.requests) == seen
    forget_hub_failures()
    resolve_model_config("Qwen/Qwen3-8B")
    assert len(hub.requests) == seen + 1


def test_a_repository_without_config_json_is_named(hub: HubServer) -> None:
    with pytest.raises(ConfigError) as info:
        from_command("vllm serve acme/weights-only")
    assert info.value.code is ErrorCode.UNKNOWN_MODEL
    assert (
        f"the hub {hub.url} has the model but no config.json at revision main" in info.value.message
    )


def test_a_hub_that_is_down_falls_back_fast_and_is_not_asked_again(hub: HubServer) -> None:
    hub.stop()
    start = time.perf_counter()
    got = resolve_model_config("Qwen/Qwen3-8B")
    assert time.perf_counter() - start < 2.0  # no retries with backoff
    assert got.source == "known_models"
    assert any(
        n.startswith(f"the hub {hub.url} could not be reached (ConnectError") for n in got.notes
    ), got.notes
    again = resolve_model_config("meta-llama/Llama-3.1-8B-Instruct")
    assert again.notes[-1].endswith("; not asked again for 60 s"), again.notes


def test_a_gated_model_needs_hf_token(hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as info:
        from_command("vllm serve acme/gated")
    assert info.value.code is ErrorCode.GATED_MODEL
    assert info.value.message.startswith(
        "model 'acme/gated' is gated and not in policies/known_models.yaml ("
    )
    assert "a gated model, and HF_TOKEN is not set (ask for access" in info.value.message
    monkeypatch.setenv("HF_TOKEN", "hf_not_granted")
    with pytest.raises(ConfigError, match="HF_TOKEN gives no access to it") as info:
        from_command("vllm serve acme/gated")
    assert info.value.code is ErrorCode.GATED_MODEL
    monkeypatch.setenv("HF_TOKEN", "hf_granted")
    got = resolve_model_config("acme/gated")
    assert got.source == "hub" and got.fields()["architecture"] == "Qwen3ForCausalLM"
    assert hub.requests[-1][2] == "Bearer hf_granted"


def test_a_gated_model_known_to_known_models_decides_with_its_facts(hub: HubServer) -> None:
    got = resolve_model_config("meta-llama/Llama-3.1-8B-Instruct")
    assert got.source == "known_models"
    assert got.fields()["architecture"] == "LlamaForCausalLM"
    assert any("a gated model, and HF_TOKEN is not set" in n for n in got.notes)
    assert got.describe().startswith(
        "meta-llama/Llama-3.1-8B-Instruct from policies/known_models.yaml (not a local directory; "
    )


def test_hf_hub_offline_never_touches_the_network(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    got = resolve_model_config("Qwen/Qwen3-8B")
    assert got.source == "known_models"
    assert got.notes[-1] == "the hub was not asked (HF_HUB_OFFLINE=1)"
    with pytest.raises(ConfigError, match=r"the hub was not asked \(HF_HUB_OFFLINE=1\)\)"):
        from_command("vllm serve acme/tiny")  # on the hub, never asked
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(ConfigError, match=r"the hub was not asked \(offline=True\)"):
        from_command("vllm serve acme/tiny", offline=True)
    assert hub.requests == []


def test_a_command_lines_own_hf_variables_do_not_steer_the_lookup(hub: HubServer) -> None:
    parsed = command_to_fields(
        "HF_ENDPOINT=http://10.0.0.1 HF_HUB_OFFLINE=1 vllm serve acme/tiny", {}
    )
    assert parsed.model_source is not None and parsed.model_source.source == "hub"
    assert parsed.ignored_env == ["HF_ENDPOINT", "HF_HUB_OFFLINE"]


def test_local_directories_and_hf_config_path(hub: HubServer, tmp_path: Path) -> None:
    local = tmp_path / "cfg"
    local.mkdir()
    (local / "config.json").write_text(json.dumps(DSV2["config"]))
    got = command_to_fields(f"vllm serve {local} --revision v9", {}).model_source
    assert got is not None and (got.source, got.path) == ("local", str(local / "config.json"))
    via = command_to_fields(f"vllm serve acme/tiny --hf-config-path {local}", {})
    assert via.fields["architecture"] == "DeepseekV2ForCausalLM" and hub.requests == []
    hub_cfg = command_to_fields("vllm serve ./weights --hf-config-path acme/tiny", {})
    assert hub_cfg.fields["architecture"] == "Qwen3ForCausalLM"
    with pytest.raises(ConfigError) as info:
        from_command(f"vllm serve {tmp_path / 'nowhere'}")
    assert info.value.code is ErrorCode.UNKNOWN_MODEL
    assert (
        "config.json was not found (not a local directory with a config.json)" in info.value.message
    )
    with pytest.raises(ConfigError, match="--hf-config-path 'acme/missing' is not in"):
        from_command("vllm serve acme/tiny --hf-config-path acme/missing")


def test_bad_timeout_is_named(hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "soon")
    with pytest.raises(
        ConfigError, match="HF_HUB_ETAG_TIMEOUT: expected a positive number of seconds, got 'soon'"
    ):
        from_command("vllm serve acme/tiny")


def test_turnout_decide_reads_the_hub_and_says_so(hub: HubServer, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "400"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "turnout.oracle.cli",
            "decide",
            "--",
            "vllm",
            "serve",
            "acme/tiny",
            "--revision",
            "v1",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "family deepseek" in out.stdout
    assert f"model config acme/tiny at revision v1 from the hub (commit {V1[:12]}): " in out.stdout


def test_a_cache_that_cannot_be_written_is_not_taken_for_the_network(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HF_HUB_CACHE", str(blocker / "hub"))
    for _ in range(2):  # not remembered as an unreachable hub: asked again
        with pytest.raises(ConfigError) as info:
            from_command("vllm serve acme/tiny")
        assert (
            f"reading config.json from the hub {hub.url} failed (NotADirectoryError"
            in info.value.message
        )
    assert sum(m == "HEAD" and p.endswith("/main/config.json") for m, p, _ in hub.requests) >= 2
