"""The steps of ``turnout launch`` (oracle/cli/launch.py holds the command and its options)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

import typer

from turnout.oracle.cli.inputs import Overrides
from turnout.oracle.cli.render import EXIT_BAD_INPUT, EXIT_PIN
from turnout.oracle.client import OracleClient
from turnout.oracle.errors import ErrorCode, OracleError
from turnout.oracle.launch import (
    SERVICE_TIMEOUT_S,
    Launch,
    LaunchRefused,
    decide_launch,
    engine_of,
    make_client,
    report,
)
from turnout.oracle.launch_inputs import LaunchSettings, config_from_command, split_assignments
from turnout.oracle.launch_startup import run_child
from turnout.oracle.vllm_install import find_vllm
from turnout.oracle.wire import StartupIn, address_problem

log = logging.getLogger("turnout.launch")
SOURCES = {
    "service": "the service's canary snapshot",
    "disk": "the last-known-good canary snapshot on disk (the service did not answer in time)",
    "defaults": "the rollout.yaml defaults of the pack (no service snapshot, none on disk)",
}


def run(
    argv: list[str],
    deployment_id: str | None,
    architecture: str | None,
    hf_config: Path | None,
    platform: str | None,
    sets: list[str] | None,
    report_startup: bool,
    dry_run: bool,
    service_timeout: float | None = None,
    advertise_address: str | None = None,
) -> None:
    """See :func:`oracle.cli.launch.launch`."""
    _logging()
    if advertise_address is not None:
        _check_advertised(advertise_address, report_startup)
    words, assigned = split_assignments(argv)
    if not words:
        _fail(
            OracleError(
                "nothing to launch: turnout launch -- vllm serve MODEL [flags]",
                code=ErrorCode.BAD_USAGE,
            )
        )
    env = {**os.environ, **assigned}
    ov = Overrides(architecture, hf_config, platform, deployment_id, (), tuple(sets or ()))
    try:
        install = find_vllm(words[0], env)
        (log.info if install.has_pack else log.warning)("%s", install.describe())
        settings = LaunchSettings.from_env(env)
        fields = {k: v for k, v in ov.fields().items() if k != "deployment_id"}
        config, _ = config_from_command(
            words,
            env,
            release=install.release,
            architecture=architecture,
            hf_config=hf_config,
            deployment_id=deployment_id or settings.deployment_id,
            overrides=fields,
        )
    except OracleError as exc:
        _fail(exc)
    try:
        client = make_client(settings, service_timeout or SERVICE_TIMEOUT_S)
    except OSError as exc:  # the cache dir cannot be made (a file in the way, no permission)
        _fail(
            OracleError(
                f"TURNOUT_CACHE_DIR {settings.cache_dir}: cannot be used "
                f"({exc.strerror or exc}); point it at a writable directory",
                code=ErrorCode.BAD_USAGE,
            )
        )
    try:
        planned = decide_launch(client, config, install)
    except LaunchRefused as exc:
        _refused(client, exc, dry_run, words)
    _say(planned)
    if dry_run:
        client.close(flush_timeout_s=0)
        print(json.dumps(_plan_json(planned, words)))
        raise typer.Exit(0)
    event_id = report(client, planned)
    if report_startup:
        raise typer.Exit(_run_child(client, planned, words, env, event_id, advertise_address))
    _exec(client, planned, words, env, event_id)


def _logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("turnout launch: %(message)s"))
    root = logging.getLogger("turnout")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(logging.WARNING)
    log.setLevel(logging.INFO)


def _check_advertised(address: str, report_startup: bool) -> None:
    """Refuse an ``--advertise-address`` that would not be used or that the service would
    refuse, before anything starts."""
    if not report_startup:
        _fail(
            OracleError(
                "--advertise-address is used only with --report-startup: without it launch "
                "becomes vLLM and registers nothing",
                code=ErrorCode.BAD_USAGE,
            )
        )
    problem = address_problem(address)
    if problem is not None:
        _fail(OracleError(f"--advertise-address: {problem}", code=ErrorCode.BAD_USAGE))


def _fail(exc: OracleError) -> NoReturn:
    log.error("error (%s): %s", exc.code, exc.message)
    raise typer.Exit(EXIT_BAD_INPUT)


def _say(planned: Launch) -> None:
    d = planned.decision
    log.info("canaries: %s", SOURCES[planned.snapshot_source])
    for m in d.messages:
        (log.warning if m.level == "WARNING" else log.info)("%s", m.message)
    name = planned.env_var
    if planned.operator_pin is not None:
        how = f"{name}={planned.operator_pin} kept (the operator's pin)"
    elif planned.env:
        how = ", ".join(f"{k}={v}" for k, v in planned.env.items()) + " set"
    else:
        how = f"{name} left unset: vLLM's own selection picks {_upper(d.runner)}"
    log.info("runner %s (%s, stage %s): %s", _upper(d.runner), d.reason_code, d.stage or "-", how)


def _upper(runner: str | None) -> str:
    return runner.upper() if runner else "none"


def _refused(client: OracleClient, exc: LaunchRefused, dry_run: bool, words: list[str]) -> NoReturn:
    for m in exc.launch.decision.messages:
        log.warning("%s", m.message)
    log.error("not starting vLLM (%s): %s", exc.code, exc.message)
    if dry_run:
        print(json.dumps(_plan_json(exc.launch, words)))
        client.close(flush_timeout_s=0)
    else:
        event_id = report(client, exc.launch)
        client.close(flush_timeout_s=client.timeout_s)
        _delivered(client, event_id)
    raise typer.Exit(EXIT_PIN)


def _plan_json(planned: Launch, words: list[str]) -> dict[str, object]:
    return {"argv": words, "executable": str(_executable(planned)), **planned.to_json()}


def _executable(planned: Launch) -> Path:
    assert planned.install.executable is not None  # find_vllm always names it
    return planned.install.executable


def _delivered(client: OracleClient, event_id: str | None) -> None:
    if event_id is None:
        log.info("no service configured (TURNOUT_URL): the decision is not reported")
    elif client.spool.pending():
        log.warning(
            "decision event %s spooled in %s: the service has not acknowledged it "
            "yet; the next turnout client on that directory sends it",
            event_id,
            client.spool.directory,
        )
    else:
        log.info("decision event %s reported", event_id)


def _exec(
    client: OracleClient,
    planned: Launch,
    words: list[str],
    env: dict[str, str],
    event_id: str | None,
) -> NoReturn:
    """Report (each request within the client's deadline, the thread joined at most a second
    later), then become vLLM."""
    client.close(flush_timeout_s=client.timeout_s)
    _delivered(client, event_id)
    executable = str(_executable(planned))
    log.info("exec %s %s", executable, " ".join(words[1:]))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(executable, words, planned.environ(env))
    except OSError as exc:
        raise typer.Exit(_cannot_start(executable, exc)) from None


def _cannot_start(executable: str, exc: OSError) -> int:
    """Say why ``executable`` did not start; the status a shell gives then (127: not found,
    126: found but not run)."""
    log.error("cannot start %s: %s", executable, exc.strerror or exc)
    return 127 if isinstance(exc, FileNotFoundError) else 126


def _register(
    client: OracleClient, planned: Launch, words: list[str], runner: str, address: str | None
) -> None:
    """Register the vLLM server with the service (Prometheus' targets, the engines on an old
    decision); the client repeats it while vLLM runs and ends it when vLLM exits."""
    try:
        engine = engine_of(
            planned,
            words,
            host=client.host,
            runner=runner,
            pack=client.wire_pack,
            address=address,
        )
    except ValueError as exc:
        log.warning("vLLM is not registered with the service: %s", exc)
        return
    client.register_engine(engine)
    log.info("registered vLLM with the service as %s at %s", engine.engine_id, engine.address)


def _run_child(
    client: OracleClient,
    planned: Launch,
    words: list[str],
    env: dict[str, str],
    event_id: str | None,
    advertise_address: str | None = None,
) -> int:
    """vLLM as a child; its start-up line is reported as a follow-up event
    (``<event id>.startup``) once it says which runner it uses."""

    def on_startup(runner: str, line: str) -> None:
        same = runner == planned.runner
        (log.info if same else log.warning)(
            "vLLM says it uses %s (%s): %s",
            runner.upper(),
            "as decided" if same else f"turnout decided {_upper(planned.runner)}",
            line,
        )
        report(
            client,
            planned,
            startup=StartupIn.model_validate({"runner": runner, "line": line[:2000]}),
            event_id=f"{event_id}.startup" if event_id else None,
        )
        if client.service_configured:
            _register(client, planned, words, runner, advertise_address)

    log.info("starting %s %s (--report-startup)", _executable(planned), " ".join(words[1:]))
    try:
        status = run_child(
            words, planned.environ(env), executable=_executable(planned), on_startup=on_startup
        )
    except OSError as exc:
        status = _cannot_start(str(_executable(planned)), exc)
    client.close(flush_timeout_s=2.0)
    _delivered(client, event_id)
    log.info("vLLM exited with status %d", status)
    return status
