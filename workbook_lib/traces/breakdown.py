"""A trace broken down per row (one CPU thread, or one GPU stream): exclusive times by range, kind
and operator inside the row's wall time (see the package docstring)."""
from __future__ import annotations

import bisect

from ..results.trace import OpTime, RowBreakdown, TraceBreakdown  # noqa: F401
from .reading import (GPU_CATS, GPU_RANGE_CATS, STEP_OPERATOR, STEP_PREFIX, Event, Trace,
                      build_tree, main_thread, range_path, self_time, union_seconds)


WALL_DEFINITION = (
    "Each event's exclusive (self) time is its duration minus its direct children's, so nested "
    "events are counted once. Wall time: on the thread that holds the ProfilerStep# ranges, the "
    "union of those steps (only time inside them is kept: the profiler's own start and stop, "
    "and Python frames around the steps, are left out and reported apart); on another CPU "
    "thread or process, the union of its top-level events; on a GPU stream, its busy time (the "
    "union of its kernels, copies and sets; the GPU-side ranges only name the kernels). Rows "
    "are never summed together: threads overlap in time.")


WALL_STEPS = "union of the ProfilerStep# spans"


WALL_TOP = "union of the thread's top-level events"


WALL_GPU = "busy time: union of the stream's kernels, copies and sets"


def _is_gpu(events: list[Event]) -> bool:
    return any(e.cat.lower() in GPU_CATS for e in events)


def _row_label(tr: Trace, pid, tid, gpu: bool, main: bool, main_pid) -> str:
    if gpu:
        dev = tr.process_names.get(pid, "")
        dev = dev if dev.upper().startswith("GPU") else f"GPU {pid}"
        return f"{dev} stream {tid}"
    name = tr.thread_names.get((pid, tid))
    base = f"thread {tid}" + (f" ({name})" if name and str(tid) not in name else "")
    if name and str(tid) in name:
        base = name
    if main:
        return f"main thread: {base}, process {pid}"
    if main_pid is not None and pid != main_pid:
        return f"process {pid} (another process, e.g. a DataLoader worker): {base}"
    return f"{base}, process {pid}"


def _ops(evs: list[Event], self_of: dict[int, float]) -> list[OpTime]:
    acc: dict[str, list] = {}
    for e in evs:  # ProfilerStep#2, #3... are one operator, so that two traces compare
        a = acc.setdefault(STEP_OPERATOR if e.is_step else e.name, [0, 0.0, 0.0])
        a[0] += 1
        a[1] += self_of[id(e)]
        anc = e.parent
        while anc is not None and anc.name != e.name:
            anc = anc.parent
        if anc is None:
            a[2] += e.dur / 1e6
    ops = [OpTime(n, c, x, i) for n, (c, x, i) in acc.items()]
    return sorted(ops, key=lambda o: (-o.exclusive_s, o.name))


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint union of ``(start, end)`` spans."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a < out[-1][1]:  # touching spans (one step after another) stay apart
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(lo: float, hi: float, window: list[tuple[float, float]], starts: list[float],
             per: dict[int, float] | None = None) -> float:
    """Length of ``[lo, hi]`` inside the disjoint sorted ``window`` (microseconds); ``per``
    (if given) accumulates it by window interval."""
    i = max(bisect.bisect_right(starts, lo) - 1, 0)
    tot = 0.0
    while i < len(window) and window[i][0] < hi:
        part = max(0.0, min(hi, window[i][1]) - max(lo, window[i][0]))
        tot += part
        if per is not None and part:
            per[i] = per.get(i, 0.0) + part
        i += 1
    return tot


def _overlaps(e: Event, window, starts) -> bool:
    """Whether ``e`` lies in the window at all (an instant-long event: its time inside it)."""
    i = max(bisect.bisect_right(starts, e.ts) - 1, 0)
    return (_overlap(e.ts, e.clipped_end, window, starts) > 0
            or window[i][0] <= e.ts <= window[i][1])


def _self_in_window(e: Event, window, starts, per: dict[int, float] | None = None) -> float:
    """``e``'s self time (its span less its direct children's) inside ``window``: a Python
    frame enclosing the steps (``with_stack=True``) or an operator that straddles a step
    boundary counts only its part inside the steps."""
    tot, cur, end = 0.0, e.ts, e.clipped_end
    for c in e.children:  # in time order (build_tree), each within its parent
        if c.ts > cur:
            tot += _overlap(cur, c.ts, window, starts, per)
        cur = max(cur, c.clipped_end)
    if end > cur:
        tot += _overlap(cur, end, window, starts, per)
    return tot


