"""``turnout launch --report-startup``: vLLM as a child process whose output is passed through
unchanged (stdout to stdout, stderr to stderr, byte for byte, as it comes) while the first line
in which vLLM says which model runner it uses is looked for; signals sent to the launcher are
forwarded to vLLM, and the launcher exits with vLLM's status.

The lines are vLLM's own (the same text in releases 0.29 to 0.33):

- ``Using V2 Model Runner``: the worker, as it initialises its device, when V2 was selected
  (``logger.info_once`` in vllm/v1/worker/gpu_worker.py, cpu_worker.py and xpu_worker.py);
- ``Loading model from scratch...``: V2's ``GPUModelRunner.load_model``
  (vllm/v1/worker/gpu/model_runner.py), for a worker that logs no device line;
- ``Starting to load model MODEL...``: V1's ``GPUModelRunner.load_model``
  (vllm/v1/worker/gpu_model_runner.py) and ``CPUModelRunner.load_model``
  (vllm/v1/worker/cpu_model_runner.py). V1 has no line of its own before it (with
  ``VLLM_USE_V2_MODEL_RUNNER=0`` the selection logs nothing): the first of these lines decides.

The selection's own warnings (``...; using the V1 model runner instead.``) are not taken as the
answer: vLLM 0.31 may log one during an early evaluation whose answer the final one overrides.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO

STARTUP_LINES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bUsing V2 Model Runner\b"), "v2"),
    (re.compile(r"\bLoading model from scratch\.\.\."), "v2"),
    (re.compile(r"\bStarting to load model\b"), "v1"),
)
FORWARDED_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MAX_PARTIAL = 1 << 16  # a "line" longer than this (a progress bar) is looked at in pieces
PUMP_DRAIN_S = 5.0  # after vLLM exits, how long its last output may take to come through
log = logging.getLogger("turnout.launch")

OnStartup = Callable[[str, str], None]  # (runner, line)


def runner_of_line(line: str) -> str | None:
    """``"v1"``/``"v2"`` when ``line`` is vLLM saying which runner it uses, else None."""
    text = _ANSI.sub("", line)
    return next((runner for pattern, runner in STARTUP_LINES if pattern.search(text)), None)


class StartupWatch:
    """Looks for the first runner line across vLLM's streams; calls ``on_startup`` once."""

    def __init__(self, on_startup: OnStartup) -> None:
        self.on_startup = on_startup
        self.found: tuple[str, str] | None = None
        self._lock = threading.Lock()

    def line(self, raw: bytes) -> None:
        if self.found is not None:
            return
        text = raw.decode("utf-8", "replace").rstrip("\r\n")
        runner = runner_of_line(text)
        if runner is None:
            return
        with self._lock:
            if self.found is not None:
                return
            self.found = (runner, _ANSI.sub("", text).strip())
        self.on_startup(*self.found)


def _pump(source: IO[bytes], sink: IO[bytes], watch: StartupWatch) -> None:
    """Copy ``source`` to ``sink`` as it comes (no waiting for whole lines), handing each
    complete line to ``watch``."""
    partial = b""
    fd = source.fileno()
    while chunk := os.read(fd, 65536):
        _write(sink, chunk)
        if watch.found is not None:
            continue
        lines = (partial + chunk).split(b"\n")
        partial = lines.pop()[-_MAX_PARTIAL:]
        for raw in lines:
            watch.line(raw)
    if partial:
        watch.line(partial)


def _write(sink: IO[bytes], chunk: bytes) -> None:
    """Pass ``chunk`` on. A sink whose reader went away (``| head``, a log shipper that died)
    gets /dev/null in its place: vLLM's output must still be read (a full pipe would block
    it), and it goes on as it would have, writing to a closed pipe itself."""
    try:
        sink.write(chunk)
        sink.flush()
    except OSError as err:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), sink.fileno())
        log.warning(
            "the launcher's %s is closed (%s): vLLM's output there is dropped from now on",
            "stdout" if sink.fileno() == 1 else "stderr",
            err.strerror or err,
        )
        sink.flush()  # what the buffer held goes to /dev/null now


def run_child(
    argv: Sequence[str], env: Mapping[str, str], *, executable: Path, on_startup: OnStartup
) -> int:
    """Run ``argv`` (``executable`` is what runs; ``argv[0]`` stays as given) with ``env`` in
    its own process group, forward FORWARDED_SIGNALS to it, pass its output through, and
    return its exit status (128 + N when signal N ended it, as a shell reports it).

    Raises:
        OSError: ``executable`` cannot be started (not there, not executable, not a format
            the system runs).
    """
    proc = subprocess.Popen(
        list(argv),
        executable=str(executable),
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        process_group=0,
    )
    watch = StartupWatch(on_startup)

    def forward(signum: int, _frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(src, sink, watch), daemon=True)
        for src, sink in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer))
    ]
    try:
        for t in pumps:
            t.start()
        status = proc.wait()
        for t in pumps:  # a process vLLM left behind may hold its pipes open: do not hang
            t.join(timeout=PUMP_DRAIN_S)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return status if status >= 0 else 128 - status
