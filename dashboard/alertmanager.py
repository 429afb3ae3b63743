"""Alertmanager receivers: who may send alerts to ``POST /api/v1/alertmanager``, and what each
alert does (the file named by ``TURNOUT_ALERTMANAGER_CONFIG``).

The file is YAML, read once at start-up::

    receivers:
      - name: sre-pager                 # audited as alertmanager:sre-pager
        token_sha256: 5e88…             # or token_env: TURNOUT_AM_SRE_TOKEN
        rules:                          # the first rule whose labels match decides
          - match: {severity: critical}
            action: kill_switch         # pause | rollback | kill_switch
          - match: {severity: page}
            match_re: {turnout_stage: "llama-.*"}
            action: pause

A receiver is chosen by its bearer token (the SHA-256 of the token Alertmanager sends in
``http_config.authorization.credentials``, or the token in an environment variable), and by
name too when the request says ``?receiver=<name>``. A rule matches an alert when each label
of ``match`` has that value and each of ``match_re`` fully matches its regular expression
(Python's ``re``, anchored as Alertmanager's matchers are). A file that cannot be used is
refused at start-up with :class:`AlertConfigError`, which names the file and the line.

The payload these rules read is Alertmanager's webhook body (version 4): see
https://prometheus.io/docs/alerting/latest/configuration/#webhook_config and
``dashboard/api/schemas_alerts.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Self

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from turnout.dashboard.store.alerts import Action
from turnout.oracle.errors import ErrorCode, OracleError

__all__ = [
    "Action",
    "AlertConfigError",
    "AlertmanagerConfig",
    "ReceiverConfig",
    "Receivers",
    "Rule",
    "load_receivers",
]

MAX_RECEIVERS = 64
MAX_RULES = 100
MAX_CONFIG_BYTES = 1024 * 1024
# Stage, family and deployment labels read by the rules (the Prometheus rules set them).
STAGE_LABEL, FAMILY_LABEL, DEPLOYMENT_LABEL = (
    "turnout_stage",
    "turnout_family",
    "turnout_deployment",
)

ReceiverName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$")]
LabelName = Annotated[str, StringConstraints(min_length=1, max_length=128)]
LabelValue = Annotated[str, StringConstraints(max_length=1024)]


class AlertConfigError(OracleError):
    """``TURNOUT_ALERTMANAGER_CONFIG`` names a file that cannot be used: missing, not YAML,
    or not receivers as the module doc shows. The message starts ``<file>:<line>:``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ErrorCode.BAD_CONFIG)


class Rule(BaseModel):
    """One rule of a receiver: labels to match and the action of a match."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: dict[LabelName, LabelValue] = Field(
        default_factory=dict, description="labels that must have exactly these values"
    )
    match_re: dict[LabelName, str] = Field(
        default_factory=dict,
        description="labels whose value must fully match these regular expressions",
    )
    action: Action
    _patterns: dict[str, re.Pattern[str]] = PrivateAttr(default_factory=dict)

    @field_validator("match_re")
    @classmethod
    def _compiles(cls, value: dict[str, str]) -> dict[str, str]:
        for name, pattern in value.items():
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(
                    f"match_re {name}: {pattern!r} is no regular expression ({err})"
                ) from None
        return value

    def model_post_init(self, _context: Any) -> None:
        self._patterns = {name: re.compile(p) for name, p in self.match_re.items()}

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when every label of ``match`` and ``match_re`` is as the rule says (a label
        the alert lacks is the empty string, as in Alertmanager's matchers)."""
        return all(labels.get(k, "") == v for k, v in self.match.items()) and all(
            p.fullmatch(labels.get(k, "")) is not None for k, p in self._patterns.items()
        )


class ReceiverConfig(BaseModel):
    """One receiver: its name, its token (as its SHA-256, or the variable holding it) and its
    rules, tried in order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ReceiverName
    token_sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{64}$")] | None = None
    token_env: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    rules: list[Rule] = Field(min_length=1, max_length=MAX_RULES)
    _digest: bytes = PrivateAttr(default=b"")

    @model_validator(mode="after")
    def _one_token(self, info: ValidationInfo) -> Self:
        if (self.token_sha256 is None) == (self.token_env is None):
            raise ValueError("give exactly one of token_sha256 and token_env")
        if self.token_sha256 is not None:
            self._digest = bytes.fromhex(self.token_sha256)
            return self
        assert self.token_env is not None
        environ: Mapping[str, str] = (info.context or {}).get("environ", os.environ)
        token = environ.get(self.token_env, "").strip()
        if not token:
            raise ValueError(f"token_env: the variable {self.token_env} is not set or empty")
        self._digest = hashlib.sha256(token.encode()).digest()
        return self

    @property
    def digest(self) -> bytes:
        """The SHA-256 of the receiver's token."""
        return self._digest

    def action_for(self, labels: Mapping[str, str]) -> Action | None:
        """The action of the first rule matching ``labels`` (None: no rule matches)."""
        return next((r.action for r in self.rules if r.matches(labels)), None)


