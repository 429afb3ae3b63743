"""turnout's engine reporting to a real rollout-control service (``TURNOUT_URL``): the start-up
decision with the service's canaries, then the runtime health of its requests at close; an
engine killed mid-run is told by its next start as a crash. Tiny random-weight Llama on CPU."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "model"))
sys.path.insert(0, str(Path(__file__).parents[1] / "dashboard"))
from service_helpers import LiveService, make_tokens, start_service
from tiny_model_configs import TINY_DECODER_CONFIGS

from turnout.engine.errors import EngineConfigError
from turnout.engine.llm import LLM
from turnout.engine.model import write_random_weights
from turnout.engine.sampling_params import SamplingParams

STAGE = "llama-mistral-dense"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("health-llama")
    write_random_weights(TINY_DECODER_CONFIGS["llama"], path, dtype=torch.float32, seed=3)
    return path


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[LiveService, dict[str, str]]]:
    url = f"sqlite:///{tmp_path / 'svc.db'}"
    tokens = make_tokens(url)
    svc = start_service(url, tmp_path / "svc.log")
    yield svc, tokens
    svc.stop()


def _env(svc: LiveService, tokens: dict[str, str], cache: Path) -> dict[str, str]:
    return {
        "TURNOUT_URL": svc.url,
        "TURNOUT_TOKEN": tokens["operator"],
        "TURNOUT_CACHE_DIR": str(cache),
        "TURNOUT_DEPLOYMENT_ID": "prod/tiny-llama",
    }


def _get(svc: LiveService, tokens: dict[str, str], path: str) -> object:
    r = httpx.get(
        f"{svc.url}/api/v1/{path}", headers={"Authorization": f"Bearer {tokens['viewer']}"}
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_the_engine_reports_its_decision_and_its_requests_health(
    llama_dir: Path, service: tuple[LiveService, dict[str, str]], tmp_path: Path
) -> None:
    svc, tokens = service
    env = _env(svc, tokens, tmp_path / "cache")
    with LLM(llama_dir, device="cpu", max_model_len=128, environ=env) as llm:
        assert llm.decision.stage == STAGE and llm.runner_name == "v1"
        params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0)
        outs = llm.generate([[5, 6, 7], [8, 9], [10, 11, 12, 13], [999]], params)
        assert [o.error is None for o in outs] == [True, True, True, False]  # 999: refused
    decisions = _get(svc, tokens, "decisions?deployment_id=prod/tiny-llama")
    assert [(d["runner"], d["stage"]) for d in decisions] == [("v1", STAGE)]
    body = _get(svc, tokens, f"health?stage={STAGE}")
    v1 = body["by_runner"]["v1"]
    # The refused prompt is the caller's error, not the engine's: three requests, none failed.
    assert (v1["num_reports"], v1["num_engines"], v1["num_requests"], v1["num_errors"]) == (
        1,
        1,
        3,
        0,
    )
    assert v1["num_crashes"] == 0 and v1["ttft_p99_ms"] > 0 and v1["tpot_p99_ms"] > 0
    assert v1["tokens_per_s"] > 0
    assert "v2" not in body["by_runner"]
    marker = next((tmp_path / "cache" / "runs").glob("*.run"))
    assert marker.read_text() == "closed\n"


KILLED = """
import sys, time
from turnout.engine.llm import LLM
from turnout.engine.sampling_params import SamplingParams
llm = LLM(sys.argv[1], device="cpu", max_model_len=128, environ=dict(a.split("=", 1) for a in sys.argv[2:]))
llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, ignore_eos=True))
print("generated", flush=True)
time.sleep(120)
"""


def test_a_start_after_a_killed_run_reports_a_crash(
    llama_dir: Path, service: tuple[LiveService, dict[str, str]], tmp_path: Path
) -> None:
    svc, tokens = service
    env = _env(svc, tokens, tmp_path / "cache")
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(llama_dir), *(f"{k}={v}" for k, v in env.items())],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "generated"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    llm = LLM(llama_dir, device="cpu", max_model_len=128, environ=env)
    llm.close()
    llm.close()  # idempotent
    v1 = _get(svc, tokens, f"health?stage={STAGE}")["by_runner"]["v1"]  # type: ignore[index]
    # The killed run's window died with it; the restart reports the crash (and no requests).
    assert (v1["num_reports"], v1["num_crashes"], v1["num_requests"]) == (1, 1, 0)
    assert v1["crash_rate"] == 1.0
    # The killed run's decision was spooled before it generated: the restart sent it too.
    assert len(_get(svc, tokens, "decisions?deployment_id=prod/tiny-llama")) == 2  # type: ignore[arg-type]


def test_a_crash_counts_for_the_runner_that_crashed_not_the_next_ones(
    llama_dir: Path, service: tuple[LiveService, dict[str, str]], tmp_path: Path
) -> None:
    """The run killed on V1, the restart on V2 (pinned, as after a flip or a share that grew):
    the crash is V1's (a report of its own for V1), not V2's. Before, the restart's first V2
    window carried it: a V1 crash made V2's crash rate 1.0, which fails a ramp's crash gate."""
    svc, tokens = service
    env = _env(svc, tokens, tmp_path / "cache")
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(llama_dir), *(f"{k}={v}" for k, v in env.items())],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "generated"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    with LLM(
        llama_dir,
        device="cpu",
        max_model_len=128,
        environ={**env, "TURNOUT_USE_V2_MODEL_RUNNER": "1"},
    ) as llm:
        assert (llm.runner_name, llm.decision.stage) == ("v2", STAGE)
    by_runner = _get(svc, tokens, f"health?stage={STAGE}")["by_runner"]  # type: ignore[index]
    assert (by_runner["v1"]["num_crashes"], by_runner["v1"]["num_requests"]) == (1, 0)
    assert by_runner["v2"]["num_crashes"] == 0 and by_runner["v2"]["crash_rate"] == 0.0


def test_without_a_service_the_engine_reports_nothing(llama_dir: Path, tmp_path: Path) -> None:
    llm = LLM(
        llama_dir,
        device="cpu",
        max_model_len=128,
        environ={"TURNOUT_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert llm._reporting is None
    llm.close()
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf", "nan", "1e-6"])
def test_a_bad_health_interval_is_refused(llama_dir: Path, tmp_path: Path, value: str) -> None:
    # 1e-6 was taken: the engine spooled and sent a report on nearly every loop.
    with pytest.raises(
        EngineConfigError,
        match=f"TURNOUT_HEALTH_INTERVAL_S must be a number of seconds >= 1, got '{value}'",
    ):
        LLM(
            llama_dir,
            device="cpu",
            max_model_len=128,
            environ={
                "TURNOUT_URL": "http://127.0.0.1:9",
                "TURNOUT_HEALTH_INTERVAL_S": value,
                "TURNOUT_CACHE_DIR": str(tmp_path / "cache"),
            },
        )


def test_an_oracle_client_of_another_pack_is_refused(llama_dir: Path, tmp_path: Path) -> None:
    from turnout.oracle.client import OracleClient

    client = OracleClient(None, cache_dir=tmp_path / "c", pack="vllm-0.31")
    with pytest.raises(EngineConfigError, match=r"the oracle client runs pack vllm-0\.31"):
        LLM(llama_dir, device="cpu", max_model_len=128, environ={}, oracle_client=client)
    client.close()
