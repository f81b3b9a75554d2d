"""Where a training step's time goes in the pipeline's own code, function by function.

The device-side stages: one step under ``torch.profiler`` with Python stacks, read by
:func:`workbook_lib.traces.sites.attribute` (a backward operator counts at its forward's
function); that trace is deleted. The data stages: one batch under :mod:`cProfile` (the
profiler's Python tracer makes a trace of hundreds of megabytes for Python-loop data code).
``own(file)`` says whose a file is ("own", "harness", "library"); ``own.name(frame)`` names a
function, ``own.display(file)`` the path shown.
"""
from __future__ import annotations

import cProfile
import os
import pstats
import tempfile
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from ..common.progress import native_stderr_to_terminal
from ..common.rerun import rerun_quietly
from ..results.profile import LineTime
from ..traces import sites as ts
from ..traces.lines import line_totals
from ..traces.reading import load_trace
from .line_marks import LineMarks
from .profiling import NOT_OWN, SiteTime


def device_sites(step: Callable[[], object], *, device: torch.device,
                 own) -> tuple[dict[str, list[SiteTime]], str]:
    """Four calls of ``step`` (one training step each, its batch already fetched), the second
    recorded with Python stacks: per stage, the time of each function of the pipeline's own code
    (largest first), and why none is attributed when that is so; the fourth, line-marked, gives
    each function's lines (:func:`marked_lines`; where it raises, the functions stand and the
    note says why they have no lines)."""
    events = _second_step(step, device, "wb-stacks-", with_stack=True)
    if not ts.python_frames(events):
        return {}, ("not attributed: the profiler recorded no Python frames (this Python's "
                    "stacks are not supported by the profiler)")
    out = {}
    for stage, by_site in ts.attribute(events, own).items():
        rows = [_row(own, frame, library, tot.seconds, tot.ops, tot.device_seconds)
                for (frame, library), tot in by_site.items()]
        out[stage] = sorted(rows, key=lambda r: -(r.seconds + r.device_seconds))
    try:  # the lines are an addition: a step that fails under the marks keeps the functions
        lines = marked_lines(step, device=device, own=own)
    except Exception as exc:  # noqa: BLE001 - said in the report (a review: it lost them all)
        from ..failures import describe_exception

        return out, ("lines not resolved: the line-marked step raised "
                     f"{describe_exception(exc, 160)}")
    _add_lines(out, lines, own)
    return out, ""


def marked_lines(step: Callable[[], object], *, device: torch.device, own) -> dict:
    """Two more calls of ``step``, every torch call marked by the line of the pipeline's code
    that made it (:class:`.line_marks.LineMarks`), the second recorded (without Python stacks):
    :func:`workbook_lib.traces.lines.line_totals` of it."""
    with LineMarks(own):
        events = _second_step(step, device, "wb-lines-", record_shapes=True)
    return line_totals(events)


def _second_step(step: Callable[[], object], device: torch.device, prefix: str, *,
                 with_stack: bool = False, record_shapes: bool = False) -> list:
    """Two calls of ``step`` under ``torch.profiler``, the second recorded: its trace's events
    (the trace itself, a temporary file named ``prefix...``, deleted)."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".json")
    os.close(fd)
    try:
        with native_stderr_to_terminal(), rerun_quietly(), profile(
                activities=acts, with_stack=with_stack, record_shapes=record_shapes,
                schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
                on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
            for _ in range(2):
                step()
                prof.step()
        return load_trace(path)
    finally:
        os.unlink(path)


def _add_lines(out: dict, lines: dict, own) -> None:
    """Each function's lines, most operator time first, from ``lines`` (on its first row of each
    stage), matched by the function's file and ``def`` line (a mark names the code's first line,
    a decorator's where there is one)."""
    for stage, rows in out.items():
        by_function: dict = {}
        for (file, first), found in lines.get(stage, {}).items():
            key = (file, own.line(ts.Frame(file, first, "")))
            merged = by_function.setdefault(key, {})
            for n, t in found.items():
                m = merged.setdefault(n, ts.SiteTotals())
                m.seconds += t.seconds
                m.ops += t.ops
                m.device_seconds += t.device_seconds
                m.add_dims(list(t.dims), t.dims_op)
        done = set()
        for r in rows:  # largest first: the function's first row holds its lines
            found = by_function.get((r.file, r.line))
            if not found or (r.file, r.line) in done:
                continue
            done.add((r.file, r.line))
            top = sorted(found.items(), key=lambda kv: -(kv[1].seconds + kv[1].device_seconds))
            r.lines = [LineTime(n, _source(own, r.file, n), t.seconds, t.ops, t.device_seconds,
                                list(t.dims), t.dims_op) for n, t in top]


def _source(own, file: str, line: int) -> str:
    """Line ``line`` of ``file`` (as a trace names it), stripped; "" where it cannot be read."""
    import linecache

    path = own.resolve(file)
    return linecache.getline(str(path), line).strip() if path is not None else ""


def _row(own, frame, library, seconds: float, ops: float = 0.0,
         device_seconds: float = 0.0) -> SiteTime:
    lib = (f"{own.name(library)} ({own.display(library.file)}:{own.line(library)})"
           if library is not None else "")
    if frame is None:
        return SiteTime(NOT_OWN, "", 0, lib, seconds, ops, device_seconds)
    return SiteTime(own.name(frame), own.display(frame.file), own.line(frame), lib, seconds, ops,
                    device_seconds)


def data_sites(fetch: Callable[[], object], own) -> list[SiteTime]:
    """``fetch()`` (one batch's items and collate, in this process) under cProfile: each own
    function's time, its own and that of the library code it called (its calls into other own
    functions apart), largest first; the rest under :data:`NOT_OWN`."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        fetch()
    finally:
        prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, function) -> (cc, nc, tt, ct, callers)
    kind = {k: own(k[0]) if not k[0].startswith(("~", "<")) else "library" for k in stats}
    mine = [k for k in stats if kind[k] == "own"]
    total = sum(v[2] for v in stats.values())
    rows, held = [], 0.0
    for f in mine:
        inner = sum(stats[g][4][f][3] for g in mine if g != f and f in stats[g][4])
        seconds = max(0.0, stats[f][3] - inner)
        libs = {g: stats[g][4][f][3] for g in stats if kind[g] != "own" and f in stats[g][4]}
        top = max(libs, key=libs.get) if libs else None
        lib = (ts.Frame(top[0], top[1], top[2]) if top is not None and not top[0].startswith("~")
               and libs[top] > 0.5 * seconds else None)
        rows.append(_row(own, ts.Frame(f[0], f[1], f[2]), lib, seconds))
        held += seconds
    rows.append(_row(own, None, None, max(0.0, total - held)))
    return sorted(rows, key=lambda r: -r.seconds)
