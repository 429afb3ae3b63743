"""A stand-in ``vllm`` for the launch tests: a real virtual environment (a real interpreter)
whose ``bin/vllm`` is a small Python script and whose site-packages holds a
``vllm-<version>.dist-info``, so that ``importlib.metadata.version("vllm")`` of its interpreter
answers as it would for the real wheel; and ``turnout launch`` run as a real process.

What the script does is chosen by ``FAKE_VLLM_MODE`` in the environment it gets:

- ``print`` (default): one JSON line on stdout, ``{"argv": sys.argv, "env": os.environ}``;
- ``startup``: vLLM-like log lines: stderr first, then on stdout the line vLLM prints for the
  runner it would use (``Using V2 Model Runner`` unless ``VLLM_USE_V2_MODEL_RUNNER=0``,
  ``Starting to load model ...`` then), stays up ``FAKE_VLLM_HOLD_S`` seconds (default 0), then
  exits with ``FAKE_VLLM_EXIT``;
- ``flood``: about 2 MB of log lines on stdout, then the V2 runner's line, then exits with
  ``FAKE_VLLM_EXIT``;
- ``wait``: prints ``ready``, waits for a signal, prints ``got signal N`` and exits 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """#!{python}
import json, os, signal, sys, time
mode = os.environ.get("FAKE_VLLM_MODE", "print")
if mode == "print":
    print(json.dumps({{"argv": sys.argv, "env": dict(os.environ)}}))
elif mode == "startup":
    print("(APIServer pid=1) INFO 12-01 10:00:00 [utils.py:1] vLLM server version 0.31.0",
          file=sys.stderr, flush=True)
    v1 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "0"
    line = ("Starting to load model Qwen/Qwen3-8B..." if v1 else "Using V2 Model Runner")
    where = "gpu_model_runner.py:5255" if v1 else "gpu_worker.py:479"
    print(f"(EngineCore_DP0 pid=2) INFO 12-01 10:00:01 [{{where}}] {{line}}", flush=True)
    print("(APIServer pid=1) INFO 12-01 10:00:02 [launcher.py:1] Starting vLLM API server",
          flush=True)
    time.sleep(float(os.environ.get("FAKE_VLLM_HOLD_S", "0")))
    sys.exit(int(os.environ.get("FAKE_VLLM_EXIT", "0")))
elif mode == "flood":  # far more output than a pipe holds, then the runner's line
    for i in range(20000):
        print(f"INFO [loader.py:1] weights shard {{i}} " + "x" * 100)
    print("INFO 12-01 10:00:01 [gpu_worker.py:479] Using V2 Model Runner", flush=True)
    sys.exit(int(os.environ.get("FAKE_VLLM_EXIT", "0")))
elif mode == "wait":
    got = []
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda n, _f: got.append(n))
    print("ready", flush=True)
    while not got:
        time.sleep(0.01)
    print(f"got signal {{got[0]}}", flush=True)
"""


def make_fake_vllm(where: Path, version: str | None = "0.31.0") -> Path:
    """A virtual environment under ``where`` with ``bin/vllm``; ``version`` None: no
    dist-info (a vllm script whose Python has no vLLM). Returns the ``bin`` folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = where / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    if version is not None:
        info = site / f"vllm-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    script = where / "bin" / "vllm"
    script.write_text(SCRIPT.format(python=python))
    script.chmod(0o755)
    return where / "bin"


def launch_env(bin_dir: Path | None, cache: Path, **extra: str) -> dict[str, str]:
    """The environment to run ``turnout launch`` with: this checkout's packages, the fake vLLM
    first on PATH (none: no vllm anywhere on PATH), its own cache dir, no service unless
    ``TURNOUT_URL`` is given, no runner pin unless given."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TURNOUT_", "VLLM_", "FAKE_VLLM_"))
    }
    path = [str(bin_dir)] if bin_dir is not None else []
    path += [
        p for p in env.get("PATH", "").split(os.pathsep) if p and not (Path(p) / "vllm").exists()
    ]
    env.update(
        {
            "PATH": os.pathsep.join(path),
            "PYTHONPATH": str(ROOT / "src"),
            "TURNOUT_CACHE_DIR": str(cache),
            "TURNOUT_DEPLOYMENT_ID": "test/qwen3",
            **extra,
        }
    )
    return env


def run_launch(
    args: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``turnout launch ARGS`` as a process of its own (it exec's vLLM)."""
    return subprocess.run(
        [sys.executable, "-m", "turnout.oracle.cli", "launch", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def child_output(out: str) -> dict[str, object]:
    """The JSON line the fake ``vllm`` printed in ``print`` mode."""
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1, out
    return dict(json.loads(lines[0]))


def dry_run(args: list[str], env: dict[str, str]) -> dict[str, object]:
    """The plan of ``turnout launch --dry-run ARGS`` (exit 0 expected)."""
    done = run_launch(["--dry-run", *args], env)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))
