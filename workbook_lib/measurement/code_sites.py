"""Where a training step's time goes in the pipeline's own code, function by function.

The device-side stages: two steps under ``torch.profiler`` with Python stacks, each read by
:func:`workbook_lib.traces.sites.attribute` (a backward operator counts at its forward's
function); the traces are deleted. The data stages: two batches under :mod:`cProfile` (the
profiler's Python tracer makes a trace of hundreds of megabytes for Python-loop data code). Each
function's time is the mean of the :data:`RECORDED` steps, and each step's is kept beside it, so
that the answer calls one function ahead of another only where every recorded step puts it
there (one step alone cannot tell two close functions apart). ``own(file)`` says whose a file is
("own", "harness", "library"); ``own.name(frame)`` names a function, ``own.display(file)`` the
path shown.
"""
from __future__ import annotations

import cProfile
import functools
import os
import pstats
import tempfile
from typing import Callable, Sequence

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

RECORDED = 2  # steps recorded with stacks (and batches under cProfile) per pipeline
# the step calls device_sites makes: each recorded step after a warm-up call, then two
# line-marked calls (the caller fetches this many batches)
DEVICE_SITE_CALLS = 2 * RECORDED + 2


def device_sites(step: Callable[[], object], *, device: torch.device,
                 own) -> tuple[dict[str, list[SiteTime]], str]:
    """:data:`DEVICE_SITE_CALLS` calls of ``step`` (one training step each, its batch already
    fetched), :data:`RECORDED` of them recorded with Python stacks (each after an unrecorded
    one): per stage, the time of each function of the pipeline's own code (largest mean first,
    each recorded step's kept), and why none is attributed when that is so; the last call,
    line-marked, gives each function's lines (:func:`marked_lines`; where it raises, the
    functions stand and the note says why they have no lines)."""
    # a step whose trace holds no Python frame is left out (it would book every function 0)
    recorded = [events for events in _recorded_steps(step, device, "wb-stacks-", with_stack=True)
                if ts.python_frames(events)]
    if not recorded:
        return {}, ("not attributed: the profiler recorded no Python frames (this Python's "
                    "stacks are not supported by the profiler)")
    called: dict = {}  # {stage: {frame: {caller: seconds}}}, summed over the recorded steps
    per_step = [_fold_sites(ts.attribute(events, own, callers=called), own)
                for events in recorded]
    called = {stage: _fold_keys(by, own, _add_pair) for stage, by in called.items()}
    out = {}
    for stage in dict.fromkeys(st for by_stage in per_step for st in by_stage):
        keys = dict.fromkeys(k for by_stage in per_step for k in by_stage.get(stage, {}))
        rows = []
        for frame, library in keys:
            tots = [by_stage.get(stage, {}).get((frame, library), ts.SiteTotals())
                    for by_stage in per_step]
            rows.append(_row(own, frame, library, [t.seconds for t in tots],
                             [t.ops for t in tots], [t.device_seconds for t in tots],
                             _timed(called.get(stage, {}).get(frame, {}))))
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
    """Two calls of ``step`` under ``torch.profiler``, the second recorded: its trace's events."""
    return _recorded_steps(step, device, prefix, with_stack=with_stack,
                           record_shapes=record_shapes, recorded=1)[0]


