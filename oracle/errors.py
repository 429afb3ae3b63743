"""Typed errors of the decision core, and the one list of error codes.

Every error carries a stable ``code``, an :class:`ErrorCode` (a ``str``: the snake_case value is
what scripts, the JSON contract and the service's API responses carry), and a human message
that says what was wrong and what to pass instead. HTTP status codes are chosen by the
service, never here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ErrorCode(StrEnum):
    """Every error code the oracle, its CLI and the service produce, each with its ``area``:

    - ``"oracle"``: the defaults of :class:`OracleError` / :class:`ConfigError`;
    - ``"config"``: a :class:`ConfigError` (docs/oracle-api.md, "ConfigError codes");
    - ``"pack"``: loading a policy pack;
    - ``"decision"``: ``Decision.error_code`` (docs/oracle-api.md, the JSON contract);
    - ``"cli"``: the ``turnout`` command line;
    - ``"service"``: the service's API errors, ``{"detail": {"code": ...}}`` (docs/service.md).

    The values are a stable contract: tests/test_error_codes.py checks them against the docs.
    """

    area: str

    def __new__(cls, value: str, area: str = "") -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.area = area
        return member

    ORACLE_ERROR = "oracle_error", "oracle"
    BAD_CONFIG = "bad_config", "oracle"

    UNKNOWN_FIELD = "unknown_field", "config"
    BAD_VALUE = "bad_value", "config"
    BAD_SPEC = "bad_spec", "config"
    FILE_NOT_FOUND = "file_not_found", "config"
    LOCAL_FILE = "local_file", "config"
    BAD_COMMAND = "bad_command", "config"
    UNKNOWN_FLAG = "unknown_flag", "config"
    BAD_FLAG_VALUE = "bad_flag_value", "config"
    PLACEHOLDER_MODEL = "placeholder_model", "config"
    PLACEHOLDER_VALUE = "placeholder_value", "config"
    MISSING_MODEL = "missing_model", "config"
    UNKNOWN_MODEL = "unknown_model", "config"
    GATED_MODEL = "gated_model", "config"
    REVISION_NOT_FOUND = "revision_not_found", "config"

    INVALID_PACK = "invalid_pack", "pack"
    UNKNOWN_PACK = "unknown_pack", "pack"

    PIN_CONFLICT = "pin_conflict", "decision"
    NO_RUNNER = "no_runner", "decision"
    INVALID_ENV = "invalid_env", "decision"
    UNKNOWN_ARCHITECTURE = "unknown_architecture", "decision"
    REFUSED = "refused", "decision"
    UNKNOWN_SETTING = "unknown_setting", "decision"
    ARCHITECTURE_NOT_SERVED = "architecture_not_served", "decision"

    BAD_USAGE = "bad_usage", "cli"
    VLLM_NOT_INSTALLED = "vllm_not_installed", "cli"

    INVALID_REQUEST = "invalid_request", "service"
    BODY_TOO_LARGE = "body_too_large", "service"
    UNSTORABLE_VALUE = "unstorable_value", "service"
    UNAUTHENTICATED = "unauthenticated", "service"
    BAD_TOKEN = "bad_token", "service"
    FORBIDDEN = "forbidden", "service"
    IF_MATCH_REQUIRED = "if_match_required", "service"
    BAD_IF_MATCH = "bad_if_match", "service"
    SELF_REVOKE = "self_revoke", "service"
    UNKNOWN_FAMILY = "unknown_family", "service"
    STORE_ERROR = "store_error", "service"
    NOT_FOUND = "not_found", "service"
    VERSION_CONFLICT = "version_conflict", "service"
    TOO_MANY_REQUESTS = "too_many_requests", "service"
    INVALID_CHANGE = "invalid_change", "service"
    DATABASE_UNAVAILABLE = "database_unavailable", "service"
    UNKNOWN_COHORT = "unknown_cohort", "service"
    UNKNOWN_TOKEN = "unknown_token", "service"
    BAD_PERCENTAGE = "bad_percentage", "service"
    NAME_REQUIRED = "name_required", "service"
    REASON_REQUIRED = "reason_required", "service"
    REASON_TOO_LONG = "reason_too_long", "service"
    TOKEN_EXPIRED = "token_expired", "service"
    METHOD_NOT_ALLOWED = "method_not_allowed", "service"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type", "service"
    INTERNAL_ERROR = "internal_error", "service"
    UNKNOWN_RAMP = "unknown_ramp", "service"
    RAMP_EXISTS = "ramp_exists", "service"
    WRONG_STATE = "wrong_state", "service"
    SELF_APPROVAL = "self_approval", "service"
    UNKNOWN_FLIP = "unknown_flip", "service"
    UNKNOWN_WEBHOOK = "unknown_webhook", "service"


class OracleError(Exception):
    """Base of the oracle's errors: ``code`` is stable, ``message`` is for people."""

    def __init__(self, message: str, *, code: ErrorCode = ErrorCode.ORACLE_ERROR) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(OracleError):
    """A deployment config (keyword arguments, spec, command line, HF config) is invalid.

    ``code`` is one of the ErrorCode members of area ``"config"`` (``UNKNOWN_FIELD``,
    ``BAD_VALUE``, ``PLACEHOLDER_MODEL``, ...).
    """

    def __init__(
        self, message: str, *, code: ErrorCode = ErrorCode.BAD_CONFIG, field: str | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.field = field  # the offending DeploymentConfig field or spec key, when one is


@dataclass(frozen=True)
class Issue:
    """One problem found in a policy-pack file, at 1-based ``line`` and ``column``."""

    file: str
    line: int
    column: int
    message: str
    severity: str = "error"  # "error" | "warning"

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.severity}: {self.message}"


class PackError(OracleError):
    """A policy pack failed to load; ``issues`` lists every problem with its file:line:column."""

    def __init__(self, issues: list[Issue]) -> None:
        self.issues = issues
        text = "\n".join(str(i) for i in issues) or "invalid policy pack"
        super().__init__(text, code=ErrorCode.INVALID_PACK)
