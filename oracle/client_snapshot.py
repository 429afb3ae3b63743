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

import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from turnout.oracle import CanarySnapshot, Pack, bounded_json
from turnout.oracle.wire import SnapshotIn
from turnout.oracle.yamlpos import read_input

log = logging.getLogger("turnout.client")


def snapshot_mismatch(snapshot: SnapshotIn, pack: Pack, pack_name: str) -> str | None:
    """Why ``snapshot`` is not a canary snapshot of ``pack`` (loaded as ``pack_name``), in
    words; None when it is one."""
    if snapshot.pack not in (pack_name, pack.name):
        return f"it is of pack {snapshot.pack!r}, this engine runs {pack.name!r}"
    if snapshot.pack_digest is None:  # the service always sends it
        return "it carries no pack_digest, so which revision of the pack it is of is unknown"
    if snapshot.pack_digest != pack.digest:
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


def canonical_body(body: Any) -> dict[str, Any]:
    """A checked snapshot body as the client keeps it: the validated model re-serialised, so
    only the fields ``SnapshotIn`` reads reach the disk (a hostile service's extra field,
    nested 985 levels deep, was kept verbatim and broke every later start).

    Raises:
        ValueError: not a snapshot (``SnapshotIn.parse``).
    """
    return SnapshotIn.parse(body).model_dump(mode="json")


def load_last_known_good(
    path: Path, pack: Pack, pack_name: str
) -> tuple[CanarySnapshot, str | None] | None:
    """The snapshot and ETag kept at ``path``; None when there is none, or when it cannot be
    read or is not of ``pack`` (logged). A copy that cannot be read is moved aside
    (``<name>.bad-<unix time>``, kept for a person) so that it costs one warning, not one per
    start; one of another pack is left where it is (that pack's engine may come back)."""
    try:
        raw = read_input(path)  # a FIFO or a device at the cache path: refused, not read
    except FileNotFoundError:
        return None
    except OSError as err:
        log.warning("ignoring the last-known-good snapshot %s: %s", path, err)
        return None
    try:
        data = bounded_json.loads(raw.decode("utf-8"))
        body, etag = data["body"], data.get("etag")
        parsed = SnapshotIn.parse(body)
    except (ValueError, KeyError, TypeError, RecursionError) as err:
        aside = path.with_name(f"{path.name}.bad-{time.time_ns()}")
        with contextlib.suppress(OSError):
            os.replace(path, aside)
        log.warning(
            "the last-known-good snapshot %s cannot be read (%s): moved to %s",
            path,
            err,
            aside.name,
        )
        return None
    why = snapshot_mismatch(parsed, pack, pack_name)
    if why is not None:
        log.warning(
            "ignoring the last-known-good snapshot %s: not of this engine's pack: %s", path, why
        )
        return None
    return parsed.to_snapshot(), etag if isinstance(etag, str) else None


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
