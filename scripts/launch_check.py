"""Does a real vLLM pick the runner ``turnout launch`` decided? (Outside ``make test``: it needs a
vLLM wheel, installed by ``make referee-venvs``.)

For a qwen3 deployment with its rollout stage on and off, and a few neighbours (an operator's
pin, a rule that decides before the rollout, pipeline parallelism, a canary share, the kill
switch), this starts a real local service (``turnout serve`` on a fresh SQLite file), sets the
canaries through its API, runs ``turnout launch --dry-run -- <venv>/bin/vllm serve ...`` (the
launcher finds the version of that vLLM from its interpreter, and stops before exec), and hands
the environment the launch would give vLLM (this environment plus the variables it sets) to
the vLLM venv's Python. There vLLM's own selection code runs, as the referee runs it
(referee.harness.run_case: ``VllmConfig`` built without ``__post_init__``, the steps around the
selection replayed, ``use_v2_model_runner``), reading ``VLLM_USE_V2_MODEL_RUNNER`` from its
process environment. Each case passes when vLLM picks what turnout decided.

    make launch-check    # the referee venvs of LAUNCH_CHECK_RELEASES (0.31 0.33), then this
    .venv/bin/python scripts/launch_check.py --venv .referee/venv-0.31 --venv .referee/venv-0.33

Exit 0 when every case agrees, 1 otherwise. ``--markdown`` prints the table for docs/launch.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
RUNNER = "VLLM_USE_V2_MODEL_RUNNER"
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'
# In the vLLM venv: vLLM's selection for the launch's config, with the runner variable read
# from this process's environment (what the launch handed over), not from the config.
# referee/ is imported from the repository root, appended after the venv's site-packages
# (PYTHONSAFEPATH keeps the working directory off sys.path).
PROBE = """
import json, os, sys
sys.path.append(sys.argv[3])
from referee.harness import run_case
spec = json.loads(sys.argv[1])
spec.pop("env", None)
if "VLLM_USE_V2_MODEL_RUNNER" in os.environ:
    spec["env"] = {"VLLM_USE_V2_MODEL_RUNNER": os.environ["VLLM_USE_V2_MODEL_RUNNER"]}
print(json.dumps(run_case(spec, sys.argv[2])))
"""


@dataclass(frozen=True)
class Case:
    name: str
    stage_on: bool = True
    percentage: int = 100
    kill_switch: bool = False
    flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


CASES = (
    Case("stage on"),
    Case("stage off", stage_on=False),
    Case("stage off, operator pin =1", stage_on=False, env={RUNNER: "1"}),
    Case("stage on, operator pin =0", env={RUNNER: "0"}),
    Case("stage on, ngram speculation", flags=("--speculative-config", NGRAM)),
    Case("stage off, -pp 2", stage_on=False, flags=("-pp", "2")),
    Case("stage on at 0%", percentage=0),
    Case("kill switch", kill_switch=True),
)


class Service:
    """``turnout serve`` on a fresh database in ``where``, with an admin token."""

    def __init__(self, where: Path) -> None:
        self.db = f"sqlite:///{where / 'check.db'}"
        self.token = (
            self._turnout(
                "token",
                "create",
                "--role",
                "admin",
                "--name",
                "check",
                "--create",
                "--database-url",
                self.db,
            )
            .strip()
            .splitlines()[-1]
        )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(where / "service.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "turnout.oracle.cli",
                "serve",
                "--port",
                str(port),
                "--no-demo",
                "--database-url",
                self.db,
            ],
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )
        for _ in range(600):
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise SystemExit(f"the service did not start: see {where / 'service.log'}")

    @staticmethod
    def _turnout(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "turnout.oracle.cli", *args],
            cwd=ROOT,
            text=True,
            capture_output=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        ).stdout

    def set(self, case: Case) -> None:
        h = {"Authorization": f"Bearer {self.token}"}
        url = f"{self.url}/api/v1/canaries/qwen3-canary"
        etag = httpx.get(url, headers=h).headers["ETag"].strip('"')
        httpx.patch(
            url,
            headers={**h, "If-Match": etag},
            json={
                "enabled": case.stage_on,
                "percentage": case.percentage,
                "reason": f"launch check: {case.name}",
            },
        ).raise_for_status()
        httpx.post(
            f"{self.url}/api/v1/kill-switch",
            headers=h,
            json={"engaged": case.kill_switch, "reason": f"launch check: {case.name}"},
        ).raise_for_status()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def check(venv: Path, case: Case, service: Service, cache: Path) -> dict[str, Any]:
    """One case on one venv: turnout's plan and what vLLM's own selection makes of its env."""
    service.set(case)
    env = {k: v for k, v in os.environ.items() if k != RUNNER}  # the case's pin, or none
    env.update(
        {
            "PYTHONPATH": str(ROOT / "src"),
            "TURNOUT_URL": service.url,
            "TURNOUT_TOKEN": service.token,
            "TURNOUT_CACHE_DIR": str(cache),
            "TURNOUT_DEPLOYMENT_ID": "check/qwen3-8b",
            "HF_HUB_OFFLINE": "1",
            **case.env,
        }
    )
    argv = [str(venv / "bin" / "vllm"), "serve", "Qwen/Qwen3-8B", *case.flags]
    done = subprocess.run(
        [sys.executable, "-m", "turnout.oracle.cli", "launch", "--dry-run", "--", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"turnout launch failed ({done.returncode}):\n{done.stderr}")
    plan = json.loads(done.stdout)
    spec = {k: v for k, v in plan["config"].items() if k not in ("model", "deployment_id")}
    vllm_env = {**env, **plan["env"]}  # what the exec would hand vLLM
    probe = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            PROBE,
            json.dumps(spec),
            plan["vllm"]["pack"].removeprefix("vllm-"),
            str(ROOT),
        ],
        cwd=ROOT,
        env=vllm_env,
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        raise SystemExit(f"vLLM's selection failed:\n{probe.stderr[-3000:]}")
    got = json.loads(probe.stdout.strip().splitlines()[-1])
    d = plan["decision"]
    return {
        "vllm": plan["vllm"]["version"],
        "case": case.name,
        "turnout": plan["runner"],
        "reason_code": d["reason_code"],
        "source": plan["snapshot_source"],
        "set": ", ".join(f"{k}={v}" for k, v in plan["env"].items())
        or (f"kept {RUNNER}={plan['operator_pin']}" if plan["operator_pin"] else "unset"),
        "picks": got["decision"],
        "agree": got["decision"] == plan["runner"],
        "vllm_log": [w["message"] for w in got["warnings"]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--venv",
        action="append",
        type=Path,
        required=True,
        help="a referee venv with vLLM installed (repeatable)",
    )
    parser.add_argument("--markdown", action="store_true", help="the results as a table")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="turnout-launch-check-") as tmp:
        service = Service(Path(tmp))
        try:
            for venv in args.venv:
                for case in CASES:
                    rows.append(check(venv.resolve(), case, service, Path(tmp) / venv.name))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            service.stop()
    if args.markdown:
        print(
            "| vLLM | case | turnout decides | VLLM_USE_V2_MODEL_RUNNER | vLLM's selection "
            "picks | agree |\n|---|---|---|---|---|---|"
        )
        for r in rows:
            print(
                f"| {r['vllm']} | {r['case']} | {r['turnout']} ({r['reason_code']}) | "
                f"{r['set']} | {r['picks']} | {'yes' if r['agree'] else '**no**'} |"
            )
    bad = [r for r in rows if not r["agree"]]
    print(f"{len(rows) - len(bad)} of {len(rows)} cases agree", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
