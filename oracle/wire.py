"""The service's wire vocabulary, defined once: the canary snapshot, the decision event and the
deployment input, as pydantic models.

The service's API (``dashboard/api/schemas.py`` re-exports these, so they also make its OpenAPI
document), the engine client (:mod:`oracle.client`) and the CLI (``--canaries`` files, commands
files) validate with the same models. The names are the service's: ``...In`` is what it takes,
``...Out`` what it answers. Readers take the part of a body they use and ignore the rest, so a
newer service's extra fields do not break an older engine; types are checked, never coerced
(``"false"`` is not a boolean, ``"50"`` or ``true`` not a percentage).

Only the standard library and pydantic: the engine client imports this without the service's
libraries (no FastAPI, no SQLAlchemy).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from turnout.oracle.config import DeploymentConfig
from turnout.oracle.decision import CanarySnapshot, CohortState, Decision, ReasonCode

Percentage = Annotated[StrictInt, Field(ge=0, le=100)]
MAX_NAME_CHARS = 256  # a deployment id's length in an event or a health report
# No control character (C0, DEL, C1: NUL among them) in text the service stores and shows: a
# NUL was stored on SQLite, refused by PostgreSQL, and written raw into the CSV export.
NO_CONTROL_CHARS = r"^[^\x00-\x1f\x7f-\x9f]*$"


def _visible(value: str) -> str:
    """A name someone can read: at least one character that is neither white space nor
    invisible (zero-width and other format characters, which ``str.isprintable`` refuses)."""
    if not any(c.isprintable() and not c.isspace() for c in value):
        raise ValueError("needs a visible character (not only spaces or zero-width ones)")
    return value


Name = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_CHARS, pattern=NO_CONTROL_CHARS),
    AfterValidator(_visible),
]
# A rule id as the store keeps it (its reason column holds 128 characters on every backend).
MAX_RULE_ID_CHARS = 128
RuleId = Annotated[str, Field(min_length=1, max_length=MAX_RULE_ID_CHARS, pattern=NO_CONTROL_CHARS)]
# The family an event names when the oracle could not place the deployment in one (an unknown
# architecture: no runner, reason code ERROR).
UNKNOWN_FAMILY = "unknown"
MAX_EVENTS_PER_BATCH = 5_000


def error_text(err: ValidationError, *, limit: int = 3) -> str:
    """The first ``limit`` errors of ``err`` as ``where: what`` (``cohorts[0].enabled: Input
    should be a valid boolean``), for a ValueError a person reads."""
    parts = []
    for e in err.errors(include_url=False)[:limit]:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".")
        parts.append(f"{where}: {e['msg']}" if where else str(e["msg"]))
    more = err.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


# -- the canary snapshot (GET /api/v1/canaries) ------------------------------------------------
class SnapshotCohort(BaseModel):
    """A cohort's canary as engines read it: the three fields a decision needs (the rest of a
    ``CohortOut`` is optional here)."""

    cohort: StrictStr
    enabled: StrictBool
    percentage: Percentage
    version: StrictInt | None = None
    updated_at: dt.datetime | None = None
    updated_by: StrictStr | None = None


class SnapshotKillSwitch(BaseModel):
    engaged: StrictBool
    version: StrictInt | None = None
    updated_at: dt.datetime | None = None
    updated_by: StrictStr | None = None


class SnapshotIn(BaseModel):
    """The body of ``GET /api/v1/canaries`` as engines and ``--canaries`` files read it."""

    pack: StrictStr | None = None
    pack_digest: StrictStr | None = Field(
        default=None,
        description="the content hash of the service's pack (``Pack.digest``): "
        "an engine uses the snapshot only with the same pack",
    )
    kill_switch: SnapshotKillSwitch
    cohorts: Sequence[SnapshotCohort]

    @classmethod
    def parse(cls, body: Any) -> SnapshotIn:
        """The snapshot of a decoded JSON body; ValueError saying what is wrong otherwise."""
        if not isinstance(body, Mapping):
            raise ValueError(f"not a canary snapshot (a JSON {type(body).__name__}, not an object)")
        try:
            return cls.model_validate(body)
        except ValidationError as err:
            raise ValueError(f"not a canary snapshot ({error_text(err)})") from None

    def to_snapshot(self) -> CanarySnapshot:
        """The oracle's CanarySnapshot (every cohort, and the kill switch)."""
        return CanarySnapshot(
            cohorts={c.cohort: CohortState(c.enabled, c.percentage) for c in self.cohorts},
            kill_switch=self.kill_switch.engaged,
        )

    def last_change(self) -> SnapshotCohort | None:
        """The cohort changed last (by ``updated_at``), when the body says."""
        dated = [c for c in self.cohorts if c.updated_at is not None]
        return max(dated, key=lambda c: c.updated_at or dt.datetime.min, default=None)


