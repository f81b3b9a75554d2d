"""Where each stage's time goes in the profiled code: the innermost frame of the pipeline's own
code that holds it.

In a trace recorded with Python stacks, each event's self time goes to the innermost enclosing
``python_function`` frame the caller counts as the pipeline's (``is_own``), with the outermost
library frame under it; a backward operator goes to the frame of the forward operator that
created it (same autograd sequence number). Written here rather than read with
``prof.key_averages(group_by_stack_n=...)``: that groups by full stack, not by the pipeline's
frame, does not follow a backward operator to its forward, and its stack parser fails on some
traces (``UnicodeDecodeError``) that read fine exported.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from .reading import Event, build_tree, main_thread, self_time

PYTHON = "python_function"
EVALUATE = "autograd::engine::evaluate_function: "
RUN_BACKWARD = "run_backward"  # the engine's entry: the host waits in it for other threads
FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.+)$")


@dataclass(frozen=True)
class Frame:
    """A Python frame as the trace names it."""

    file: str
    line: int
    function: str

    @classmethod
    def parse(cls, name: str) -> "Frame | None":
        m = FRAME.match(name)
        return None if m is None else cls(m["file"], int(m["line"]), m["func"])

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


@dataclass
class SiteTotals:
    """Seconds and operator calls of one site in one stage, over the recorded steps: host
    self time, and the device time of the kernels its operators launched (CUDA traces)."""

    seconds: float = 0.0
    ops: int = 0
    device_seconds: float = 0.0
    # the input of its operators most like a matrix per sample, where shapes were recorded, and
    # the operator that took it: what a line computes on ([B, N, N]: a graph per sample)
    dims: tuple = ()
    dims_op: str = ""

    def add(self, other: "SiteTotals") -> None:
        """Add ``other``'s figures to these (its operand kept where it ranks above)."""
        self.seconds += other.seconds
        self.ops += other.ops
        self.device_seconds += other.device_seconds
        self.add_dims(list(other.dims), other.dims_op)

    def add_dims(self, dims, op: str) -> None:
        """Keep ``dims`` (an operator's input shape) if it ranks above the one kept: a batch of
        square matrices (3 or more dimensions, the last two equal) first, then the most
        elements (a review: ``bmm(A [B, N, N], H [B, N, F])`` with F > N kept H)."""
        if dims and operand_rank(dims) > operand_rank(self.dims):
            self.dims, self.dims_op = tuple(dims), op


def operand_rank(dims) -> tuple:
    """How an operand ranks as what a line computes on: a batch of square matrices first, then
    the most elements (:meth:`SiteTotals.add_dims`; the verdict merges lines by it too)."""
    return (len(dims) >= 3 and dims[-1] == dims[-2], math.prod(dims) if dims else 0)


def largest_input(e: Event) -> list:
    """The input shape of an operator event recorded with shapes that ranks first (a batch of
    square matrices, then the most elements; :meth:`SiteTotals.add_dims`), or []."""
    shapes = [d for d in (e.args.get("Input Dims") or []) if isinstance(d, list) and d and
              all(isinstance(x, int) for x in d)]
    return max(shapes, key=operand_rank) if shapes else []


Site = tuple  # (the pipeline's frame or None, the library frame under it or None)
UNOWNED: Site = (None, None)
PLUMBING = ("torch/nn/modules/module.py",)  # calls into a module: its forward is named instead


def _sequence(e: Event) -> int | None:
    v = e.args.get("Sequence number")
    return int(v) if isinstance(v, (int, float)) and v >= 0 else None


def _is_op(e: Event) -> bool:
    return e.cat == "cpu_op"


def python_frames(events: list[Event]) -> int:
    """How many Python frames the trace holds (0: it was not recorded with stacks)."""
    return sum(1 for e in events if e.cat == PYTHON)


