"""The client's on-disk spools of unreported decision events and health reports (JSON lines,
fsynced; one directory each).

``append`` returns only once the event is on disk. ``drain`` seals the open segment (a rename,
so appends go on into a new file), sends sealed segments in batches and deletes a segment only
after every batch of it was acknowledged; a failed send keeps it for the next try (resending is
harmless: the service ingests idempotently by event id).

Segments are owned by locks, not process ids: a writer holds an exclusive ``flock`` on its open
segment from the moment the segment exists (it is created under a temporary name, locked, then
renamed into place) until it is sealed. A segment nobody holds a lock on is an orphan, left by
a process that died, and any client on the directory seals and sends it, whatever its name says
— a restarted engine with the same process id (PID 1 in a container) included. The kernel
drops a dead process's locks, so a crash never leaves a segment looking live. A batch the service
rejects as invalid is resent event by event: the events it takes are stored, the ones it
rejects, and lines of a segment that cannot be read (corruption), are set aside in
``rejected-*.jsonl`` (kept for a person, never dropped). Events it refuses only for now (dated
ahead of its clock: ``event_in_future``) go into a new sealed segment instead, sent again at
the first drain :data:`DEFER_RETRY_S` later, and so on until the clocks agree.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal

log = logging.getLogger("turnout.client")

# "ok": acknowledged; "retry": not (keep it); "reject": the service refuses the batch whole
# (split it); "later": the service refuses it for now (an event dated ahead of its clock):
# split it, and keep a single item so refused to send again at the next drain; "split":
# something else in the way (a proxy's 413) refuses the batch whole: split it, and keep a
# single item it still refuses for a later resend; a set of positions: acknowledged, those
# items refused alone (set them aside).
SendResult = Literal["ok", "retry", "reject", "later", "split"] | frozenset[int]
#: An event refused "for now" but dated further ahead of this host's clock than this is set
#: aside, not kept: no clock fix brings a year-2100 event within the service's skew.
MAX_DEFER = dt.timedelta(days=30)
#: Seconds before events refused for now are sent again: each goes alone (its batch was split
#: to find it), so a service whose clock lags would otherwise get one request per such event
#: at every flush (each second).
DEFER_RETRY_S = 60.0


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._open_path = self.directory / f"open-{uuid.uuid4().hex}.jsonl"
        self._file: IO[str] | None = None

    def append(self, event: dict[str, Any]) -> None:
        """Write one event and fsync it; durable when this returns."""
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            if self._file is None:
                self._file = self._create_locked()
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())

    def _create_locked(self) -> IO[str]:
        """The open segment, created locked: under a name no client reads, locked, then renamed
        into place (a rename keeps the lock), so no client ever sees it unlocked."""
        tmp = self._open_path.with_suffix(".new")
        f = open(tmp, "a", encoding="utf-8")  # noqa: SIM115 - held until sealed
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.replace(tmp, self._open_path)
        except BaseException:
            f.close()
            raise
        return f

    def close(self) -> None:
        """Seal the open segment and release its lock: the events stay for any client on the
        directory to send (an append after this opens a new segment)."""
        self._seal_own()

    def pending(self) -> int:
        """Events on disk not yet acknowledged (open and sealed segments)."""
        return sum(len(_read_events(p)[0]) for p in self._segments(("open-", "sealed-")))

    def drain(
        self, send: Callable[[list[dict[str, Any]]], SendResult | bool], batch_size: int
    ) -> int:
        """Send what is spooled; returns the number of events acknowledged."""
        self._seal_own()
        self._seal_orphans()
        sent = 0
        for path in self._segments(("sealed-",)):
            if _not_before(path) > time.time():
                continue  # events refused for now, not yet due again
            with _exclusive(path) as locked:
                if not locked or not path.exists():
                    continue  # another live client is sending it
                events, unreadable = _read_events(path)
                rejected: list[str] = []
                deferred: list[str] = []
                for start in range(0, len(events), batch_size):
                    batch = events[start : start + batch_size]
                    result = _send_batch(send, batch, rejected, deferred)
                    if result is None:
                        return sent  # retry later; the segment stays (resending is harmless)
                    sent += result
                if rejected or unreadable:
                    self._set_aside(path, [*unreadable, *rejected])
                if deferred:
                    self._defer(path, deferred)
                path.unlink()
        return sent

    @staticmethod
    def _set_aside(path: Path, lines: list[str]) -> None:
        """Keep what the service will never take (or what cannot be read) for a person."""
        aside = path.with_name("rejected-" + path.name[7:])
        with open(aside, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        log.error(
            "set aside %d events of %s in %s: the service rejected them or they cannot be read",
            len(lines),
            path.name,
            aside.name,
        )

    def _defer(self, path: Path, lines: list[str]) -> None:
        """Keep events the service refused for now in a new sealed segment (written under a
        name no client reads, then renamed): sent again at the next drain, after the others."""
        tmp = self.directory / f"defer-{uuid.uuid4().hex}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        due = int(time.time() + DEFER_RETRY_S)
        later = self._sealed_name(self.directory / f"open-deferred-{due}.jsonl")
        os.replace(tmp, later)
        log.warning(
            "kept %d events of %s for a later send in %s: the service refused them for now "
            "(dated ahead of its clock)",
            len(lines),
            path.name,
            later.name,
        )

    def _segments(self, prefixes: tuple[str, ...]) -> list[Path]:
        return sorted(p for p in self.directory.glob("*.jsonl") if p.name.startswith(prefixes))

    def _seal_own(self) -> None:
        with self._lock:
            if self._file is None:
                return
            # Renamed while still locked, then closed: no other client can take it for an
            # orphan in between.
            os.replace(self._open_path, self._sealed_name(self._open_path))
            self._file.close()
            self._file = None

    def _seal_orphans(self) -> None:
        """Seal every open segment no writer holds a lock on (its writer died)."""
        for path in self._segments(("open-",)):
            if path == self._open_path:
                continue
            with _exclusive(path) as orphan:
                if orphan:
                    with contextlib.suppress(FileNotFoundError):  # another client sealed it
                        os.replace(path, self._sealed_name(path))
        for path in self.directory.glob("open-*.new"):  # created, never renamed: empty
            if path != self._open_path.with_suffix(".new"):
                with _exclusive(path) as orphan:
                    if orphan:
                        path.unlink(missing_ok=True)

    def _sealed_name(self, open_path: Path) -> Path:
        # sealed-<time-ordered id>-<original name>: drained oldest first.
        return open_path.with_name(f"sealed-{uuid.uuid1().hex}-{open_path.name[5:]}")


def _send_batch(
    send: Callable[[list[dict[str, Any]]], SendResult | bool],
    batch: list[dict[str, Any]],
    rejected: list[str],
    deferred: list[str],
) -> int | None:
    """Send one batch; the number of events handled (acknowledged, set aside or deferred), or
    None to retry later. A batch the service rejects (one bad event rejects it whole) is resent
    event by event, so that only the bad events are set aside (appended to ``rejected`` as
    JSON lines), and those it refuses for now kept (``deferred``; :data:`MAX_DEFER`)."""
    result = send(batch)
    if result is True or result == "ok":
        return len(batch)
    if isinstance(result, frozenset):
        rejected += [json.dumps(batch[i], separators=(",", ":")) for i in sorted(result)]
        return len(batch) - len(result)
    if result not in ("reject", "later", "split"):
        return None
    if len(batch) == 1:
        if result == "split":
            return None  # not the service's word: the event stays spooled
        line = json.dumps(batch[0], separators=(",", ":"))
        (deferred if result == "later" and _may_wait(batch[0]) else rejected).append(line)
        return 0
    acknowledged = 0
    for event in batch:
        one = _send_batch(send, [event], rejected, deferred)
        if one is None:
            return None
        acknowledged += one
    return acknowledged


def _not_before(path: Path) -> float:
    """When a segment of deferred events is due (epoch seconds, in its name); 0 for others."""
    name = path.stem
    _head, sep, due = name.rpartition("-deferred-")
    return float(due) if sep and due.isdigit() else 0.0


def _may_wait(event: dict[str, Any]) -> bool:
    """Whether an event refused for now is dated less than :data:`MAX_DEFER` ahead of this
    host's clock (an event without a readable time may not wait)."""
    try:
        at = dt.datetime.fromisoformat(str(event["at"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return False
    if at.tzinfo is None:
        return False
    return at - dt.datetime.now(dt.UTC) <= MAX_DEFER


def _read_events(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The events of a segment, and the lines that are not events (corruption: kept as they
    are, bytes that are not UTF-8 replaced). A torn last line (no newline: a crash inside
    ``append``, which therefore never returned) is dropped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], []
    lines = data.split(b"\n")
    if lines[-1]:
        log.warning("%s:%d: skipping a torn last line", path.name, len(lines))
    events: list[dict[str, Any]] = []
    unreadable: list[str] = []
    for raw in lines[:-1]:
        if not raw.strip():
            continue
        try:
            event = json.loads(raw.decode("utf-8"))
        except ValueError:  # invalid JSON or not UTF-8
            unreadable.append(raw.decode("utf-8", "replace"))
            continue
        if isinstance(event, dict):
            events.append(event)
        else:
            unreadable.append(raw.decode("utf-8"))
    return events, unreadable


@contextmanager
def _exclusive(path: Path) -> Iterator[bool]:
    """Whether this client got the exclusive lock of ``path`` (held inside the block); False
    when another holds it (a live writer, another client sending it) or the file is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
