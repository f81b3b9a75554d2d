"""Host-side work a run does on purpose: a region marked :func:`host_side` is host work in a GPU
run too (a plan made from host tensors, its indexes sent to the device non-blocking), so a CPU
run's projection of GPU host syncs (:mod:`workbook_lib.measurement.syncs`) does not count what
runs inside it, where every tensor is a CPU tensor and a ``.numpy()`` would otherwise read as a
copy to the host; its operators are not counted as the step's either (on a GPU too). A
thread-local depth, written here because no library marks such regions for a dispatch-mode
counter; a CUDA run's own sync count (``set_sync_debug_mode``) ignores it. The projection takes
``deleted`` to be on the host, as docs/fix-api.md says to keep it: a pipeline that moves it to
the GPU makes syncs there that the CPU projection does not count.
"""
from __future__ import annotations

import contextlib
import threading
from contextlib import contextmanager
from typing import Iterator

_state = threading.local()


@contextmanager
def _marked(kind: str, on: bool = True) -> Iterator[None]:
    """This thread's depth of ``kind`` raised by one inside (nothing when not ``on``)."""
    if not on:
        yield
        return
    setattr(_state, kind, getattr(_state, kind, 0) + 1)
    try:
        yield
    finally:
        setattr(_state, kind, getattr(_state, kind) - 1)


def _inside(kind: str) -> bool:
    return getattr(_state, kind, 0) > 0


def host_side() -> contextlib.AbstractContextManager:
    """Mark the work inside as host work by design (see the module docstring)."""
    return _marked("host")


def on_host() -> bool:
    """Whether this thread is inside :func:`host_side`."""
    return _inside("host")


def cache_blocks(blocked: bool = True) -> contextlib.AbstractContextManager:
    """Mark a repeated block of a library loop that runs a block of samples (or rows) at a time
    on a CPU, to keep each block in cache, and the whole batch as one block on a GPU: the loop
    marks every block after its first (``blocked`` False: not marked), so the sync counter
    counts a block's operators once, as a GPU runs them. A stage's operator count (what tells
    a Python loop over the samples) is then the one the whole batch as one block gives."""
    return _marked("blocks", blocked)


def in_cache_blocks() -> bool:
    """Whether this thread is inside :func:`cache_blocks`."""
    return _inside("blocks")
