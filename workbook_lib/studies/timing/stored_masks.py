"""Strategy 3's stored masks read cold and warm (notebook 03; read by a claim of 05).

:func:`stored_mask_reads` times the per-item read of stored masks with the file's pages dropped
(cold) and again (warm), in the same rounds.
"""
from __future__ import annotations

import torch

from ...measurement.timing import Stat
from ...results.timing import StoredReads


def drop_page_cache(path) -> bool:
    """Ask the kernel to drop a file's cached pages: fsync, then ``POSIX_FADV_DONTNEED``.
    Returns False where the call does not exist (the reads are then warm: say so)."""
    import os

    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def stored_mask_reads(graph, pert: torch.Tensor, *, rounds: int = 5,
                      storage_dir=None) -> StoredReads:
    """Time strategy 3's per-item read of ``len(pert)`` stored masks, cold and warm, ``rounds``
    times (per round: drop the file's pages, read every item twice); the file goes in
    ``storage_dir`` (default: a temporary folder, removed after).
    """
    import gc
    import shutil
    import tempfile
    import time
    from pathlib import Path

    from ...strategies import make_strategy

    if rounds < 1:
        raise ValueError(f"'rounds' must be a positive integer (got {rounds})")
    own = storage_dir is None
    d = Path(tempfile.mkdtemp(prefix="wb-reads-")) if own else Path(storage_dir)
    try:
        s = make_strategy("replicated_mask_stored", graph, storage_dir=d)
        path = s.store(pert)
        n = len(pert)

        def read_all() -> float:
            t0 = time.perf_counter()
            for i in range(n):
                s.make_item(i, pert[i])
            return (time.perf_counter() - t0) * 1e3 / n
        cold, warm = [], []
        dropped = True
        for _ in range(rounds):
            s._mm = None  # unmap, so that the pages can be dropped
            gc.collect()
            dropped = drop_page_cache(path) and dropped
            cold.append(read_all())
            warm.append(read_all())
        c, w = Stat.from_samples(cold, unit="ms"), Stat.from_samples(warm, unit="ms")
        return StoredReads(n, graph.num_edges(), path.stat().st_size, c, w,
                           c.ratio_to(w, paired=True), dropped)
    finally:
        if own:
            shutil.rmtree(d, ignore_errors=True)
