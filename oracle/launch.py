"""A real vLLM obeys the rollout: the runner for one vLLM start, and the environment that makes
vLLM's own selection pick it (``turnout launch``, and :func:`apply_rollout` for code that builds
``vllm.LLM`` itself).

Two packs decide together. The pack of the *installed* vLLM release (``vllm-0.31``:
:mod:`oracle.vllm_install`) says what vLLM's own selection does with the deployment — which
runner it picks by itself, which rules force or block a runner, what a pin does. The service's
pack (``TURNOUT_PACK``, ``turnout`` by default) and its canary snapshot say what the rollout
allows (:meth:`oracle.pack.Pack.decide_rollout`). As in docs/architecture.md §3.3, the rollout
is asked only where no rule decided: where vLLM would pick V2 by default.

The rule for ``VLLM_USE_V2_MODEL_RUNNER`` (the release pack's runner variable):

- the operator set it (in the environment, or as ``NAME=value`` before ``vllm``): it is kept,
  nothing is set, and the decision is the release's under that pin (mode ``pinned``);
- otherwise it is set to the decided runner's value (``0``: V1, ``1``: V2) exactly when vLLM's
  own automatic selection is not known to pick that runner: when the rollout holds V1 back
  (stage off, outside the canary share, kill switch) where vLLM would take V2, or when the
  pack does not know the architecture (turnout decides V1 for it). Everywhere else it stays
  unset, and vLLM's own selection picks the decided runner by itself, with its own checks
  intact (a pin ``1`` would turn a V2 blocker turnout cannot see, such as Triton missing on
  the host, into a start-up error);
- before anything is set, the release pack decides again under the pin: a pin vLLM would
  refuse is never handed to it (:class:`LaunchRefused`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import uuid
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from turnout.oracle.client import OracleClient, SnapshotSource
from turnout.oracle.config import DeploymentConfig
from turnout.oracle.decision import CanarySnapshot, Decision, RunnerName
from turnout.oracle.errors import ErrorCode, OracleError
from turnout.oracle.launch_inputs import LaunchSettings, config_from_command, engine_args_words
from turnout.oracle.pack import Pack, load_pack
from turnout.oracle.vllm_install import VllmInstall, installed_vllm
from turnout.oracle.wire import (
    MAX_ENV_VALUE_CHARS,
    EngineIn,
    LaunchIn,
    StartupIn,
    engine_registration,
)

#: The deadline of each request launch makes to the service, in seconds (``--service-timeout``):
#: the canary snapshot it decides with, and the decision event before vLLM is exec'ed (an event
#: not acknowledged by then stays in the spool, for the next client on the cache dir). The
#: client's own request deadline.
SERVICE_TIMEOUT_S = 0.5
#: What the start-up wait adds to the snapshot fetch's own deadline, in seconds: the client's
#: thread starting, and checking and keeping the answer. The wait ends as soon as the fetch
#: does (answered, refused, or cut at its deadline), so this only bounds a stalled host.
STARTUP_SLACK_S = 0.25

log = logging.getLogger("turnout.launch")


class LaunchRefused(OracleError):
    """The decision starts no runner (vLLM would refuse the deployment, or the operator's pin
    cannot be honoured): ``launch`` holds it, ``code`` is the decision's error code."""

    def __init__(self, launch: Launch) -> None:
        d = launch.decision
        super().__init__(d.error or "no runner", code=d.error_code or ErrorCode.NO_RUNNER)
        self.launch = launch


@dataclass(frozen=True)
class Launch:
    """One vLLM start decided. ``decision`` is turnout's (what is reported); ``vllm_decision``
    what vLLM's own selection makes of the deployment as given (the release pack, no rollout);
    ``env`` the variables launch sets for vLLM (empty: none); ``operator_pin`` the runner
    variable as the operator set it; ``snapshot_source`` where the canaries came from."""

    decision: Decision
    vllm_decision: Decision
    config: DeploymentConfig
    install: VllmInstall
    env: Mapping[str, str]
    operator_pin: str | None
    snapshot_source: SnapshotSource
    rollout_pack: str
    env_var: str = "VLLM_USE_V2_MODEL_RUNNER"  # the release pack's runner variable

    @property
    def runner(self) -> str | None:
        return self.decision.runner

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment vLLM runs with: ``base`` and the variables set."""
        return {**base, **self.env}

    def wire(self, startup: StartupIn | None = None) -> LaunchIn:
        """The event's ``launch`` part."""
        pin = self.operator_pin  # reported as set, cut to what an event takes
        return LaunchIn(
            vllm_version=self.install.version[:64],
            vllm_pack=self.install.pack,
            has_pack=self.install.has_pack,
            env=dict(self.env),
            operator_pin=None if pin is None else pin[:MAX_ENV_VALUE_CHARS],
            snapshot_source=self.snapshot_source,
            startup=startup,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "env": dict(self.env),
            "operator_pin": self.operator_pin,
            "snapshot_source": self.snapshot_source,
            "rollout_pack": self.rollout_pack,
            "vllm": self.install.to_json(),
            "deployment_id": self.config.deployment_id,
            "decision": self.decision.to_json(),
            "vllm_decision": self.vllm_decision.to_json(),
            "config": self.config.to_spec(),
        }


