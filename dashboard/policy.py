"""The service's side of the oracle: the loaded pack, the canary snapshot built from the store
(cached for ``snapshot_ttl_s``), and the calls to ``decide``/``explain``/``enumerate_matrix``.

No decision logic lives here: every runner choice is the oracle's.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from turnout.dashboard.echo import clip
from turnout.dashboard.matrix import MatrixCache, MatrixSummary
from turnout.dashboard.store import canaries as canary_store
from turnout.dashboard.store.canaries import CohortDefault, RolloutState
from turnout.dashboard.store.db import Database
from turnout.dashboard.store.errors import StoreError
from turnout.oracle import (
    CanarySnapshot,
    CohortState,
    Decision,
    DeploymentConfig,
    Explanation,
    Pack,
    decide,
    explain,
    from_command,
    from_spec,
    load_pack,
)
from turnout.oracle.errors import ErrorCode
from turnout.oracle.sources import HintFor, release_for_pack

_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def closest(name: str, choices: Iterable[str], *, fuzzy: bool = True) -> str | None:
    """The choice ``name`` most likely meant: the same word in another case (``Llama`` →
    ``llama``), else (``fuzzy``) the closest spelling, case ignored; None when nothing is
    close."""
    by_lower = {c.lower(): c for c in choices}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1) if fuzzy else []
    return by_lower[close[0]] if close else None


def to_snapshot(state: RolloutState) -> CanarySnapshot:
    """The oracle's snapshot for a store state."""
    return CanarySnapshot(
        cohorts={
            c: CohortState(enabled=e, percentage=p) for c, (e, p, _v) in state.cohorts.items()
        },
        kill_switch=state.kill_switch,
    )


@dataclass(frozen=True)
class Snapshot:
    state: RolloutState
    canaries: CanarySnapshot

    @property
    def etag(self) -> str:
        return self.state.etag


