"""The client's on-disk spool of unreported decision events (JSON lines, fsynced).

``append`` returns only once the event is on disk. ``drain`` seals the open segment (a rename,
so appends go on into a new file), sends sealed segments in batches and deletes a segment only
after every batch of it was acknowledged; a failed send keeps it for the next try (resending is
harmless: the service ingests idempotently by event id). Segments left open by a process that
died are sealed and sent by the next client on the same directory. A segment the service
rejects as invalid is set aside as ``rejected-*.jsonl`` (kept for a person, never dropped).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal

log = logging.getLogger("turnout.client")

SendResult = Literal["ok", "retry", "reject"]


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._open_path = self.directory / f"open-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        self._file: IO[str] | None = None

    def append(self, event: dict[str, Any]) -> None:
        """Write one event and fsync it; durable when this returns."""
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            if self._file is None:
                self._file = open(self._open_path, "a", encoding="utf-8")  # noqa: SIM115
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())

    def pending(self) -> int:
        """Events on disk not yet acknowledged (open and sealed segments)."""
        return sum(len(_read_events(p)) for p in self._segments(("open-", "sealed-")))

    def drain(self, send: Callable[[list[dict[str, Any]]], SendResult | bool],
              batch_size: int) -> int:
        """Send what is spooled; returns the number of events acknowledged."""
        self._seal_own()
        self._seal_orphans()
        sent = 0
        for path in self._segments(("sealed-",)):
            with _exclusive(path) as locked:
                if not locked or not path.exists():
                    continue  # another live client is sending it
                events = _read_events(path)
                for start in range(0, len(events), batch_size):
                    result = send(events[start:start + batch_size])
                    if result is True or result == "ok":
                        sent += len(events[start:start + batch_size])
                        continue
                    if result == "reject":
                        os.replace(path, path.with_name("rejected-" + path.name[7:]))
                        log.error("set aside %s: the service rejected its events", path.name)
                        break
                    return sent  # retry later; the segment stays
                else:
                    path.unlink()
        return sent

    def _segments(self, prefixes: tuple[str, ...]) -> list[Path]:
        return sorted(p for p in self.directory.glob("*.jsonl") if p.name.startswith(prefixes))

    def _seal_own(self) -> None:
        with self._lock:
            if self._file is None:
                return
            self._file.close()
            self._file = None
            os.replace(self._open_path, self._sealed_name(self._open_path))

    def _seal_orphans(self) -> None:
        for path in self._segments(("open-",)):
            if path == self._open_path:
                continue
            pid = _pid_of(path)
            if pid is not None and _alive(pid):
                continue
            with contextlib.suppress(FileNotFoundError):  # another client sealed it first
                os.replace(path, self._sealed_name(path))

    def _sealed_name(self, open_path: Path) -> Path:
        # sealed-<time-ordered id>-<original name>: drained oldest first.
        return open_path.with_name(f"sealed-{uuid.uuid1().hex}-{open_path.name[5:]}")


def _read_events(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    events = []
    for i, line in enumerate(lines):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            # Only a torn last line (a crash inside append, which never returned) can be here.
            log.warning("%s:%d: skipping a torn line", path.name, i + 1)
    return events


def _pid_of(path: Path) -> int | None:
    parts = path.name.split("-")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def _exclusive(path: Path) -> Iterator[bool]:
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
