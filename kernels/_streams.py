"""Two launches that may run at once: the second on a side stream forked from the current one.

``run_overlapped(device, first, second)`` launches ``first`` on the current CUDA stream and
``second`` on a per-device side stream that first waits for everything queued on the current
stream, then joins the current stream back (``wait_stream``) before returning. Work queued on
the current stream afterwards sees both; the caching allocator's stream-ordered reuse stays safe
because nothing of the side stream outlives the join. Under ``torch.cuda.graph`` capture the
fork and the join are captured as event edges: the graph holds two parallel branches (CUDA
programming guide, "Cross-stream dependencies and events" under stream capture).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_side_streams: dict[int, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream of ``device`` (a CUDA device), made on first use."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _side_streams:
        _side_streams[index] = torch.cuda.Stream(device=index)  # type: ignore[no-untyped-call]  # torch.cuda.Stream.__new__ is unannotated
    return _side_streams[index]


def run_overlapped(
    device: torch.device, first: Callable[[], None], second: Callable[[], None]
) -> None:
    """``first()`` on the current stream, ``second()`` on the side stream, both ordered after
    what is queued now and before what is queued next (see the module docstring)."""
    main = torch.cuda.current_stream(device)
    side = side_stream(device)
    side.wait_stream(main)
    first()
    with torch.cuda.stream(side):
        second()
    main.wait_stream(side)