class Policy:
    """The pack plus a TTL-cached view of the store's canary state (thread-safe)."""

    def __init__(self, pack_name: str, db: Database, ttl_s: float) -> None:
        self.pack: Pack = load_pack(pack_name)
        self.pack_name = pack_name
        # the vLLM release whose `vllm serve` parser reads command lines (None: the newest)
        self.release: str | None = release_for_pack(self.pack)
        self._db = db
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cached: tuple[float, Snapshot] | None = None
        self._generation = 0  # bumped by invalidate(): a read that spans one is not kept
        self._matrix = MatrixCache()
        self._responses: tuple[str, dict[DeploymentConfig, tuple[bytes, str, str]]] = ("", {})

    def cohort_defaults(self) -> list[CohortDefault]:
        return [
            CohortDefault(c.id, bool(c.enabled), int(getattr(c, "percentage", 100) or 100))
            for c in self.pack.cohorts
        ]

    def cohort_families(self) -> dict[str, tuple[str, ...]]:
        """Cohort id → the families its stage names (empty for attribute-only stages)."""
        return {c.id: tuple(c.families) for c in self.pack.cohorts}

    def cohort_labels(self) -> dict[str, str]:
        return {c.id: str(getattr(c, "label", c.id)) for c in self.pack.cohorts}

    def resolve_cohort(self, name: str) -> str:
        """A cohort id from a cohort id or a family name (the first stage that lists the
        family: ``qwen3`` → ``qwen3-canary``); unknown names come back unchanged."""
        ids = [c.id for c in self.pack.cohorts]
        if name in ids:
            return name
        for c in self.pack.cohorts:
            if name in c.families:
                return c.id
        return name

    def rollout_position(self, cohort: str) -> int:
        """A cohort's place in rollout order: its stage's index in the pack; a cohort the pack
        does not list (kept in the store from an earlier pack) comes after every stage. Sort by
        ``(position, cohort)``."""
        ids = [c.id for c in self.pack.cohorts]
        return ids.index(cohort) if cohort in ids else len(ids)

    def unknown_cohort_message(self, name: str, existing: Iterable[str]) -> str:
        """What to say when ``name`` is not a cohort id: for a family name, the stage that
        lists it; otherwise the closest id. Either way, every id of ``existing`` (the store's
        cohorts), in rollout order."""
        ids = sorted(set(existing), key=lambda c: (self.rollout_position(c), c))
        listed = "cohorts: " + ", ".join(ids)
        stages = [c.id for c in self.pack.cohorts if name in c.families]
        shown = clip(name)
        if stages:
            return (
                f"{shown!r} is a family, not a cohort id: its stage is cohort {stages[0]!r} "
                f"({listed})"
            )
        if name in self.pack.families:
            return (
                f"{shown!r} is a family, not a cohort id, and no stage lists it by name: its "
                "deployments join a stage by their attributes (a decision's `stage` says "
                f"which) ({listed})"
            )
        close = closest(name, ids)
        family = closest(name, self.pack.families, fuzzy=False)
        if close is None and family is not None:
            stage = self.resolve_cohort(family)
            hint = f" (did you mean the family {family!r}?" + (
                f" its stage is cohort {stage!r})" if stage != family else ")"
            )
        else:
            hint = f" (did you mean {close!r}?)" if close else ""
        return f"unknown cohort {shown!r}{hint}; {listed}"

    def unknown_family_message(self, name: str) -> str:
        """What to say when ``name`` is not a family of the pack: for a cohort id, its
        families; otherwise the closest family (any case), or every family."""
        families = self.family_names()
        staged = self.cohort_families().get(name)
        shown = clip(name)
        if staged is not None:
            named = ", ".join(staged) or "none by name: it takes deployments by attributes"
            return f"{shown!r} is a cohort id, not a family: its families are {named}"
        close = closest(name, families)
        if close is not None:
            return f"unknown family {shown!r} (did you mean {close!r}?)"
        return f"unknown family {shown!r}; the pack's families: {', '.join(families)}"

    def store_error_text(self, cohort: str, err: StoreError) -> str:
        """The message of a store error about ``cohort``: for an unknown cohort,
        :meth:`unknown_cohort_message` over the store's cohorts; else the error's own."""
        if err.code == ErrorCode.UNKNOWN_COHORT:
            return self.unknown_cohort_message(cohort, self.snapshot().state.cohorts)
        return str(err)

    def family_names(self) -> list[str]:
        return sorted(self.pack.families)

    def reason_labels(self) -> dict[str, str]:
        """Fallback-reason key → label: the pack's rules, the per-stage rollout reasons
        (``rollout.stage_off:<stage>``, see ``aggregates.reason_keys``) and the fixed ones."""
        # Rule labels may be templates ("speculative method '{speculative_method}'"); the
        # ranking counts a rule over all its decisions, so each placeholder takes the value(s)
        # the rule's own condition admits.
        labels = {r.id: r.matched_label() for r in self.pack.rules}
        labels.update(
            {
                "rollout.kill_switch": "the rollout kill switch is on",
                "rollout.no_stage": "in no rollout stage",
                "pin.v1": f"pinned to V1 by {self.pack.env_var}=0",
                "pin.v2": f"pinned to V2 by {self.pack.env_var}=1",
                "ERROR": "no runner: the configuration cannot be served as asked",
                "unknown_rule": "rule ids no pack names (folded: turnout db cardinality)",
            }
        )
        for c in self.pack.cohorts:
            labels[f"rollout.stage_off:{c.id}"] = f"not yet enabled for V2 (stage {c.label})"
            labels[f"rollout.split_out:{c.id}"] = f"outside the canary share of stage {c.label}"
        return labels

    def cached_snapshot(self) -> Snapshot | None:
        """The cached snapshot while fresh, else None (the caller refreshes off the event loop)."""
        cached = self._cached
        if cached is not None and time.monotonic() - cached[0] < self._ttl_s:
            return cached[1]
        return None

    def snapshot(self) -> Snapshot:
        """The current snapshot, read from the store when the cache is older than the TTL."""
        fresh = self.cached_snapshot()
        if fresh is not None:
            return fresh
        with self._lock:
            # Requests that queued here while another refreshed take its snapshot: one store
            # read per TTL, not one per waiting request.
            fresh = self.cached_snapshot()
            if fresh is not None:
                return fresh
            while True:
                generation = self._generation
                with self._db.read_session() as session:
                    state = canary_store.read_state(session=session)
                snap = Snapshot(state, to_snapshot(state))
                if generation == self._generation:
                    self._cached = (time.monotonic(), snap)
                    return snap
                # This process flipped while the read ran: the read may predate the flip's
                # commit, and cached it would hide the flip for a whole TTL. Read again.

    def invalidate(self) -> None:
        """Forget the cached snapshot (after a flip made by this process has committed),
        including one being read while it runs."""
        self._generation += 1
        self._cached = None

    def explain(
        self, config: DeploymentConfig, canaries: CanarySnapshot | None = None
    ) -> Explanation:
        """The oracle's Explanation (decision + smallest changes that reach V2)."""
        return explain(
            config,
            pack=self.pack,
            canaries=canaries if canaries is not None else self.snapshot().canaries,
        )

    def matrix(self) -> MatrixSummary:
        """The matrix grid under the current canaries (cached per snapshot)."""
        snap = self.snapshot()
        return self._matrix.get(self.pack, snap.canaries, snap.etag)

    def decision_json(self, config: DeploymentConfig, snap: Snapshot) -> tuple[bytes, str, str]:
        """(Decision JSON bytes, runner or "none", reason code) under ``snap``, kept per
        snapshot: decide is pure, so the same config under the same canaries has one answer."""
        cache = self._responses
        if cache[0] != snap.etag:
            cache = self._responses = (snap.etag, {})
        hit = cache[1].get(config)
        if hit is None:
            d = self.decide(config, snap.canaries)
            hit = (json.dumps(d.to_json()).encode(), d.runner or "none", str(d.reason_code))
            if len(cache[1]) < 8192:
                cache[1][config] = hit
        return hit

    def decide(self, config: DeploymentConfig, canaries: CanarySnapshot | None = None) -> Decision:
        return decide(
            config,
            pack=self.pack,
            canaries=canaries if canaries is not None else self.snapshot().canaries,
        )


