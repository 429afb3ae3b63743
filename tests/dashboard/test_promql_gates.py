"""PromQL gates against a real Prometheus (Debian's) scraping two exporters that stand for a
canary and a baseline engine (vLLM's TTFT histogram with its buckets, labelled as the
service's HTTP SD labels them), on SQLite and PostgreSQL:

- Prometheus' answers read as one value or as inconclusive with the reason (no data, several
  series, NaN, a refused query, Prometheus unreachable);
- a ramp gated by "canary p95 TTFT / baseline p95 TTFT <= 1.2" steps while the canary is
  as fast as the baseline, and pauses (rolls back) once the canary turns slow, the query,
  value and verdict in the ramp's last gates and in the audit log;
- a gate that stays inconclusive pauses the ramp after max_inconclusive_rounds, even one
  whose on_failure is rollback.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_helpers import (
    PrometheusServer,
    free_port,
    serve_text_format,
    skip_under_a_shifted_clock,
    start_prometheus,
)

from turnout.dashboard import promql
from turnout.dashboard.gates import GateConfig, PromqlGate, PromqlReading
from turnout.dashboard.health_source import health_reader
from turnout.dashboard.store import advance, audit, canaries, ramps
from turnout.dashboard.store.canaries import CohortDefault
from turnout.dashboard.store.db import Database
from turnout.serving.metrics import TIME_TO_FIRST_TOKEN_BUCKETS

STAGE = "qwen3-canary"
TTFT_P95 = (
    "histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket"
    '{{turnout_stage="$stage",turnout_cohort="{cohort}"}}[$window])))'
)
TTFT_RATIO = PromqlGate(
    name="ttft_p95_ratio",
    query=f"({TTFT_P95.format(cohort='canary')}) / ({TTFT_P95.format(cohort='baseline')})",
    comparison="<=",
    threshold=1.2,
    window="30s",
)


class Exporter:
    """One engine's TTFT histogram on its own /metrics port, with steady traffic: 100
    requests a second at ``latency_s`` (a rate needs samples that move)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            registry=self.registry,
            buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self.port = free_port()
        self.server = serve_text_format(self.registry, self.port)
        self.latency_s = 0.05
        self.stopped = threading.Event()
        threading.Thread(target=self._traffic, daemon=True).start()

    def _traffic(self) -> None:
        while not self.stopped.wait(0.1):
            for _ in range(10):
                self.ttft.observe(self.latency_s)

    def stop(self) -> None:
        self.stopped.set()
        self.server.shutdown()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[PrometheusServer, Exporter, Exporter]]:
    skip_under_a_shifted_clock()
    canary, baseline = Exporter(), Exporter()
    config = f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: engines
    static_configs:
      - targets: ["127.0.0.1:{canary.port}"]
        labels: {{turnout_stage: "{STAGE}", turnout_cohort: canary}}
      - targets: ["127.0.0.1:{baseline.port}"]
        labels: {{turnout_stage: "{STAGE}", turnout_cohort: baseline}}
