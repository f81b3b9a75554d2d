"""What a reader sees of a pipeline that failed (02, 03, 04): one line each saying which
pipeline, where (stage, step, rank) and what, the traceback in a collapsed ``<details>`` block.
"""
from __future__ import annotations

import html

from IPython.display import HTML

from ..failures import PipelineFailure


def failure_html(f: PipelineFailure) -> str:
    """One failure: its line, then its traceback collapsed."""
    line = f"<p><b>{html.escape(f.kind.upper().replace('_', ' '))}</b>: " \
           f"{html.escape(f.line())}</p>"
    if not f.traceback.strip():
        return line
    return (line + "<details><summary>traceback</summary><pre style=\"font-size: 80%; "
            "white-space: pre-wrap;\">" + html.escape(f.traceback.rstrip()) + "</pre></details>")


def failures_note(failures: dict[str, PipelineFailure], *, what: str = "",
                  none: str = "Every pipeline ran: no failure.") -> HTML:
    """Each failure of ``failures`` (pipeline -> record) in one line, traceback collapsed; ``what``
    names the others' figures for the closing sentence; ``none``: the line when nothing failed.
    """
    if not failures:
        return HTML(f"<p>{html.escape(none)}</p>" if none else "")
    lost = [n for n, f in failures.items() if not f.figures_kept]
    tail = ""
    if lost:
        tail = (f"<p>{html.escape(what or 'The figures')} below are those of the other "
                f"pipelines; {', '.join(html.escape(repr(n)) for n in lost)} "
                f"{'has' if len(lost) == 1 else 'have'} no figure among them.</p>")
    return HTML("".join(failure_html(f) for f in failures.values()) + tail)