class CohortOut(SnapshotCohort):
    """A cohort's canary as the service answers it."""

    label: str
    position: int = Field(description="the stage's place in the rollout order, from 0")
    version: StrictInt
    updated_at: dt.datetime
    updated_by: StrictStr


class KillSwitchOut(SnapshotKillSwitch):
    version: StrictInt
    updated_at: dt.datetime
    updated_by: StrictStr


class CanariesOut(SnapshotIn):
    """Every cohort in rollout order, and the kill switch (``GET /api/v1/canaries``)."""

    pack: StrictStr
    pack_digest: StrictStr
    kill_switch: KillSwitchOut
    cohorts: Sequence[CohortOut]


class OracleSnapshotCohort(BaseModel):
    enabled: StrictBool
    percentage: Percentage = 100


class OracleSnapshotIn(BaseModel):
    """The oracle's own shape, ``CanarySnapshot.to_json()``: ``{"kill_switch": bool,
    "cohorts": {COHORT: {"enabled": bool, "percentage": 0..100}}}``."""

    kill_switch: StrictBool = False
    cohorts: dict[str, OracleSnapshotCohort] = Field(default_factory=dict)

    def to_snapshot(self) -> CanarySnapshot:
        return CanarySnapshot(
            cohorts={k: CohortState(c.enabled, c.percentage) for k, c in self.cohorts.items()},
            kill_switch=self.kill_switch,
        )


# -- decision events (POST /api/v1/decisions) --------------------------------------------------
EnvName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
MAX_ENV_VALUE_CHARS = 256
EnvValue = Annotated[str, Field(max_length=MAX_ENV_VALUE_CHARS)]


class StartupIn(BaseModel):
    """What vLLM said at start-up about the runner it uses (``turnout launch
    --report-startup``): the runner and vLLM's own log line that says it. It comes in a
    follow-up event, ``<decision event id>.startup`` (the same decision, with this part), which
    the service attaches to the decision instead of counting a second one."""

    model_config = ConfigDict(extra="forbid")

    runner: Literal["v1", "v2"]
    line: str = Field(max_length=2_000, description="vLLM's log line, as printed")


class LaunchIn(BaseModel):
    """How ``turnout launch`` (or ``oracle.launch.apply_rollout``) started vLLM with the
    decision: an optional part of a decision event (events without it are unchanged)."""

    model_config = ConfigDict(extra="forbid")

    vllm_version: str = Field(min_length=1, max_length=64)
    vllm_pack: str = Field(
        min_length=1, max_length=64, description="the pack whose selection stood for vLLM's own"
    )
    has_pack: bool = Field(
        default=True, description="false: the version has no pack, vllm_pack stood in"
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, max_length=16, description="the variables launch set for vLLM"
    )
    operator_pin: EnvValue | None = Field(
        default=None, description="the runner variable as the operator set it, kept"
    )
    snapshot_source: Literal["service", "disk", "defaults"]
    startup: StartupIn | None = None


class EventIn(BaseModel):
    """One decision as an engine reports it (:func:`decision_event` builds these). The service
    also checks it against its pack: ``pack``, ``family`` and ``stage`` must be the pack's,
    ``config`` is bounded and ``at`` may not lie ahead of the service's clock (docs/service.md)."""

    model_config = ConfigDict(extra="forbid")

    event_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:-]+$")
    at: AwareDatetime
    deployment_id: Name
    host: str = Field(default="", max_length=256, pattern=NO_CONTROL_CHARS)
    pack: str = Field(min_length=1, max_length=64, pattern=NO_CONTROL_CHARS)
    family: str = Field(
        min_length=1,
        max_length=64,
        pattern=NO_CONTROL_CHARS,
        description=f"a family of the pack, or {UNKNOWN_FAMILY!r} when the "
        "oracle placed the deployment in none",
    )
    runner: Literal["v1", "v2"] | None
    mode: Literal["auto", "pinned"]
    stage: str | None = Field(
        default=None,
        max_length=64,
        pattern=NO_CONTROL_CHARS,
        description="a stage (cohort id) of the pack's rollout",
    )
    reason_code: ReasonCode
    rule_ids: list[RuleId] = Field(default_factory=list, max_length=200)
    policy_digest: str = Field(default="", max_length=128, pattern=NO_CONTROL_CHARS)
    config: dict[str, Any] | None = None
    demo: bool = False
    launch: LaunchIn | None = None

    def to_json(self) -> dict[str, Any]:
        """The event as JSON data; without ``launch`` when it has none, so that an event of a
        plain engine reads as it did before the field existed."""
        return self.model_dump(mode="json", exclude={"launch"} if self.launch is None else None)


