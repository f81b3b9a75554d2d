"""Breaking a ``torch.profiler`` Chrome trace into exclusive times that add up.

Profiler events nest: a ``wb:forward`` range contains ``aten::linear``, which contains
``aten::addmm``... Summing every event's duration counts a parent and all its children, so
categories add up to several times the wall time (that is how a whole training step once showed
up as "optimizer 24%"). Here each event's *self* (exclusive) time - its duration minus its
direct children's - is attributed once: to its operator (the event's name), to its kind (the
trace's ``cat``: ``cpu_op``, ``user_annotation``, ``cuda_runtime``, ``kernel``...) and to its
*range*, the path of ``record_function`` ranges that enclose it (``my:forward > my:inner``).
Every thread and every GPU stream is broken down on its own, so nothing is counted twice across
threads either.

**Wall time**, per row of the trace (one CPU thread, or one GPU stream):

* a CPU thread holding ``ProfilerStep#N`` ranges (the thread that called ``prof.step()``):
  the union of those step spans; only the part of each event's self time inside the steps is
  kept (events outside every step, the profiler's own start and stop bookkeeping, and the time
  of enclosing Python frames outside the steps in a ``with_stack=True`` trace are left out and
  reported apart). The first recorded step's span also holds the end of the profiler's own
  switch to recording (a millisecond or a few); the later steps' spans match the steps' wall
  time measured outside the profiler.
* any other CPU thread (autograd's device threads, a prefetch thread, another process such as
  a DataLoader worker whose trace was merged in): the union of its top-level events;
* a GPU stream: its busy time, the union of its kernels, copies and sets. The GPU-side
  ``gpu_user_annotation`` ranges only name the kernels inside them (their own "self" time is
  the stream idling, not work).

On a CPU thread the exclusive times of the kept events add up to its wall time (every instant of
the thread's wall time belongs to exactly one innermost event); the report shows the sum and its
ratio to the wall time, so a trace where they do not (events that overlap without nesting) shows.

**What is read**: complete events (``ph: X``) and begin/end pairs (``B``/``E``, matched per
thread, innermost first), from a ``.json`` or a gzipped ``.json.gz`` file (as
``torch.profiler.tensorboard_trace_handler`` writes), in the object form
(``{"traceEvents": [...]}``) or the bare array form of the Chrome trace format. Metadata (``M``:
process and thread names, used for the labels), flow events (``s``/``t``/``f``: CPU-to-GPU
correlation and forward-backward links), instant, counter and async events are not timed work
and are counted as ignored. The profiler's own span (``cat: Trace``, ``PyTorch Profiler (0)``)
is ignored too.

**PyTorch Lightning**: ``PyTorchProfiler`` runs ``torch.profiler`` and writes the same Chrome
trace (its ``[pl][profile]...`` and ``[pl][module]...`` ranges are ``record_function`` ranges,
so they appear as ranges here); nothing Lightning-specific is needed to read it.

**DataLoader workers**: ``torch.profiler`` records the process that runs it; worker processes
appear in a trace only when it was merged from several processes (each process id is then its
own section, never summed with the main thread).

Written here rather than taken from a library: ``torch.profiler``'s own tables
(``key_averages``) need the live profiler object, not a trace file, and its ``self`` times are
per operator only; HTA (Holistic Trace Analysis) is not a dependency of this project and does not
give the per-range partition either.
"""
from __future__ import annotations

import bisect
import gzip
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from .exceptions import TraceError
from .records import Record

STAGE_PREFIX = "wb:"
UNTRACKED = "untracked (loop, Python)"
STEP_PREFIX = "ProfilerStep#"
STEP_OPERATOR = "ProfilerStep#N"
OUTSIDE = "(outside any range)"
RANGE_CATS = frozenset({"user_annotation", "gpu_user_annotation"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "memcpy",
                      "memset"})
GPU_RANGE_CATS = frozenset({"gpu_user_annotation"})
IGNORED_CATS = frozenset({"trace"})  # the profiler's own span, "PyTorch Profiler (0)"
PH_NAMES = {"M": "metadata", "s": "flow", "t": "flow", "f": "flow", "i": "instant",
            "I": "instant", "R": "instant", "C": "counter", "b": "async", "e": "async",
            "n": "async", "S": "async", "T": "async", "F": "async", "N": "object",
            "O": "object", "D": "object", "P": "sample", "c": "clock sync"}


