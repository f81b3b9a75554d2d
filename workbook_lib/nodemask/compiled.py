"""numba's compiled CPU kernels for the delta push and the batch's corrections, loaded once per
process (:func:`kernels`), and the threading layer they run on."""
from __future__ import annotations

import os
from typing import Any, NamedTuple

NO_NUMBA_ENV = "WORKBOOK_NO_NUMBA"  # set (non-empty): behave as if numba were not installed

# numba's threads block between launches instead of spinning (its default OpenMP layer spins and
# starves PyTorch's next operations on a machine with as many cores as PyTorch's threads; see
# docs/figures.md). Applied before numba's first parallel launch, unless NUMBA_THREADING_LAYER is set.
THREADING_LAYER = "workqueue"


class Kernels(NamedTuple):
    """The compiled kernels of :mod:`workbook_lib.nodemask.numba_push`, and numba itself."""

    fwd: Any
    bwd: Any
    numba: Any
    fwd_pool: Any
    bwd_pool: Any
    corrections_host: Any
    selection: Any


_LOADED: Kernels | bool | None = None  # None: not tried yet; False: numba unavailable


def kernels() -> Kernels | bool:
    """The compiled kernels (compiled once per process, cached on disk by numba), or False when
    numba is unavailable or :data:`NO_NUMBA_ENV` is set."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    if os.environ.get(NO_NUMBA_ENV):
        _LOADED = False
        return _LOADED
    try:
        import numba
    except ImportError:
        _LOADED = False
        return _LOADED
    if not os.environ.get("NUMBA_THREADING_LAYER"):  # a user's explicit choice is kept
        numba.config.THREADING_LAYER = THREADING_LAYER
    from . import numba_push as k

    _LOADED = Kernels(k.fwd, k.bwd, numba, k.fwd_pool, k.bwd_pool, k.corrections_host,
                      k.selection)
    return _LOADED


def numba_threading_layer() -> str:
    """The threading layer numba's parallel kernels run on in this process ("" without numba;
    the configured one until the first parallel launch)."""
    loaded = kernels()
    if not loaded:
        return ""
    try:
        return loaded.numba.threading_layer()
    except ValueError:  # no parallel launch yet
        return str(loaded.numba.config.THREADING_LAYER)


def numba_available() -> bool:
    """True when the compiled CPU push kernel can be used."""
    return bool(kernels())