class IngestIn(BaseModel):
    """A batch of decision events; a bad event rejects the batch whole (nothing stored)."""

    model_config = ConfigDict(extra="forbid")

    events: list[EventIn] = Field(min_length=1, max_length=MAX_EVENTS_PER_BATCH)


def batch_digest(ids: Sequence[str]) -> str:
    """What an acknowledgement names its batch by: SHA-256 (hex) of the JSON list of the ids
    sent (event ids, report ids), in the order sent."""
    return hashlib.sha256(json.dumps(list(ids), separators=(",", ":")).encode()).hexdigest()


class IngestAck(BaseModel):
    """What the engine client reads of ``POST /api/v1/decisions``' answer: the batch is
    acknowledged when ``accepted`` is the number of events sent and ``batch_digest`` is
    :func:`batch_digest` of their ids."""

    accepted: StrictInt
    batch_digest: StrictStr


def decision_event(
    decision: Decision,
    config: DeploymentConfig,
    *,
    pack: str,
    deployment_id: str,
    host: str = "",
    at: dt.datetime | None = None,
    event_id: str | None = None,
    demo: bool = False,
    launch: LaunchIn | None = None,
) -> EventIn:
    """The event that reports ``decision`` (made for ``config``) to the service; ``launch``
    when ``turnout launch`` started vLLM with it."""
    return EventIn(
        event_id=event_id or uuid.uuid4().hex,
        at=at or dt.datetime.now(dt.UTC),
        deployment_id=deployment_id,
        host=host,
        pack=pack,
        family=decision.family or UNKNOWN_FAMILY,
        runner=decision.runner,
        mode=decision.mode,
        stage=decision.stage,
        reason_code=decision.reason_code,
        rule_ids=[r.rule_id for r in decision.reasons],
        policy_digest=decision.policy_digest,
        config=config.to_spec(),
        demo=demo,
        launch=launch,
    )


# -- runtime health (POST /api/v1/health) ------------------------------------------------------
MAX_REPORTS_PER_BATCH = 5_000
MAX_HEALTH_WINDOW = dt.timedelta(days=1)
Count = Annotated[StrictInt, Field(ge=0, le=2**31 - 1)]
Millis = Annotated[StrictFloat, Field(ge=0, le=1e9, allow_inf_nan=False)]


class HealthReportIn(BaseModel):
    """One engine's health over one window, as it reports it (the engine's own measurements:
    ``engine/health.py`` for turnout's engine). Latencies are milliseconds over the requests
    that finished in the window (None: none did); ``output_tokens_per_s`` is the output tokens
    of the window over the seconds the engine spent generating them (0 when idle)."""

    model_config = ConfigDict(extra="forbid")

    report_id: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9._:-]+$",
        description="unique per report: resending it stores nothing twice",
    )
    deployment_id: Name
    host: str = Field(default="", max_length=256)
    pack: str = Field(min_length=1, max_length=64)
    runner: Literal["v1", "v2"]
    family: str = Field(min_length=1, max_length=64)
    stage: str | None = Field(
        default=None, max_length=64, description="the rollout stage (cohort id) of the decision"
    )
    window_start: AwareDatetime
    window_end: AwareDatetime
    num_requests: Count = Field(description="requests that finished in the window")
    num_errors: Count = Field(description="of those, the ones that failed in the engine")
    num_crashes: Count = Field(
        default=0,
        description="starts after a run of the same "
        "deployment that did not close cleanly (a crash, a kill)",
    )
    ttft_p50_ms: Millis | None = None
    ttft_p99_ms: Millis | None = None
    tpot_p50_ms: Millis | None = None
    tpot_p99_ms: Millis | None = None
    num_output_tokens: Annotated[StrictInt, Field(ge=0, le=2**53)] = 0
    output_tokens_per_s: Annotated[StrictFloat, Field(ge=0, le=1e9, allow_inf_nan=False)] = 0.0

    @model_validator(mode="after")
    def _consistent(self) -> HealthReportIn:
        # A difference, not window_start + a day: that overflows at the end of year 9999.
        if not dt.timedelta(0) < self.window_end - self.window_start <= MAX_HEALTH_WINDOW:
            raise ValueError("window_end must be after window_start, by at most a day")
        if self.num_errors > self.num_requests:
            raise ValueError("num_errors cannot exceed num_requests")
        # Output tokens over their rate is the time spent generating them: within one window,
        # at most a day (a denormal rate over many tokens would be years, beyond a float).
        if (
            self.output_tokens_per_s > 0
            and self.num_output_tokens  # (float rounding)
            > self.output_tokens_per_s * MAX_HEALTH_WINDOW.total_seconds() * (1 + 1e-9)
        ):
            raise ValueError(
                "num_output_tokens / output_tokens_per_s is the time spent "
                "generating them: at most a day in one window"
            )
        for name in ("ttft", "tpot"):
            p50, p99 = getattr(self, f"{name}_p50_ms"), getattr(self, f"{name}_p99_ms")
            if (p50 is None) != (p99 is None) or (p50 is not None and p50 > p99):
                raise ValueError(f"{name}_p50_ms and {name}_p99_ms go together, p50 <= p99")
        return self