def _row(tr: Trace, key: tuple, evs: list[Event], main: bool, main_pid, depth) -> RowBreakdown:
    pid, tid = key
    gpu = _is_gpu(evs)
    roots = build_tree(evs)
    steps = [e for e in evs if e.is_step] if not gpu else []
    outside = 0.0
    if gpu:
        timed = [e for e in evs if e.cat.lower() not in GPU_RANGE_CATS]
        # kernels, copies and sets run one after another on a stream: each its whole duration
        self_of = {id(e): e.dur / 1e6 for e in timed}
        wall, rule = union_seconds([(e.ts, e.end) for e in timed]), WALL_GPU
    else:
        self_all = {id(e): self_time(e) / 1e6 for e in evs}
        if steps:
            window = _merge([(s.ts, s.end) for s in steps])
            starts = [w[0] for w in window]
            per_step = {id(e): {} for e in evs}
            self_in = {id(e): _self_in_window(e, window, starts, per_step[id(e)]) / 1e6
                       for e in evs}
            timed = [e for e in evs if _overlaps(e, window, starts)]
            outside = sum(self_all.values()) - sum(self_in.values())
            self_all = self_in
            wall, rule = union_seconds([(s.ts, s.end) for s in steps]), WALL_STEPS
        else:
            timed = evs
            wall, rule = union_seconds([(r.ts, r.end) for r in roots]), WALL_TOP
        self_of = self_all
    ranges: dict[str, float] = {}
    kinds: dict[str, float] = {}
    range_steps: dict[str, list[float]] = {}
    for e in timed:
        s = self_of[id(e)]
        k = range_path(e, depth)
        ranges[k] = ranges.get(k, 0.0) + s
        if steps:
            acc = range_steps.setdefault(k, [0.0] * len(window))
            for i, us in per_step[id(e)].items():
                acc[i] += us / 1e6
        c = e.cat or "(no cat)"
        kinds[c] = kinds.get(c, 0.0) + s
    by_size = lambda d: dict(sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))  # noqa: E731
    return RowBreakdown(
        label=_row_label(tr, pid, tid, gpu, main, main_pid), pid=str(pid), tid=str(tid),
        kind="GPU stream" if gpu else "CPU thread", main=main, wall_s=wall, wall_rule=rule,
        exclusive_s=sum(self_of[id(e)] for e in timed), events=len(timed), steps=len(steps),
        outside_steps_s=outside, ranges=by_size(ranges), kinds=by_size(kinds),
        range_steps={k: range_steps[k] for k in by_size(ranges)} if steps else {},
        operators=_ops(timed, self_of))


def breakdown(trace: Trace, *, depth: int | None = None) -> TraceBreakdown:
    """Break every thread and GPU stream of ``trace`` down by exclusive time.

    Args:
        trace: from :func:`read_trace`.
        depth: cut range paths to their outermost ``depth`` ranges (None: full paths).

    Raises:
        ValueError: ``depth`` below 1.
    """
    if depth is not None and depth < 1:
        raise ValueError(f"depth must be a positive integer (got {depth})")
    groups: dict[tuple, list[Event]] = {}
    for e in trace.events:
        groups.setdefault((e.pid, e.tid), []).append(e)
    cpu = [k for k, evs in groups.items() if not _is_gpu(evs)]
    # the GPU streams carry ProfilerStep# annotations too: the main row is a CPU thread
    main_key = main_thread([e for k in cpu for e in groups[k]], STEP_PREFIX)
    if main_key is None:
        if cpu:
            main_key = max(cpu, key=lambda k: union_seconds(
                [(r.ts, r.end) for r in build_tree(groups[k])]))
    main_pid = main_key[0] if main_key else None
    rows = [_row(trace, k, evs, k == main_key, main_pid, depth) for k, evs in groups.items()]
    rows.sort(key=lambda r: (not r.main, r.kind == "GPU stream", r.pid != str(main_pid),
                             -r.wall_s))
    main = next((r.label for r in rows if r.main), None)
    return TraceBreakdown(path=trace.path, rows=rows, main=main, depth=depth,
                          ignored=dict(sorted(trace.ignored.items())))
