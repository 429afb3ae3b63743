"""``turnout decide`` / ``explain --canaries FILE`` with the body of the service's
``GET /api/v1/canaries`` decide as ``POST /api/v1/decide`` does, and every human-readable
result says which canaries it used."""

from __future__ import annotations

import json
from pathlib import Path

from service_helpers import Api
from typer.testing import CliRunner

from turnout.oracle.cli import app
from turnout.oracle.errors import ErrorCode

LLAMA = ["--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]


def _turnout(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_the_service_snapshot_file_decides_as_the_service(api: Api, tmp_path: Path) -> None:
    # After a flip, turnout decide kept the rollout.yaml defaults (DISABLED) while POST
    # /decide said V2, and a file of GET /canaries was refused with a raw exception text.
    url = "/api/v1/canaries/llama-mistral-dense"
    version = api.client.get(url, headers=api.h("viewer")).json()["version"]
    flip = api.client.patch(
        url,
        json={"enabled": True, "reason": "parity green"},
        headers={**api.h("operator"), "If-Match": f'"{version}"'},
    )
    assert flip.status_code == 200, flip.text
    snapshot = api.client.get("/api/v1/canaries", headers=api.h("viewer"))
    served = api.client.post(
        "/api/v1/decide",
        headers=api.h("viewer"),
        json={"command": "vllm serve meta-llama/Llama-3.1-8B-Instruct"},
    )
    assert served.json()["runner"] == "v2"
    path = tmp_path / "snap.json"
    path.write_text(snapshot.text)

    code, out = _turnout("decide", "--canaries", str(path), *LLAMA)
    assert code == 0 and "runner V2" in out, out
    flat = " ".join(out.split())
    assert (
        f"canaries: {path} (service snapshot of pack turnout, last change "
        f"llama-mistral-dense v{version + 1} at "
    ) in flat
    assert "stages on: qwen3-canary, llama-mistral-dense)" in flat

    code, out = _turnout("decide", "--json", "--canaries", str(path), *LLAMA)
    assert json.loads(out)["runner"] == served.json()["runner"]
    assert json.loads(out)["policy_digest"] == served.json()["policy_digest"]

    code, out = _turnout("explain", "--canaries", str(path), *LLAMA)
    assert "runner V2" in out and "canary:llama-mistral-dense off" not in out
    assert f"canaries: {path} (service snapshot" in " ".join(out.split())


def test_without_a_file_the_output_says_it_used_the_pack_defaults() -> None:
    for command in ("decide", "explain"):
        code, out = _turnout(command, *LLAMA)
        assert code == 0 and "runner V1" in out
        assert (
            "canaries: rollout.yaml defaults of pack turnout (pass --canaries FILE, e.g. "
            "the service's GET /api/v1/canaries, to decide with the live ones)"
        ) in " ".join(out.split()), out


def test_a_snapshot_of_another_pack_is_refused(api: Api, tmp_path: Path) -> None:
    path = tmp_path / "snap.json"
    path.write_text(api.client.get("/api/v1/canaries", headers=api.h("viewer")).text)
    code, out = _turnout("decide", "--pack", "vllm-0.31", "--canaries", str(path), *LLAMA)
    assert code == 2
    assert "the snapshot is of pack 'turnout', the decision uses pack 'vllm-0.31'" in out


def test_an_unknown_model_hint_is_worded_for_the_api(api: Api) -> None:
    # POST /decide said "pass --architecture ARCH or --config", flags it does not take.
    r = api.client.post(
        "/api/v1/decide",
        headers=api.h("viewer"),
        json={"command": "vllm serve arcee-ai/Trinity-Large-Thinking"},
    )
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail["code"] == ErrorCode.UNKNOWN_MODEL
    assert "by its name it may be AfmoeForCausalLM (AFMoE (Trinity))" in detail["message"]
    assert (
        'send {"config": {"architecture": ARCH, ...}} instead of the command, or add '
        '--hf-overrides \'{"architectures": ["ARCH"]}\' to the command'
    ) in detail["message"]
    assert "--architecture" not in detail["message"]


def test_an_unknown_model_hint_is_worded_for_the_command_line() -> None:
    code, out = _turnout("decide", "--", "vllm", "serve", "google/gemma-4-26B-A4B-it")
    assert code == 2
    assert (
        "may be Gemma4ForCausalLM (Gemma 4), Gemma4ForConditionalGeneration (Gemma 4), "
        "Gemma4UnifiedForConditionalGeneration (Gemma 4) (check the model's config.json); "
        "pass --architecture ARCH or --config path/to/config.json, or add --hf-overrides "
        '\'{"architectures": ["ARCH"]}\' to the command'
    ) in " ".join(out.split())
