"""The page of ``python -m workbook_lib stability``: every headline figure of the runs side by
side, whether it agrees, and why not (:mod:`workbook_lib.tools.stability` judges them),
through the template ``stability.html.j2`` (:mod:`workbook_lib.report.pages`)."""
from __future__ import annotations

from pathlib import Path

from ..tools.stability import StabilityResult, StabilityRow
from ..common.files import atomic_write_text
from ..common.text import one_line, text_table
from .pages import render


def _status(x: StabilityRow) -> str:
    if x.agrees is None:
        return "CONTENDED" if x.note.startswith("contended") else "—"
    return "agrees" if x.agrees else "DIFFERS"


def page(r: StabilityResult) -> str:
    """The stability page.

    Args:
        r: the runs' comparison (:func:`workbook_lib.tools.stability.compare_figures`).
    """
    bad = [x for x in r.disagreeing if x.verdict_rests_on]
    busy = [x for x in r.rows if x.note.startswith("contended")]
    summary = ("Every figure the verdict rests on agrees within the tolerance." if not bad else
               "Figures the verdict rests on that differ: " + ", ".join(x.label for x in bad))
    if busy:
        summary += (" Contended (measured while the process got less than 80% of the CPU it "
                    "asked for; not judged): " + ", ".join(x.label for x in busy) + ".")
    rows = [{"row": x, "status": _status(x),
             # differs: red where the verdict rests on it, else pale
             "cls": "" if x.agrees is not False else ("bad" if x.verdict_rests_on else "differs"),
             "rel": "" if x.rel_diff is None else f"{x.rel_diff:.1%}"} for x in r.rows]
    return render("stability.html.j2", runs=r.runs, tolerance=f"{r.tolerance:.0%}",
                  drift=None if r.drift is None else f"{r.drift:.0%}", summary=summary,
                  rows=rows)


def write_page(r: StabilityResult, out_dir: str | Path) -> Path:
    """Write :func:`page` to ``out_dir/stability.html``; its path."""
    path = Path(out_dir) / "stability.html"
    atomic_write_text(path, page(r))
    return path


def summary_lines(r: StabilityResult) -> list[str]:
    """The terminal's table: one line per figure with its label, each run's value, the
    relative difference and whether it agrees (``ok``, ``DIFFERS``, blank when not judged)."""
    return text_table([[one_line(x.label, 60), " | ".join(v[:30] for v in x.values),
                        "" if x.rel_diff is None else f"{x.rel_diff:.1%}",
                        "" if x.agrees is None else ("ok" if x.agrees else "DIFFERS")]
                       for x in r.rows], "<<>")
