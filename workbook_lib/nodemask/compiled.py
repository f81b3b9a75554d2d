"""numba's compiled CPU kernels for the delta push and the batch's corrections (and the push's
threaded driver) and a fused sum's row scatters, loaded once per process (:func:`kernels`), and
the threading layer they run on."""
from __future__ import annotations

import os
from typing import Any, NamedTuple

# numba's threads block between launches instead of spinning (its default OpenMP layer spins and
# starves PyTorch's next operations on a machine with as many cores as PyTorch's threads; see
# docs/figures.md). Applied before numba's first parallel launch, unless NUMBA_THREADING_LAYER is set.
THREADING_LAYER = "workqueue"


class Kernels(NamedTuple):
    """The kernels of :mod:`workbook_lib.nodemask.numba_push` and
    :mod:`workbook_lib.nodemask.numba_rows`, and numba itself: each is compiled by numba except
    ``push_counts`` and ``push_block``, Python drivers that run the compiled passes
    ``push_count`` and ``push_fill`` (each with or without the transpose) on threads, one run of
    whole samples each: ``push_counts`` the first (the plan fills the second into its group's
    arrays, ``PushCounts.fill``), ``push_block`` both (the tests' reference)."""

    fwd: Any
    bwd: Any
    numba: Any
    fwd_pool: Any
    bwd_pool: Any
    corrections_host: Any
    selection: Any
    csr_pair: Any
    push_block: Any
    push_counts: Any
    own_rows: Any
    mark_receivers: Any
    add_diff_at: Any
    add_scaled_at: Any
    add_csr_t: Any
    gin_sum_rows: Any
    take_add_at: Any
    gin_sum_rows_backward: Any


_LOADED: Kernels | None = None


def kernels() -> Kernels:
    """The compiled kernels (compiled once per process, cached on disk by numba)."""
    global _LOADED
    if _LOADED is None:
        import numba

        if not os.environ.get("NUMBA_THREADING_LAYER"):  # a user's explicit choice is kept
            numba.config.THREADING_LAYER = THREADING_LAYER
        from . import numba_push as k
        from . import numba_rows as r

        _LOADED = Kernels(k.fwd, k.bwd, numba, k.fwd_pool, k.bwd_pool, k.corrections_host,
                          k.selection, k.csr_pair, k.push_block, k.push_counts, k.own_rows,
                          k.mark_receivers, r.add_diff_at, r.add_scaled_at,
                          r.add_csr_t, r.gin_sum_rows, r.take_add_at, r.gin_sum_rows_backward)
    return _LOADED


def numba_threading_layer() -> str:
    """The threading layer numba's parallel kernels run on in this process (the configured one
    until the first parallel launch)."""
    loaded = kernels()
    try:
        return loaded.numba.threading_layer()
    except ValueError:  # no parallel launch yet
        return str(loaded.numba.config.THREADING_LAYER)