def config_from_request(
    *,
    config: Mapping[str, Any] | None = None,
    command: str | None = None,
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    hint_for: HintFor = "api",
    release: str | None = None,
    offline: bool = True,
) -> DeploymentConfig:
    """A DeploymentConfig from exactly one of a spec mapping, a ``vllm serve`` command string or
    its argv (read by vLLM ``release``'s parser; None: the newest). A request never reads the
    server's files (``--config``, ``--hf-config-path`` and local model paths are refused as
    ``local_file``) and asks the hub only when not ``offline`` (``TURNOUT_HUB_ONLINE``).
    Raises the oracle's ConfigError for bad input, ValueError when not exactly one source is
    given."""
    given = [x is not None for x in (config, command, argv)]
    if sum(given) != 1:
        raise ValueError("give exactly one of `config`, `command` or `argv`")
    if config is not None:
        return from_spec(dict(config))
    env = dict(env or {})
    if command is not None:
        argv = split_command(command, env)
    assert argv is not None
    return from_command(
        list(argv), env, hint_for=hint_for, release=release, offline=offline, local_files=False
    )


def split_command(command: str, env: dict[str, str]) -> list[str]:
    """Split a pasted shell command: backslash line continuations are joined and leading
    ``NAME=value`` assignments move into ``env``. Raises ValueError on unbalanced quotes."""
    words = shlex.split(command.replace("\\\n", " ").replace("\\\r\n", " "))
    while words and _ENV_ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return words
