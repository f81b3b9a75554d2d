"""A measurement's re-run of a step that has already run plainly: its warnings are not shown.

03 counts a step's syncs and marks its lines by running the step again under a
``TorchFunctionMode`` (``measurement/syncs.py``, ``measurement/line_marks.py``). A warning the
pipeline's code raises there is a repeat of one its plain runs (the check on one batch, the
warm-up steps) have shown already, attributed to the line of the pipeline's code. Under a mode
Python attributes it to the mode's frame instead (``warnings.warn(stacklevel=2)`` from torch
finds ``__torch_function__``), so a user trial saw torch's broadcast warning from its loss again
"at" ``syncs.py`` and ``line_marks.py``. Python 3.12's ``skip_file_prefixes`` would re-attribute
it; this project supports 3.10.

The re-run's warnings are dropped where they would be shown (``warnings.showwarning``), not by
a filter: changing the filters (``warnings.catch_warnings``) resets Python's once-per-line
registry, so the next plain step would show the pipeline's warning once more (a review). The
filters still apply (an "error" filter raises), and the registry still marks what was dropped.
What the profiler or the harness warns during a re-run is dropped too. A CUDA sync count records
every warning already (it reads torch's sync warnings from them) and shows none.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator


def _dropped(*args, **kwargs) -> None:
    """``warnings.showwarning`` inside :func:`rerun_quietly`: shows nothing."""


@contextmanager
def rerun_quietly() -> Iterator[None]:
    """Inside: warnings are not shown (a re-run of a step whose plain runs showed them)."""
    shown = warnings.showwarning
    warnings.showwarning = _dropped
    try:
        yield
    finally:
        warnings.showwarning = shown
