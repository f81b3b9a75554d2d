"""Comparing run folders: the headline figures of two or more runs side by side.

Each row is one headline figure (:mod:`workbook_lib.analysis.headlines`) with its unit and noise
in every run, and each run after the first against the first: the ratio, and whether that is
better or worse for that figure (lower is better for a time, higher for a speedup) only when the two figures' noise bands do not
overlap (interquartile ranges, or two standard errors of a fitted coefficient; exact figures
compare exactly), otherwise "within noise". A negative fitted coefficient has no direction. Runs
made on different snapshots are refused unless forced: their numbers do not compare; runs of the
same snapshot at different scales compare (the page says so: absolute figures move with size).
A figure measured while the process got less than 80% of the CPU its threads asked for (another
job on the same CPUs: :mod:`workbook_lib.measurement.cpu`) is marked contended and not compared:
a steady disturbance keeps its IQR small, so its noise band would not cover the error.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from ..exceptions import RunComparisonError
from ..running.results import read_meta
from .headlines import FITTED, Figure, headline_figures


def _checksums(run: Path) -> set[str]:
    out = set()
    for f in run.glob("[0-9][0-9]_*.json"):
        meta = read_meta(run, f.stem)
        if meta and meta.snapshot_checksum:
            out.add(meta.snapshot_checksum)
    return out


def _params(run: Path) -> dict:
    env = {}
    if (run / "environment.json").is_file():
        try:
            env = json.loads((run / "environment.json").read_text())
        except ValueError:
            env = {}
    return env.get("params", {}) or {}


def same_snapshot_other_scale(params: list[dict]) -> bool:
    """True when the runs name the same snapshot and seed and differ only in scale (their
    graphs' checksums differ because the scale does)."""
    keys = {(p.get("snapshot"), p.get("seed")) for p in params}
    return len(keys) == 1 and None not in next(iter(keys)) and \
        len({p.get("scale") for p in params}) > 1


def fmt_value(v: float) -> str:
    """A figure's value: counts with thousands separators, others to 4 significant digits."""
    if float(v).is_integer() and abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def _cell(f: Figure | None) -> str:
    if f is None:
        return "—"
    if f.text is not None:
        return html.escape(f.text)
    if f.value is None:
        return "n/a"
    unit = f" {f.unit}" if f.unit and f.unit != "x" else ("x" if f.unit == "x" else "")
    noise = f" <small>(IQR {f.iqr:.2g})</small>" if f.iqr is not None else ""
    if f.rel_se is not None:
        noise = f" <small>(standard error {f.rel_se:.0%})</small>"
    busy = (f" <b class='worse'>contended</b> <small>({html.escape(f.cpu.explain())})</small>"
            if f.contended else "")
    return f"{fmt_value(f.value)}{unit}{noise}{busy}"


def half_band(f: Figure) -> float:
    """Half the width of a figure's noise band: IQR/2, two standard errors of a fitted
    coefficient, 0 for an exact figure."""
    if f.iqr is not None:
        return f.iqr / 2
    if f.se is not None:
        return 2 * abs(f.se)
    return 0.0


def _verdict(a: Figure | None, b: Figure | None) -> tuple[str, str]:
    """(text, css class) of run b against run a for this figure."""
    if a is None or b is None:
        return "", ""
    if a.text is not None:
        return ("same", "") if a.text == b.text else ("different", "worse")
    if not a.value or b.value is None:
        return "", ""
    r = b.value / a.value
    if a.contended or b.contended:
        return f"{r:.3g}x (contended: not compared)", ""
    if a.better is None:
        return f"{r:.3g}x", ""
    if a.kind == FITTED and (a.value < 0 or b.value < 0):
        return f"{r:.3g}x (a negative coefficient: no direction)", ""
    if abs(b.value - a.value) <= 1e-9 * max(abs(a.value), abs(b.value)):
        return "equal", ""
    if a.kind == FITTED and (a.se is None or b.se is None):
        return f"{r:.3g}x (no standard error: no direction)", ""
    if abs(b.value - a.value) <= half_band(a) + half_band(b):
        return f"{r:.3g}x (within noise)", ""
    good = (b.value < a.value) == (a.better == "lower")
    return f"{r:.3g}x ({'better' if good else 'worse'})", "better" if good else "worse"


def compare_runs(runs: list[str | Path], out: str | Path | None = None, *,
                 force: bool = False) -> Path:
    """Write an HTML page comparing run folders (the first is the reference); returns its path.

    Raises:
        RunComparisonError: fewer than two runs, a folder missing or without results, or runs
            made on different snapshots (unless ``force``).
    """
    paths = [Path(r) for r in runs]
    if len(paths) < 2:
        raise RunComparisonError("compare needs at least two run folders")
    for d in paths:
        if not d.is_dir():
            raise RunComparisonError(f"run folder {d} does not exist")
    figs = [headline_figures(d) for d in paths]
    for d, f in zip(paths, figs):
        if not f:
            raise RunComparisonError(f"run folder {d} holds no results of this workbook version")
    sums = [_checksums(d) for d in paths]
    differ = any(s and sums[0] and s != sums[0] for s in sums[1:])
    scales = differ and same_snapshot_other_scale([_params(d) for d in paths])
    if scales:
        differ = False
    if differ and not force:
        raise RunComparisonError(
            "the runs used different snapshots; their numbers would not be comparable "
            "(pass --force to compare anyway)")
    keys = list(dict.fromkeys(k for f in figs for k in f))
    head = "".join(f"<th>{html.escape(d.name)}</th>" for d in paths) + "".join(
        f"<th>{html.escape(d.name)} vs {html.escape(paths[0].name)}</th>" for d in paths[1:])
    rows = []
    for k in keys:
        ref = figs[0].get(k)
        any_f = next(f[k] for f in figs if k in f)
        cells = "".join(f"<td>{_cell(f.get(k))}</td>" for f in figs)
        for f in figs[1:]:
            text, cls = _verdict(ref, f.get(k))
            cells += f"<td class='{cls}'>{text}</td>"
        rows.append(f"<tr><td>{html.escape(any_f.label)}<br><small>{any_f.notebook}, "
                    f"{any_f.kind}</small></td>{cells}</tr>")

    def env_line(d: Path) -> str:
        env = {}
        if (d / "environment.json").is_file():
            env = json.loads((d / "environment.json").read_text())
        p = env.get("params", {}) or {}
        return (f"<li><b>{html.escape(d.name)}</b>: {html.escape(str(env.get('device_label')))}"
                f", scale {p.get('scale')}, H {p.get('hidden')}, created "
                f"{html.escape(str(env.get('created')))}</li>")
    warn = "<p class='warn'>The runs used different snapshots (compared with --force).</p>" \
        if differ else ("<p class='warn'>The runs used the same snapshot at different scales: "
                        "absolute figures move with the graph's size, and so may ratios.</p>"
                        if scales else "")
    page = f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Run comparison</title><style>body{{font-family:system-ui,sans-serif;max-width:1200px;
margin:2em auto}} td,th{{border-bottom:1px solid #ddd;padding:5px 8px;text-align:left;
vertical-align:top}} th{{background:#f4f4f4}} .better{{color:#176d17}} .worse{{color:#a11}}
.warn{{background:#fbe3e3;padding:6px}} small{{color:#666}}</style></head><body>
<h1>Run comparison</h1><ul>{''.join(env_line(d) for d in paths)}</ul>{warn}
<p>Each run against the first: the ratio, better or worse by the figure's direction (lower is
better for times, higher for speedups) when the two figures' noise bands do not overlap (their
interquartile ranges; two standard errors of a fitted coefficient), else "within noise". Absolute
times move with the machine's speed; ratios measured in the same rounds do not; ratios of separate
launches (notebook 04's DDP factor, the gap it multiplies, the weak-scaling efficiency) move with
the machine's drift between the launches. A figure marked <b>contended</b> was measured while the
process's compute threads got less than 80% of the CPU they asked for (its line says by whom:
other jobs on the same CPUs, or the run's own processes): it can look precise and be wrong by
orders of magnitude, so it is not compared.</p>
<table><tr><th>figure</th>{head}</tr>{''.join(rows)}</table></body></html>"""
    out_path = Path(out) if out else Path("runs") / ("compare-" + "-vs-".join(
        d.name for d in paths) + ".html")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(page, encoding="utf-8")
    return out_path
