"""Typed domain errors of the store, each with a stable ``code`` (the API maps them to HTTP)."""

from __future__ import annotations

from turnout.oracle.errors import ErrorCode


class StoreError(Exception):
    """Base of the store's errors; ``code`` is stable, ``str(err)`` is for people."""

    code: ErrorCode = ErrorCode.STORE_ERROR

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class NotFound(StoreError):
    code = ErrorCode.NOT_FOUND


class VersionConflict(StoreError):
    """The caller's version (If-Match) is not the current one: someone else changed it first."""

    code = ErrorCode.VERSION_CONFLICT

    def __init__(self, message: str, *, current_version: int) -> None:
        super().__init__(message)
        self.current_version = current_version


class InvalidChange(StoreError):
    code = ErrorCode.INVALID_CHANGE


class Conflict(StoreError):
    """The change does not fit the state of what it changes (a ramp that is not live, a
    second live ramp on a cohort); re-read it."""

    code = ErrorCode.WRONG_STATE


class NotAllowed(StoreError):
    """The caller may not make this change whatever its role (approving its own request)."""

    code = ErrorCode.SELF_APPROVAL


class DatabaseUnavailable(StoreError):
    """The configured database cannot be used: not a URL, a SQLite directory that cannot be
    made, a server that refuses the connection or is not there."""

    code = ErrorCode.DATABASE_UNAVAILABLE
