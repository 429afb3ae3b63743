"""The fleet's Prometheus, as the ramp gates read it: one instant query per PromQL gate
(``GET /api/v1/query``, Prometheus' HTTP API, docs "Querying API"), asked outside any
database transaction, each bounded by a timeout.

A gate needs one number. The answer's ``data.resultType`` is ``scalar`` (its value), or
``vector`` with exactly one sample; anything else is inconclusive, with the reason: no data
(an empty vector: no engine scraped yet, or no traffic in the window), NaN or ±Inf (0/0 of a
ratio without traffic), several series (the query must aggregate them, e.g. ``sum``), a
refused query (Prometheus' ``errorType`` and ``error``), or Prometheus not answering.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from turnout.dashboard.gates import GateConfig, PromqlReading
from turnout.oracle.client_http import request_within

#: The largest answer a gate reads (one value is a few hundred bytes; a query that returns
#: whole series is refused as "several series" long before this).
MAX_ANSWER_BYTES = 4 << 20

log = logging.getLogger("turnout.service")

#: How many gate queries a pass has in flight at once.
MAX_PARALLEL_QUERIES = 16

#: An instant query at a time: returns the reading (never raises).
Querier = Callable[[str, dt.datetime], PromqlReading]


@dataclass(frozen=True)
class Prometheus:
    """A Prometheus server: its base URL (``http://prometheus:9090``), the per-query timeout
    in seconds, and an ``Authorization`` header value when it needs one."""

    url: str
    timeout_s: float = 5.0
    authorization: str | None = None

    def query(self, query: str, at: dt.datetime) -> PromqlReading:
        """The value of ``query`` at ``at``, or why there is none; the whole answer within
        ``timeout_s`` (a server that trickles its bytes is cut there, not per read), at most
        ``MAX_ANSWER_BYTES``. Never raises."""
        headers = {"Authorization": self.authorization} if self.authorization else {}
        try:
            with httpx.Client(timeout=self.timeout_s) as http:
                resp = request_within(
                    http,
                    "GET",
                    self.url.rstrip("/") + "/api/v1/query",
                    deadline_s=self.timeout_s,
                    params={"query": query, "time": f"{at.timestamp():.3f}"},
                    headers=headers,
                )
        except (httpx.HTTPError, httpx.InvalidURL, ValueError, UnicodeError) as err:
            # (DeadlineExceeded is an httpx.HTTPError; a URL or a header value that cannot
            # be sent is a setting's fault, said in the gate's message rather than a crash)
            return PromqlReading(query, None, f"Prometheus unreachable: {err}"[:500], at)
        if len(resp.content) > MAX_ANSWER_BYTES:
            return PromqlReading(query, None, f"an answer over {MAX_ANSWER_BYTES} bytes", at)
        try:
            body = resp.json()
        except ValueError:
            return PromqlReading(query, None, f"Prometheus answered HTTP {resp.status_code}", at)
        return reading_of(query, body, resp.status_code, at)


def reading_of(query: str, body: Any, status: int, at: dt.datetime) -> PromqlReading:
    """The reading of one ``/api/v1/query`` answer (``body``: its JSON)."""
    if not isinstance(body, dict) or body.get("status") != "success":
        kind = body.get("errorType", "") if isinstance(body, dict) else ""
        error = body.get("error", "") if isinstance(body, dict) else ""
        why = f"{kind}: {error}" if kind or error else f"HTTP {status}"
        return PromqlReading(query, None, f"Prometheus refused the query ({why})"[:500], at)
    data = body.get("data")
    if not isinstance(data, dict):
        return PromqlReading(query, None, "an answer without a result (data is not an object)", at)
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar" and isinstance(result, list) and len(result) == 2:
        return _value(query, result[1], at)
    if kind != "vector" or not isinstance(result, list):
        return PromqlReading(query, None, f"a {kind} result, not one value", at)
    if not result:
        return PromqlReading(query, None, "no data", at)
    if len(result) > 1:
        return PromqlReading(
            query, None, f"{len(result)} series, not one: aggregate them (sum, max, ...)", at
        )
    sample = result[0].get("value") if isinstance(result[0], dict) else None
    if not isinstance(sample, list) or len(sample) != 2:
        return PromqlReading(query, None, "a sample without a value", at)
    return _value(query, sample[1], at)


def _value(query: str, text: Any, at: dt.datetime) -> PromqlReading:
    # Prometheus writes a sample's value as a string ("0.25", "NaN"); a bool is no value.
    if isinstance(text, bool):
        return PromqlReading(query, None, f"not a number: {text}", at)
    try:
        value = float(text)
    except (TypeError, ValueError):
        return PromqlReading(query, None, f"not a number: {str(text)[:40]}", at)
    if not math.isfinite(value):
        return PromqlReading(query, None, f"{text} (no traffic in the window?)", at)
    return PromqlReading(query, value, None, at)


def read_gates(
    ramps: Iterable[tuple[int, str, Mapping[str, Any]]], querier: Querier, now: dt.datetime
) -> dict[int, dict[str, PromqlReading]]:
    """Every PromQL gate of every ramp given (``(ramp id, stage, stored gates)``), queried at
    ``now``: ramp id → gate name → reading.

    The queries run at once (up to :data:`MAX_PARALLEL_QUERIES`), so that a pass takes about
    one query's time, at most the querier's timeout, however many gates there are; asked one
    after another, twenty gates on a Prometheus at its 5 s timeout held scheduled flips for
    100 s."""
    asked: list[tuple[int, str, str]] = []
    for ramp_id, stage, stored in ramps:
        config = GateConfig.model_validate(stored)
        asked.extend((ramp_id, g.name, g.render(stage)) for g in config.promql or ())
    if not asked:
        return {}
    with ThreadPoolExecutor(min(MAX_PARALLEL_QUERIES, len(asked))) as pool:
        readings = list(pool.map(lambda a: _read_one(querier, a[2], now), asked))
    out: dict[int, dict[str, PromqlReading]] = {}
    for (ramp_id, name, _query), reading in zip(asked, readings, strict=True):
        out.setdefault(ramp_id, {})[name] = reading
    return out


def _read_one(querier: Querier, query: str, now: dt.datetime) -> PromqlReading:
    """One gate's reading; a querier that raises makes that gate inconclusive, never the pass
    (a raise here stopped every ramp and scheduled flip of the pass)."""
    try:
        return querier(query, now)
    except Exception as err:
        log.warning("PromQL gate query %r failed: %r", query[:200], err)
        return PromqlReading(query, None, f"the query failed: {err!r}"[:500], now)


def unconfigured(query: str, at: dt.datetime) -> PromqlReading:
    """The querier of a service without ``TURNOUT_PROMETHEUS_URL``."""
    return PromqlReading(query, None, "no Prometheus configured (TURNOUT_PROMETHEUS_URL)", at)


__all__ = ["Prometheus", "Querier", "read_gates", "reading_of", "unconfigured"]
