"""The page of ``python -m workbook_lib compare``: the runs' headline figures side by side
(:mod:`workbook_lib.tools.compare` compares them), through the template
``compare.html.j2`` (:mod:`workbook_lib.report.pages`)."""
from __future__ import annotations

import html
from pathlib import Path

from ..tools.compare import RunComparison, fmt_value
from ..tools.headlines import Figure
from ..common.files import atomic_write_text
from .pages import markup, render


def cell(f: Figure | None):
    """One run's figure as the page shows it: value, unit, noise, and "contended" with whom."""
    if f is None:
        return "—"
    if f.text is not None:
        return f.text
    if f.value is None:
        return "n/a"
    unit = f" {f.unit}" if f.unit and f.unit != "x" else ("x" if f.unit == "x" else "")
    noise = f" <small>(IQR {f.iqr:.2g})</small>" if f.iqr is not None else ""
    if f.rel_se is not None:
        noise = f" <small>(standard error {f.rel_se:.0%})</small>"
    busy = (f" <b class='worse'>contended</b> <small>({html.escape(f.cpu.explain())})</small>"
            if f.contended else "")
    return markup(f"{fmt_value(f.value)}{html.escape(unit)}{noise}{busy}")


def page(c: RunComparison) -> str:
    """The comparison's HTML page.

    Args:
        c: the comparison (:func:`workbook_lib.tools.compare.compare_runs`).
    """
    rows = [{"label": r.label, "notebook": r.notebook, "kind": r.kind,
             "cells": [cell(f) for f in r.figures], "against_first": r.against_first}
            for r in c.rows]
    return render("compare.html.j2", runs=c.runs, rows=rows, other_snapshots=c.other_snapshots,
                  other_scales=c.other_scales)


def default_path(c: RunComparison) -> Path:
    """``runs/compare-A-vs-B.html``."""
    return Path("runs") / ("compare-" + "-vs-".join(r.name for r in c.runs) + ".html")


def write_page(c: RunComparison, out: str | Path | None = None) -> Path:
    """Write the comparison ``c``'s page to ``out`` (default :func:`default_path`); returns its
    path.
    """
    path = Path(out) if out else default_path(c)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, page(c))
    return path