class AlertmanagerConfig(BaseModel):
    """The whole file: its receivers (names and tokens unique)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    receivers: list[ReceiverConfig] = Field(min_length=1, max_length=MAX_RECEIVERS)


@dataclass(frozen=True)
class Receivers:
    """The receivers the service accepts alerts from (none without a configuration)."""

    receivers: tuple[ReceiverConfig, ...] = ()
    source: Path | None = None

    def authenticate(self, token: str | None, name: str | None = None) -> ReceiverConfig | None:
        """The receiver whose token is ``token`` (and whose name is ``name``, when given), or
        None. Every receiver's digest is compared, in constant time, whichever matches."""
        if not token:
            return None
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for receiver in self.receivers:
            if hmac.compare_digest(digest, receiver.digest) and name in (None, receiver.name):
                found = receiver
        return found


def load_receivers(path: Path | None, environ: Mapping[str, str] | None = None) -> Receivers:
    """The receivers of the file at ``path`` (None: no receivers); ``token_env`` variables
    are read from ``environ`` (default: the process's environment).

    Raises:
        AlertConfigError: the file cannot be read or is larger than 1 MiB, is not YAML, or
            is not receivers as the module doc shows (an unknown key, a rule without an
            action, a regular expression that does not compile, a ``token_env`` variable
            unset, two receivers of one name or one token); the message names the file and
            the line (``alerts.yaml:7: receivers[0].rules[1].action: ...``).
    """
    if path is None:
        return Receivers()
    try:
        raw = path.read_bytes()[: MAX_CONFIG_BYTES + 1]
    except OSError as err:
        raise AlertConfigError(f"{path}: cannot read it ({err.strerror or err})") from err
    if len(raw) > MAX_CONFIG_BYTES:
        raise AlertConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        loader = yaml.SafeLoader(raw.decode("utf-8"))
        try:
            root = loader.get_single_node()
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except UnicodeDecodeError as err:
        raise AlertConfigError(f"{path}: not UTF-8 (byte {err.start})") from err
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = f"{mark.line + 1}:" if mark is not None else ""
        raise AlertConfigError(f"{path}:{line} not YAML: {err.problem or err}") from err
    except yaml.YAMLError as err:
        raise AlertConfigError(f"{path}: not YAML: {err}") from err
    try:
        config = AlertmanagerConfig.model_validate(
            data, context={"environ": os.environ if environ is None else environ}
        )
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        loc = tuple(first["loc"])
        raise AlertConfigError(
            f"{path}:{_line(root, loc)}: {_dotted(loc) or 'the file'}: {first['msg']}"
            + (f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else "")
        ) from None
    names: dict[str, int] = {}
    digests: dict[bytes, int] = {}
    for i, receiver in enumerate(config.receivers):
        earlier, what = names.get(receiver.name), f"the name {receiver.name!r}"
        if earlier is None:
            earlier, what = digests.get(receiver.digest), "the token"
        if earlier is not None:
            raise AlertConfigError(
                f"{path}:{_line(root, ('receivers', i))}: receivers[{i}] has {what} of "
                f"receivers[{earlier}] (each receiver has its own)"
            )
        names[receiver.name], digests[receiver.digest] = i, i
    return Receivers(tuple(config.receivers), path)


def _dotted(loc: tuple[int | str, ...]) -> str:
    """``("receivers", 0, "rules")`` → ``receivers[0].rules``."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _line(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int:
    """The 1-based line of the deepest node of the YAML tree ``root`` that ``loc`` reaches."""
    node = root
    if node is None:
        return 1
    for part in loc:
        nxt: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            nxt = next(
                (v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part),
                None,
            )
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            nxt = node.value[part] if 0 <= part < len(node.value) else None
        if nxt is None:
            break
        node = nxt
    return int(node.start_mark.line) + 1
