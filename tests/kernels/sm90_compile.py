"""The sm_90 compile scripts (``compile_*.py`` beside this file), run for the compile tests.

Each script compiles a group of kernels for sm_90 (H100/H200) with Triton's bundled ptxas, no
GPU needed: the interpreter the CPU suite uses accepts code the compiler rejects. From a cold
Triton cache (a fresh CI machine) the six take about 115 s of one core, all of it CPU.

``make test`` sets ``TURNOUT_SM90_COMPILE=background``. The pytest process that starts the run
(the xdist controller: ``pytest_configure`` in ``tests/conftest.py``) then starts this file as
a driver that runs every script, two at a time, at the lowest CPU priority (nice 19): they take the cores the suite
leaves idle (servers waiting out a bake time or a scrape interval) and yield them to the tests
otherwise. Each compile test waits for its script's output. Without the variable, each test
runs its script itself, as before.

Run as ``python sm90_compile.py OUT_DIR``: the background driver. It writes, per script,
``<script>.out``/``.err`` and then ``<script>.rc`` (the exit status; written last, atomically,
so that a reader that sees it sees the rest).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: The scripts, longest first (cold-cache seconds on one core: 32, 23, 23, 14, 14, 10).
SCRIPTS = (
    "compile_paged_attention.py",
    "compile_mla_attention.py",
    "compile_mamba.py",
    "compile_spec_decode.py",
    "compile_fused_moe.py",
    "compile_for_gpu.py",
)
#: The environment variable naming the folder the background driver writes to.
RESULTS_ENV = "TURNOUT_SM90_COMPILE_RESULTS"
MODE_ENV = "TURNOUT_SM90_COMPILE"
TIMEOUT_S = 900


@dataclass(frozen=True)
class Compiled:
    """A script's exit status and output."""

    returncode: int
    stdout: str
    stderr: str


def has_ptxas() -> bool:
    """Whether the installed Triton ships ptxas (the NVIDIA backend's bin/ptxas); located
    without importing Triton."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    package = Path(next(iter(spec.submodule_search_locations)))
    return (package / "backends" / "nvidia" / "bin" / "ptxas").exists()


def script_env() -> dict[str, str]:
    """The scripts' environment: compiled, not interpreted; turnout from the source tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", RESULTS_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def run_script(script: str) -> Compiled:
    """``script``'s result: from the background driver when one runs for this session (waiting
    for it), else from running the script here.

    Raises:
        AssertionError: the driver died or did not finish ``script`` within 900 s.
    """
    results = os.environ.get(RESULTS_ENV)
    if results:
        return _wait_for(Path(results), script)
    proc = subprocess.run(
        [sys.executable, str(HERE / script)],
        capture_output=True,
        text=True,
        env=script_env(),
        cwd=ROOT,
        timeout=TIMEOUT_S,
    )
    return Compiled(proc.returncode, proc.stdout, proc.stderr)


def _wait_for(results: Path, script: str) -> Compiled:
    rc_file = results / f"{script}.rc"
    deadline = time.monotonic() + TIMEOUT_S
    while not rc_file.exists():
        pid = int((results / "driver.pid").read_text())
        if not _alive(pid) and not rc_file.exists():
            raise AssertionError(f"the sm_90 compile driver (pid {pid}) died before {script}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{script} not compiled within {TIMEOUT_S} s in the background")
        time.sleep(0.5)
    return Compiled(
        int(rc_file.read_text()),
        (results / f"{script}.out").read_text(),
        (results / f"{script}.err").read_text(),
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_background(results: Path) -> subprocess.Popen[bytes]:
    """Start the driver writing into ``results`` (an existing folder): nice 19, in its own
    process group (the caller stops it with ``os.killpg``); its pid in ``driver.pid``.

    A process group, not a session: Linux's scheduler autogroups (``sched_autogroup``) share
    the CPU between sessions whatever their nice values, so a new session at nice 19 took half
    the cores from the tests; inside the tests' session nice 19 yields to them."""
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    with (results / "driver.err").open("wb") as err:
        proc = subprocess.Popen(
            [*nice, sys.executable, str(Path(__file__).resolve()), str(results)],
            env=script_env(),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            process_group=0,
        )
    (results / "driver.pid").write_text(str(proc.pid))
    return proc


def _drive(results: Path) -> int:
    def one(script: str) -> None:
        with (
            open(results / f"{script}.out", "wb") as out,
            open(results / f"{script}.err", "wb") as err,
        ):
            rc = subprocess.call([sys.executable, str(HERE / script)], stdout=out, stderr=err)
        tmp = results / f"{script}.rc.tmp"
        tmp.write_text(str(rc))
        tmp.replace(results / f"{script}.rc")

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(one, SCRIPTS))
    return 0


if __name__ == "__main__":
    sys.exit(_drive(Path(sys.argv[1])))
