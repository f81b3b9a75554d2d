"""Operator time by line of the pipeline's own code, from a step profiled under
:class:`workbook_lib.measurement.line_marks.LineMarks`.

An operator's time (host, and on a GPU its kernels') goes to the marked line whose range holds it;
a backward operator's to its forward operator's line (same autograd sequence number), not to a
line whose range merely encloses the whole backward (a ``loss.backward()`` in the pipeline's
code), unless that range starts inside the backward node: a custom ``autograd.Function``'s
backward, whose calls are marked at its own lines. Time that no torch call of the pipeline's
holds (its Python between calls, what the harness ran) has no line. Written here for the
reasons :mod:`workbook_lib.measurement.line_marks` gives.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict

from ..measurement.line_marks import PREFIX, parse
from .reading import GPU_CATS, Event, build_tree, main_thread, self_time
from .sites import EVALUATE, SiteTotals, _is_op, _sequence, largest_input

Function = tuple  # (file as the trace names it, its first line)


def line_totals(events: list[Event], stage_prefix: str = "wb:"
                ) -> dict[str, dict[Function, dict[int, SiteTotals]]]:
    """``{stage: {(file, first line): {line: SiteTotals}}}`` over the recorded steps.

    Args:
        events: a trace's events (:func:`~.reading.load_trace`) recorded under ``LineMarks``
            (Python stacks are not needed; with shapes, each line keeps its largest operand).
        stage_prefix: the prefix of the stage ranges, on the step's main thread.
    """
    thread = main_thread(events) or main_thread(events, step_marker=stage_prefix)
    spans = sorted((e.ts, e.end, e.name[len(stage_prefix):]) for e in events
                   if e.name.startswith(stage_prefix) and (e.pid, e.tid) == thread)
    # the marks, per thread (a GPU's custom backward runs on the engine's thread); recorded as
    # operator events, they are read as ranges and left out of the operators (their own time,
    # the mode's, is no operator's: found by a review, a line of size reads booked 600 'ops')
    marks: dict = defaultdict(list)
    for e in events:
        where = parse(e.name) if e.name.startswith(PREFIX) else None
        if where is not None:
            marks[(e.pid, e.tid)].append((e.ts, e.end, where))
    for table in marks.values():
        table.sort()

    def within(table, ts: float):
        i = bisect_right(table, (ts, float("inf"))) - 1
        return table[i] if i >= 0 and ts < table[i][1] else None

    host = [e for e in events if e.cat.lower() not in GPU_CATS and not e.is_range
            and not e.name.startswith(PREFIX)]
    engine = {(e.pid, e.tid) for e in host if e.name.startswith(EVALUATE)}
    host = [e for e in host if (e.pid, e.tid) == thread or (e.pid, e.tid) in engine]
    build_tree(host)
    where: dict[int, tuple | None] = {}  # id(event) -> (file, first, line) or None
    node_start: dict[int, float | None] = {}  # id(event) -> its backward node's start
    forward_line: dict[int, tuple] = {}
    by_external: dict = {}
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(SiteTotals)))
    for e in sorted(host, key=lambda e: (e.ts, -e.dur)):  # parents before their children
        up = where.get(id(e.parent)) if e.parent is not None else None
        node = node_start.get(id(e.parent)) if e.parent is not None else None
        if e.name.startswith(EVALUATE):
            seq = _sequence(e)
            up, node = (forward_line.get(seq) if seq is not None else None), e.ts
        else:
            m = within(marks.get((e.pid, e.tid), []), e.ts)
            if m is not None and (node is None or m[0] >= node):  # a custom backward's line
                up = m[2]
            if node is None and _is_op(e) and (e.pid, e.tid) == thread:
                seq = _sequence(e)
                outer = e.parent is not None and _is_op(e.parent) and _sequence(e.parent) == seq
                if seq is not None and not outer and up is not None:
                    forward_line[seq] = up
        where[id(e)], node_start[id(e)] = up, node
        span = within(spans, e.ts)
        if up is None or span is None:
            continue
        tot = out[span[2]][up[:2]][up[2]]
        tot.seconds += self_time(e) / 1e6
        if _is_op(e) and not (e.parent is not None and _is_op(e.parent)):
            tot.ops += 1
            tot.add_dims(largest_input(e), e.name)
        if _is_op(e) and "External id" in e.args:
            by_external[e.args["External id"]] = (span[2], up)
    for e in events:  # kernels and copies: device time, at the line that launched them
        if e.cat.lower() in GPU_CATS and e.cat.lower() != "gpu_user_annotation":
            hit = by_external.get(e.args.get("External id"))
            if hit is not None:
                out[hit[0]][hit[1][:2]][hit[1][2]].device_seconds += e.dur / 1e6
    return {st: {f: dict(lines) for f, lines in fs.items()} for st, fs in out.items()}
