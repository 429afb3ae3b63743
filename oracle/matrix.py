"""enumerate_matrix(): every cell of a pack's closed domains, with its Decision.

A cell is one architecture x one runner pin (auto, v1, v2) x one scenario. Scenarios are the
default deployment; the default with one deployment dimension set to another value of its
closed domain (every value of every dimension the pack declares); and, for each rule, its
witness: the smallest setting that makes the rule's ``when`` hold (so rules over two
dimensions, such as pipeline parallelism with external_launcher, fire in the grid too).
This is the capability matrix an operator reads: rows are families, columns features.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from turnout.oracle.compile_types import CompiledRule
from turnout.oracle.conditions import Condition
from turnout.oracle.config import CONFIG_FIELD_NAMES, FIELD_INFO, DeploymentConfig
from turnout.oracle.decision import CanarySnapshot, Decision
from turnout.oracle.pack import Pack

PINS = ("auto", "v1", "v2")
_BASE = DeploymentConfig()


@dataclass(frozen=True)
class Scenario:
    """A column: its id and the config fields it sets (sorted (field, value) pairs)."""

    id: str
    changes: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Cell:
    """One cell and its Decision; ``config`` is built on first access."""

    architecture: str
    family: str
    pin: str
    scenario: Scenario
    decision: Decision
    base: DeploymentConfig  # the row's config (architecture and pin), before the scenario

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.architecture, self.pin, self.scenario.id)

    @property
    def config(self) -> DeploymentConfig:
        changes = dict(self.scenario.changes)
        return self.base._trusted_replace(changes) if changes else self.base


class _Probe:
    """The attributes of a cell's config without building a DeploymentConfig: the policy
    only reads attributes, and enumerating tens of thousands of cells is dominated by
    building frozen configs otherwise."""


def _settable(dim: str) -> bool:
    info = FIELD_INFO.get(dim)
    return info is not None and info.changeable and info.kind not in ("env",)


def _witness(rule: CompiledRule, pack: Pack) -> tuple[tuple[str, Any], ...] | None:
    """The first non-default domain value of each settable tested dimension that satisfies
    the rule (None when a tested dimension cannot be set or nothing satisfies it); a derived
    predicate the rule needs true is met through its first alternative that can be."""
    out: dict[str, Any] = {}
    for cond in rule.conditions:
        alternatives = pack.data.derived_conditions.get(cond.dim)
        if alternatives is not None:
            if cond.test(False):
                continue
            found = next(
                (
                    w
                    for w in (_conditions_witness(alt, pack) for alt in alternatives)
                    if w is not None
                ),
                None,
            )
            if found is None:
                return None
            out.update(found)
            continue
        found = _conditions_witness((cond,), pack)
        if found is None:
            return None
        out.update(found)
    return tuple(sorted(out.items()))


def _conditions_witness(conds: Sequence[Condition], pack: Pack) -> dict[str, Any] | None:
    out = {}
    for cond in conds:
        if not _settable(cond.dim):
            continue  # model facts and the pin come from the row / the pin axis
        default = getattr(_BASE, cond.dim)
        if cond.test(default):
            continue
        domain = pack.domains.get(cond.dim) or ()
        values = [v for v in domain if v != default and cond.test(v)]
        if not values:
            return None
        out[cond.dim] = values[0]
    return out


def scenarios(pack: Pack) -> list[Scenario]:
    """The columns of the pack's matrix (see the module docstring)."""
    out: dict[tuple[tuple[str, Any], ...], str] = {(): "default"}
    for dim, domain in pack.domains.items():
        if not _settable(dim) or not domain:
            continue
        default = getattr(_BASE, dim)
        for value in domain:
            if value != default:
                out.setdefault(((dim, value),), f"{dim}={_text(value)}")
    for rule in pack.data.rules:
        changes = _witness(rule, pack)
        if changes:
            out.setdefault(changes, f"rule:{rule.id}")
    return [Scenario(name, changes) for changes, name in out.items()]


def _text(v: Any) -> str:
    if isinstance(v, tuple):
        return "[" + ",".join(v) + "]"
    return str(v).lower() if isinstance(v, bool) else str(v)


def enumerate_matrix(
    pack: Pack,
    canaries: CanarySnapshot | None = None,
    *,
    columns: Sequence[Scenario] | None = None,
    architectures: Sequence[str] | None = None,
    pins: Sequence[str] = PINS,
) -> Iterator[Cell]:
    """Yield every cell (architecture x pin x scenario) with its Decision under ``pack``
    (``columns``, ``architectures`` and ``pins`` narrow the grid)."""
    cols = list(columns) if columns is not None else scenarios(pack)
    archs = pack.architectures
    names = list(architectures) if architectures is not None else sorted(archs)
    pin_envs = {pin: pack.pin_env(None if pin == "auto" else pin) for pin in pins}
    decide = pack.decide_attributes
    for arch in names:
        info = archs.get(arch)
        family = info.family if info is not None else "(unknown)"
        row = _BASE._trusted_replace({"architecture": arch})
        for pin in pins:
            base = row._trusted_replace({"env": _frozen(pin_envs[pin])}) if pin != "auto" else row
            state = {name: getattr(base, name) for name in CONFIG_FIELD_NAMES}
            for col in cols:
                probe = object.__new__(_Probe)
                probe.__dict__.update(state)
                probe.__dict__.update(col.changes)
                yield Cell(arch, family, pin, col, decide(probe, canaries), base)


def _frozen(env: dict[str, str]) -> Any:
    from turnout.oracle.coerce import FrozenMap

    return FrozenMap(env)
