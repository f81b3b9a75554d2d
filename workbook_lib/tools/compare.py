"""Comparing run folders: the headline figures of two or more runs side by side.

Each row is one headline figure (:mod:`workbook_lib.tools.headlines`) in every run, each run
against the first: the ratio, and better or worse only when the noise bands do not overlap
(else "within noise"). Contended figures are not compared; runs on different snapshots are
refused unless forced. Returns records (:class:`RunComparison`);
:mod:`workbook_lib.report.compare_view` writes the page.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
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


def half_band(f: Figure) -> float:
    """Half the width of a figure's noise band: IQR/2, two standard errors of a fitted
    coefficient, 0 for an exact figure."""
    if f.iqr is not None:
        return f.iqr / 2
    if f.se is not None:
        return 2 * abs(f.se)
    return 0.0


def _verdict(a: Figure | None, b: Figure | None) -> tuple[str, str]:
    """(text, direction: "better", "worse" or "") of run b against run a for this figure."""
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


@dataclass
class ComparedRun:
    """One run folder as the comparison names it."""
    name: str
    device: str | None
    scale: float | None
    hidden: int | None
    created: str | None


@dataclass
class ComparedFigure:
    """One headline figure in every run, and each run after the first against the first."""
    key: str
    label: str
    notebook: str
    kind: str
    figures: list[Figure | None]  # one per run (None: not in that run)
    against_first: list[tuple[str, str]]  # one per run after the first: (text, direction)


@dataclass
class RunComparison:
    runs: list[ComparedRun]
    other_snapshots: bool  # the runs used different snapshots (compared with force)
    other_scales: bool  # the same snapshot at different scales
    rows: list[ComparedFigure] = field(default_factory=list)


def _run(d: Path) -> ComparedRun:
    env = {}
    if (d / "environment.json").is_file():
        env = json.loads((d / "environment.json").read_text())
    p = env.get("params", {}) or {}
    return ComparedRun(d.name, env.get("device_label"), p.get("scale"), p.get("hidden"),
                       env.get("created"))


def compare_runs(runs: list[str | Path], *, force: bool = False) -> RunComparison:
    """Every headline figure of two or more run folders (the first is the reference), each run
    against the first; ``force`` compares runs made on different snapshots too.

    Raises:
        RunComparisonError: fewer than two runs, a folder missing or without results, or different
            snapshots without ``force``.
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
    out = RunComparison([_run(d) for d in paths], bool(differ), bool(scales))
    for k in dict.fromkeys(k for f in figs for k in f):
        any_f = next(f[k] for f in figs if k in f)
        out.rows.append(ComparedFigure(k, any_f.label, any_f.notebook, any_f.kind,
                                       [f.get(k) for f in figs],
                                       [_verdict(figs[0].get(k), f.get(k)) for f in figs[1:]]))
    return out