def _recorded_steps(step: Callable[[], object], device: torch.device, prefix: str, *,
                    with_stack: bool = False, record_shapes: bool = False,
                    recorded: int = RECORDED) -> list[list]:
    """``2 * recorded`` calls of ``step`` under ``torch.profiler``, every second one recorded
    (the one before it warms the profiler up): each recorded call's trace events (the traces,
    temporary files named ``prefix...``, deleted)."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    paths: list[str] = []

    def ready(p) -> None:
        fd, path = tempfile.mkstemp(prefix=prefix, suffix=".json")
        os.close(fd)
        paths.append(path)
        p.export_chrome_trace(path)

    try:
        with native_stderr_to_terminal(), rerun_quietly(), profile(
                activities=acts, with_stack=with_stack, record_shapes=record_shapes,
                schedule=schedule(wait=0, warmup=1, active=1, repeat=recorded),
                on_trace_ready=ready) as prof:
            for _ in range(2 * recorded):
                step()
                prof.step()
        return [load_trace(path) for path in paths]
    finally:
        for path in paths:
            os.unlink(path)


def _add_lines(out: dict, lines: dict, own) -> None:
    """Each function's lines, most operator time first, from ``lines`` (on its first row of each
    stage), matched by the function's file and ``def`` line (a mark names the code's first line,
    a decorator's where there is one)."""
    for stage, rows in out.items():
        by_function: dict = {}
        for (file, first), found in lines.get(stage, {}).items():
            key = (file, own.def_line(file, first))  # a comprehension's: its function's
            merged = by_function.setdefault(key, {})
            for n, t in found.items():
                merged.setdefault(n, ts.SiteTotals()).add(t)
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


MOST_CALLERS = 3  # callers kept per function, the most time first


def _fold(own, frame):
    """The frame a row is kept under: a comprehension's or lambda's (``f.<locals>.<genexpr>``)
    the function that holds it (a user trial: a helper's generator expression was a row of its
    own, its time counted in the helper's too), every one at its ``def`` line (a decorated
    function's code starts at its decorator); None as it is."""
    if frame is None:
        return None
    f = own.enclosing(frame)
    return ts.Frame(f.file, own.line(f), f.function)


def _fold_keys(by: dict, own, add) -> dict:
    """``{frame: value}`` re-keyed by :func:`_fold`, the values of one key merged by ``add(a,
    b)`` (``a`` None for the first)."""
    out: dict = {}
    for frame, value in by.items():
        key = _fold(own, frame)
        out[key] = add(out.get(key), value)
    return out


def _add_pair(a: dict | None, b: dict) -> dict:
    """Two ``{caller: [host seconds, device seconds]}`` summed."""
    out = {k: list(v) for k, v in (a or {}).items()}
    for k, (h, d) in b.items():
        m = out.setdefault(k, [0.0, 0.0])
        m[0] += h
        m[1] += d
    return out


def _fold_sites(by_stage: dict, own) -> dict:
    """:func:`workbook_lib.traces.sites.attribute`'s sites with each frame folded
    (:func:`_fold`) and the totals of one site merged."""
    out: dict = {}
    for stage, sites in by_stage.items():
        merged = out.setdefault(stage, {})
        for (frame, lib), t in sites.items():
            merged.setdefault((_fold(own, frame), lib), ts.SiteTotals()).add(t)
    return out


def _timed(by: dict) -> dict:
    """``{caller: [host seconds, device seconds]}`` -> ``{caller: seconds}``: the device's
    where the function's work ran any kernel (a GPU step, as its row is ranked there), else the
    host's."""
    dev = any(d for _h, d in by.values())
    return {f: (d if dev else h) for f, (h, d) in by.items()}


def _label(own, frame) -> str:
    return f"{own.name(frame)} ({own.display(frame.file)}:{own.line(frame)})"


def _callers(own, frame, by: dict) -> tuple[list[str], list[float]]:
    """The own functions that called ``frame``'s function, the most time first (at most
    :data:`MOST_CALLERS`), each with its share of all its time, from ``{caller frame or None (no
    own function: the loop, a library): seconds}``. A comprehension or lambda counts as the
    function that holds it (:meth:`OwnCode.enclosing`: ``sum(f(x) for x in xs)`` in ``g`` is a
    call from ``g``); a call from itself (recursion) counts in neither the callers nor the
    whole; ([], []) where no own function called it."""
    me = _label(own, frame)
    sums: dict[str, float] = {}
    total = 0.0
    for f, sec in by.items():
        name = _label(own, own.enclosing(f)) if f is not None else None
        if name == me:
            continue
        total += sec
        if name is not None:
            sums[name] = sums.get(name, 0.0) + sec
    top = sorted((n for n in sums if sums[n] > 0), key=lambda n: -sums[n])[:MOST_CALLERS]
    if total <= 0 or not top:
        return [], []
    return top, [sums[n] / total for n in top]


