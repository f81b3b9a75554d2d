"""Which line of the pipeline's own code each operator was called from, for one profiled step.

While :class:`LineMarks` is active, every torch call (a function, a tensor method or operator,
made directly or through a library such as PyG) is wrapped in a profiler range named after the
innermost frame of the pipeline's own code that led to it: ``wb-line:<file>:<first>:<line>``
(the file as the trace names it, the function's first line, the calling line). A call whose
innermost such frame is the harness's (the loop's own ``backward()``, its optimizer) is not
marked. :func:`workbook_lib.traces.lines.line_totals` reads the ranges back: each operator's time,
and its backward's through autograd's sequence numbers, at the line that called it. Autograd runs
a backward inside ``Tensor.backward``, itself a torch call whose handler runs with the mode set
aside, so while the mode is active a custom ``autograd.Function``'s Python backward is entered
with the mode pushed again (``BackwardCFunction.apply``, wrapped for the block and put back):
its calls are marked at its own lines too. On a GPU the engine runs the backward on a thread of
its own, whose calls are marked the same way and read per thread (not run here: no GPU).

Written here: ``torch.profiler``'s Python stacks name a function by its first line only, and
``line_profiler`` times Python lines on the host, not the operators a line launches (on a GPU
they run later) nor their backward, which autograd runs outside the line.
"""
from __future__ import annotations

import sys
import threading
from typing import Callable

from torch._C._profiler import _RecordFunctionFast
from torch.autograd.function import BackwardCFunction
from torch.overrides import TorchFunctionMode

PREFIX = "wb-line:"
_ENTRIES = ("apply", "apply_boxed")  # where autograd enters a custom backward (torch 2.13)
_LOCK = threading.Lock()
_UNSEEN = object()


def mark(file: str, first: int, line: int) -> str:
    """A range's name for a call on ``line`` of the function starting at ``first`` in ``file``."""
    return f"{PREFIX}{file}:{first}:{line}"


def parse(name: str) -> tuple[str, int, int] | None:
    """``(file, first, line)`` of a :func:`mark` name, else None."""
    if not name.startswith(PREFIX):
        return None
    file, _, rest = name[len(PREFIX):].rpartition(":")
    file, _, first = file.rpartition(":")
    try:
        return file, int(first), int(rest)
    except ValueError:
        return None


class LineMarks(TorchFunctionMode):
    """Marks each torch call with the line of the pipeline's own code that made it.

    Args:
        own: a file -> "own", "harness" or "library"; with ``own.display(file)``, the file as a
            trace names it (:class:`workbook_lib.studies.timing.own_code.OwnCode`).
    """

    def __init__(self, own: Callable[[str], str]):
        super().__init__()
        self.own = own
        self._files: dict = {}  # co_filename -> its display name (own), "" (harness), None

    def _kind(self, filename: str):
        k = self._files.get(filename, _UNSEEN)
        if k is _UNSEEN:
            kind = self.own(filename)
            k = self.own.display(filename) if kind == "own" else \
                ("" if kind == "harness" else None)
            self._files[filename] = k
        return k

    def __enter__(self):
        with _LOCK:  # a custom backward enters again, maybe on the engine's thread
            self._depth = getattr(self, "_depth", 0) + 1
            if self._depth == 1:  # the outermost entry wraps
                self._saved = {n: getattr(BackwardCFunction, n) for n in _ENTRIES
                               if hasattr(BackwardCFunction, n)}
                for name, inner in self._saved.items():
                    setattr(BackwardCFunction, name, self._wrap(inner))
        try:
            return super().__enter__()
        except BaseException:
            self._leave()
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._leave()

    def _wrap(self, inner):
        mode = self

        def entry(node, *args):  # a custom backward: its torch calls under this mode
            with mode:
                return inner(node, *args)
        return entry

    def _leave(self) -> None:
        with _LOCK:
            self._depth -= 1
            if self._depth == 0:
                for name, inner in self._saved.items():
                    setattr(BackwardCFunction, name, inner)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        f = sys._getframe(1)
        while f is not None:
            k = self._kind(f.f_code.co_filename)
            if k is not None:
                break
            f = f.f_back
        if f is None or not k:  # no frame of the pipeline's, or the harness's nearer
            return func(*args, **kwargs)
        with _RecordFunctionFast(mark(k, f.f_code.co_firstlineno, f.f_lineno)):
            return func(*args, **kwargs)