def plan(
    config: DeploymentConfig,
    *,
    install: VllmInstall,
    rollout_pack: Pack,
    canaries: CanarySnapshot | None,
    snapshot_source: SnapshotSource = "defaults",
) -> Launch:
    """Decide one vLLM start (pure; no I/O but loading the release pack once). ``config``
    carries the operator's environment (``config.env``). Raises LaunchRefused when the
    decision starts no runner."""
    release = load_pack(install.pack)
    own = release.decide(config)
    pin = config.env.get(release.env_var)
    roll = rollout_pack.decide_rollout(config, canaries)
    placed = roll.error_code is None  # the service's pack knows the architecture
    decision = own._replace(stage=roll.stage if placed else None)
    if pin is None and placed and own.runner == "v2" and own.reason_code == "DEFAULT":
        decision = _rollout_decision(own, roll)  # no rule decided: the rollout does
    env: dict[str, str] = {}
    if (
        pin is None
        and decision.runner is not None
        and (decision.runner != own.runner or own.error_code is ErrorCode.UNKNOWN_ARCHITECTURE)
    ):
        env = release.pin_env(decision.runner)
    launch = Launch(
        decision,
        own,
        config,
        install,
        env,
        pin,
        snapshot_source,
        rollout_pack.name,
        release.env_var,
    )
    if decision.runner is None:
        raise LaunchRefused(launch)
    if env:
        _check_pin(release, config, launch)
    return launch


def _rollout_decision(own: Decision, roll: Decision) -> Decision:
    """The rollout's answer where vLLM would take V2 by default: its runner, reasons, canary
    and reason code, after vLLM's own log lines; one digest for both packs and the canaries."""
    digest = hashlib.sha256(f"{own.policy_digest}:{roll.policy_digest}".encode()).hexdigest()
    # The rollout's reason to hold V1 back is said; its "Using V2 Model Runner" is vLLM's to say.
    held = roll.messages if roll.runner == "v1" else ()
    messages = own.messages + tuple(m for m in held if m not in own.messages)
    return roll._replace(
        messages=messages, family=own.family or roll.family, policy_digest=digest[:16]
    )


def _check_pin(release: Pack, config: DeploymentConfig, launch: Launch) -> None:
    """vLLM, given the pin, must pick the decided runner (and not refuse to start)."""
    pinned = release.decide(config.replace(env={**config.env, **launch.env}))
    if pinned.runner != launch.runner:
        refused = launch.decision._replace(
            runner=None,
            reason_code="ERROR",
            error_code=pinned.error_code or ErrorCode.REFUSED,
            error=f"vLLM {launch.install.version} would not take "
            f"{', '.join(f'{k}={v}' for k, v in launch.env.items())}: "
            f"{pinned.error or f'it picks {pinned.runner}'}",
        )
        raise LaunchRefused(dataclasses.replace(launch, decision=refused))


def make_client(settings: LaunchSettings, timeout_s: float = SERVICE_TIMEOUT_S) -> OracleClient:
    """The service's embedded client for a launch: the service's pack, the cache dir, each
    request within ``timeout_s`` seconds; nothing is started yet.

    The first decision waits for the first snapshot fetch to end (at most ``timeout_s`` plus
    STARTUP_SLACK_S), not the 50 ms an engine's client waits: vLLM takes far longer to start
    than any fetch, and a fixed 50 ms lost the race to a service that was up on a loaded host
    or a link of a few round trips, leaving the last-known-good copy to decide (a stage an
    operator had just turned off went on running V2)."""
    return OracleClient(
        settings.url,
        settings.token,
        cache_dir=settings.cache_dir,
        pack=settings.pack,
        timeout_s=timeout_s,
        startup_wait_s=timeout_s + STARTUP_SLACK_S,
    )


def decide_launch(client: OracleClient, config: DeploymentConfig, install: VllmInstall) -> Launch:
    """Start ``client`` (its background snapshot fetch) and decide with the snapshot it has
    within its start-up wait: the service's, else the last-known-good copy on disk, else the
    pack's defaults (``Launch.snapshot_source`` says which). Raises LaunchRefused."""
    client.start()
    canaries = client.snapshot()
    return plan(
        config,
        install=install,
        rollout_pack=client.pack,
        canaries=canaries,
        snapshot_source=client.snapshot_source,
    )


