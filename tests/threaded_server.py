"""A test's HTTP server in a daemon thread that stops at once.

``serve_forever`` looks for a ``shutdown()`` request once per ``poll_interval``, 0.5 s by
default (Python's socketserver), so every server a test stopped cost it half a second: 72
teardowns, 36 s of the suite's time. Polling every 20 ms costs nothing measurable.
"""

from __future__ import annotations

import socketserver
import threading

POLL_INTERVAL_S = 0.02


def serve_in_thread(server: socketserver.BaseServer) -> threading.Thread:
    """Start ``server.serve_forever`` in a daemon thread; ``server.shutdown()`` returns
    within :data:`POLL_INTERVAL_S` seconds."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": POLL_INTERVAL_S}, daemon=True
    )
    thread.start()
    return thread