# -- engine registration (PUT /api/v1/engines/{engine_id}) ----------------------------------
# An address a Prometheus can scrape: a host name or an IPv4 address, or an IPv6 one in
# brackets, and a port.
ADDRESS_PATTERN = (
    r"^([A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}$"
)
ENGINE_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,64}$"


def address_problem(address: str) -> str | None:
    """What is wrong with ``address`` as an engine's ``host:port`` (None: nothing): the shape
    of :data:`ADDRESS_PATTERN`, a port in 1..65535, a bracketed host that is an IPv6 address,
    a host that is not "every interface" (``0.0.0.0``, ``[::]``)."""
    if not re.fullmatch(ADDRESS_PATTERN, address):
        return f"{address!r} is not HOST:PORT (a host name, an IPv4 address or [IPv6], and a port)"
    if not 1 <= int(address.rsplit(":", 1)[1]) <= 65535:
        return f"address {address!r}: the port must be in 1..65535"
    host = address.rsplit(":", 1)[0].strip("[]")
    if address.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"address {address!r}: not an IPv6 address"
    if host in ("0.0.0.0", "::") or host.strip("0:.") == "":
        return (
            f"address {address!r}: every interface is no address to scrape; name the host "
            "(its name or IP)"
        )
    return None


class EngineIn(BaseModel):
    """A serving engine, as it registers with the service and repeats as its heartbeat: where
    it answers (its OpenAI-compatible API and its Prometheus metrics), the decision it runs,
    and its cohort in the stage's canary. The service lists it for Prometheus' HTTP service
    discovery (``GET /api/v1/prometheus/targets``) and in the list of engines still on an old
    decision. ``PUT /api/v1/engines/{engine_id}`` takes it (the id also in the body);
    ``DELETE`` ends the registration at a clean exit.

    ``cohort`` is ``canary`` for an engine the stage's canary put on V2 (the decision's
    ``canary.included``), else ``baseline``. ``vllm_version`` is the vLLM release whose
    metric names the engine exports: vLLM's own for ``turnout launch``, the release
    ``turnout engine serve`` follows (``serving/metrics.py``) for turnout's runners."""

    model_config = ConfigDict(extra="forbid")

    engine_id: str = Field(pattern=ENGINE_ID_PATTERN, description="unique per engine process")
    deployment_id: Name
    host: str = Field(default="", max_length=256)
    address: str = Field(
        max_length=300, pattern=ADDRESS_PATTERN, description="host:port Prometheus scrapes"
    )
    scheme: Literal["http", "https"] = "http"
    metrics_path: str = Field(default="/metrics", max_length=256, pattern=r"^/[A-Za-z0-9._~/%-]*$")
    engine: Literal["turnout", "vllm"] = Field(
        description="turnout's runners (turnout engine serve) or vLLM (turnout launch)"
    )
    vllm_version: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9.+_-]+$")
    pack: str = Field(min_length=1, max_length=64)
    family: str = Field(min_length=1, max_length=64)
    stage: str | None = Field(default=None, max_length=64)
    runner: Literal["v1", "v2"]
    mode: Literal["auto", "pinned"]
    cohort: Literal["canary", "baseline"]
    policy_digest: str = Field(default="", max_length=128)
    config: dict[str, Any] | None = Field(
        default=None, description="the deployment's spec, as a decision event carries it"
    )
    started_at: AwareDatetime

    @model_validator(mode="after")
    def _port(self) -> EngineIn:
        problem = address_problem(self.address)
        if problem is not None:
            raise ValueError(problem)
        # A time the store can keep on both backends (year 1 with an offset overflows).
        try:
            year = self.started_at.astimezone(dt.UTC).year
        except OverflowError:  # year 1 east of UTC is before year 1 in UTC
            year = 0
        if not 2000 <= year <= 9000:
            raise ValueError("started_at must lie between the years 2000 and 9000")
        return self


