"""What ingest checks of a reported decision beyond its schema (``oracle.wire.EventIn``):
that it is of the service's pack, names the pack's families, stages and rule ids
(``Pack.rule_ids``: the fallback counts are keyed by rule id, so an id the pack cannot produce
would add keys without bound), carries a config of bounded size and a plausible time.

Each finding is one validator error (``type``, ``loc`` into the batch, ``msg``, ``input``),
so that a batch with a bad event is refused whole with the API's 422 ``invalid_request``,
naming the event, the field and the value (the engine client then resends event by event and
sets aside only the events refused). The checks run once per batch, a few set look-ups per
event: a pydantic validator per event cost as much as the rest of the validation together.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from typing import Any, get_args

import pydantic_core

from turnout.dashboard.echo import clip
from turnout.dashboard.policy import Policy, closest
from turnout.dashboard.settings import Settings
from turnout.oracle.decision import ReasonCode
from turnout.oracle.errors import ErrorCode
from turnout.oracle.pack import load_pack
from turnout.oracle.paths import SHIPPED_PACKS
from turnout.oracle.wire import UNKNOWN_FAMILY, EventIn

EARLIEST_EVENT = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
# Events of a batch (by index) whose unknown rule id gets a "did you mean" hint.
_MAX_HINTS = 20


def event_errors(
    events: Sequence[EventIn], policy: Policy, settings: Settings, now: dt.datetime | None = None
) -> list[dict[str, Any]]:
    """Every finding of every event of a batch (empty: the batch may be stored)."""
    checker = _checker(policy, settings.max_clock_skew_s, settings.max_config_bytes)
    now = now or dt.datetime.now(dt.UTC)
    latest = now + checker.skew
    packs, families, stages = checker.packs, checker.families, checker.stage_set
    rule_ids = checker.rule_ids
    found: list[dict[str, Any]] = []
    for i, e in enumerate(events):
        # the common case in one expression: a few set look-ups, no call
        if (
            e.pack in packs
            and e.family in families
            and (e.stage is None or e.stage in stages)
            and EARLIEST_EVENT <= e.at <= latest
            and e.config is None
            and e.launch is None
            and rule_ids.issuperset(e.rule_ids)
        ):
            continue
        found += checker.check(i, e, now)
    return found


@functools.lru_cache(maxsize=8)
def _checker(policy: Policy, skew_s: float, max_config: int) -> _Checker:
    return _Checker(policy, skew_s, max_config)


class _Checker:
    """What the checks need of the pack and the settings, computed once."""

    def __init__(self, policy: Policy, skew_s: float, max_config: int) -> None:
        self.policy = policy
        self.packs = frozenset({policy.pack.name, policy.pack_name})
        self.families = frozenset(policy.pack.families) | {UNKNOWN_FAMILY}
        self.stages = [c.id for c in policy.pack.cohorts]
        self.stage_set = frozenset(self.stages)
        self.rule_ids = policy.pack.rule_ids
        self.sorted_rule_ids = sorted(self.rule_ids)
        self.skew = dt.timedelta(seconds=skew_s)
        self.max_config = max_config

    def check(self, i: int, e: EventIn, now: dt.datetime) -> list[dict[str, Any]]:
        out = []
        if e.pack not in self.packs:
            out.append(
                _error(
                    "wrong_pack",
                    i,
                    "pack",
                    e.pack,
                    f"{clip(e.pack)!r} is not the pack this service runs "
                    f"({self.policy.pack.name!r}): report to the service of that pack",
                )
            )
        if e.family not in self.families:
            out.append(
                _error(
                    ErrorCode.UNKNOWN_FAMILY,
                    i,
                    "family",
                    e.family,
                    self.policy.unknown_family_message(e.family),
                )
            )
        if e.stage is not None and e.stage not in self.stage_set:
            out.append(_error("unknown_stage", i, "stage", e.stage, self._stage_message(e.stage)))
        if not EARLIEST_EVENT <= e.at <= now + self.skew:
            out.append(self._time_error(i, e.at, now))
        if e.config is not None:
            out += self._config_errors(i, e.config)
        allowed = self.rule_ids
        if e.launch is not None:  # decided by the vLLM release's pack, reported under ours
            allowed = allowed | release_rule_ids(e.launch.vllm_pack)
        unknown = [(j, r) for j, r in enumerate(e.rule_ids) if r not in allowed]
        if unknown:
            out.append(self._rule_error(i, unknown, e.launch.vllm_pack if e.launch else None))
        return out

    def _rule_error(
        self, i: int, unknown: list[tuple[int, str]], release_pack: str | None
    ) -> dict[str, Any]:
        """One finding per event, at its first unknown rule id, however many it names. A
        spelling hint for the first events of a batch only: difflib over the pack's ids costs
        about a millisecond an id, and a hostile batch holds a million."""
        j, rule = unknown[0]
        close = closest(rule, self.sorted_rule_ids, fuzzy=i < _MAX_HINTS and len(rule) <= 64)
        hint = f" (did you mean {close!r}?)" if close else ""
        more = f" and {len(unknown) - 1} more unknown" if len(unknown) > 1 else ""
        packs = self.policy.pack.name
        if release_pack is not None and release_pack != packs:
            packs += f" or of {clip(release_pack)!r} (the launch's vllm_pack)"
            if release_pack not in SHIPPED_PACKS:
                packs += ", a pack this service does not ship: upgrade the service"
        return {
            "type": "unknown_rule",
            "loc": ("body", "events", i, "rule_ids", j),
            "msg": f"rule id {clip(rule)!r}{hint}{more}: not a rule id of pack {packs} (its "
            "matrix rules, steps, errors, pins and rollout reasons): report with the pack the "
            "service runs",
            "input": rule,
        }

    def _stage_message(self, stage: str) -> str:
        close = closest(stage, self.stages)
        hint = f" (did you mean {close!r}?)" if close else ""
        return (
            f"unknown stage {clip(stage)!r}{hint}; the stages of pack "
            f"{self.policy.pack.name}: {', '.join(self.stages)}"
        )

    def _time_error(self, i: int, at: dt.datetime, now: dt.datetime) -> dict[str, Any]:
        if at < EARLIEST_EVENT:
            return _error(
                "event_too_old",
                i,
                "at",
                at.isoformat(),
                f"{at.isoformat()} is before {EARLIEST_EVENT.date()}: not a decision time",
            )
        ahead = (at - now).total_seconds()
        return _error(
            "event_in_future",
            i,
            "at",
            at.isoformat(),
            f"{at.isoformat()} is {ahead:.0f} s ahead of the service's clock "
            f"({now.isoformat(timespec='seconds')}); at most "
            f"{self.skew.total_seconds():.0f} s are taken "
            "(TURNOUT_MAX_CLOCK_SKEW_S): check the engine host's clock",
        )

    def _config_errors(self, i: int, config: dict[str, Any]) -> list[dict[str, Any]]:
        text = pydantic_core.to_json(config, inf_nan_mode="null")
        if len(text) > self.max_config:
            return [
                _error(
                    "config_too_large",
                    i,
                    "config",
                    f"{len(text)} bytes",
                    f"the config is {len(text)} bytes as JSON; at most "
                    f"{self.max_config} are stored (TURNOUT_MAX_CONFIG_BYTES)",
                )
            ]
        if b"\\u0000" in text:  # a NUL, as JSON escapes it, in a key or a string
            return [
                _error(
                    "nul_character",
                    i,
                    "config",
                    "U+0000",
                    "the config holds a NUL character (U+0000): PostgreSQL cannot store one, "
                    "so no backend does",
                )
            ]
        if b"null" in text and text != pydantic_core.to_json(config, inf_nan_mode="constants"):
            return [
                _error(
                    "non_finite_number",
                    i,
                    "config",
                    "Infinity or NaN",
                    "the config holds a number too large for a JSON number (read as Infinity)",
                )
            ]
        return []


@functools.lru_cache(maxsize=len(SHIPPED_PACKS))
def release_rule_ids(name: str) -> frozenset[str]:
    """The rule ids of shipped pack ``name`` (``turnout launch`` decides with the pack of the
    vLLM release it starts and reports under the service's pack); none for another name."""
    return load_pack(name).rule_ids if name in SHIPPED_PACKS else frozenset()


def known_reasons(policy: Policy) -> frozenset[str]:
    """Every reason a fallback count may be kept under: the rule ids of the service's pack and
    of every shipped pack (launch events name their release pack's), and the reason codes (an
    event without rule ids is counted under its code)."""
    ids = set(policy.pack.rule_ids).union(*(release_rule_ids(name) for name in SHIPPED_PACKS))
    return frozenset(ids | set(get_args(ReasonCode)))


def _error(kind: str, i: int, field: str, value: object, message: str) -> dict[str, Any]:
    return {"type": str(kind), "loc": ("body", "events", i, field), "msg": message, "input": value}