def _row(own, frame, library, seconds: Sequence[float], ops: Sequence[float] = (),
         device_seconds: Sequence[float] = (), callers: dict | None = None) -> SiteTime:
    """A site's row: its mean per recorded step, each step's figures kept (``seconds`` has one
    item per recorded step; ``ops`` and ``device_seconds`` as many, or none), and the own
    functions that called it, from ``callers`` (:func:`_callers`)."""
    n = len(seconds)
    ops = list(ops) or [0.0] * n
    dev = list(device_seconds) or [0.0] * n
    lib = _label(own, library) if library is not None else ""
    mean = (sum(seconds) / n, sum(ops) / n, sum(dev) / n)
    steps = {"step_seconds": list(seconds), "step_device_seconds": dev}
    if frame is None:
        return SiteTime(NOT_OWN, "", 0, lib, *mean, **steps)
    steps["callers"], steps["caller_shares"] = _callers(own, frame, callers or {})
    return SiteTime(own.name(frame), own.display(frame.file), own.line(frame), lib, *mean,
                    **steps)


def data_sites(fetches: Sequence[Callable[[], object]], own) -> list[SiteTime]:
    """Each of ``fetches`` (a batch's items, or its collate; one per recorded batch, in this
    process) under its own cProfile: each own function's time, its own and that of the library
    code it called (its calls into other own functions apart), largest mean first, each
    batch's kept, with the library callee that holds more than half of it over all of them
    (if one does); the rest under :data:`NOT_OWN`."""
    per_call = [_fold_keys(_profiled(fetch, own), own, _add_profiled) for fetch in fetches]
    rows = []
    for frame in dict.fromkeys(f for by_frame in per_call for f in by_frame):
        seconds = [by_frame[frame][0] if frame in by_frame else 0.0 for by_frame in per_call]
        _, libs, callers = functools.reduce(
            _add_profiled, [by_frame[frame] for by_frame in per_call if frame in by_frame], None)
        top = max(libs, key=libs.get) if libs else None
        lib = (top if top is not None and not top.file.startswith("~")
               and libs[top] > 0.5 * sum(seconds) else None)
        rows.append(_row(own, frame, lib, seconds, callers=callers))
    return sorted(rows, key=lambda r: -r.seconds)


def _add_profiled(a: tuple | None, b: tuple) -> tuple:
    """Two of :func:`_profiled`'s ``(seconds, {library: seconds}, {caller: seconds})`` summed."""
    if a is None:
        return b[0], dict(b[1]), dict(b[2])
    libs, callers = dict(a[1]), dict(a[2])
    for k, v in b[1].items():
        libs[k] = libs.get(k, 0.0) + v
    for k, v in b[2].items():
        callers[k] = callers.get(k, 0.0) + v
    return a[0] + b[0], libs, callers