def cohort_of(decision: Decision) -> Literal["canary", "baseline"]:
    """``canary`` when the stage's canary took this deployment (to V2), else ``baseline``."""
    return "canary" if decision.canary is not None and decision.canary.included else "baseline"


def engine_registration(
    decision: Decision,
    config: DeploymentConfig,
    *,
    engine_id: str,
    address: str,
    engine: Literal["turnout", "vllm"],
    vllm_version: str,
    pack: str,
    deployment_id: str,
    host: str = "",
    metrics_path: str = "/metrics",
    scheme: Literal["http", "https"] = "http",
    started_at: dt.datetime | None = None,
) -> EngineIn:
    """The registration of an engine that runs ``decision``.

    Raises:
        ValueError: the decision has no runner (nothing serves), or a field is out of bounds
            (pydantic's ValidationError, a ValueError).
    """
    if decision.runner is None:
        raise ValueError(f"no runner serves this deployment: {decision.error}")
    return EngineIn(
        engine_id=engine_id,
        deployment_id=deployment_id,
        host=host,
        address=address,
        scheme=scheme,
        metrics_path=metrics_path,
        engine=engine,
        vllm_version=vllm_version,
        pack=pack,
        family=decision.family or UNKNOWN_FAMILY,
        stage=decision.stage,
        runner=decision.runner,
        mode=decision.mode,
        cohort=cohort_of(decision),
        policy_digest=decision.policy_digest,
        config=config.to_spec(),
        started_at=started_at or dt.datetime.now(dt.UTC),
    )


class HealthIngestIn(BaseModel):
    """A batch of health reports. Unlike decision events, a bad report is refused alone: the
    others are stored, and the answer names each refused one."""

    model_config = ConfigDict(extra="forbid")

    reports: list[HealthReportIn] = Field(min_length=1, max_length=MAX_REPORTS_PER_BATCH)


class ErrorDetail(BaseModel):
    code: StrictStr
    message: StrictStr


class HealthRejected(BaseModel):
    """A report of the batch the service refused, in the API's error shape."""

    index: StrictInt = Field(description="its position in the batch, from 0")
    report_id: StrictStr | None
    detail: ErrorDetail


class HealthAck(BaseModel):
    """The answer to ``POST /api/v1/health``: the batch (``batch_digest`` of its report ids,
    in the order sent; ``""`` for an item without a readable one) is acknowledged: the
    reports not in ``rejected`` are stored."""

    accepted: StrictInt = Field(description="reports stored (new ones and resent duplicates)")
    inserted: StrictInt = Field(default=0, description="reports that were new")
    rejected: list[HealthRejected] = Field(default_factory=list)
    batch_digest: StrictStr


# -- deployment inputs (POST /api/v1/decide and /explain; commands files) ----------------------
class DeploymentIn(BaseModel):
    """Exactly one of ``config`` (spec fields), ``command`` (a ``vllm serve`` line, optionally
    with leading ``NAME=value`` environment assignments) or ``argv`` (+ ``env``)."""

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] | None = None
    command: str | None = Field(default=None, max_length=20_000)
    argv: list[StrictStr] | None = Field(default=None, max_length=2_000)
    env: dict[str, StrictStr] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_source(self) -> DeploymentIn:
        if sum(x is not None for x in (self.config, self.command, self.argv)) != 1:
            raise ValueError("give exactly one of `config`, `command` or `argv`")
        return self


class CommandsFileLine(DeploymentIn):
    """A JSON line of a commands file (``turnout decide --commands``, as
    ``policies/reference/vllm_recipes.jsonl``): a deployment input with its id and source."""

    id: StrictStr | StrictInt | None = None
    source: str | None = None
