"""Python's garbage-collector pauses inside a timed region.

A collection of the oldest generation walks every tracked Python object of the process, so a
step that happens to trigger one can take several times its neighbours (measured: a collate
that builds lists per sample, 280 ms steps among 55 ms ones, one step in three, none with the
collector disabled). The step's wall time rightly includes it, as a training loop pays it, but
a reader needs to see it apart: its cost follows every live object of the process, the other
pipeline's in the same run too, not only the step's own work.

Written here because no maintained tool times the collector per region: ``gc.callbacks`` is
CPython's own hook (a "start" and a "stop" call around each collection), and this only adds up
the time between them while a region is open.
"""
from __future__ import annotations

import gc
import time


class GcPauses:
    """Seconds the collector ran while :meth:`open`.

    Args:
        clock: the time source (``time.perf_counter``, as the step's own timer).
    """

    def __init__(self, clock=time.perf_counter):
        self._clock = clock
        self._start: float | None = None
        self.seconds = 0.0
        self._on = False

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = self._clock()
        elif self._start is not None:  # a stop whose start came before the region: not counted
            self.seconds += self._clock() - self._start
            self._start = None

    def open(self) -> None:
        """Start counting from zero (the callback added once; :meth:`close` removes it)."""
        self.seconds, self._start = 0.0, None
        if not self._on:
            gc.callbacks.append(self._callback)
            self._on = True

    def close(self) -> float:
        """Stop counting; the seconds the collector ran since :meth:`open`."""
        if self._on:
            gc.callbacks.remove(self._callback)
            self._on = False
        return self.seconds
