"""Where the ramp gates read engine health from: the engines' health reports
(``dashboard.store.health.health_by_runner``, per runner in a stage over a time range)."""

from __future__ import annotations

from turnout.dashboard.store.advance import HealthReader


def health_reader() -> HealthReader:
    """``dashboard.store.health.health_by_runner``."""
    from turnout.dashboard.store.health import health_by_runner

    return health_by_runner
