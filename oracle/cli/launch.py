"""``turnout launch -- vllm serve MODEL [flags]``: start the installed vLLM with the runner the
rollout gives it (oracle.launch says how the runner and ``VLLM_USE_V2_MODEL_RUNNER`` are
decided).

Exit status: vLLM's own (the launcher becomes vLLM, or with ``--report-startup`` passes its
status on); 0 for ``--dry-run``; 2 for bad input, before anything else happens (no vLLM
installed, a flag or value the release's ``vllm serve`` parser refuses, a model it cannot
place); 3 when the decision starts no runner (an operator pin vLLM would refuse, a deployment
no runner serves), reported first.
"""

from __future__ import annotations

from typing import Annotated

import typer

from turnout.oracle.cli.decide_cmd import ArchOpt, Argv, HfOpt, IdOpt, PlatOpt, SetOpt

ReportOpt = Annotated[
    bool,
    typer.Option(
        "--report-startup",
        help="run vLLM as a child (output passed through, signals forwarded) "
        "and report the line where it names its model runner",
    ),
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--service-timeout",
        min=0.01,
        max=600.0,
        metavar="SECONDS",
        help="how long each request to the service may take: the canary snapshot (the decision "
        "waits for it) and the decision event before vLLM starts [default: 0.5]",
    ),
]
AdvertiseOpt = Annotated[
    str | None,
    typer.Option(
        "--advertise-address",
        metavar="HOST:PORT",
        help="with --report-startup: the address the service lists for Prometheus to scrape "
        "(default: vllm serve's --host and --port; the host name when it binds every interface)",
    ),
]
DryOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="decide and print the plan as JSON (argv, the variables set, the "
        "decision); start and report nothing",
    ),
]


def launch(
    argv: Argv = None,
    deployment_id: IdOpt = None,
    architecture: ArchOpt = None,
    hf_config: HfOpt = None,
    platform: PlatOpt = None,
    sets: SetOpt = None,
    report_startup: ReportOpt = False,
    service_timeout: TimeoutOpt = None,
    advertise_address: AdvertiseOpt = None,
    dry_run: DryOpt = False,
) -> None:
    """Start vLLM with the runner the rollout gives it: sets VLLM_USE_V2_MODEL_RUNNER where
    the rollout says so (an operator's own setting is kept), reports the decision, then
    exec's `vllm serve` with the exact argv. Service: TURNOUT_URL, TURNOUT_TOKEN, TURNOUT_PACK;
    TURNOUT_CACHE_DIR, TURNOUT_DEPLOYMENT_ID."""
    # The client (httpx) and the launcher load only when this command runs: `turnout decide`
    # stays as light as it was.
    from turnout.oracle.cli.launch_run import run

    run(
        argv or [],
        deployment_id,
        architecture,
        hf_config,
        platform,
        sets,
        report_startup,
        dry_run,
        service_timeout,
        advertise_address,
    )
