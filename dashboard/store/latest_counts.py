"""Deployments counted by their latest decision, kept as events arrive (table ``latest_counts``).

Ingest moves a deployment's latest decision forward (table ``deployments``) and, in the same
transaction, moves the deployment's count from the keys of its old latest decision to the keys
of the new one: ``-1`` under each key of the old state, ``+1`` under each key of the new
(:func:`apply_moves`). A key is (bucket size, bucket, reason, kind, family, stage, pack,
runner, demo): the bucket is the one the decision's time falls in, for each of four sizes
(5 minutes, 1 hour, 6 hours, 1 day). A deployment is counted once with ``reason = ""`` (itself) and,
when its latest decision is not V2, once under each of its fallback-reason keys. The reasons are
bounded by the pack: ingest refuses rule ids the pack cannot give; :func:`cardinality` and
:func:`compact` (``turnout db cardinality``) find and fold what was stored before.

A read of a time window then sums a few hundred rows (``aggregates.fallbacks``), whatever the
number of stored events or deployments. Fine buckets are read only for recent times, so they
are kept for a limited time (:data:`RETENTION_S`); day buckets are kept for good unless the
database sets a retention (:func:`set_day_retention`, ``turnout db retention``): then the
``all`` window is the days kept, and a deployment whose latest decision is older leaves the
counts.

The same functions rebuild the table from ``deployments`` (:func:`rebuild`: migration 0004's
backfill) and serve the bulk loader (``dashboard/store/bulk.py``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, NamedTuple

from sqlalchemy import Connection, delete, func, insert, select, update

from turnout.dashboard.store.models import Deployment, LatestCounts, ServiceMeta

# Bucket sizes, seconds, each a multiple of the one before: 5 minutes, an hour, 6 hours, a day.
BUCKETS = (300, 3600, 21600, 86400)
# How far back (seconds) each size is kept, None: for good. The reads use 5-minute buckets for
# windows of up to 24 hours (and their first hour), hourly ones for the 24-hour window and the
# first hours of the 7-day one, 6-hour ones for the 7-day window (a sixth of the rows hourly
# buckets would take: the 7-day window is the largest read); a day of slack on top. In a fleet
# whose deployments report every few days, a move then rarely touches a fine bucket.
RETENTION_S: dict[int, int | None] = {
    300: 2 * 86400,
    3600: 9 * 86400,
    21600: 9 * 86400,
    86400: None,
}
# service_meta key: how many days day buckets are kept (absent: for good). A property of the
# database, not of a process: every writer must agree on which buckets moves still touch, or
# a count taken off a pruned bucket would leave -1 behind.
DAY_RETENTION_KEY = "day_bucket_retention_days"
# The day retention's bounds, days: the `all` window never narrower than the 7-day one (a
# retention of N days keeps the day buckets that start within N days, so 8 covers 7 days and
# the partial day before them), and no later than dates can go.
MIN_DAY_RETENTION_DAYS = 8
MAX_DAY_RETENTION_DAYS = 36_500
# Rows are deleted a day after ingest stops writing them, so that a pruning transaction and
# an ingest whose clock is a little behind never touch the same row.
_PRUNE_MARGIN_S = 86400

Kind = Literal["blocked", "waiting", "held"]
KINDS: tuple[Kind, ...] = ("blocked", "waiting", "held")
_WAITING = frozenset(
    {
        "rollout.stage_off",
        "rollout.split_out",
        "rollout.no_stage",
        "DISABLED",
        "DEFAULT",
        "SPLIT",
        "TARGETING_MATCH",
    }
)
_HELD = frozenset({"rollout.kill_switch", "pin.v1", "STATIC"})
_PER_STAGE = ("rollout.stage_off", "rollout.split_out")


def reason_keys(rule_ids: Sequence[str], reason_code: str, stage: str | None) -> list[str]:
    """What a fallback is attributed to: its rule ids, the per-stage rollout reasons split by
    stage (``rollout.stage_off:qwen3-canary``), or, with no rule at all, the reason code."""
    if not rule_ids:
        return [reason_code]
    return [f"{r}:{stage}" if r in _PER_STAGE and stage else r for r in rule_ids]


def reason_kind(key: str) -> Kind:
    """``"waiting"``: the deployment waits for its rollout stage (off, outside the canary
    share, in no stage); ``"held"``: an operator holds it on V1 (the kill switch, a V1 pin);
    ``"blocked"``: anything else, a rule of the pack that V2 does not serve (a real
    incompatibility) or a configuration no runner serves. A bare reason code (an event without
    rule ids) is classed by what the code means."""
    base = key.split(":", 1)[0]
    if base in _WAITING:
        return "waiting"
    if base in _HELD:
        return "held"
    return "blocked"


class State(NamedTuple):
    """A deployment's latest decision, as far as the counts need it."""

    t: int  # the decision's time, epoch seconds (UTC)
    event_id: str
    pack: str
    family: str
    stage: str | None
    runner: str | None
    reason_code: str
    rule_ids: tuple[str, ...]
    demo: bool


