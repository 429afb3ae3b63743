"""A seeded, generated fleet of decision events for the aggregate tests, and the fallback
report recomputed from the raw events (the reference the stored aggregates must equal)."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from turnout.dashboard.store.aggregates import WINDOWS, FleetFilter
from turnout.dashboard.store.events import EventRecord
from turnout.dashboard.store.latest_counts import reason_keys, reason_kind

FAMILIES = {
    "qwen3": "qwen3-canary",
    "llama": "llama-mistral",
    "mistral": "llama-mistral",
    "deepseek_v2": "moe",
    "granitemoe": None,
}
PACKS = ("turnout", "vllm-0.31")
# (runner, reason code, rule ids): the shapes of real decisions.
DECISIONS: list[tuple[str | None, str, tuple[str, ...]]] = [
    ("v2", "TARGETING_MATCH", ()),
    ("v2", "SPLIT", ()),
    ("v2", "TARGETING_MATCH", ("mamba",)),
    ("v1", "TARGETING_MATCH", ("spec_ngram",)),
    ("v1", "TARGETING_MATCH", ("dbo", "cpu_offload")),
    ("v1", "TARGETING_MATCH", ("cpu_offload",)),
    ("v1", "DISABLED", ("rollout.stage_off",)),
    ("v1", "DISABLED", ("rollout.stage_off",)),
    ("v1", "SPLIT", ("rollout.split_out",)),
    ("v1", "DISABLED", ("rollout.kill_switch",)),
    ("v1", "STATIC", ("pin.v1",)),
    ("v1", "DEFAULT", ("rollout.no_stage",)),
    (None, "ERROR", ("spec_ngram", "dbo")),
    (None, "ERROR", ()),
    ("v1", "STATIC", ()),
]


def generate(
    seed: int, *, num_events: int, num_deployments: int, now: dt.datetime, days: float = 12.0
) -> list[EventRecord]:
    """Events of ``num_deployments`` deployments over the ``days`` before ``now`` (a few an
    hour ahead), on a 7-minute grid so that equal times (broken by event id) occur."""
    rng = random.Random(seed)
    out = []
    steps = int(days * 24 * 60 / 7)
    for i in range(num_events):
        d = rng.randrange(num_deployments)
        family = list(FAMILIES)[d % len(FAMILIES)]
        runner, code, rules = rng.choice(DECISIONS)
        at = now - dt.timedelta(minutes=7 * rng.randrange(-8, steps))
        if rng.random() < 0.2:  # another zone: the same instant, stored as UTC
            at = at.astimezone(dt.timezone(dt.timedelta(hours=-5)))
        out.append(
            EventRecord(
                event_id=f"ev-{rng.getrandbits(40):010x}-{i}",
                at=at,
                deployment_id=f"dep-{d:04d}",
                pack=PACKS[d % 7 == 0],
                family=family,
                runner=runner,
                mode="auto",
                reason_code=code,
                rule_ids=rules,
                stage=FAMILIES[family],
                host=f"h{d % 5}",
                config={"n": d} if rng.random() < 0.5 else None,
                demo=d % 11 == 0,
            )
        )
    return out


def follow_ups(events: list[EventRecord], seed: int, share: float = 0.4) -> list[EventRecord]:
    """What ``turnout launch --report-startup`` sends after a share of ``events`` (those with
    a runner: vLLM started): ``<id>.startup``, the same decision 1 to 900 s later, with vLLM's
    line (naming the decided runner, or now and then the other one)."""
    from turnout.oracle.wire import LaunchIn, StartupIn

    rng = random.Random(seed)
    out = []
    for e in events:
        if e.runner is None or rng.random() >= share:
            continue
        said = e.runner if rng.random() < 0.8 else {"v1": "v2", "v2": "v1"}[e.runner]
        launch = LaunchIn.model_validate(
            {
                "vllm_version": "0.31.0",
                "vllm_pack": "vllm-0.31",
                "snapshot_source": "service",
                "startup": StartupIn.model_validate({"runner": said, "line": f"vLLM says {said}"}),
            }
        )
        out.append(
            EventRecord(
                **{
                    **e.__dict__,
                    "event_id": f"{e.event_id}.startup",
                    "at": e.at + dt.timedelta(seconds=rng.randint(1, 900)),
                    "launch": launch,
                }
            )
        )
    return out


def with_follow_ups(
    parts: list[list[EventRecord]], extra: list[EventRecord], seed: int
) -> list[list[EventRecord]]:
    """``parts`` with each follow-up of ``extra`` added to the batch of its decision or one of
    the three after it (a client spools the follow-up after its decision)."""
    rng = random.Random(seed)
    first = {}
    for i, part in enumerate(parts):
        for e in part:
            first.setdefault(e.event_id, i)
    out = [list(p) for p in parts]
    for f in extra:
        i = first[f.event_id.removesuffix(".startup")]
        out[min(len(out) - 1, i + rng.randint(0, 3))].append(f)
    return out


def batches(
    events: list[EventRecord], seed: int, *, max_batch: int = 40, resend: float = 0.1
) -> list[list[EventRecord]]:
    """The events shuffled (out of order) into batches of 1..``max_batch``, some resent."""
    rng = random.Random(seed)
    order = events[:]
    rng.shuffle(order)
    out: list[list[EventRecord]] = []
    i = 0
    while i < len(order):
        n = rng.randint(1, max_batch)
        out.append(order[i : i + n])
        i += n
        if out and rng.random() < resend:
            out.append(rng.choice(out)[:])  # a resend after a lost acknowledgement
    return out


@dataclass
class Expected:
    num_deployments: int = 0
    num_fallbacks: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    ranked: list[tuple[str, int]] = field(default_factory=list)
    by_family: dict[str, Counter[str]] = field(default_factory=dict)
    # family → (deployments, fallbacks, kind → fallbacks)
    families: dict[str, tuple[int, int, dict[str, int]]] = field(default_factory=dict)
    over_time: dict[str, dict[int, int]] = field(default_factory=dict)  # key → bin → n


def latest(events: list[EventRecord]) -> dict[str, EventRecord]:
    out: dict[str, EventRecord] = {}
    for e in events:
        cur = out.get(e.deployment_id)
        if cur is None or (e.at, e.event_id) > (cur.at, cur.event_id):
            out[e.deployment_id] = e
    return out


def expected(events: list[EventRecord], window: str, f: FleetFilter, now: dt.datetime) -> Expected:
    """The report recomputed from raw events: each deployment's latest decision (greatest
    (time, event id)), kept when in the window and the filter."""
    span, bin_s, _align = WINDOWS[window]
    start = None
    if span is not None:  # windows start on a 5-minute boundary, the 7-day one on an hour
        t = int(now.timestamp()) - span
        start = t - t % (3600 if window == "7d" else 300)
    want = Expected()
    ranked: Counter[str] = Counter()
    by_family: dict[str, Counter[str]] = defaultdict(Counter)
    fam_all: Counter[str] = Counter()
    fam_fallbacks: Counter[str] = Counter()
    fam_kinds: dict[str, Counter[str]] = defaultdict(Counter)
    over: dict[str, Counter[int]] = defaultdict(Counter)
    for e in latest(events).values():
        ts = int(e.at.timestamp())
        if (
            (start is not None and ts < start)
            or (f.family and e.family != f.family)
            or (f.stage and e.stage != f.stage)
            or (f.pack and e.pack != f.pack)
            or (not f.include_demo and e.demo)
        ):
            continue
        want.num_deployments += 1
        fam_all[e.family] += 1
        if e.runner == "v2":
            continue
        keys = set(reason_keys(list(e.rule_ids), e.reason_code, e.stage))
        kinds = {reason_kind(k) for k in keys}
        kind = next(k for k in ("blocked", "held", "waiting") if k in kinds)
        want.num_fallbacks += 1
        want.by_kind[kind] += 1
        fam_fallbacks[e.family] += 1
        fam_kinds[e.family][kind] += 1
        for k in keys:
            ranked[k] += 1
            by_family[e.family][k] += 1
            over[k][ts - ts % bin_s] += 1
    want.ranked = sorted(ranked.items(), key=lambda kv: (-kv[1], kv[0]))
    want.by_family = dict(by_family)
    want.families = {k: (n, fam_fallbacks[k], dict(fam_kinds[k])) for k, n in fam_all.items()}
    want.over_time = {k: dict(v) for k, v in over.items()}
    return want
