"""``turnout launch`` without a service: a fake ``vllm`` (tests/fake_vllm.py: a real virtual
environment whose interpreter has a vllm dist-info, and a script that prints what it was given)
is exec'ed, or run as a child with ``--report-startup``; what reaches it is what vLLM would get.
The service's part (its snapshot, reports, the service down) is in
tests/dashboard/test_launch_service.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fake_vllm import ROOT, child_output, dry_run, launch_env, make_fake_vllm, run_launch

from turnout.oracle import load_pack
from turnout.oracle.decision import CanarySnapshot, CohortState
from turnout.oracle.errors import ErrorCode
from turnout.oracle.launch import SERVICE_TIMEOUT_S, STARTUP_SLACK_S, make_client
from turnout.oracle.launch_inputs import LaunchSettings, engine_args_words, split_assignments
from turnout.oracle.launch_startup import runner_of_line
from turnout.oracle.vllm_install import FALLBACK_PACK, interpreter_of, pack_for_version

QWEN3 = ["--", "vllm", "serve", "Qwen/Qwen3-8B", "-tp", "2"]
LLAMA = ["--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]  # its stage is off
RUNNER = "VLLM_USE_V2_MODEL_RUNNER"


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fake_vllm(tmp_path_factory.mktemp("venv-0.31") / "venv")


@pytest.fixture
def env(fake: Path, tmp_path: Path) -> dict[str, str]:
    return launch_env(fake, tmp_path / "cache")


def _lkg(cache: Path, snapshot: CanarySnapshot) -> None:
    """A last-known-good copy on disk, as the client keeps one (the service's body shape:
    every stage of the pack, those ``snapshot`` does not name at their defaults)."""
    cache.mkdir(parents=True, exist_ok=True)
    pack = load_pack("turnout")
    states = {c.id: CohortState(c.enabled, c.percentage) for c in pack.cohorts}
    states |= snapshot.cohorts
    body = {
        "pack": "turnout",
        "pack_digest": pack.digest,
        "kill_switch": {"engaged": snapshot.kill_switch},
        "cohorts": [
            {"cohort": k, "enabled": s.enabled, "percentage": s.percentage}
            for k, s in states.items()
        ],
    }
    (cache / "snapshot-turnout.json").write_text(json.dumps({"etag": None, "body": body}))


def test_stage_on_execs_vllm_with_the_exact_argv_and_env_untouched(env: dict[str, str]) -> None:
    done = run_launch(QWEN3, env)
    assert done.returncode == 0, done.stderr
    seen = child_output(done.stdout)
    assert seen["argv"][1:] == QWEN3[2:]  # type: ignore[index]
    assert Path(seen["argv"][0]).name == "vllm"  # type: ignore[index]
    assert seen["env"] == env  # nothing set: vLLM's own selection picks V2
    assert "VLLM_USE_V2_MODEL_RUNNER left unset: vLLM's own selection picks V2" in done.stderr
    assert "deciding with pack vllm-0.31" in done.stderr


def test_stage_off_pins_v1(env: dict[str, str]) -> None:
    done = run_launch(LLAMA, env)
    assert done.returncode == 0, done.stderr
    assert child_output(done.stdout)["env"] == {**env, RUNNER: "0"}
    assert "not yet enabled for Llama (stage Llama + Mistral dense)" in done.stderr
    plan = dry_run(LLAMA, env)
    assert plan["env"] == {RUNNER: "0"} and plan["runner"] == "v1"
    assert plan["decision"]["reason_code"] == "DISABLED"  # type: ignore[index]
    assert plan["vllm_decision"]["runner"] == "v2"  # type: ignore[index]


def test_the_stage_state_comes_from_the_snapshot(env: dict[str, str], tmp_path: Path) -> None:
    on = dry_run(QWEN3, env)
    assert (on["runner"], on["env"], on["snapshot_source"]) == ("v2", {}, "defaults")
    _lkg(tmp_path / "cache", CanarySnapshot({"qwen3-canary": CohortState(False)}))
    off = dry_run(QWEN3, env)
    assert (off["runner"], off["env"], off["snapshot_source"]) == ("v1", {RUNNER: "0"}, "disk")
    assert off["decision"]["stage"] == "qwen3-canary"  # type: ignore[index]
    _lkg(tmp_path / "cache", CanarySnapshot({}, kill_switch=True))
    killed = dry_run(QWEN3, env)
    assert (killed["runner"], killed["env"]) == ("v1", {RUNNER: "0"})


def test_a_rule_decides_before_the_rollout_and_nothing_is_set(env: dict[str, str]) -> None:
    ngram = [
        *LLAMA,
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}',
    ]
    plan = dry_run(ngram, env)  # V1 by vLLM's own rule, whatever the stage
    assert (plan["runner"], plan["env"]) == ("v1", {})
    assert plan["decision"]["reason_code"] == "TARGETING_MATCH"  # type: ignore[index]


def test_an_architecture_the_packs_do_not_know_gets_v1_pinned(env: dict[str, str]) -> None:
    plan = dry_run(["--architecture", "NoSuchForCausalLM", "--", "vllm", "serve", "org/new"], env)
    assert (plan["runner"], plan["env"]) == ("v1", {RUNNER: "0"})  # vLLM alone might take V2
    assert plan["decision"]["error_code"] == "unknown_architecture"  # type: ignore[index]


@pytest.mark.parametrize("how", ["environment", "assignment"])
def test_the_operators_pin_is_kept_and_reported_as_theirs(env: dict[str, str], how: str) -> None:
    args = LLAMA if how == "environment" else ["--", f"{RUNNER}=1", *LLAMA[1:]]
    run_env = {**env, RUNNER: "1"} if how == "environment" else env
    done = run_launch(args, run_env)
    assert done.returncode == 0, done.stderr
    assert child_output(done.stdout)["env"] == {**env, RUNNER: "1"}
    assert "VLLM_USE_V2_MODEL_RUNNER=1 kept (the operator's pin)" in done.stderr
    plan = dry_run(args, run_env)
    assert (plan["runner"], plan["env"], plan["operator_pin"]) == ("v2", {}, "1")
    assert plan["decision"]["mode"] == "pinned"  # type: ignore[index]
    assert plan["argv"] == LLAMA[1:]


def test_a_pin_vllm_would_refuse_exits_3_without_starting_it(env: dict[str, str]) -> None:
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'
    done = run_launch([*QWEN3, "--speculative-config", spec], {**env, RUNNER: "1"})
    assert done.returncode == 3
    assert done.stdout == ""  # vLLM never ran
    assert "Model Runner V2 does not yet support: speculative method 'ngram'" in done.stderr
    bad = run_launch(QWEN3, {**env, RUNNER: "yes"})
    assert bad.returncode == 3 and "invalid literal for int()" in bad.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--", "vllm", "serve", "Qwen/Qwen3-8B", "--not-a-flag"],
            "unrecognized arguments: --not-a-flag (the vllm serve parser of vLLM 0.31.0)",
        ),
        (
            ["--", "vllm", "serve", "Qwen/Qwen3-8B", "--tensor-parallel-size", "two"],
            "argument --tensor-parallel-size/-tp: invalid int value: 'two'",
        ),
        (["--", "vllm", "serve", "Qwen/Qwen3-8B", "--omni"], "unknown_flag"),
        (["--", "vllm", "bench", "serve"], "not a `vllm serve` command line"),
        ([], "nothing to launch"),
    ],
)
def test_bad_input_is_named_as_vllm_names_it_and_starts_nothing(
    env: dict[str, str], args: list[str], said: str
) -> None:
    done = run_launch(args, env)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and done.stdout == ""


def test_a_version_without_a_pack_decides_with_the_fallback(tmp_path: Path) -> None:
    env = launch_env(make_fake_vllm(tmp_path / "venv", "0.40.1"), tmp_path / "cache")
    done = run_launch(["--dry-run", *QWEN3], env)
    assert done.returncode == 0, done.stderr
    assert (
        "vLLM 0.40.1 at" in done.stderr
        and "has no policy pack" in done.stderr
        and f"deciding with {FALLBACK_PACK} instead" in done.stderr
    )
    vllm = json.loads(done.stdout)["vllm"]
    assert (vllm["version"], vllm["pack"], vllm["has_pack"]) == ("0.40.1", FALLBACK_PACK, False)


def test_a_release_with_a_pack_uses_it_and_its_parser(tmp_path: Path) -> None:
    env = launch_env(make_fake_vllm(tmp_path / "venv", "0.33.0"), tmp_path / "cache")
    plan = dry_run(QWEN3, env)
    assert plan["vllm"]["pack"] == "vllm-0.33"  # type: ignore[index]
    assert plan["vllm_decision"]["pack"] == "vllm-0.33"  # type: ignore[index]
    done = run_launch(["--", "vllm", "serve", "Qwen/Qwen3-8B", "--not-a-flag"], env)
    assert "the vllm serve parser of vLLM 0.33.0" in done.stderr


def test_no_vllm_on_path_says_so_and_nothing_else_happens(tmp_path: Path) -> None:
    env = launch_env(None, tmp_path / "cache", TURNOUT_URL="http://127.0.0.1:9")
    done = run_launch(QWEN3, env)
    assert done.returncode == 2 and done.stdout == ""
    assert "vllm_not_installed" in done.stderr and "no 'vllm' executable on PATH" in done.stderr
    assert not (tmp_path / "cache").exists()  # no client, no spool, no snapshot fetched


def test_a_cache_dir_that_cannot_be_made_is_a_clear_error(fake: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("in the way")
    done = run_launch(QWEN3, launch_env(fake, tmp_path / "file" / "cache"))
    assert done.returncode == 2 and done.stdout == ""
    assert "TURNOUT_CACHE_DIR" in done.stderr and "Traceback" not in done.stderr


def test_a_vllm_whose_python_has_no_vllm_is_not_installed(tmp_path: Path) -> None:
    env = launch_env(make_fake_vllm(tmp_path / "venv", None), tmp_path / "cache")
    done = run_launch(QWEN3, env)
    assert done.returncode == 2 and done.stdout == ""
    assert "has no 'vllm' distribution installed" in done.stderr


def test_the_path_given_for_vllm_is_the_one_inspected(fake: Path, tmp_path: Path) -> None:
    env = launch_env(None, tmp_path / "cache")
    done = run_launch(["--", str(fake / "vllm"), "serve", "Qwen/Qwen3-8B"], env)
    assert done.returncode == 0, done.stderr
    assert child_output(done.stdout)["argv"][0] == str(fake / "vllm")  # type: ignore[index]


def test_report_startup_tees_output_and_finds_the_runner_line(env: dict[str, str]) -> None:
    done = run_launch(
        ["--report-startup", *QWEN3], {**env, "FAKE_VLLM_MODE": "startup", "FAKE_VLLM_EXIT": "7"}
    )
    assert done.returncode == 7  # vLLM's status, passed on
    assert "[gpu_worker.py:479] Using V2 Model Runner" in done.stdout
    assert "Starting vLLM API server" in done.stdout
    assert "vLLM server version 0.31.0" in done.stderr
    assert "vLLM says it uses V2 (as decided)" in done.stderr
    held = run_launch(["--report-startup", *LLAMA], {**env, "FAKE_VLLM_MODE": "startup"})
    assert held.returncode == 0
    assert "vLLM says it uses V1 (as decided)" in held.stderr


def test_report_startup_outlives_its_stdout_closing(env: dict[str, str]) -> None:
    """The reader of the launcher's output goes away (``| head -1``, a log shipper that
    died): vLLM goes on and its status is the launcher's. The pump thread died of the broken
    pipe before (a traceback), nothing read vLLM's output any more, and vLLM blocked for
    ever on a full pipe."""
    cmd = [sys.executable, "-m", "turnout.oracle.cli", "launch", "--report-startup", *QWEN3]
    proc = subprocess.Popen(
        cmd,
        env={**env, "FAKE_VLLM_MODE": "flood", "FAKE_VLLM_EXIT": "5"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"INFO [loader.py:1] weights shard 0 ")
    proc.stdout.close()
    try:
        proc.wait(timeout=120)  # a hang detector: it ends as soon as vLLM has written all
    finally:
        proc.kill()
    err = proc.stderr.read().decode()
    assert proc.returncode == 5, err
    assert "Traceback" not in err and "output there is dropped from now on" in err, err
    assert "vLLM says it uses V2 (as decided)" in err  # the runner's line still read


TRAMPOLINE = "#!/bin/sh\n'''exec' \"/nonexistent/long path/bin/python\" \"$0\" \"$@\"\n' '''"


@pytest.mark.parametrize("first_lines", ["#!/nonexistent/bin/python3", TRAMPOLINE])
def test_a_vllm_whose_interpreter_is_missing_cannot_be_launched(
    fake: Path, tmp_path: Path, first_lines: str
) -> None:
    """Its dist-info says a version, but the script cannot run: refused before anything is
    decided or reported (an exec of it was a FileNotFoundError traceback naming the script)."""
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    body = (fake / "vllm").read_text().split("\n", 1)[1]
    script.write_text(first_lines + "\n" + body)
    script.chmod(0o755)
    shutil.copytree(fake.parent / "lib", tmp_path / "lib")  # the dist-info beside it
    for mode in ([], ["--report-startup"]):
        done = run_launch(
            [*mode, "--", str(script), "serve", "Qwen/Qwen3-8B"],
            launch_env(None, tmp_path / "cache"),
        )
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert "vllm_not_installed" in done.stderr and "/nonexistent/" in done.stderr
        assert "cannot run" in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("mode", [[], ["--report-startup"]])
def test_a_vllm_the_system_cannot_execute_is_a_clear_error(
    fake: Path, tmp_path: Path, mode: list[str]
) -> None:
    """A file with no interpreter line (an exec format error) and a dist-info beside it: the
    decision is made, but starting it fails: the launcher says why and exits 126, as a shell
    would, with no traceback."""
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text("print('not a script the kernel can run')\n")
    script.chmod(0o755)
    shutil.copytree(fake.parent / "lib", tmp_path / "lib")
    done = run_launch(
        [*mode, "--", str(script), "serve", "Qwen/Qwen3-8B"], launch_env(None, tmp_path / "cache")
    )
    assert done.returncode == 126, done.stderr
    assert "cannot start" in done.stderr and "Exec format error" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_without_the_double_dash_everything_from_vllm_on_is_vllms(
    env: dict[str, str], tmp_path: Path
) -> None:
    """``turnout launch vllm serve M --config vllm.yaml -tp 2``: launch's own options go before
    the command. Before, options after it were launch's: ``-tp`` was "No such option: -t",
    and ``--config`` (vLLM's YAML file, and launch's HF config.json) was taken by launch: the
    deployment decided as another model's and vLLM started without it."""
    (tmp_path / "vllm.yaml").write_text("max-model-len: 4096\n")
    plan = dry_run(
        ["vllm", "serve", "Qwen/Qwen3-8B", "--config", str(tmp_path / "vllm.yaml"), "-tp", "2"], env
    )
    assert plan["argv"] == [
        "vllm",
        "serve",
        "Qwen/Qwen3-8B",
        "--config",
        str(tmp_path / "vllm.yaml"),
        "-tp",
        "2",
    ]
    assert plan["config"]["architecture"] == "Qwen3ForCausalLM"  # type: ignore[index]
    assert plan["config"]["tensor_parallel_size"] == 2  # type: ignore[index]
    done = run_launch(["vllm", "serve", "Qwen/Qwen3-8B", "--dry-run"], env)  # vLLM's flag now
    assert done.returncode == 2 and "unrecognized arguments: --dry-run" in done.stderr


