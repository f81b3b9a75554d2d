"""Where a converted step's time goes: wall time per part of the converted encoder (each module
or fused sum of its traced forward, the wildtype, the host plan), forward and backward apart.

Why our own: ``torch.profiler`` books time to operators, not to the converted form's parts, and
the converted form's fused CPU paths run only while nothing watches its operators
(:func:`.workers.watched`), so a profiled step is not the step that trains. Here, only while
:func:`collect` is active:

- the forward of each node of the traced forward is timed in
  :meth:`.convert.ConvertedEncoder._execute` (:func:`timed`), and the wildtype's part of a
  conv's node inside it; a part's time is its own, less the parts timed inside it;
- the backward of each of the converted form's autograd functions (:func:`timed_function`) is
  timed and booked to the part whose forward made it;
- the host plan is its own part (a plan made ahead by ``plan_ahead`` in another thread: only
  the wait for it, under its own label);
- a pooled tail's modules are computed by the readout: their floor is booked to it.

The backward of PyTorch's own operators (a user's readout module, a convolution whose
backward is PyTorch's, an add of wildtypes, the loss) is not booked to a part: it is in the
step's time and in no part's. On a GPU the device is synchronized around each timed region, so
a step under :func:`collect` is slower than one without: the parts say where the time goes, the
step's own time is best measured without them. Outside :func:`collect` each hook costs a global
read and a Python call or two per module, microseconds against a step's milliseconds."""
from __future__ import annotations

import functools
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..measurement.timing import sync
from ..results.parts import PartTime, StepParts

PLAN = "plan (host)"
PLAN_WAITED = "plan (host, the wait for plan_ahead's)"
WILDTYPE = "wildtype, once per batch"  # as the floor names its part

_active: "_Collector | None" = None


class _Collector:
    """The times and, per thread (an autograd engine's device thread runs a GPU's backward),
    the stack of open parts."""

    def __init__(self, device: torch.device):
        self.device = device
        self.times: dict[tuple[str, str], float] = {}
        self.covers: dict[str, set] = {}  # label -> module paths whose floor it holds
        self._lock = threading.Lock()
        self._local = threading.local()

    @property
    def stack(self) -> list[list]:  # [label, start, time of the parts timed inside]
        st = getattr(self._local, "stack", None)
        if st is None:
            st = self._local.stack = []
        return st

    @property
    def node_open(self) -> bool:  # a part opened by switch() is on this thread's stack
        return getattr(self._local, "node_open", False)

    @node_open.setter
    def node_open(self, value: bool) -> None:
        self._local.node_open = value

    def current(self) -> str:
        return self.stack[-1][0] if self.stack else "unlabelled"

    def enter(self, label: str) -> None:
        sync(self.device)
        self.stack.append([label, time.perf_counter(), 0.0])

    def leave(self, phase: str) -> None:
        sync(self.device)
        label, start, inner = self.stack.pop()
        took = time.perf_counter() - start
        key = (label, phase)
        with self._lock:
            self.times[key] = self.times.get(key, 0.0) + took - inner
        if self.stack:
            self.stack[-1][2] += took


def active() -> bool:
    """Whether parts are being timed (:func:`collect`)."""
    return _active is not None


def current() -> str:
    """The label of the innermost part being timed ("unlabelled" outside every part)."""
    return _active.current() if _active is not None else "unlabelled"


def cover(label: str, path: str) -> None:
    """Book the floor of the module at ``path`` to part ``label`` (a pooled tail's module, which
    the readout computes); nothing outside :func:`collect`."""
    col = _active
    if col is not None:
        col.covers.setdefault(label, set()).add(path)


def switch(label: str | None) -> None:
    """End the part the last :func:`switch` began (if any) and begin ``label``'s forward (none
    with None): the traced forward's nodes, one after another, without a block per node."""
    col = _active
    if col is None:
        return
    if col.node_open:
        col.leave("forward")
        col.node_open = False
    if label is not None:
        col.enter(label)
        col.node_open = True


@contextmanager
def timed(label: str, phase: str = "forward"):
    """Time the block as part ``label``'s ``phase`` (its own time: less the parts timed inside
    it); nothing outside :func:`collect`."""
    col = _active
    if col is None:
        yield
        return
    col.enter(label)
    try:
        yield
    finally:
        col.leave(phase)


def timed_function(cls):
    """Class decorator for an autograd function of the converted form: under :func:`collect`,
    its forward notes the part it runs in, and its backward is timed as that part's."""
    fwd, bwd = cls.forward, cls.backward

    @functools.wraps(fwd)
    def forward(ctx, *args, **kwargs):
        if _active is not None:
            ctx.wb_part = _active.current()
        return fwd(ctx, *args, **kwargs)

    @functools.wraps(bwd)
    def backward(ctx, *grads):
        col = _active
        if col is None:
            return bwd(ctx, *grads)
        col.enter(getattr(ctx, "wb_part", "unlabelled"))
        try:
            return bwd(ctx, *grads)
        finally:
            col.leave("backward")

    cls.forward, cls.backward = staticmethod(forward), staticmethod(backward)
    return cls


@dataclass
class Collected:
    """What :func:`collect` timed: ``times`` ``{(label, phase): seconds}``, ``covers``
    ``{label: module paths whose floor it also holds}``."""

    times: dict = field(default_factory=dict)
    covers: dict = field(default_factory=dict)


@contextmanager
def collect(device: torch.device | str = "cpu"):
    """Time the converted form's parts while the block runs; yields a :class:`Collected` whose
    ``times`` (``{(label, phase): seconds}``) and ``covers`` (``{label: module paths whose floor
    it also holds}``) are filled when the block ends. One at a time (ValueError otherwise)."""
    global _active
    if _active is not None:
        raise ValueError("parts are already being timed (collect is not reentrant)")
    col = _Collector(torch.device(device))
    out = Collected()
    _active = col
    try:
        yield out
    finally:
        _active = None
        out.times.update(col.times)
        out.covers.update(col.covers)


def time_parts(step, *, steps: int = 3, device: torch.device | str = "cpu",
               warmup: int = 1) -> StepParts:
    """Where ``step``'s time goes: ``steps`` calls of ``step`` (a converted encoder's forward
    and backward, say) after ``warmup`` untimed ones, each part's forward and backward seconds
    per step, and the step's own seconds per step in the same calls.

    Args:
        step: a callable of no arguments that runs one step.
        steps: timed calls (at least 1).
        device: where the step runs (a GPU is synchronized around each part).
        warmup: calls before the timed ones, not timed.

    Raises:
        ValueError: ``steps`` under 1 or ``warmup`` negative.
    """
    if steps < 1:
        raise ValueError(f"'steps' must be at least 1 (got {steps})")
    if warmup < 0:
        raise ValueError(f"'warmup' must be 0 or more (got {warmup})")
    dev = torch.device(device)
    for _ in range(warmup):
        step()
    with collect(dev) as collected:
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync(dev)
        total = time.perf_counter() - t0
    got, extra = collected.times, collected.covers
    labels = list(dict.fromkeys(label for label, _ in got))
    parts = {lb: PartTime(forward_s=got.get((lb, "forward"), 0.0) / steps,
                          backward_s=got.get((lb, "backward"), 0.0) / steps) for lb in labels}
    return StepParts(step_s=total / steps, steps=steps, parts=parts,
                     synchronized=dev.type == "cuda",
                     covers={lb: sorted(p) for lb, p in extra.items() if lb in parts})
