"""benchmarks/fleet_load.py's bulk loader writes a fleet the service reads: its events carry
every field the store reads (a field the store gained, ``launch``, broke it once)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from benchmarks import fleet_load
from benchmarks.load_client import decided_configs
from turnout.dashboard.store import aggregates
from turnout.dashboard.store.db import Database


def test_a_bulk_loaded_fleet_is_read_by_the_fallbacks(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    now = dt.datetime.now(dt.UTC)
    loaded = fleet_load.bulk_load(url, decided_configs()[:20], 2000, 300, now)
    assert loaded["events"] == 2000
    db = Database(url)
    with db.read_session() as s:
        report = aggregates.fallbacks(session=s, window="all", now=now)
    db.dispose()
    assert 0 < report.num_deployments <= 300  # each event picks one of 300 at random
    assert report.num_fallbacks > 0 and report.ranked