def attribute(events: list[Event], kind: Callable[[str], str],
              stage_prefix: str = "wb:",
              callers: dict | None = None) -> dict[str, dict[Site, SiteTotals]]:
    """Self time, operator calls and device time per stage and site.

    Args:
        events: a trace's events (:func:`~.reading.load_trace`), recorded with Python stacks.
        kind: a frame's file -> "own" (the pipeline's code), "harness" (the code that runs the
            steps) or "library".
        stage_prefix: the prefix of the stage ranges; an event of the step's threads (the main
            one, and those the autograd engine ran the backward on) is in the stage whose range
            holds its start (the ranges are left out of the nesting). Other threads' work (a
            Python thread pool in the forward, convert's planning thread) is not attributed.
        callers: where given, added to: ``{stage: {frame: {caller: [host seconds, device
            seconds]}}}``, each own frame's time by the nearest enclosing own frame it ran under
            (None: none, the loop or a library called it), so that a helper shared by two
            functions can be told by whom it was called. In the backward, the forward's: a
            backward operator counts at its forward operator's frame, with that frame's caller;
            a custom ``backward`` is called from the function that called its ``apply``.

    Returns:
        ``{stage: {(frame or None, library frame or None): SiteTotals}}``; a ``None`` frame holds
        what ran under no frame of the pipeline's own.
    """
    from bisect import bisect_right

    from .reading import GPU_CATS

    thread = main_thread(events) or main_thread(events, step_marker=stage_prefix)
    spans = sorted((e.ts, e.end, e.name[len(stage_prefix):]) for e in events
                   if e.name.startswith(stage_prefix) and (e.pid, e.tid) == thread)

    def stage_at(ts: float) -> str | None:
        i = bisect_right(spans, (ts, float("inf"), "")) - 1
        return spans[i][2] if i >= 0 and ts < spans[i][1] else None

    # the step's own threads: the main one, and those the autograd engine runs the backward on
    # (a CUDA device's); not a Python thread that merely ran meanwhile (found by a user trial: a
    # background sampler's frames, started during a forward, were booked to it, 11x its time)
    host = [e for e in events if e.cat.lower() not in GPU_CATS and not e.is_range]
    engine = {(e.pid, e.tid) for e in host if e.name.startswith(EVALUATE)}
    host = [e for e in host if (e.pid, e.tid) == thread or (e.pid, e.tid) in engine]
    build_tree(host)
    sites: dict[int, Site] = {}
    called_by: dict[int, Frame | None] = {}  # the caller of each event's own frame
    backward: dict[int, bool] = {}
    forward_ops: dict[int, list[Event]] = defaultdict(list)
    by_external: dict = {}
    out: dict[str, dict[Site, SiteTotals]] = defaultdict(lambda: defaultdict(SiteTotals))
    for e in sorted(host, key=lambda e: (e.ts, -e.dur)):  # parents before their children
        up = sites.get(id(e.parent), UNOWNED) if e.parent is not None else UNOWNED
        by = called_by.get(id(e.parent)) if e.parent is not None else None
        in_bw = backward.get(id(e.parent), False) if e.parent is not None else False
        if e.cat == PYTHON:
            f = Frame.parse(e.name)
            k = kind(f.file) if f is not None else "library"
            if k == "own":
                if up[0] != f:  # (a recursive call keeps the outer call's caller)
                    by = up[0]
                up = (f, None)
            elif k == "harness":
                up, by = UNOWNED, None
            elif f is not None and up[0] is not None and up[1] is None and \
                    not f.file.endswith(PLUMBING):
                up = (up[0], f)
        elif e.name.startswith(EVALUATE):
            in_bw = True
            seq = _sequence(e)
            fwd = forward_ops.get(seq, []) if seq is not None else []
            up = sites.get(id(fwd[-1]), UNOWNED) if fwd else UNOWNED
            by = called_by.get(id(fwd[-1])) if fwd else None
        elif _is_op(e) and not in_bw:
            seq = _sequence(e)
            outer = e.parent is not None and _is_op(e.parent) and _sequence(e.parent) == seq
            if seq is not None and not outer:
                forward_ops[seq].append(e)
        sites[id(e)], called_by[id(e)], backward[id(e)] = up, by, in_bw
        stage = stage_at(e.ts)
        if _is_op(e) and "External id" in e.args:
            by_external[e.args["External id"]] = (stage, up, by)
        if stage is None or (e.cat == PYTHON and RUN_BACKWARD in e.name):
            continue  # the engine's entry waits for its threads: their work is counted
        tot = out[stage][up]
        tot.seconds += self_time(e) / 1e6
        if callers is not None and up[0] is not None:
            callers.setdefault(stage, {}).setdefault(up[0], {}).setdefault(
                by, [0.0, 0.0])[0] += self_time(e) / 1e6
        if _is_op(e) and not (e.parent is not None and _is_op(e.parent)):
            tot.ops += 1
    for e in events:  # kernels and copies: device time, at the operator that launched them
        if e.cat.lower() in GPU_CATS and e.cat.lower() != "gpu_user_annotation":
            hit = by_external.get(e.args.get("External id"))
            if hit is not None and hit[0] is not None:
                out[hit[0]][hit[1]].device_seconds += e.dur / 1e6
                if callers is not None and hit[1][0] is not None:
                    callers.setdefault(hit[0], {}).setdefault(hit[1][0], {}).setdefault(
                        hit[2], [0.0, 0.0])[1] += e.dur / 1e6
    return {k: dict(v) for k, v in out.items()}
