"""benchmarks/fleet_load.py's bulk loader writes a fleet the service reads: its events carry
every field the store reads (a field the store gained, ``launch``, broke it once). Run as the
benchmarks run, in a process of its own: the benchmark scripts put their folder and the
repository root on sys.path, which the suite's own process must not get."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

from turnout.dashboard.store import aggregates
from turnout.dashboard.store.db import Database

ROOT = Path(__file__).resolve().parents[2]
LOAD = """
import datetime as dt, json, sys
sys.path.insert(0, sys.argv[2])
import fleet_load, load_client
now = dt.datetime.fromisoformat(sys.argv[3])
print(json.dumps(fleet_load.bulk_load(sys.argv[1], load_client.decided_configs()[:20], 2000, 300, now)))
"""


def test_a_bulk_loaded_fleet_is_read_by_the_fallbacks(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    now = dt.datetime.now(dt.UTC)
    done = subprocess.run(
        [sys.executable, "-P", "-c", LOAD, url, str(ROOT / "benchmarks"), now.isoformat()],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["events"] == 2000
    db = Database(url)
    with db.read_session() as s:
        report = aggregates.fallbacks(session=s, window="all", now=now)
    db.dispose()
    assert 0 < report.num_deployments <= 300  # each event picks one of 300 at random
    assert report.num_fallbacks > 0 and report.ranked