def report(
    client: OracleClient,
    launch: Launch,
    *,
    startup: StartupIn | None = None,
    event_id: str | None = None,
) -> str | None:
    """Spool the launch's decision event (fsynced before this returns; the client's thread
    sends it); ``startup``: what vLLM said at start-up (a follow-up event). None when no
    service is configured (nothing to report to)."""
    if not client.service_configured:
        return None
    try:
        return client.report(
            launch.decision,
            launch.config,
            deployment_id=launch.config.deployment_id or client.host,
            launch=launch.wire(startup),
            event_id=event_id,
        )
    except OSError as err:  # a full disk must not stop vLLM from starting
        log.error(
            "decision (runner %s) not reported: cannot write the spool in %s (%s)",
            launch.runner,
            client.spool.directory,
            err,
        )
        return None


def apply_rollout(
    model: str,
    engine_args: Mapping[str, Any] | None = None,
    *,
    environ: MutableMapping[str, str] | None = None,
    deployment_id: str | None = None,
    architecture: str | None = None,
    hf_config: str | Path | None = None,
    platform: str | None = None,
    client: OracleClient | None = None,
) -> Launch:
    """Decide the runner for ``vllm.LLM(model, **engine_args)`` in this process and set
    ``environ`` (default ``os.environ``) so that vLLM picks it; call it before the
    ``vllm.LLM`` is built. The decision is reported (when ``TURNOUT_URL`` names a service) and
    returned::

        from turnout.oracle.launch import apply_rollout
        launch = apply_rollout(model="Qwen/Qwen3-8B", engine_args=dict(tensor_parallel_size=2))
        llm = vllm.LLM("Qwen/Qwen3-8B", tensor_parallel_size=2)

    The settings come from ``environ`` (:class:`~oracle.launch_inputs.LaunchSettings`);
    ``client``: an OracleClient of your own (not closed here). Raises VllmNotInstalled (this
    Python has no vLLM), ConfigError (an engine argument the release's parser refuses, in its
    words), LaunchRefused (no runner can start the deployment)."""
    environ = os.environ if environ is None else environ
    install = installed_vllm()
    settings = LaunchSettings.from_env(environ)
    words = engine_args_words(model, engine_args or {}, release=install.release)
    config, _ = config_from_command(
        words,
        environ,
        release=install.release,
        architecture=architecture,
        hf_config=hf_config,
        hint_for="python",
        deployment_id=deployment_id or settings.deployment_id,
        overrides={"platform": platform} if platform else None,
    )
    own_client = client is None
    client = client or make_client(settings)
    try:
        launch = decide_launch(client, config, install)
        report(client, launch)
    except LaunchRefused as exc:
        report(client, exc.launch)
        raise
    finally:
        if own_client:
            client.close(flush_timeout_s=client.timeout_s)
    environ.update(launch.env)
    return launch


def served_address(words: list[str], default_host: str) -> tuple[str, Literal["http", "https"]]:
    """Where ``vllm serve`` (``words``) answers, as ``(host:port, scheme)``: its ``--host``
    (``default_host`` when absent or every interface) and ``--port`` (vLLM's default 8000),
    ``https`` when ``--ssl-certfile`` is given (vllm/entrypoints/openai/cli_args.py)."""
    flags: dict[str, str] = {}
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name in ("--host", "--port", "--ssl-certfile"):
            flags[name] = value if eq else (words[i + 1] if i + 1 < len(words) else "")
    host = flags.get("--host") or default_host
    if host in ("0.0.0.0", "::"):
        host = default_host
    port = flags.get("--port") or "8000"
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return address, "https" if flags.get("--ssl-certfile") else "http"


def engine_of(
    launch: Launch,
    words: list[str],
    *,
    host: str,
    pack: str,
    runner: str | None = None,
    address: str | None = None,
) -> EngineIn:
    """The registration of the vLLM ``launch`` started (``pack``: the rollout pack's name;
    ``runner``: the one vLLM said it uses, when it differs from the decision's; ``address``:
    the ``host:port`` to list instead of ``--host``/``--port``, ``--advertise-address``).

    Raises:
        ValueError: no runner, or an address the service would refuse.
    """
    decision = launch.decision
    said: RunnerName | None = "v1" if runner == "v1" else "v2" if runner == "v2" else None
    if said is not None:
        decision = decision._replace(runner=said)
    served, scheme = served_address(words, host)
    address = address or served
    return engine_registration(
        decision,
        launch.config,
        engine_id=f"{host[:40]}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
        address=address,
        scheme=scheme,
        engine="vllm",
        vllm_version=launch.install.version[:64],
        pack=pack,
        deployment_id=launch.config.deployment_id or host,
        host=host,
    )
