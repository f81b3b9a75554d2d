"""Reading a Chrome trace into events, nesting them, and their exclusive (self) times, per
thread, by stage and range (see the package docstring)."""
from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ..exceptions import TraceError

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
    args: dict = field(default_factory=dict)  # the event's args (sequence numbers...)

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
        args = e.get("args")
        events.append(Event(name=str(e.get("name", "")), ts=ts, dur=dur, tid=key[1],
                            pid=key[0], cat=cat, args=args if isinstance(args, dict) else {}))
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


# ---------------------------------------------------------------------------------------------
# Two traces.


