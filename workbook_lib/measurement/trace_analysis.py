"""Breaking a ``torch.profiler`` Chrome trace into categories that add up.

Profiler events nest: a ``wb:forward`` range contains ``aten::linear``, which contains
``aten::addmm``... Summing every event's duration counts a parent and all its children, so
categories add up to several times the wall time (that is how a whole training step once showed
up as "optimizer 24%"). Here each event's *self* (exclusive) time - its duration minus its
direct children's - is attributed to the innermost enclosing ``wb:<stage>`` range, so the
categories partition the profiled time of the main thread.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

STAGE_PREFIX = "wb:"
UNTRACKED = "untracked (loop, Python)"


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

    @property
    def end(self) -> float:
        return self.ts + self.dur


def load_trace(path: str | Path) -> list[Event]:
    """Complete ('X') events of a Chrome trace file written by ``export_chrome_trace``."""
    with open(path) as fh:
        doc = json.load(fh)
    raw = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [Event(name=e.get("name", ""), ts=float(e["ts"]), dur=float(e.get("dur", 0.0)),
                  tid=e.get("tid"), pid=e.get("pid"), cat=e.get("cat", ""))
            for e in raw if e.get("ph") == "X" and "ts" in e]


def build_tree(events: list[Event]) -> list[Event]:
    """Link each event to its innermost enclosing event on the same (pid, tid); return roots."""
    roots = []
    by_thread: dict = {}
    for e in events:
        e.children, e.parent = [], None
        by_thread.setdefault((e.pid, e.tid), []).append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e.ts, -e.dur))
        stack: list[Event] = []
        for e in evs:
            while stack and stack[-1].end <= e.ts:
                stack.pop()
            if stack:
                e.parent = stack[-1]
                stack[-1].children.append(e)
            else:
                roots.append(e)
            stack.append(e)
    return roots


def self_time(e: Event) -> float:
    """Duration minus the (clipped) durations of direct children."""
    inner = sum(min(c.end, e.end) - c.ts for c in e.children)
    return max(0.0, e.dur - inner)


def stage_of(e: Event) -> str | None:
    cur = e
    while cur is not None:
        if cur.name.startswith(STAGE_PREFIX):
            return cur.name[len(STAGE_PREFIX):]
        cur = cur.parent
    return None


def _root(e: Event) -> Event:
    while e.parent is not None:
        e = e.parent
    return e


def main_thread(events: list[Event], step_marker: str = "ProfilerStep") -> tuple | None:
    """(pid, tid) of the thread that holds the profiler step ranges (None if absent)."""
    for e in events:
        if e.name.startswith(step_marker):
            return (e.pid, e.tid)
    return None


def exclusive_breakdown(events: list[Event], *, thread: tuple | None = None) -> dict[str, float]:
    """Seconds per category from self times on one thread (the main thread by default).

    Categories are the ``wb:`` stages; self time inside a step but outside any stage is
    ``UNTRACKED``. The categories add up to the thread's covered time exactly.
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


def naive_breakdown(events: list[Event]) -> dict[str, float]:
    """What summing every event's inclusive duration gives (the mistake to avoid): each
    event counted under its stage on every thread, parents and children alike."""
    build_tree(events)
    out: dict[str, float] = {}
    for e in events:
        cat = stage_of(e) or UNTRACKED
        out[cat] = out.get(cat, 0.0) + e.dur / 1e6
    return out


def covered_seconds(events: list[Event], *, thread: tuple | None = None) -> float:
    """Union length of the root events on one thread (seconds)."""
    thread = thread if thread is not None else main_thread(events)
    evs = [e for e in events if thread is None or (e.pid, e.tid) == thread]
    roots = build_tree(evs)
    total, cur_end = 0.0, float("-inf")
    for r in sorted(roots, key=lambda e: e.ts):
        start = max(r.ts, cur_end)
        if r.end > start:
            total += r.end - start
        cur_end = max(cur_end, r.end)
    return total / 1e6