def test_a_deployment_id_too_long_to_report_is_bad_input(fake: Path, tmp_path: Path) -> None:
    """Over 256 characters no event takes it: refused before anything is decided (the report
    was a ValidationError traceback, after the decision)."""
    long_id = "d" * 300
    for args, extra in [
        (QWEN3, {"TURNOUT_DEPLOYMENT_ID": long_id}),
        (["--deployment-id", long_id, *QWEN3], {}),
    ]:
        env = launch_env(fake, tmp_path / "cache", TURNOUT_URL="http://127.0.0.1:9", **extra)
        done = run_launch(args, env)
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert "the deployment id is 300 characters long: at most 256" in done.stderr
        assert "Traceback" not in done.stderr


def test_a_pin_too_long_to_report_is_reported_cut(env: dict[str, str]) -> None:
    """An operator pin of 300 characters (vLLM refuses it: exit 3, reported first): the event
    carries its first 256. Building the event raised a ValidationError before."""
    done = run_launch(
        ["--", f"{RUNNER}={'y' * 300}", *QWEN3[1:]], {**env, "TURNOUT_URL": "http://127.0.0.1:9"}
    )
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert "spooled in" in done.stderr  # reported (the service is down: it waits in the spool)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_report_startup_forwards_signals(env: dict[str, str], signum: int) -> None:
    cmd = [sys.executable, "-m", "turnout.oracle.cli", "launch", "--report-startup", *QWEN3]
    proc = subprocess.Popen(
        cmd,
        env={**env, "FAKE_VLLM_MODE": "wait"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert out.strip() == f"got signal {int(signum)}", err
    assert proc.returncode == 0


@pytest.mark.parametrize(
    ("line", "runner"),
    [
        # vLLM 0.31.0's own lines (vllm/v1/worker/gpu_worker.py:479, gpu/model_runner.py:375,
        # gpu_model_runner.py:5255), as its logger formats them
        (
            "(EngineCore_DP0 pid=7) INFO 12-01 10:00:01 [gpu_worker.py:479] Using V2 Model Runner",
            "v2",
        ),
        ("INFO 12-01 10:00:01 [model_runner.py:375] Loading model from scratch...", "v2"),
        (
            "(EngineCore_DP0 pid=7) INFO 12-01 [gpu_model_runner.py:5255] Starting to load model "
            "Qwen/Qwen3-8B...",
            "v1",
        ),
        ("\x1b[32mINFO\x1b[0m 12-01 [cpu_worker.py:162] Using V2 Model Runner", "v2"),
        # the selection's warning is not the answer (an early evaluation may be overridden)
        (
            "WARNING [vllm.py:755] Model Runner V2 does not yet support dual batch overlap; using the "
            "V1 model runner instead.",
            None,
        ),
        ("INFO Starting vLLM API server on http://0.0.0.0:8000", None),
    ],
)
def test_runner_of_line(line: str, runner: str | None) -> None:
    assert runner_of_line(line) == runner


@pytest.mark.parametrize(
    ("version", "want"),
    [
        ("0.31.0", ("vllm-0.31", True)),
        ("0.31.2", ("vllm-0.31", True)),
        ("0.29.0", ("vllm-0.29", True)),
        ("0.33.1+cu129", ("vllm-0.33", True)),
        ("0.32.0rc1", ("vllm-0.32", True)),
        ("0.28.2", (FALLBACK_PACK, False)),
        ("0.40.0", (FALLBACK_PACK, False)),
        ("1.0.0", (FALLBACK_PACK, False)),
        ("dev", (FALLBACK_PACK, False)),
    ],
)
def test_pack_for_version(version: str, want: tuple[str, bool]) -> None:
    assert pack_for_version(version) == want


def test_interpreter_of_each_shebang_form(tmp_path: Path) -> None:
    def script(text: str) -> Path:
        path = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
        path.write_text(text)
        return path

    assert interpreter_of(script("#!/opt/venv/bin/python3\nimport x\n")) == Path(
        "/opt/venv/bin/python3"
    )
    long = "/a path with spaces/venv/bin/python"
    assert interpreter_of(script(f"#!/bin/sh\n'''exec' \"{long}\" \"$0\" \"$@\"\n' '''\n")) == Path(
        long
    )
    found = interpreter_of(script("#!/usr/bin/env python3\n"))
    assert found is not None and found.name.startswith("python3")
    assert interpreter_of(script("#!/bin/bash\nexec foo\n")) is None
    assert interpreter_of(script("\x7fELF binary")) is None


def test_engine_args_become_the_releases_flags() -> None:
    words = engine_args_words(
        "Qwen/Qwen3-8B",
        {
            "tensor_parallel_size": 2,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "speculative_config": {"method": "ngram"},
            "max_model_len": None,
        },
        release="0.31",
    )
    assert words == [
        "vllm",
        "serve",
        "Qwen/Qwen3-8B",
        "--tensor-parallel-size",
        "2",
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--speculative-config",
        '{"method": "ngram"}',
    ]
    with pytest.raises(Exception, match="'tensor_parallel' is not an engine argument") as err:
        engine_args_words("Qwen/Qwen3-8B", {"tensor_parallel": 2}, release="0.31")
    assert getattr(err.value, "code", None) is ErrorCode.UNKNOWN_FLAG


def test_split_assignments() -> None:
    assert split_assignments(["A=1", "B=x=y", "vllm", "serve", "C=3"]) == (
        ["vllm", "serve", "C=3"],
        {"A": "1", "B": "x=y"},
    )


def test_settings_and_the_clients_start_up_wait(tmp_path: Path) -> None:
    settings = LaunchSettings.from_env(
        {
            "TURNOUT_URL": "http://svc:8000",
            "TURNOUT_TOKEN": "t",
            "TURNOUT_CACHE_DIR": str(tmp_path),
            "HOME": "/h",
        }
    )
    assert (settings.url, settings.token, settings.pack) == ("http://svc:8000", "t", "turnout")
    client = make_client(settings)
    # The first decision waits for the first snapshot fetch to end, which its request deadline
    # bounds (the slack only covers the thread's start): with the service down or hung, the
    # decision comes from the disk copy or the defaults (tests/dashboard/test_launch_service.py
    # says which one is used, and that a service slower than 50 ms is waited for).
    assert (
        (client.timeout_s, client.startup_wait_s)
        == (SERVICE_TIMEOUT_S, SERVICE_TIMEOUT_S + STARTUP_SLACK_S)
        == (0.5, 0.75)
    )
    client.close()
    patient = make_client(settings, timeout_s=5.0)  # --service-timeout 5
    assert (patient.timeout_s, patient.startup_wait_s) == (5.0, 5.25)
    patient.close()
    assert LaunchSettings.from_env({"HOME": "/h"}).cache_dir == Path("/h/.cache/turnout")
    assert LaunchSettings.from_env({"HOME": "/h", "XDG_CACHE_HOME": "/x"}).cache_dir == Path(
        "/x/turnout"
    )


def test_apply_rollout_sets_the_environment_in_process(tmp_path: Path) -> None:
    """The Python helper, in a process whose interpreter has a vllm distribution."""
    site = tmp_path / "site"
    info = site / "vllm-0.31.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0\n")
    code = (
        "import json, os\n"
        "from turnout.oracle.launch import apply_rollout\n"
        "a = apply_rollout(model='Qwen/Qwen3-8B', engine_args=dict(tensor_parallel_size=2))\n"
        "b = apply_rollout(model='meta-llama/Llama-3.1-8B-Instruct')\n"
        "print(json.dumps([a.runner, dict(a.env), b.runner, dict(b.env),\n"
        "                  os.environ.get('VLLM_USE_V2_MODEL_RUNNER')]))\n"
    )
    env = launch_env(None, tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(site)])
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["v2", {}, "v1", {RUNNER: "0"}, "0"]


def test_apply_rollout_without_vllm_says_so(tmp_path: Path) -> None:
    code = (
        "from turnout.oracle.launch import apply_rollout\n"
        "try:\n    apply_rollout(model='Qwen/Qwen3-8B')\n"
        "except Exception as e:\n    print(type(e).__name__, e.code, e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=launch_env(None, tmp_path / "cache"),
        cwd=ROOT,
        timeout=120,
    )
    assert done.stdout.startswith("VllmNotInstalled vllm_not_installed vLLM is not installed")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--advertise-address", "h:8000"], "used only with --report-startup"),
        (["--report-startup", "--advertise-address", "h"], "is not HOST:PORT"),
        (["--report-startup", "--advertise-address", "h:70000"], "the port must be in 1..65535"),
        (["--report-startup", "--advertise-address", "a b:80"], "is not HOST:PORT"),
    ],
)
def test_an_advertise_address_that_would_not_be_used_or_listed_starts_nothing(
    env: dict[str, str], args: list[str], says: str
) -> None:
    done = run_launch([*args, *QWEN3], {**env, "FAKE_VLLM_MODE": "startup"})
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert "--advertise-address" in done.stderr and says in done.stderr, done.stderr
