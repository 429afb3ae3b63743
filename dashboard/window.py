"""The time window of a page or an export: the last hour, day or week, everything, or a
``from``/``to`` range (UTC), read from the query string the same way everywhere.

A page adopts it in three steps: a ``window: WindowDep`` parameter on its route, ``window.start``
and ``window.end`` passed to its store query, and ``{{ window_control(window) }}`` (from
``templates/_window.html``) inside its filter form; links to other pages of the same rows carry
``window.query()``. Bad input (an unknown window, a time that does not parse, ``from`` after
``to``) is kept as ``window.error`` and shown beside the control; the rows are not filtered by a
window the visitor did not mean, so the page shows none.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query

# key → (label, length; None: no bound)
PRESETS: dict[str, tuple[str, dt.timedelta | None]] = {
    "1h": ("last hour", dt.timedelta(hours=1)),
    "24h": ("last 24 hours", dt.timedelta(hours=24)),
    "7d": ("last 7 days", dt.timedelta(days=7)),
    "all": ("all", None),
}
CUSTOM = "custom"
MAX_TIME_TEXT = 40  # "2026-11-29T10:00:00.000000+00:00" and a little more


@dataclass(frozen=True)
class TimeWindow:
    """``[start, end)`` in UTC (either None: unbounded); ``key`` is a PRESETS key or "custom"."""

    key: str = "all"
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    from_text: str = ""
    to_text: str = ""
    error: str = ""

    @property
    def choices(self) -> list[tuple[str, str]]:
        return [(k, label) for k, (label, _len) in PRESETS.items()]

    def query(self) -> dict[str, str]:
        """The query parameters that give this window again (for links and exports)."""
        if self.key == CUSTOM:
            out = {"window": CUSTOM}
            if self.from_text:
                out["from"] = self.from_text
            if self.to_text:
                out["to"] = self.to_text
            return out
        return {} if self.key == "all" else {"window": self.key}

    def describe(self) -> str:
        """For a heading: ``in the last 24 hours``, ``from 2026-11-01 00:00 UTC``, ``""``."""
        if self.error or self.key == "all":
            return ""
        if self.key != CUSTOM:
            return f"in the {PRESETS[self.key][0]}"
        parts = []
        if self.start is not None:
            parts.append(f"from {self.start:%Y-%m-%d %H:%M} UTC")
        if self.end is not None:
            parts.append(f"until {self.end:%Y-%m-%d %H:%M} UTC")
        return " ".join(parts)


def parse_time(text: str, name: str) -> dt.datetime:
    """``2026-11-29``, ``2026-11-29T10:00`` (what a browser's datetime-local field sends; read
    as UTC) or any ISO 8601 time with an offset. Raises ValueError naming ``name``."""
    value = text.strip()
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{name}: {text[:MAX_TIME_TEXT]!r} is not a time (use 2026-11-29, "
            "2026-11-29T10:00 in UTC, or an ISO 8601 time with its offset)"
        ) from None
    try:
        return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)
    except OverflowError:  # 0001-01-01T00:00+14:00 is before year 1 in UTC
        raise ValueError(
            f"{name}: {text[:MAX_TIME_TEXT]!r} is out of range (in UTC it falls "
            "before year 1 or after year 9999)"
        ) from None


def read_window(
    window: str = "", from_text: str = "", to_text: str = "", now: dt.datetime | None = None
) -> TimeWindow:
    """The window a query string asks for. ``from``/``to`` go with ``window=custom`` (or no
    ``window`` at all); beside a preset they are an error, not silently dropped. Raises
    ValueError with what is wrong."""
    key = window.strip() or (CUSTOM if from_text.strip() or to_text.strip() else "all")
    if key != CUSTOM and key not in PRESETS:
        raise ValueError(
            f"window: {window[:MAX_TIME_TEXT]!r} is not a window; use "
            f"{', '.join(PRESETS)} or {CUSTOM} (with from and to)"
        )
    if key != CUSTOM:
        if from_text.strip() or to_text.strip():
            raise ValueError(f"from/to go with window=custom, not window={key}")
        length = PRESETS[key][1]
        now = now or dt.datetime.now(dt.UTC)
        return TimeWindow(key, None if length is None else now - length, None)
    start = parse_time(from_text, "from") if from_text.strip() else None
    end = parse_time(to_text, "to") if to_text.strip() else None
    if start is not None and end is not None and start >= end:
        raise ValueError(
            f"from ({start:%Y-%m-%d %H:%M} UTC) must be before to ({end:%Y-%m-%d %H:%M} UTC)"
        )
    return TimeWindow(CUSTOM, start, end, from_text.strip(), to_text.strip())


def page_window(
    window: Annotated[str, Query(max_length=16)] = "",
    from_text: Annotated[str, Query(alias="from", max_length=MAX_TIME_TEXT)] = "",
    to_text: Annotated[str, Query(alias="to", max_length=MAX_TIME_TEXT)] = "",
) -> TimeWindow:
    """The page dependency: the window asked for, or one carrying ``error`` (shown by the
    control) with what the visitor typed kept in the form."""
    try:
        return read_window(window, from_text, to_text)
    except ValueError as err:
        return TimeWindow(
            CUSTOM if from_text or to_text else "all",
            from_text=from_text,
            to_text=to_text,
            error=str(err),
        )


WindowDep = Annotated[TimeWindow, Depends(page_window)]