def _profiled(fetch: Callable[[], object], own) -> dict:
    """``fetch()`` under cProfile: ``{frame or None: (seconds, {library frame: seconds},
    {caller: seconds})}``: each own function's time, its own lines' (``tt``) and that of the
    library code under it, each library function's lines' time going up its callers, in
    proportion to their time in it, to the first own function (None: none); the library frame
    it called that holds that time; and its time by caller (None: nothing of the pipeline's
    called it). Every second is counted once: a user trial's ``sorted(key=f)`` and
    ``sum(genexpr)`` had counted ``f``'s time in its caller's too, 50/50 for a function that
    did nearly nothing.

    cProfile keeps each function's time by its direct caller only. A call through library code
    (``sorted(key=f)``, ``map(f, ...)``) is put to the own functions that called that code, in
    proportion to their time in it. A function that calls other own functions (not its own
    comprehensions) has its callers' split of its own lines' time (``tt``: its cumulative time
    by caller holds its callees' time too, and those are not split by its caller). Callers
    that it reaches itself (recursion, direct or through others) are left out: their time is
    already inside the outer call's."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        fetch()
    finally:
        prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, function) -> (cc, nc, tt, ct, callers)
    kind = {k: own(k[0]) if not k[0].startswith(("~", "<")) else "library" for k in stats}
    mine = [k for k in stats if kind[k] == "own"]
    callees: dict = {}
    for g, v in stats.items():
        for c in v[4]:
            callees.setdefault(c, []).append(g)
    seconds = {f: stats[f][2] for f in mine}
    libs: dict = {f: {} for f in mine}
    rest = 0.0  # library time under no own function
    up = _up_to_own(stats, kind)
    for g in stats:
        if kind[g] == "own" or stats[g][2] <= 0:
            continue
        for (f, below), share in up(g).items():
            part = stats[g][2] * share
            if f is None:
                rest += part
                continue
            seconds[f] += part
            key = ts.Frame(below[0], below[1], below[2])
            libs[f][key] = libs[f].get(key, 0.0) + part
    out: dict = {}
    for f in mine:
        me = _fold(own, ts.Frame(f[0], f[1], f[2]))
        # the own functions it calls, directly or through library code
        below = _reached(callees, f, through=lambda g: kind.get(g) != "own")
        others = any(_fold(own, ts.Frame(g[0], g[1], g[2])) != me
                     for g in below if kind.get(g) == "own")
        out[ts.Frame(f[0], f[1], f[2])] = (seconds[f], libs[f],
                                           _by_caller(stats, kind, f, callees, up,
                                                      own_lines=others))
    out[None] = (rest, {}, {})
    return out


def _up_to_own(stats: dict, kind: dict) -> Callable:
    """``up(g)``: where library function ``g``'s time goes, given up its callers in proportion
    to their cumulative time in it until an own function: ``{(own function or None, the library
    function it called): fraction}`` (None: no caller, or a cycle of library calls). Memoized:
    a library function reached from many places is walked once."""
    memo: dict = {}
    busy: set = set()

    def up(g) -> dict:
        if g in memo:
            return memo[g]
        ups = {c: v[3] for c, v in stats[g][4].items()}
        whole = sum(ups.values())
        if whole <= 0 or g in busy:
            return {(None, g): 1.0}
        busy.add(g)
        out: dict = {}
        for c, t in ups.items():
            w = t / whole
            if kind.get(c) == "own":
                out[(c, g)] = out.get((c, g), 0.0) + w
            elif c in stats:
                for key, x in up(c).items():
                    out[key] = out.get(key, 0.0) + w * x
            else:
                out[(None, g)] = out.get((None, g), 0.0) + w
        busy.discard(g)
        memo[g] = out
        return out
    return up


def _by_caller(stats: dict, kind: dict, f, callees: dict, up: Callable, *,
               own_lines: bool) -> dict:
    """``f``'s time by the own function that called it (None: none did), its callers'
    cumulative time in it (their ``tt``, its own lines' time, where ``own_lines``); a library
    caller's share passed up to the own functions that called it by ``up``
    (:func:`_up_to_own`), less those ``f`` reaches itself (recursion through library code)."""
    reached = _reached(callees, f)
    out: dict = {}
    for g, (_nc, _cc, tt, ct) in stats[f][4].items():
        if g in reached:  # recursion: already inside the outer call's time
            continue
        seconds = tt if own_lines else ct
        shares: dict = {}
        for (c, _below), x in ({(g, None): 1.0} if kind.get(g) == "own" else up(g)).items():
            if c not in reached:
                shares[c] = shares.get(c, 0.0) + x
        whole = sum(shares.values())
        if whole <= 0:
            shares, whole = {None: 1.0}, 1.0
        for c, x in shares.items():
            key = ts.Frame(c[0], c[1], c[2]) if c is not None else None
            out[key] = out.get(key, 0.0) + seconds * x / whole
    return out


def _reached(callees: dict, f, through: Callable = lambda g: True) -> set:
    """The functions ``f`` calls, directly or through others for which ``through(g)`` (``f``
    among them where it recurses), from ``{function: [its callees]}``: with every one, those
    that call ``f`` back are recursion."""
    seen, todo = set(), [f]
    while todo:
        for g in callees.get(todo.pop(), ()):
            if g not in seen:
                seen.add(g)
                if through(g):
                    todo.append(g)
    return seen
