"""The page of ``python -m workbook_lib trace``: a profiler trace broken down by exclusive time.

One figure (the main thread's ranges, per profiled step; both traces side by side when two are
given), then a section per row of the trace (the main thread first, then other threads and
processes, then GPU streams), each with its wall time and what its exclusive times add up to,
its ranges, kinds and top operators; then, for two traces, the difference tables.
"""
from __future__ import annotations

import base64
import html
import io

from ..measurement.trace_analysis import OUTSIDE, WALL_DEFINITION, DiffRow, RowBreakdown, \
    TraceBreakdown, TraceDiff
from ..measurement.timing import Stat
from .tables import FOOTNOTE, IMPRECISE, fmt_pct, fmt_ratio, fmt_seconds, fmt_time_stat

CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;color:#222}
td,th{border-bottom:1px solid #ddd;padding:4px 8px;vertical-align:top;text-align:left}
th{background:#f4f4f4} td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:90%} small{color:#666} .note{background:#f3f8fc;border-left:4px solid #3b7dbf;
padding:.5em 1em} .warn{background:#fcf3e3;border-left:4px solid #c98a1a;padding:.5em 1em}
.more{color:#a11} .less{color:#176d17} section{margin-top:2em}"""

WALL_NOTE = html.escape(WALL_DEFINITION).replace("ProfilerStep#", "<code>ProfilerStep#</code>")


def _esc(s: object) -> str:
    return html.escape(str(s))


def _table(head: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    th = "".join(f"<th>{_esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(
        f"<td class='n'>{c}</td>" if i >= numeric_from else f"<td>{c}</td>"
        for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _per(row: RowBreakdown) -> str:
    return "per step" if row.steps else "in total"


def _figure(bds: list[TraceBreakdown], names: list[str], top: int = 12) -> tuple[str, str]:
    """(base64 PNG, alt text) of the main threads' ranges, per step, largest first."""
    import numpy as np

    from . import plotting
    from .plotting import plt

    plotting.setup()
    mains = [b.main_row for b in bds]
    both = all(m.steps for m in mains)
    divs = [m.per_step if both else 1 for m in mains]  # per step only where every trace has
    keys: list[str] = []
    for m in mains:
        keys += [k for k in m.ranges if k not in keys]
    keys.sort(key=lambda k: -max(m.ranges.get(k, 0.0) / d for m, d in zip(mains, divs)))
    shown, rest = keys[:top], keys[top:]
    vals = [[m.ranges.get(k, 0.0) / d * 1e3 for k in shown] +
            ([sum(m.ranges.get(k, 0.0) for k in rest) / d * 1e3] if rest else [])
            for m, d in zip(mains, divs)]
    labels = [k if len(k) <= 60 else k[:29] + "…" + k[-30:] for k in shown] + \
        ([f"{len(rest)} other ranges"] if rest else [])
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(labels) * len(mains) + 1.6))
    y = np.arange(len(labels))
    h = 0.8 / len(mains)
    for i, (v, n) in enumerate(zip(vals, names)):
        ax.barh(y + (i - (len(mains) - 1) / 2) * h, v, height=h, label=n,
                color=plotting.PALETTE[i])
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    positive = [x for v in vals for x in v if x > 0] or [1.0]
    per = "per profiled step (mean)" if both else "in total"
    plotting.value_axis(ax, positive, f"exclusive time, ms {per}")
    if len(mains) > 1:
        ax.legend()
    plotting.title(ax, "Main thread: exclusive time by record_function range",
                   sizes=" vs ".join(f"{n}: {m.steps} steps" if m.steps else f"{n}: no steps"
                                     for n, m in zip(names, mains)),
                   repeats="nested events counted once")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    alt = "; ".join(f"{n}: " + ", ".join(f"{lab} {x:.3g} ms" for lab, x in zip(labels, v))
                    for n, v in zip(names, vals))
    return base64.b64encode(buf.getvalue()).decode("ascii"), f"Exclusive time {per}: {alt}"


def _row_section(row: RowBreakdown, top: int) -> str:
    d = row.per_step
    add = (f"exclusive times add up to {fmt_seconds(row.exclusive_s)} = "
           f"{fmt_pct(row.coverage)} of the wall time")
    outside = (f"; {fmt_seconds(row.outside_steps_s)} of events outside every step left out"
               if row.outside_steps_s else "")
    steps = f", {row.steps} ProfilerStep# ranges" if row.steps else ""
    head = (f"<p>Wall time {fmt_seconds(row.wall_s)} ({_esc(row.wall_rule)}{steps}); {add}"
            f"{outside}. {row.events} events.</p>")
    spread = bool(row.range_steps)
    ranges = _table(["range (outermost > innermost)", f"exclusive, {_per(row)} (mean)",
                     "share of wall time"] +
                    (["each step: median (IQR, n)"] if spread else []),
                    [[_esc(k) if k != OUTSIDE else f"<i>{_esc(k)}</i>", fmt_seconds(v / d),
                      fmt_pct(v / row.wall_s if row.wall_s else float("nan"))] +
                     ([fmt_time_stat(Stat.from_samples(row.range_steps[k]))] if spread else [])
                     for k, v in row.ranges.items()])
    if IMPRECISE in ranges:
        ranges += (f"<p><small>{_esc(FOOTNOTE)} Here the steps are what the trace recorded, "
                   "not repeats chosen for a precision target.</small></p>")
    kinds = _table(["kind (the trace's cat)", f"exclusive, {_per(row)}", "share"],
                   [[_esc(k), fmt_seconds(v / d),
                     fmt_pct(v / row.wall_s if row.wall_s else float("nan"))]
                    for k, v in row.kinds.items()])
    ops = row.operators[:top]
    more = (f"<p><small>{len(row.operators) - top} more operators in the JSON.</small></p>"
            if len(row.operators) > top else "")
    optab = _table(["operator", f"calls {_per(row)}", f"exclusive, {_per(row)}",
                    f"inclusive, {_per(row)}", "exclusive share"],
                   [[f"<code>{_esc(o.name)}</code>", f"{o.calls / d:.3g}",
                     fmt_seconds(o.exclusive_s / d), fmt_seconds(o.inclusive_s / d),
                     fmt_pct(o.exclusive_s / row.wall_s if row.wall_s else float("nan"))]
                    for o in ops])
    return (f"<section><h3>{_esc(row.label)}</h3>{head}<h4>By range</h4>{ranges}"
            f"<h4>By kind</h4>{kinds}<h4>Top {len(ops)} operators by exclusive time</h4>"
            f"<p><small>Inclusive time counts an operator once where it nests in itself."
            f"</small></p>{optab}{more}</section>")


def _diff_table(title: str, rows: list[DiffRow], names: list[str], top: int | None) -> str:
    shown = rows if top is None else rows[:top]

    def cls(r: DiffRow) -> str:
        return "more" if r.delta_s > 0 else ("less" if r.delta_s < 0 else "")
    body = [[_esc(r.key), fmt_seconds(r.a_s), fmt_seconds(r.b_s),
             f"<span class='{cls(r)}'>{'+' if r.delta_s > 0 else ''}"
             f"{fmt_seconds(r.delta_s)}</span>",
             "new" if r.ratio is None and r.b_s else ("gone" if r.ratio == 0 else
                                                     fmt_ratio(r.ratio))] for r in shown]
    more = (f"<p><small>{len(rows) - len(shown)} more in the JSON.</small></p>"
            if len(rows) > len(shown) else "")
    return (f"<h3>{_esc(title)}</h3>" +
            _table(["", names[0], names[1], f"{names[1]} - {names[0]}",
                    f"{names[1]} / {names[0]}"], body) + more)


def page(bds: list[TraceBreakdown], names: list[str], dif: TraceDiff | None = None, *,
         top: int = 25) -> str:
    """The HTML page of one trace's breakdown, or two traces' and their difference.

    Args:
        bds: one or two breakdowns.
        names: how each trace is named on the page (its file name).
        dif: the difference (B against A) when two traces are given.
        top: operators shown per table (every one is in the JSON).
    """
    png, alt = _figure(bds, names)
    parts = []
    for bd, name in zip(bds, names):
        ignored = ", ".join(f"{n} {k}" for k, n in bd.ignored.items()) or "none"
        depth = f" Range paths cut to {bd.depth} level(s)." if bd.depth else ""
        parts.append(f"<h2>{_esc(name)}</h2><p><code>{_esc(bd.path)}</code>: {len(bd.rows)} "
                     f"row(s). Events not timed and skipped: {_esc(ignored)}.{depth}</p>")
        parts += [_row_section(r, top) for r in bd.rows]
    if dif is not None:
        d = [f"<h2>{_esc(names[1])} against {_esc(names[0])}</h2><p>Figures {dif.per} "
             f"({names[0]}: {dif.a_steps} steps, {names[1]}: {dif.b_steps} steps), largest "
             "change first; the ranges, kinds and operators are the main threads'.</p>",
             _diff_table("Wall and busy times", dif.rows, names, None),
             _diff_table("By range", dif.ranges, names, top),
             _diff_table("By kind", dif.kinds, names, None),
             _diff_table("By operator", dif.operators, names, top)]
        if dif.kernels:
            d.append(_diff_table("GPU kernels, copies and sets (all streams)", dif.kernels,
                                 names, top))
        parts.insert(0, "<section>" + "".join(d) + "</section>")
    title = " vs ".join(names)
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Trace breakdown: {_esc(title)}</title><style>{CSS}</style></head><body>
<h1>Where the profiled time went: {_esc(title)}</h1>
<p class="note">{WALL_NOTE}</p>
<img src="data:image/png;base64,{png}" alt="{_esc(alt)}">
{''.join(parts)}</body></html>"""