"""
    server = start_prometheus(tmp_path, config)
    try:
        yield server, canary, baseline
    finally:
        server.stop()
        canary.stop()
        baseline.stop()


def _wait_scraped(server: PrometheusServer) -> None:
    server.wait_for('count(up{job="engines"} == 1) == 2')


def test_answers_read_as_one_value_or_as_why_not(
    fleet: tuple[PrometheusServer, Exporter, Exporter],
) -> None:
    server, _canary, _baseline = fleet
    _wait_scraped(server)
    prom = promql.Prometheus(server.url, timeout_s=5)
    now = dt.datetime.now(dt.UTC)
    assert prom.query('sum(up{job="engines"})', now).value == 2.0
    assert prom.query("scalar(vector(0.25))", now).value == 0.25
    assert prom.query('up{job="no-such-job"}', now).problem == "no data"
    several = prom.query('up{job="engines"}', now)
    assert several.value is None and "2 series" in (several.problem or "")
    nan = prom.query("vector(0) / vector(0)", now)
    assert nan.value is None and "NaN" in (nan.problem or "")
    refused = prom.query("sum(", now)
    assert refused.value is None and "bad_data" in (refused.problem or "")
    gone = promql.Prometheus(f"http://127.0.0.1:{free_port()}", timeout_s=1).query("up", now)
    assert gone.value is None and "unreachable" in (gone.problem or "")


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    database.upgrade()
    with database.write_session() as s:
        canaries.ensure_defaults(session=s, defaults=[CohortDefault(STAGE, False)])
        s.commit()
    yield database
    database.dispose()


def _start(db: Database, gates: GateConfig, on_failure: str) -> int:
    steps = [{"percentage": p, "bake_s": 0} for p in (10, 50, 100)]
    with db.write_session() as s:
        ramp = ramps.request_ramp(
            session=s,
            cohort=STAGE,
            steps=steps,
            gates=gates,
            on_failure=on_failure,
            reason="PromQL-gated",
            actor="alice",
            requester="alice",
            if_version=1,
            needs_approval=False,
            now=dt.datetime.now(dt.UTC),
        )
        s.commit()
        return ramp.id


def _tick(db: Database, querier: promql.Querier) -> list[advance.RampTick]:
    now = dt.datetime.now(dt.UTC)
    with db.read_session() as s:
        active = [(r.id, r.cohort, dict(r.gates)) for r in ramps.list_ramps(session=s, live_only=True)
                  if r.state == "active"]  # fmt: skip
    readings = promql.read_gates(active, querier, now)
    with db.write_session() as s:
        return advance.advance_ramps(
            session=s, now=now, named={STAGE: ("qwen3",)}, health=health_reader(), promql=readings
        )


def test_a_slow_canary_fails_the_ttft_gate(
    db: Database, fleet: tuple[PrometheusServer, Exporter, Exporter]
) -> None:
    server, canary, baseline = fleet
    _wait_scraped(server)
    canary.latency_s = baseline.latency_s = 0.05
    server.wait_for(TTFT_RATIO.render(STAGE) + " > 0")
    gates = GateConfig(evidence_max_age_s=60, health_reports=False, promql=(TTFT_RATIO,))
    ramp_id = _start(db, gates, on_failure="rollback")
    query = promql.Prometheus(server.url).query

    first = _tick(db, query)
    by_gate = {g.gate: g for g in first[0].gates}
    assert by_gate["promql:ttft_p95_ratio"].status == "pass", by_gate
    assert by_gate["promql:ttft_p95_ratio"].figures["value"] == pytest.approx(1.0, rel=0.05)

    canary.latency_s = 2.0  # the canary turns slow: p95 TTFT from 50 ms to 2 s
    deadline = time.monotonic() + 30
    outcome = "held"
    while time.monotonic() < deadline:
        ticks = _tick(db, query)
        if not ticks:
            break
        outcome = ticks[0].outcome
        if outcome == "rolled_back":
            break
        time.sleep(1)
    assert outcome == "rolled_back"
    with db.read_session() as s:
        ramp = ramps.get_ramp(session=s, ramp_id=ramp_id)
        gate = next(g for g in ramp.last_gates if g["gate"] == "promql:ttft_p95_ratio")
        assert gate["status"] == "fail" and gate["figures"]["value"] > 1.2
        assert gate["figures"]["query"].startswith("(histogram_quantile(0.95")
        assert f'turnout_stage="{STAGE}"' in gate["figures"]["query"]
        entries = audit.list_entries(session=s, limit=50)
        actions = [e.action for e in entries]
        assert "ramp.rollback" in actions
        turned = [e for e in entries if e.action == "ramp.gate"]
        assert {e.after["status"] for e in turned} >= {"pass", "fail"}  # type: ignore[index]
        assert not canaries.read_state(session=s).cohorts[STAGE][0]  # the stage is off again


def test_an_inconclusive_gate_pauses_even_a_rollback_ramp(
    db: Database, fleet: tuple[PrometheusServer, Exporter, Exporter]
) -> None:
    server, _canary, _baseline = fleet
    silent = PromqlGate(
        name="nothing_scraped",
        query='sum(rate(vllm:request_success_total{turnout_stage="$stage"}[$window]))',
        comparison=">=",
        threshold=0.0,
    )
    gates = GateConfig(health_reports=False, promql=(silent,), max_inconclusive_rounds=3)
    ramp_id = _start(db, gates, on_failure="rollback")
    query = promql.Prometheus(server.url).query
    outcomes = [_tick(db, query)[0].outcome for _ in range(3)]
    assert outcomes == ["held", "held", "paused"]
    with db.read_session() as s:
        ramp = ramps.get_ramp(session=s, ramp_id=ramp_id)
        assert ramp.state == "paused"
        gate = next(g for g in ramp.last_gates if g["gate"] == "promql:nothing_scraped")
        assert gate["figures"]["inconclusive_rounds"] == 3
        assert "no data" in gate["message"]
        assert canaries.read_state(session=s).cohorts[STAGE][0]  # paused, not rolled back


def test_without_prometheus_the_gate_waits_and_never_passes(db: Database) -> None:
    gate = PromqlGate(name="any", query="vector(1)", comparison=">=", threshold=0.0)
    ramp_id = _start(db, GateConfig(health_reports=False, promql=(gate,)), on_failure="pause")
    ticks = _tick(db, promql.unconfigured)
    assert ticks[0].outcome == "held"
    (result,) = [g for g in ticks[0].gates if g.gate == "promql:any"]
    assert result.status == "wait" and "TURNOUT_PROMETHEUS_URL" in result.message
    with db.read_session() as s:
        assert ramps.get_ramp(session=s, ramp_id=ramp_id).step_index == 0


def test_every_gate_of_a_pass_is_asked_at_once() -> None:
    """Twelve gates over three ramps: each query waits at a barrier for all twelve, which
    only queries in flight together can pass (asked one after another, the first would wait
    its whole timeout and every reading would say so)."""
    gates = tuple(
        PromqlGate(name=f"g{i}", query=f"vector({i})", comparison=">=", threshold=0.0)
        for i in range(4)
    )
    stored = GateConfig(health_reports=False, promql=gates).model_dump(mode="json")
    barrier = threading.Barrier(12)
    now = dt.datetime.now(dt.UTC)

    def querier(query: str, at: dt.datetime) -> PromqlReading:
        try:
            barrier.wait(timeout=60)
        except threading.BrokenBarrierError:
            return PromqlReading(query, None, "asked alone", at)
        return PromqlReading(query, float(query[7:-1]), None, at)

    readings = promql.read_gates([(r, STAGE, stored) for r in (1, 2, 3)], querier, now)
    assert {
        ramp: {name: (reading.value, reading.problem) for name, reading in by_name.items()}
        for ramp, by_name in readings.items()
    } == {r: {f"g{i}": (float(i), None) for i in range(4)} for r in (1, 2, 3)}


@pytest.mark.parametrize(
    "body",
    [
        {"status": "success", "data": ["x"]},
        {"status": "success", "data": "x"},
        {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, True]}]}},
        {"status": "success", "data": {"resultType": "scalar", "result": [1, {"a": 1}]}},
    ],
)
def test_an_answer_of_another_shape_is_inconclusive(body: object) -> None:
    reading = promql.reading_of("q", body, 200, dt.datetime.now(dt.UTC))
    assert reading.value is None and reading.problem


def test_a_querier_that_raises_makes_its_gate_inconclusive_not_the_pass() -> None:
    gates = tuple(
        PromqlGate(name=n, query=f"vector({i})", comparison=">=", threshold=0.0)
        for i, n in enumerate(("ok", "boom"))
    )
    stored = GateConfig(health_reports=False, promql=gates).model_dump(mode="json")

    def querier(query: str, at: dt.datetime) -> PromqlReading:
        if query == "vector(1)":
            raise AttributeError("'list' object has no attribute 'get'")
        return PromqlReading(query, 0.0, None, at)

    readings = promql.read_gates([(7, STAGE, stored)], querier, dt.datetime.now(dt.UTC))
    assert readings[7]["ok"].value == 0.0
    assert readings[7]["boom"].value is None and "AttributeError" in str(
        readings[7]["boom"].problem
    )


def test_a_prometheus_that_trickles_is_cut_at_the_timeout(tmp_path: Path) -> None:
    """A breaker's Prometheus sent its status line, then a byte a second: the per-read timeout
    never fired and the ticker stalled. The whole answer now has the timeout."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        while not stop.wait(0.2):
            with contextlib.suppress(OSError):
                conn.sendall(b" ")
        conn.close()

    threading.Thread(target=trickle, daemon=True).start()
    port = listener.getsockname()[1]
    started = time.monotonic()
    got = promql.Prometheus(f"http://127.0.0.1:{port}", timeout_s=1.0).query("up", _now())
    stop.set()
    assert got.value is None and "unreachable" in (got.problem or "")
    assert time.monotonic() - started < 10


def test_settings_a_gate_cannot_use_are_refused() -> None:
    from pydantic import ValidationError

    from turnout.dashboard.settings import Settings

    for bad in ({"prometheus_url": "http://[::1"}, {"prometheus_url": "ftp://prom"},
                {"prometheus_authorization": "Bearer é"}):  # fmt: skip
        with pytest.raises(ValidationError):
            Settings(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="nothing watches"):
        GateConfig(health_reports=False)
    with pytest.raises(ValidationError, match=r"30s\.\.9999h"):
        PromqlGate(name="a", query="up", comparison="<", threshold=1.0, window="1s")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
