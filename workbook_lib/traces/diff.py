"""Two traces' breakdowns side by side: what each range, kind and operator costs in one and the
other (the ``trace A B`` command)."""
from __future__ import annotations

from ..results.trace import DiffRow, TraceBreakdown, TraceDiff


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
