"""Typed domain errors of the store, each with a stable ``code`` (the API maps them to HTTP)."""

from __future__ import annotations


class StoreError(Exception):
    """Base of the store's errors; ``code`` is stable, ``str(err)`` is for people."""

    code = "store_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class NotFound(StoreError):
    code = "not_found"


class VersionConflict(StoreError):
    """The caller's version (If-Match) is not the current one: someone else changed it first."""

    code = "version_conflict"

    def __init__(self, message: str, *, current_version: int) -> None:
        super().__init__(message)
        self.current_version = current_version


class InvalidChange(StoreError):
    code = "invalid_change"


class DatabaseUnavailable(StoreError):
    """The configured database cannot be used: not a URL, a SQLite directory that cannot be
    made, a server that refuses the connection or is not there."""

    code = "database_unavailable"