@dataclass
class Event:
    name: str
    ts: float  # microseconds
    dur: float
    tid: object
    pid: object = 0
    cat: str = ""
    children: list = field(default_factory=list)
    parent: "Event | None" = None
    stop: float | None = None  # the end clipped to the parent's (set by build_tree)

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def clipped_end(self) -> float:
        """The end, or the enclosing event's where this one outlasts it (profiler timestamps
        are not always perfectly nested): the part beyond belongs to the parent's parent."""
        return self.end if self.stop is None else self.stop

    @property
    def is_range(self) -> bool:
        """A ``record_function`` range (CPU or GPU side), ``ProfilerStep#N`` included."""
        return self.cat.lower() in RANGE_CATS

    @property
    def is_step(self) -> bool:
        return self.name.startswith(STEP_PREFIX)


@dataclass
class Trace:
    """The timed events of one trace file, with the names its metadata gives.

    Attributes:
        path: the file read.
        events: complete events and matched begin/end pairs.
        thread_names: ``(pid, tid) -> name`` from ``thread_name`` metadata.
        process_names: ``pid -> name`` (``process_name``, plus ``process_labels`` such as
            ``GPU 0``).
        ignored: how many events of each other kind were skipped (metadata, flow, ...).
    """

    path: str
    events: list[Event]
    thread_names: dict = field(default_factory=dict)
    process_names: dict = field(default_factory=dict)
    ignored: dict[str, int] = field(default_factory=dict)


def _load_json(path: Path) -> object:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{path}: not a profiler trace (a damaged gzip file: {exc})",
                             path=str(path)) from None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0][:120]
        raise TraceError(f"{path}: not a profiler trace (not JSON: {first})",
                         path=str(path)) from None


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def read_trace(path: str | Path) -> Trace:
    """Read a Chrome trace (``.json`` or gzipped), refusing a file that is not one.

    Raises:
        TraceError: not JSON (or a damaged gzip file), JSON without a ``traceEvents`` list, or
            no timed event in it (nothing to break down).
        OSError: the file cannot be read.
    """
    p = Path(path)
    doc = _load_json(p)
    raw = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(raw, list):
        raise TraceError(f"{p}: JSON but not a profiler trace (no 'traceEvents' list; "
                         "expected a Chrome trace as torch.profiler's export_chrome_trace "
                         "writes)", path=str(p))
    events: list[Event] = []
    ignored: dict[str, int] = {}
    open_b: dict[tuple, list[dict]] = {}
    threads: dict = {}
    procs: dict = {}

    def skip(kind: str) -> None:
        ignored[kind] = ignored.get(kind, 0) + 1

    for e in raw:
        if not isinstance(e, dict):
            skip("malformed")
            continue
        ph = e.get("ph")
        if ph == "M":
            skip("metadata")
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            if e.get("name") == "thread_name" and "name" in args:
                threads[(e.get("pid"), e.get("tid"))] = str(args["name"])
            elif e.get("name") == "process_name" and "name" in args:
                procs.setdefault(e.get("pid"), str(args["name"]))
            elif e.get("name") == "process_labels" and "labels" in args:
                procs[e.get("pid")] = str(args["labels"])
            continue
        if ph not in ("X", "B", "E"):
            skip(PH_NAMES.get(ph, f"ph {ph!r}"))
            continue
        ts = _num(e.get("ts"))
        cat = str(e.get("cat") or "")
        if ts is None:
            skip("malformed")
            continue
        if cat.lower() in IGNORED_CATS:
            skip("profiler span")
            continue
        key = (e.get("pid"), e.get("tid"))
        if ph == "B":
            open_b.setdefault(key, []).append(e)
            continue
        if ph == "E":
            stack = open_b.get(key)
            if not stack:
                skip("unmatched end (E)")
                continue
            b = stack.pop()
            start = float(b["ts"])
            if ts < start:
                skip("malformed")
                continue
            events.append(Event(name=str(b.get("name", "")), ts=start, dur=ts - start,
                                tid=key[1], pid=key[0], cat=str(b.get("cat") or cat)))
            continue
        dur = _num(e.get("dur"))
        if dur is None or dur < 0:
            skip("malformed")
            continue
        events.append(Event(name=str(e.get("name", "")), ts=ts, dur=dur, tid=key[1],
                            pid=key[0], cat=cat))
    unclosed = sum(len(s) for s in open_b.values())
    if unclosed:
        ignored["unclosed begin (B)"] = unclosed
    if not events:
        raise TraceError(f"{p}: a trace with no timed events (no complete 'X' or begin/end "
                         "'B'/'E' event with a time): nothing to break down", path=str(p))
    return Trace(path=str(p), events=events, thread_names=threads, process_names=procs,
                 ignored=ignored)


