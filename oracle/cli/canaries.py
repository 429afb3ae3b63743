"""The canaries a ``turnout`` command decides with: the pack's defaults, or a snapshot file in
either of two shapes, and the line that tells the reader which.

Shapes of a ``--canaries`` file:

* the service's ``GET /api/v1/canaries`` body, as ``curl`` saves it: ``{"pack",
  "kill_switch": {"engaged", ...}, "cohorts": [{"cohort", "enabled", "percentage",
  "version", "updated_at", "updated_by", ...}]}`` (``oracle.wire.SnapshotIn``, as engines
  read it);
* the oracle's own ``CanarySnapshot.to_json()`` (``oracle.wire.OracleSnapshotIn``): ``{"kill_switch": bool, "cohorts": {id:
  {"enabled": bool, "percentage": int}}}``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from turnout.oracle import bounded_json
from turnout.oracle.decision import CanarySnapshot
from turnout.oracle.errors import ConfigError, ErrorCode
from turnout.oracle.pack import Pack
from turnout.oracle.wire import OracleSnapshotIn, SnapshotIn, error_text
from turnout.oracle.yamlpos import read_text

SHAPES = (
    'the body of GET /api/v1/canaries ({"pack", "kill_switch": {"engaged"}, "cohorts": '
    '[{"cohort", "enabled", "percentage"}]}) or {"kill_switch": true|false, "cohorts": '
    '{COHORT: {"enabled": true|false, "percentage": 0..100}}}'
)


@dataclass(frozen=True)
class Canaries:
    """A canary snapshot (None: the pack's rollout.yaml defaults) and where it came from, in
    words (``source``, printed under every human-readable result)."""

    snapshot: CanarySnapshot | None
    source: str


def default_canaries(pack: Pack) -> Canaries:
    return Canaries(
        None,
        f"rollout.yaml defaults of pack {pack.name} (pass --canaries FILE, "
        "e.g. the service's GET /api/v1/canaries, to decide with the live ones)",
    )


def load_canaries(path: Path | None, pack: Pack) -> Canaries:
    """The canaries of a ``--canaries`` file (see the module doc for its two shapes), or the
    pack's defaults when ``path`` is None. Raises ConfigError (``file_not_found``,
    ``bad_spec``) saying what is wrong, and naming the shapes accepted."""
    if path is None:
        return default_canaries(pack)
    try:
        data = bounded_json.loads(read_text(path))
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror or exc}", code=ErrorCode.FILE_NOT_FOUND
        ) from None
    except ValueError as exc:
        raise ConfigError(
            f"{path}: not JSON ({exc}); expected {SHAPES}", code=ErrorCode.BAD_SPEC
        ) from None
    if not isinstance(data, dict):
        raise _not_a_snapshot(path, f"a JSON {type(data).__name__}, not an object")
    if isinstance(data.get("cohorts"), list) or isinstance(data.get("kill_switch"), dict):
        return _from_service(path, data, pack)
    return _from_oracle(path, data, pack)


def _not_a_snapshot(path: Path, why: str) -> ConfigError:
    return ConfigError(
        f"{path}: not a canary snapshot: {why}; expected {SHAPES}", code=ErrorCode.BAD_SPEC
    )


def _from_service(path: Path, body: dict[str, Any], pack: Pack) -> Canaries:
    if "pack" in body and body["pack"] != pack.name:
        raise ConfigError(
            f"{path}: the snapshot is of pack {body['pack']!r}, the decision uses "
            f"pack {pack.name!r}; pass --pack {body['pack']} or the snapshot of "
            f"a service running {pack.name!r}",
            code=ErrorCode.BAD_SPEC,
        )
    try:
        parsed = SnapshotIn.model_validate(body)
    except ValidationError as exc:
        raise _not_a_snapshot(path, error_text(exc)) from None
    snapshot = parsed.to_snapshot()
    latest = parsed.last_change()
    change = ""
    if latest is not None:
        change = (
            f", last change {latest.cohort} v{latest.version or '?'} at "
            f"{_when(latest.updated_at)} by {latest.updated_by or '?'}"
        )
    return Canaries(
        snapshot,
        f"{path} (service snapshot of pack {pack.name}{change}; {_summary(snapshot, pack)})",
    )


def _when(at: dt.datetime | None) -> str:
    """A cohort's ``updated_at`` as the service writes it (``2026-11-30T10:02:03.123456Z``)."""
    return "?" if at is None else at.isoformat().replace("+00:00", "Z")


def _from_oracle(path: Path, data: dict[str, Any], pack: Pack) -> Canaries:
    try:
        snapshot = OracleSnapshotIn.model_validate(data).to_snapshot()
    except ValidationError as exc:
        raise _not_a_snapshot(path, error_text(exc)) from None
    return Canaries(snapshot, f"{path} ({_summary(snapshot, pack)})")


def _summary(snapshot: CanarySnapshot, pack: Pack) -> str:
    """Kill switch, stages on, and the cohorts the pack does not have (not silently dropped)."""
    known = [c.id for c in pack.cohorts]  # rollout order
    states = [(k, snapshot.cohorts[k]) for k in known if k in snapshot.cohorts]
    on = [k if s.percentage == 100 else f"{k} {s.percentage}%" for k, s in states if s.enabled]
    text = (
        f"kill switch {'ENGAGED' if snapshot.kill_switch else 'off'}; stages on: "
        f"{', '.join(on) or 'none'}"
    )
    stale = sorted(set(snapshot.cohorts) - set(known))
    if stale:
        text += f"; not in pack {pack.name}, not used: {', '.join(stale)}"
    return text
