"""Screenshots of every page of the service, from a fresh demo fleet, for docs/images/.

    .venv/bin/python scripts/screenshots.py            # writes docs/images/*.png
    .venv/bin/python scripts/screenshots.py --out DIR  # elsewhere; --only canaries,matrix

It starts ``turnout serve`` on a new SQLite database in a temporary folder (the demo fleet is
recorded at start), records two parity results (one green, one failing) so the Canaries page
has evidence to show, signs in with an admin token and drives Debian's chromium through
Playwright (``scripts/ensure-chromium.sh`` installs it), one image per page and state listed
in SHOTS. Run it after any change to a page; docs/service.md shows the images.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1280, "height": 900}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(folder: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """(process, base URL, admin token) of a demo service on a fresh database."""
    url = f"sqlite:///{folder / 'screens.db'}"
    env = {
        **os.environ,
        "TURNOUT_DATABASE_URL": url,
        "TURNOUT_LOG_LEVEL": "warning",
        "PYTHONPATH": str(ROOT / "src"),
        "TURNOUT_TICK_S": "0.5",
    }
    turnout = [sys.executable, "-c", "from turnout.oracle.cli import main; main()"]
    subprocess.run([*turnout, "db", "upgrade"], env=env, check=True, capture_output=True)
    token = subprocess.run(
        [*turnout, "token", "create", "--role", "admin", "--name", "docs"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    port = _free_port()
    log = open(folder / "serve.log", "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        [*turnout, "serve", "--port", str(port), "--demo"],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"turnout serve exited:\n{(folder / 'serve.log').read_text()}")
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return proc, base, token
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("turnout serve did not answer within 90 s")


def record_evidence(base: str, token: str) -> None:
    """A green parity run for qwen3 and a failing one for llama (the confirm form warns)."""
    auth = {"Authorization": f"Bearer {token}"}
    for family, result in (("qwen3", "pass"), ("llama", "fail"), ("mistral", "pass")):
        r = httpx.post(
            f"{base}/api/v1/evidence",
            headers=auth,
            json={
                "family": family,
                "runner_pair": "v1:v2",
                "suite": "tests/parity greedy+seeded",
                "result": result,
                "details": "screenshots.py",
            },
        )
        r.raise_for_status()


def record_health(base: str, token: str) -> None:
    """Six hours of 10-minute health windows from four engines of the llama-mistral-dense
    stage, two per runner: V2 with the lower TPOT, one V2 crash (the Engine health page)."""
    import datetime as dt
    import random

    rng = random.Random(7)
    end = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    reports = []
    for w in range(36):
        start = end - dt.timedelta(minutes=10 * (36 - w))
        for runner, engine in (("v1", "a"), ("v1", "b"), ("v2", "c"), ("v2", "d")):
            tpot = (9.5 if runner == "v1" else 4.8) * rng.uniform(0.9, 1.15)
            num_requests = rng.randint(80, 120)
            tokens = num_requests * 128
            reports.append(
                {
                    "report_id": f"shot-{runner}{engine}-{w}",
                    "deployment_id": f"prod/llama-{engine}",
                    "pack": "turnout",
                    "runner": runner,
                    "family": "llama",
                    "stage": "llama-mistral-dense",
                    "window_start": start.isoformat(),
                    "window_end": (start + dt.timedelta(minutes=10)).isoformat(),
                    "num_requests": num_requests,
                    "num_errors": rng.randint(0, 1),
                    "num_crashes": 1 if (runner, engine, w) == ("v2", "d", 20) else 0,
                    "ttft_p50_ms": tpot * 6,
                    "ttft_p99_ms": tpot * 14,
                    "tpot_p50_ms": tpot,
                    "tpot_p99_ms": tpot * 1.4,
                    "num_output_tokens": tokens,
                    "output_tokens_per_s": 1000.0 / tpot * 24,
                }
            )
    auth = {"Authorization": f"Bearer {token}"}
    for i in range(0, len(reports), 100):
        httpx.post(
            f"{base}/api/v1/health", headers=auth, json={"reports": reports[i : i + 100]}
        ).raise_for_status()


def kill_switch(base: str, token: str, engaged: bool) -> None:
    r = httpx.post(
        f"{base}/api/v1/kill-switch",
        headers={"Authorization": f"Bearer {token}"},
        json={"engaged": engaged, "reason": "screenshot of the engaged state"},
    )
    r.raise_for_status()


def _canaries_confirm(page: Any, base: str) -> None:
    page.goto(base + "/canaries")
    page.locator("#cohort-llama-mistral-dense button.toggle").click()
    form = page.locator("#confirm-llama-mistral-dense form.confirm")
    form.wait_for()
    share = form.locator("input[name=percentage]")
    share.fill("10")
    page.wait_for_selector("#impact-llama-mistral-dense [data-share='10']")
    form.locator("input[name=reason]").fill("parity suite green on H200")


def _matrix_cell(page: Any, base: str) -> None:
    page.goto(base + "/matrix")
    row = page.locator("#matrix tbody tr", has=page.locator("th", has_text="qwen3_moe"))
    row.locator("td").nth(0).click()
    page.keyboard.press("ArrowRight")  # the detail follows the keyboard too


def _upgrade(page: Any, base: str) -> None:
    page.goto(base + "/upgrade?from=vllm-0.30&to=vllm-0.31")
    page.locator("#switch-deepseek_vl summary").click()


def _explain(page: Any, base: str) -> None:
    page.goto(base + "/explain")
    page.fill(
        "textarea[name=command]",
        "vllm serve Qwen/Qwen3-8B --speculative-config.method "
        "ngram --speculative-config.num_speculative_tokens 3",
    )
    page.click("form#explain button[type=submit]")
    page.wait_for_selector("#decision")


def _canaries_ramp(page: Any, base: str) -> None:
    """A ramp of llama-mistral-dense at its first step, its gates read by the ticker, with a
    webhook subscription whose receiver is down (the Webhooks page shows the retries)."""
    auth = {"Authorization": f"Bearer {TOKEN[0]}"}
    r = httpx.post(
        f"{base}/api/v1/webhooks",
        headers=auth,
        json={
            "url": f"http://127.0.0.1:{_free_port()}/turnout",
            "kinds": ["ramp_step", "gate_failure"],
            "description": "on-call channel (down)",
        },
    )
    r.raise_for_status()
    r = httpx.post(
        f"{base}/api/v1/evidence",
        headers=auth,
        json={  # llama fixed since
            "family": "llama",
            "suite": "tests/parity greedy+seeded",
            "result": "pass",
            "num_tests": 412,
            "num_failures": 0,
            "num_errors": 0,
            "num_skipped": 6,
        },
    )
    r.raise_for_status()
    cohort = f"{base}/api/v1/canaries/llama-mistral-dense"
    r = httpx.post(
        cohort + "/ramp",
        headers={**auth, "If-Match": httpx.get(cohort, headers=auth).headers["ETag"]},
        json={
            "steps": [{"percentage": p, "bake_s": 1800} for p in (10, 25, 50, 100)],
            "on_failure": "rollback",
            "reason": "parity suite green on H200",
        },
    )
    r.raise_for_status()
    for _ in range(100):
        page.goto(base + "/canaries")
        if page.locator("#ramp-llama-mistral-dense table.gates").count():
            break
        page.wait_for_timeout(200)
    page.locator("#ramps").scroll_into_view_if_needed()


def _ramp_on_overview(page: Any, base: str) -> None:
    if not page.locator("#ramp-llama-mistral-dense").count():  # shot alone: start the ramp
        _canaries_ramp(page, base)
    page.goto(base + "/")


def _webhooks(page: Any, base: str) -> None:
    for _ in range(100):  # the first attempt has failed
        page.goto(base + "/webhooks")
        if "ConnectError" in page.inner_text("#outbox"):
            return
        page.wait_for_timeout(200)


def _goto(path: str) -> Callable[[Any, str], None]:
    return lambda page, base: page.goto(base + path)


# name → (how to get there, the whole page or only the first screen)
SHOTS: dict[str, tuple[Callable[[Any, str], None], bool]] = {
    "fallback-reasons": (_goto("/fallbacks"), True),
    "canaries-confirm": (_canaries_confirm, True),
    "decisions": (_goto("/decisions?window=7d&size=25"), True),
    "deployment": (_goto("/deployments/demo%2Frecipe-0008"), True),
    "matrix": (_matrix_cell, True),
    "explain": (_explain, True),
    "upgrade-preview": (_upgrade, True),
    "audit": (_goto("/audit"), True),
    "canaries-ramp": (_canaries_ramp, True),
    "overview": (_ramp_on_overview, True),  # after the ramp: its state beside the stage
    "webhooks": (_webhooks, True),
    "engine-health": (_goto("/health?stage=llama-mistral-dense&window=24h"), True),
}
TOKEN: list[str] = []  # the admin token of the running service


def shoot(base: str, token: str, out: Path, only: set[str] | None) -> list[Path]:
    from playwright.sync_api import sync_playwright

    TOKEN[:] = [token]
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_context(viewport=VIEWPORT).new_page()
        page.goto(base + "/login")
        page.fill("input[name=token]", token)
        page.click("button[type=submit]")
        page.wait_for_url(base + "/")
        for name, (go, full) in SHOTS.items():
            if only and name not in only:
                continue
            go(page, base)
            page.wait_for_load_state("networkidle")
            path = out / f"{name}.png"
            page.screenshot(path=str(path), full_page=full)
            written.append(path)
        if not only or "canaries-kill-switch" in only:
            kill_switch(base, token, True)
            page.goto(base + "/canaries")
            path = out / "canaries-kill-switch.png"
            page.screenshot(path=str(path), full_page=True)
            written.append(path)
            kill_switch(base, token, False)
        browser.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated names: " + ", ".join([*SHOTS, "canaries-kill-switch"]),
    )
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"{CHROMIUM} is missing: run scripts/ensure-chromium.sh")
    only = {n.strip() for n in args.only.split(",") if n.strip()} or None
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="turnout-screens-") as tmp:
        proc, base, token = start_service(Path(tmp))
        try:
            record_evidence(base, token)
            record_health(base, token)
            for path in shoot(base, token, args.out, only):
                print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