def load_trace(path: str | Path) -> list[Event]:
    """The timed events of a Chrome trace file (see :func:`read_trace`)."""
    return read_trace(path).events


def build_tree(events: list[Event]) -> list[Event]:
    """Link each event to its innermost enclosing event on the same (pid, tid); return roots.

    An event that starts inside another but outlasts it is cut at its parent's end
    (``clipped_end``), so that the tree nests properly and no instant has two innermost events.
    """
    roots = []
    by_thread: dict = {}
    for e in events:
        e.children, e.parent, e.stop = [], None, None
        by_thread.setdefault((e.pid, e.tid), []).append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e.ts, -e.dur))
        stack: list[Event] = []
        for e in evs:
            while stack and stack[-1].clipped_end <= e.ts:
                stack.pop()
            if stack:
                e.parent = stack[-1]
                stack[-1].children.append(e)
                if e.end > e.parent.clipped_end:
                    e.stop = e.parent.clipped_end
            else:
                roots.append(e)
            stack.append(e)
    return roots


def self_time(e: Event, children: list[Event] | None = None) -> float:
    """Duration minus the durations of direct children (``children`` if given), each cut at
    its parent's end (see :func:`build_tree`)."""
    kids = e.children if children is None else children
    inner = sum(c.clipped_end - c.ts for c in kids)
    return max(0.0, e.clipped_end - e.ts - inner)


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` spans in microseconds, as seconds."""
    total, cur_end = 0.0, float("-inf")
    for start, end in sorted(spans):
        start = max(start, cur_end)
        if end > start:
            total += end - start
        cur_end = max(cur_end, end)
    return total / 1e6


def stage_of(e: Event) -> str | None:
    cur = e
    while cur is not None:
        if cur.name.startswith(STAGE_PREFIX):
            return cur.name[len(STAGE_PREFIX):]
        cur = cur.parent
    return None


def range_path(e: Event, depth: int | None = None) -> str:
    """The ``record_function`` ranges enclosing ``e`` (itself included), outermost first,
    ``ProfilerStep#N`` left out, joined by `` > `` and cut to ``depth`` levels; ``OUTSIDE``
    when there is none."""
    names = []
    cur: Event | None = e
    while cur is not None:
        if cur.is_range and not cur.is_step:
            names.append(cur.name)
        cur = cur.parent
    names.reverse()
    if depth is not None:
        names = names[:depth]
    return " > ".join(names) if names else OUTSIDE


def _root(e: Event) -> Event:
    while e.parent is not None:
        e = e.parent
    return e


def main_thread(events: list[Event], step_marker: str = "ProfilerStep") -> tuple | None:
    """(pid, tid) of the thread that holds the profiler step ranges (None if absent)."""
    counts: dict = {}
    for e in events:
        if e.name.startswith(step_marker):
            counts[(e.pid, e.tid)] = counts.get((e.pid, e.tid), 0) + 1
    return max(counts, key=counts.get) if counts else None


def exclusive_breakdown(events: list[Event], *, thread: tuple | None = None) -> dict[str, float]:
    """Seconds per ``wb:`` stage from self times on one thread (the main thread by default).

    Self time inside a step but outside any stage is ``UNTRACKED``. The categories add up to
    the thread's covered time exactly. (The notebooks' stages; :func:`breakdown` gives the
    general breakdown of any trace.)
    """
    thread = thread if thread is not None else main_thread(events)
    evs = [e for e in events if thread is None or (e.pid, e.tid) == thread]
    build_tree(evs)
    out: dict[str, float] = {}
    for e in evs:
        if thread is not None and not _root(e).name.startswith("ProfilerStep"):
            continue  # outside the profiled steps (profiler start/stop bookkeeping)
        cat = stage_of(e) or UNTRACKED
        out[cat] = out.get(cat, 0.0) + self_time(e) / 1e6
    return out


# CUDA runtime calls in which the host waits for the device (a host sync): what .item(),
# nonzero, boolean-mask indexing and a pageable device-to-host copy end in
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize",
                        "cudaEventSynchronize", "cudaMemcpy"})
HARNESS_SYNC = "harness:sync"  # measurement.timing's own syncs (never the measured code's)


def sync_wait_by_stage(events: list[Event]) -> dict[str, float]:
    """Seconds the host waited in CUDA sync calls (:data:`SYNC_CALLS`) inside each ``wb:``
    stage, the timer's own syncs (inside a :data:`HARNESS_SYNC` range) left out: the part of a
    stage's time that its host syncs cost on a GPU. Empty for a CPU trace (no such calls)."""
    build_tree(events)
    out: dict[str, float] = {}
    for e in events:
        if e.name not in SYNC_CALLS:
            continue
        cur, harness = e.parent, False
        while cur is not None:
            if cur.name == HARNESS_SYNC:
                harness = True
                break
            cur = cur.parent
        stage = stage_of(e)
        if harness or stage is None:
            continue
        out[stage] = out.get(stage, 0.0) + (e.clipped_end - e.ts) / 1e6
    return out


def naive_breakdown(events: list[Event]) -> dict[str, float]:
    """What summing every event's inclusive duration gives (the mistake to avoid): each
    event counted under its stage on every thread, parents and children alike."""
    build_tree(events)
    out: dict[str, float] = {}
    for e in events:
        cat = stage_of(e) or UNTRACKED
        out[cat] = out.get(cat, 0.0) + e.dur / 1e6
    return out


# ---------------------------------------------------------------------------------------------
# The general breakdown: every thread and stream, by range, kind and operator.

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


@dataclass
class OpTime(Record):
    """One operator (event name) on one row: calls, exclusive and inclusive seconds (an event
    nested in another of the same name is not counted again in the inclusive time)."""

    name: str
    calls: int
    exclusive_s: float
    inclusive_s: float


@dataclass
class RowBreakdown(Record):
    """One CPU thread or GPU stream.

    Attributes:
        label: how the report names the row.
        kind: ``CPU thread`` or ``GPU stream``.
        main: the row holding the ProfilerStep# ranges (or the busiest CPU thread).
        wall_s: wall time by ``wall_rule``.
        exclusive_s: the sum of the kept events' exclusive times (equals ``wall_s`` when the
            events nest properly).
        steps: ProfilerStep# ranges on this row.
        outside_steps_s: exclusive time of events outside every step (left out).
        ranges, kinds: exclusive seconds by range path and by the trace's ``cat``.
        range_steps: on the steps' thread, each range's exclusive seconds in each step (in
            time order; the first step's span also holds the profiler's switch to recording).
        operators: by exclusive time, largest first.
    """

    label: str
    pid: str
    tid: str
    kind: str
    main: bool
    wall_s: float
    wall_rule: str
    exclusive_s: float
    events: int
    steps: int = 0
    outside_steps_s: float = 0.0
    ranges: dict[str, float] = field(default_factory=dict)
    kinds: dict[str, float] = field(default_factory=dict)
    operators: list[OpTime] = field(default_factory=list)
    range_steps: dict[str, list[float]] = field(default_factory=dict)

    @property
    def coverage(self) -> float:
        """Exclusive times summed over the wall time (1 when they add up)."""
        return self.exclusive_s / self.wall_s if self.wall_s else float("nan")

    @property
    def per_step(self) -> int:
        """Divisor for per-step figures: the number of steps (1 without steps)."""
        return max(self.steps, 1)


@dataclass
class TraceBreakdown(Record):
    """Every row of a trace broken down by exclusive time; ``main`` is the main row's label."""

    path: str
    rows: list[RowBreakdown]
    main: str | None
    depth: int | None = None
    ignored: dict[str, int] = field(default_factory=dict)

    @property
    def main_row(self) -> RowBreakdown | None:
        return next((r for r in self.rows if r.main), None)

    @property
    def gpu_rows(self) -> list[RowBreakdown]:
        return [r for r in self.rows if r.kind == "GPU stream"]


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


# ---------------------------------------------------------------------------------------------
# Two traces.

@dataclass
class DiffRow(Record):
    """One key in two traces: seconds in A and B (per step where both have steps), B - A,
    B / A (None where A is 0)."""

    key: str
    a_s: float
    b_s: float
    delta_s: float
    ratio: float | None


@dataclass
class TraceDiff(Record):
    """B against A: the main threads' wall time, ranges, kinds and operators; GPU busy time and
    kernels over all streams where either trace has them. ``per`` says whether the figures are
    per profiled step (both traces have steps) or totals."""

    a: str
    b: str
    per: str
    a_steps: int
    b_steps: int
    rows: list[DiffRow]
    ranges: list[DiffRow]
    kinds: list[DiffRow]
    operators: list[DiffRow]
    kernels: list[DiffRow] = field(default_factory=list)


def _diff(a: dict[str, float], b: dict[str, float], da: float, db: float) -> list[DiffRow]:
    out = []
    for k in dict.fromkeys([*a, *b]):
        x, y = a.get(k, 0.0) / da, b.get(k, 0.0) / db
        out.append(DiffRow(k, x, y, y - x, y / x if x else None))
    return sorted(out, key=lambda r: (-abs(r.delta_s), r.key))


def _gpu_ops(bd: TraceBreakdown) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in bd.gpu_rows:
        for o in r.operators:
            out[o.name] = out.get(o.name, 0.0) + o.exclusive_s
    return out


def diff(a: TraceBreakdown, b: TraceBreakdown) -> TraceDiff:
    """Trace B against trace A, per profiled step when both main threads have steps (so traces
    of different lengths compare), else in total.

    Raises:
        ValueError: a trace without a CPU thread to compare.
    """
    ma, mb = a.main_row, b.main_row
    for bd, m in ((a, ma), (b, mb)):
        if m is None:
            raise ValueError(f"{bd.path}: no CPU thread to compare")
    per_step = ma.steps > 0 and mb.steps > 0
    da, db = (ma.steps, mb.steps) if per_step else (1, 1)

    def others(bd: TraceBreakdown) -> float:
        return sum(r.wall_s for r in bd.rows if not r.main and r.kind == "CPU thread")
    totals_a = {"main thread: wall time": ma.wall_s,
                "other CPU threads: wall time (summed)": others(a)}
    totals_b = {"main thread: wall time": mb.wall_s,
                "other CPU threads: wall time (summed)": others(b)}
    if a.gpu_rows or b.gpu_rows:
        totals_a["GPU streams: busy time (summed)"] = sum(r.wall_s for r in a.gpu_rows)
        totals_b["GPU streams: busy time (summed)"] = sum(r.wall_s for r in b.gpu_rows)
    rows = [DiffRow(k, totals_a[k] / da, totals_b[k] / db, totals_b[k] / db - totals_a[k] / da,
                    (totals_b[k] / db) / (totals_a[k] / da) if totals_a[k] else None)
            for k in totals_a]
    return TraceDiff(
        a=a.path, b=b.path, per="per profiled step" if per_step else "in total",
        a_steps=ma.steps, b_steps=mb.steps, rows=rows,
        ranges=_diff(ma.ranges, mb.ranges, da, db), kinds=_diff(ma.kinds, mb.kinds, da, db),
        operators=_diff({o.name: o.exclusive_s for o in ma.operators},
                        {o.name: o.exclusive_s for o in mb.operators}, da, db),
        kernels=_diff(_gpu_ops(a), _gpu_ops(b), da, db))
