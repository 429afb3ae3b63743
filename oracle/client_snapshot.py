"""The engine client's canary snapshot: what makes a snapshot one of this engine's pack, and the
last-known-good copy on disk.

A well-formed body is not enough to decide with. A snapshot is used (and saved as the
last-known-good copy) only when it is of the engine's pack: the ``pack`` it names is the
engine's, the pack revision it names (``pack_digest``, the content hash of the service's pack
files, when the service reports one) is the engine's ``Pack.digest``, and it holds exactly one
state for every stage of the pack's rollout. A body with no cohorts, another pack's cohorts,
a cohort twice, or a pack revision the engine does not run is logged and ignored: the engine
keeps what it had, except for one field: an engaged kill switch in a snapshot of another
revision of the same pack is honoured (``kill_switch_of_revision``), so that an operator's kill
switch reaches engines while the service and the engines run different pack revisions. Cohorts beside the pack's stages are allowed (the service keeps the rows of
stages a later pack dropped; the oracle never reads them).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from turnout.oracle import CanarySnapshot, Pack
from turnout.oracle.wire import SnapshotIn

log = logging.getLogger("turnout.client")


def snapshot_mismatch(snapshot: SnapshotIn, pack: Pack, pack_name: str) -> str | None:
    """Why ``snapshot`` is not a canary snapshot of ``pack`` (loaded as ``pack_name``), in
    words; None when it is one."""
    if snapshot.pack not in (pack_name, pack.name):
        return f"it is of pack {snapshot.pack!r}, this engine runs {pack.name!r}"
    if snapshot.pack_digest is not None and snapshot.pack_digest != pack.digest:
        return (
            f"it is of revision {snapshot.pack_digest} of pack {pack.name}, this engine "
            f"runs revision {pack.digest}"
        )
    seen: set[str] = set()
    for c in snapshot.cohorts:
        if c.cohort in seen:
            return f"it lists cohort {c.cohort!r} twice"
        seen.add(c.cohort)
    missing = [c.id for c in pack.cohorts if c.id not in seen]
    if missing:
        return (
            f"it has no state for {len(missing)} of the {len(pack.cohorts)} stages of "
            f"pack {pack.name} ({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''})"
        )
    return None


def kill_switch_of_revision(body: Any, pack: Pack, pack_name: str) -> bool:
    """A well-formed snapshot of this pack (by name) whose kill switch is engaged, whatever
    the pack revision or cohorts it holds: the engine honours that switch alone (every
    revision can send a deployment to V1) while it keeps its own copy for everything else."""
    try:
        parsed = SnapshotIn.parse(body)
    except ValueError:
        return False
    return parsed.pack in (pack_name, pack.name) and parsed.kill_switch.engaged


def checked_snapshot(body: Any, pack: Pack, pack_name: str) -> CanarySnapshot:
    """The snapshot of a decoded ``GET /api/v1/canaries`` body when it is one of ``pack``.

    Raises:
        ValueError: not a snapshot (wrong shape or types), or one of another pack (the
            message says which way).
    """
    parsed = SnapshotIn.parse(body)
    why = snapshot_mismatch(parsed, pack, pack_name)
    if why is not None:
        raise ValueError(f"not a snapshot of this engine's pack: {why}")
    return parsed.to_snapshot()


def load_last_known_good(
    path: Path, pack: Pack, pack_name: str
) -> tuple[CanarySnapshot, str | None] | None:
    """The snapshot and ETag kept at ``path``; None when there is none, or when it cannot be
    read or is not of ``pack`` (logged)."""
    try:
        data = json.loads(path.read_text())
        return checked_snapshot(data["body"], pack, pack_name), data.get("etag")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("ignoring the last-known-good snapshot %s: %s", path, err)
        return None


def save_last_known_good(path: Path, body: Mapping[str, Any], etag: str | None) -> None:
    """Keep ``body`` (already checked) and its ETag at ``path``, replaced atomically; a disk
    that cannot take it is logged (the engine decides on from memory)."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump({"etag": etag, "body": body}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        log.warning("cannot keep the last-known-good snapshot %s: %s", path, err)
