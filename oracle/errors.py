"""Typed errors of the decision core.

Every error carries a stable ``code`` (a snake_case string that scripts and the service may
match on) and a human message that says what was wrong and what to pass instead. HTTP status
codes are chosen by the service, never here.
"""

from __future__ import annotations

from dataclasses import dataclass


class OracleError(Exception):
    """Base of the oracle's errors: ``code`` is stable, ``message`` is for people."""

    def __init__(self, message: str, *, code: str = "oracle_error") -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(OracleError):
    """A deployment config (keyword arguments, spec, command line, HF config) is invalid.

    Codes: ``unknown_field``, ``bad_value``, ``placeholder_model``, ``unknown_model``,
    ``unknown_flag``, ``bad_flag_value``, ``missing_model``, ``bad_spec``, ``file_not_found``.
    """

    def __init__(self, message: str, *, code: str = "bad_config",
                 field: str | None = None) -> None:
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
        super().__init__(text, code="invalid_pack")