def state_of(e: Any) -> State:
    """The :class:`State` of an event (``events.EventLike``) or a ``deployments`` row."""
    return State(
        int(e.at.timestamp() // 1),
        e.event_id,
        e.pack,
        e.family,
        e.stage,
        e.runner,
        e.reason_code,
        tuple(e.rule_ids),
        bool(e.demo),
    )


Suffix = tuple[
    str, str, str, str, str, str, bool
]  # reason, kind, family, stage, pack, runner, demo
Key = tuple[int, int, str, str, str, str, str, str, bool]  # (bucket size, bucket, *Suffix)


def _suffixes(s: State) -> tuple[Suffix, ...]:
    return suffixes_of(s.runner, s.rule_ids, s.reason_code, s.stage, s.family, s.pack, s.demo)


@lru_cache(maxsize=16384)
def suffixes_of(
    runner: str | None,
    rule_ids: tuple[str, ...],
    reason_code: str,
    stage: str | None,
    family: str,
    pack: str,
    demo: bool,
) -> tuple[Suffix, ...]:
    """The keys of a decision but its bucket; a fleet has few distinct decisions, each is
    worked out once (equal decisions get the same tuple object)."""
    rest = (family, stage or "", pack, runner or "", bool(demo))
    if runner == "v2":
        return (("", "", *rest),)
    keys = sorted(set(reason_keys(rule_ids, reason_code, stage)))
    kinds = {reason_kind(k) for k in keys}
    kind = next((k for k in KINDS if k in kinds), "blocked")
    return (("", kind, *rest), *((k, reason_kind(k), *rest) for k in keys))


def day_retention_s(conn: Connection) -> int | None:
    """How long (seconds) this database keeps day buckets; None: for good."""
    value = conn.execute(
        select(ServiceMeta.value).where(ServiceMeta.key == DAY_RETENTION_KEY)
    ).scalar_one_or_none()
    if value is None:
        return None
    # Only set_day_retention writes it, within bounds; a value edited by hand is clamped so
    # that dates stay representable rather than failing every ingest.
    days = min(max(int(value), MIN_DAY_RETENTION_DAYS), MAX_DAY_RETENTION_DAYS)
    return days * 86400


def set_day_retention(conn: Connection, days: int | None, now: dt.datetime) -> None:
    """Keep day buckets for ``days`` days (None: for good), in the caller's transaction.
    Shorter: the buckets past it are pruned. Longer: the table is recounted from
    ``deployments`` (:func:`rebuild`), since deployments whose day buckets were pruned count
    again. On PostgreSQL the tables are locked against ingest for the length of it.

    Raises:
        ValueError: ``days`` outside :data:`MIN_DAY_RETENTION_DAYS` ..
            :data:`MAX_DAY_RETENTION_DAYS`.
    """
    if days is not None and not MIN_DAY_RETENTION_DAYS <= days <= MAX_DAY_RETENTION_DAYS:
        raise ValueError(
            f"a retention of {days} days: give {MIN_DAY_RETENTION_DAYS} to "
            f"{MAX_DAY_RETENTION_DAYS} (the 'all' window must cover the 7-day one), "
            "or keep them for good"
        )
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("LOCK TABLE deployments, latest_counts IN EXCLUSIVE MODE")
    before = day_retention_s(conn)
    conn.execute(delete(ServiceMeta).where(ServiceMeta.key == DAY_RETENTION_KEY))
    if days is not None:
        conn.execute(insert(ServiceMeta).values(key=DAY_RETENTION_KEY, value=str(days)))
    after = day_retention_s(conn)
    if before is not None and (after is None or after > before):
        rebuild(conn, now)
    else:
        prune(conn, now)


def _horizons(now_s: int, day_keep_s: int | None) -> list[tuple[int, int | None]]:
    """(bucket size, the first bucket still kept; None: all)."""
    return [
        (size, None if keep is None else now_s - keep)
        for size, keep in {**RETENTION_S, BUCKETS[-1]: day_keep_s}.items()
    ]


def first_day_kept(now: dt.datetime, day_keep_s: int | None) -> int | None:
    """The first day bucket (epoch seconds) that reads of every day count: the first whose
    start is within the retention (the buckets every move still keeps); None: all."""
    if day_keep_s is None:
        return None
    first = int(now.timestamp()) - day_keep_s
    return -(-first // 86400) * 86400


def _add(
    counts: dict[Key, int], size: int, bucket: int, suffixes: tuple[Suffix, ...], sign: int
) -> None:
    for suffix in suffixes:
        key = (size, bucket, *suffix)
        counts[key] = counts.get(key, 0) + sign


# A deployment's move: (old time, old suffixes; None: a new deployment, new time, new suffixes)
Move = tuple[int, tuple[Suffix, ...] | None, int, tuple[Suffix, ...]]


def move(old: State | None, new: State) -> Move:
    return (
        0 if old is None else old.t,
        None if old is None else _suffixes(old),
        new.t,
        _suffixes(new),
    )


def count_moves(
    moves: Iterable[Move], now: dt.datetime, day_keep_s: int | None = None
) -> dict[Key, int]:
    """The net count changes of deployments moving from an old latest decision (none: a new
    deployment) to a new one, in buckets still kept (``day_keep_s``: the database's day
    retention); keys that net to zero are dropped. Ingest's hot loop: a bucket whose keys do
    not change is skipped before any dict work."""
    horizons = _horizons(int(now.timestamp()), day_keep_s)
    counts: dict[Key, int] = {}
    for to, so, tn, sn in moves:
        for size, first in horizons:
            bn = tn - tn % size
            bo = to - to % size
            if so is sn and bo == bn:
                continue  # the same keys: +1 and -1 cancel
            if first is None or bn >= first:
                _add(counts, size, bn, sn, +1)
            if so is not None and (first is None or bo >= first):
                _add(counts, size, bo, so, -1)
    return {k: n for k, n in counts.items() if n}


def add_state(
    counts: dict[Key, int], state: State, sign: int, now_s: int, day_keep_s: int | None = None
) -> None:
    """Add ``sign`` (+1 or -1) under every key of ``state`` whose bucket is still kept."""
    for size, first in _horizons(now_s, day_keep_s):
        bucket = state.t - state.t % size
        if first is None or bucket >= first:
            _add(counts, size, bucket, _suffixes(state), sign)


_COLUMNS = (
    "bucket_s",
    "bucket",
    "reason",
    "kind",
    "family",
    "stage",
    "pack",
    "runner",
    "demo",
    "num_deployments",
)
_SQLITE_UPSERT = (
    f"INSERT INTO latest_counts ({', '.join(_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _COLUMNS)}) "
    f"ON CONFLICT ({', '.join(_COLUMNS[:-1])}) DO UPDATE SET "
    "num_deployments = latest_counts.num_deployments + excluded.num_deployments"
)


def apply_moves(conn: Connection, moves: Iterable[Move], now: dt.datetime) -> int:
    """Apply the count changes of ``moves`` in the caller's transaction (an upsert per key,
    in key order so that concurrent ingests lock rows in one order). Returns the number of
    rows written."""
    counts = count_moves(moves, now, day_retention_s(conn))
    write_counts(conn, counts)
    return len(counts)


def prune_hourly(conn: Connection, now: dt.datetime) -> None:
    """:func:`prune`, once an hour of ``now`` per database and process. The caller's last
    statement: the sweep of zero rows takes locks out of key order (and waits for none)."""
    hour = int(now.timestamp()) // 3600
    if _pruned.get(conn.engine.url) != hour:
        prune(conn, now)
        _pruned[conn.engine.url] = hour


# database URL → the hour of the last prune from this process (rows past their retention are
# never read, so pruning needs no hurry; an hourly DELETE keeps ingest from paying it)
_pruned: dict[Any, int] = {}


def write_counts(conn: Connection, counts: dict[Key, int]) -> None:
    """Add ``counts`` to the stored rows (an upsert per key, in key order)."""
    if not counts:
        return
    ordered = sorted(counts.items())
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(_SQLITE_UPSERT, [(*k[:8], int(k[8]), n) for k, n in ordered])
        return
    from turnout.dashboard.store.ingest_pg import write_counts_pg

    write_counts_pg(conn, ordered)


def prune(conn: Connection, now: dt.datetime) -> None:
    """Delete fine buckets well past their retention (never read again) and rows at zero
    (a deployment moved on: reads would only skip them)."""
    now_s = int(now.timestamp())
    for size, keep in {**RETENTION_S, BUCKETS[-1]: day_retention_s(conn)}.items():
        if keep is not None:
            conn.execute(
                delete(LatestCounts).where(
                    LatestCounts.bucket_s == size,
                    LatestCounts.bucket < now_s - keep - _PRUNE_MARGIN_S,
                )
            )
    if conn.dialect.name == "sqlite":  # the write transaction excludes every other writer
        conn.execute(delete(LatestCounts).where(LatestCounts.num_deployments == 0))
        return
    from turnout.dashboard.store.ingest_pg import DELETE_ZEROS

    conn.exec_driver_sql(DELETE_ZEROS)


def rebuild(conn: Connection, now: dt.datetime | None = None, chunk: int = 20_000) -> int:
    """Recompute the whole table from ``deployments`` (each deployment's latest decision);
    returns the number of deployments counted. Migration 0004 backfills with it."""
    now = now or dt.datetime.now(dt.UTC)
    now_s = int(now.timestamp())
    day_keep_s = day_retention_s(conn)
    conn.execute(delete(LatestCounts))
    _pruned.pop(conn.engine.url, None)
    d = Deployment.__table__.c
    stmt = select(
        d.at, d.event_id, d.pack, d.family, d.stage, d.runner, d.reason_code, d.rule_ids, d.demo
    ).order_by(d.deployment_id)
    counts: dict[Key, int] = {}
    num = 0
    for row in conn.execute(stmt):
        add_state(counts, state_of(row), +1, now_s, day_keep_s)
        num += 1
    items = sorted(counts.items())
    for start in range(0, len(items), chunk):
        write_counts(conn, dict(items[start : start + chunk]))
    return num


def nonzero_rows(conn: Connection) -> dict[Key, int]:
    """Every stored count that is not zero, by key (what tests compare)."""
    t = LatestCounts.__table__.c
    stmt = select(*(t[c] for c in _COLUMNS)).where(t.num_deployments != 0)
    return {
        (r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bool(r[8])): int(r[9])
        for r in conn.execute(stmt)
    }


#: The reason under which :func:`compact` folds counts kept under a reason no pack knows.
UNKNOWN_RULE = "unknown_rule"


@dataclass
class Cardinality:
    """What ``latest_counts`` holds: rows by bucket size, rows at zero, distinct reasons, and
    the reasons no known rule id or reason code names (``foreign``: stored before ingest
    checked rule ids against the pack, or from a pack this service no longer ships)."""

    num_rows: dict[int, int]
    num_zero_rows: int
    num_reasons: int
    num_foreign_reasons: int
    foreign_sample: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "num_rows": {str(k): v for k, v in self.num_rows.items()},
            "num_zero_rows": self.num_zero_rows,
            "num_reasons": self.num_reasons,
            "num_foreign_reasons": self.num_foreign_reasons,
            "foreign_sample": self.foreign_sample,
        }


def _foreign(reason: str, known: frozenset[str]) -> bool:
    """A stored reason no known id names: ``""`` (the deployment itself), a rule id or reason
    code, and a per-stage rollout key (``rollout.stage_off:<stage>``: only those two carry a
    suffix) are known."""
    if not reason or reason == UNKNOWN_RULE:
        return False
    base, sep, _stage = reason.partition(":")
    if sep:
        return not (base in _PER_STAGE and base in known)
    return reason not in known


def _foreign_reasons(conn: Connection, known: frozenset[str], chunk: int) -> Iterator[str]:
    t = LatestCounts.__table__.c
    rows = conn.execute(select(t.reason).distinct().execution_options(yield_per=chunk))
    for (reason,) in rows:
        if _foreign(reason, known):
            yield reason


def cardinality(conn: Connection, known: frozenset[str], *, chunk: int = 10_000) -> Cardinality:
    """Count what the table holds (reads only; streamed, so bounded memory whatever it holds).
    ``known``: the rule ids and reason codes a stored reason may name."""
    t = LatestCounts.__table__.c
    by_size = {
        int(size): int(n)
        for size, n in conn.execute(select(t.bucket_s, func.count()).group_by(t.bucket_s))
    }
    zeros = conn.execute(select(func.count()).where(t.num_deployments == 0)).scalar_one()
    reasons = conn.execute(select(func.count(t.reason.distinct()))).scalar_one()
    sample: list[str] = []
    num_foreign = 0
    for reason in _foreign_reasons(conn, known, chunk):
        num_foreign += 1
        if len(sample) < 10:
            sample.append(reason)
    return Cardinality(
        {s: by_size.get(s, 0) for s in BUCKETS}, int(zeros), int(reasons), num_foreign, sample
    )


def compact(conn: Connection, now: dt.datetime, known: frozenset[str]) -> int:
    """Prune (buckets past retention, rows at zero), then write each deployment's latest
    decision's foreign rule ids (table ``deployments``) as :data:`UNKNOWN_RULE` and recount the
    table from ``deployments`` (:func:`rebuild`): the counts then agree with what later moves
    of those deployments take off (folding only the counts left a made-up id at -1 once its
    deployment moved on). A deployment is counted once under ``unknown_rule`` however many
    foreign ids it named. In the caller's transaction; on PostgreSQL both tables are locked
    against writers for its length (ingest waits). Returns the number of foreign reasons the
    counts held before."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("LOCK TABLE deployments, latest_counts IN EXCLUSIVE MODE")
    prune(conn, now)
    folded = sum(1 for _ in _foreign_reasons(conn, known, 10_000))
    d = Deployment.__table__.c
    changed = []
    for deployment_id, rule_ids in conn.execute(select(d.deployment_id, d.rule_ids)):
        ids = list(rule_ids or ())
        if any(r not in known and r != UNKNOWN_RULE for r in ids):
            kept = [r if r in known else UNKNOWN_RULE for r in ids]
            changed.append((deployment_id, list(dict.fromkeys(kept))))
    for deployment_id, ids in changed:
        conn.execute(
            update(Deployment).where(Deployment.deployment_id == deployment_id).values(rule_ids=ids)
        )
    rebuild(conn, now)
    return folded
