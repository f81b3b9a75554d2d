"""The page of ``python -m workbook_lib trace``: a profiler trace broken down by exclusive time,
one section per row of the trace (main thread, other threads and processes, GPU streams), and
for two traces the difference tables.
"""
from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from ..traces import OUTSIDE, WALL_DEFINITION, DiffRow, RowBreakdown, TraceBreakdown, TraceDiff
from ..common.files import atomic_write_text
from ..results.stat import Stat
from .pages import markup, render
from .tables import FOOTNOTE, IMPRECISE, fmt_pct, fmt_ratio, fmt_seconds, fmt_time_stat

WALL_NOTE = html.escape(WALL_DEFINITION).replace("ProfilerStep#", "<code>ProfilerStep#</code>")


def _esc(s: object) -> str:
    return html.escape(str(s))


def _table(head: list[str], rows: list[list[str]]) -> dict:
    """A table for the template's ``table`` macro: cells are text (escaped there) or markup."""
    return {"head": head, "rows": rows}


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


def _row_section(row: RowBreakdown, top: int) -> dict:
    d = row.per_step
    add = (f"exclusive times add up to {fmt_seconds(row.exclusive_s)} = "
           f"{fmt_pct(row.coverage)} of the wall time")
    outside = (f"; {fmt_seconds(row.outside_steps_s)} of events outside every step left out"
               if row.outside_steps_s else "")
    steps = f", {row.steps} ProfilerStep# ranges" if row.steps else ""
    head = (f"Wall time {fmt_seconds(row.wall_s)} ({row.wall_rule}{steps}); {add}"
            f"{outside}. {row.events} events.")
    spread = bool(row.range_steps)

    def share(v: float) -> str:
        return fmt_pct(v / row.wall_s if row.wall_s else float("nan"))
    ranges = _table(["range (outermost > innermost)", f"exclusive, {_per(row)} (mean)",
                     "share of wall time"] + (["each step: median (IQR, n)"] if spread else []),
                    [[k if k != OUTSIDE else markup(f"<i>{_esc(k)}</i>"), fmt_seconds(v / d),
                      share(v)] +
                     ([fmt_time_stat(Stat.from_samples(row.range_steps[k]))] if spread else [])
                     for k, v in row.ranges.items()])
    kinds = _table(["kind (the trace's cat)", f"exclusive, {_per(row)}", "share"],
                   [[k, fmt_seconds(v / d), share(v)] for k, v in row.kinds.items()])
    ops = row.operators[:top]
    optab = _table(["operator", f"calls {_per(row)}", f"exclusive, {_per(row)}",
                    f"inclusive, {_per(row)}", "exclusive share"],
                   [[markup(f"<code>{_esc(o.name)}</code>"), f"{o.calls / d:.3g}",
                     fmt_seconds(o.exclusive_s / d), fmt_seconds(o.inclusive_s / d),
                     share(o.exclusive_s)] for o in ops])
    return {"label": row.label, "head": head, "ranges": ranges, "kinds": kinds, "ops": optab,
            "noisy": any(IMPRECISE in c for r in ranges["rows"] for c in r),
            "more": max(len(row.operators) - top, 0)}


def _diff_table(title: str, rows: list[DiffRow], names: list[str], top: int | None) -> dict:
    shown = rows if top is None else rows[:top]

    def cls(r: DiffRow) -> str:
        return "more" if r.delta_s > 0 else ("less" if r.delta_s < 0 else "")
    body = [[r.key, fmt_seconds(r.a_s), fmt_seconds(r.b_s),
             markup(f"<span class='{cls(r)}'>{'+' if r.delta_s > 0 else ''}"
                    f"{_esc(fmt_seconds(r.delta_s))}</span>"),
             "new" if r.ratio is None and r.b_s else ("gone" if r.ratio == 0 else
                                                     fmt_ratio(r.ratio))] for r in shown]
    return {"title": title, **_table(["", names[0], names[1], f"{names[1]} - {names[0]}",
                                      f"{names[1]} / {names[0]}"], body),
            "more": len(rows) - len(shown)}


def page(bds: list[TraceBreakdown], names: list[str], dif: TraceDiff | None = None, *,
         top: int = 25) -> str:
    """The HTML page of one or two traces' breakdowns ``bds`` (named ``names``) and their
    difference ``dif``, ``top`` operators per table (template ``trace.html.j2``).
    """
    png, alt = _figure(bds, names)
    traces = [{"name": name, "path": str(bd.path), "depth": bd.depth,
               "ignored": ", ".join(f"{n} {k}" for k, n in bd.ignored.items()) or "none",
               "sections": [_row_section(r, top) for r in bd.rows]}
              for bd, name in zip(bds, names)]
    diff = None
    if dif is not None:
        tables = [_diff_table("Wall and busy times", dif.rows, names, None),
                  _diff_table("By range", dif.ranges, names, top),
                  _diff_table("By kind", dif.kinds, names, None),
                  _diff_table("By operator", dif.operators, names, top)]
        if dif.kernels:
            tables.append(_diff_table("GPU kernels, copies and sets (all streams)",
                                      dif.kernels, names, top))
        diff = {"per": dif.per, "a_steps": dif.a_steps, "b_steps": dif.b_steps,
                "tables": tables}
    return render("trace.html.j2", title=" vs ".join(names), wall_note=markup(WALL_NOTE),
                  png=png, alt=alt, diff=diff, traces=traces, names=names, footnote=FOOTNOTE)


def write_report(bds: list[TraceBreakdown], names: list[str], dif: TraceDiff | None,
                 out: Path, *, top: int = 25) -> tuple[Path, Path]:
    """Write ``out``.html (:func:`page`) and ``out``.json (every breakdown, the difference and what
    wall time means); returns their paths. ``bds``, ``names``, ``dif``, ``top``: as for :func:`page`.
    """
    doc = {"traces": [b.to_json() for b in bds], "diff": dif.to_json() if dif else None,
           "wall_time": WALL_DEFINITION}
    html_path, json_path = Path(f"{out}.html"), Path(f"{out}.json")
    atomic_write_text(json_path, json.dumps(doc, indent=1))
    atomic_write_text(html_path, page(bds, names, dif, top=top))
    return html_path, json_path


def summary_lines(bds: list[TraceBreakdown], names: list[str],
                  dif: TraceDiff | None = None) -> list[str]:
    """The terminal's summary of ``trace``: per trace (``bds``, ``names``), each row's wall time,
    its coverage by exclusive times and the main row's five largest ranges; with a difference
    ``dif``, its total and five largest ranges.
    """
    lines = []
    for bd, name in zip(bds, names):
        lines.append(name)
        for r in bd.rows:
            per = f"{r.steps} steps" if r.steps else "no steps"
            lines.append(f"  {r.label[:70]:70s} wall {r.wall_s * 1e3:10.3f} ms ({per}); "
                         f"exclusive times add up to {r.coverage:.1%}")
            for k, v in list(r.ranges.items())[:5] if r.main else []:
                lines.append(f"    {v / r.per_step * 1e3:10.3f} ms"
                             f"{'/step' if r.steps else ''}  {k[:80]}")
    if dif is not None:
        lines.append(f"{names[1]} against {names[0]} ({dif.per}):")
        lines += [f"  {r.delta_s * 1e3:+10.3f} ms  {r.key[:80]}"
                  for r in dif.rows[:1] + dif.ranges[:5]]
    return lines
