"""What a reader sees of a pipeline that failed: one line each, the traceback folded away.

Every notebook that can lose a pipeline (02, 03, 04) shows its study's ``failures`` with
:func:`failures_note`: the line says which pipeline, where (stage, step, rank) and what; the
traceback (the rank's, the worker's, the probe's) is in a collapsed ``<details>`` block.
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
    """Each failure in one line with its traceback collapsed, or a line saying there was none.

    Args:
        failures: a study's ``failures`` (pipeline -> record).
        what: what the others' figures are, for the closing sentence ("the loop's figures").
        none: what to say when nothing failed ("": nothing).
    """
    if not failures:
        return HTML(f"<p>{html.escape(none)}</p>" if none else "")
    lost = [n for n, f in failures.items() if not f.figures_kept]
    tail = ""
    if lost:
        tail = (f"<p>{html.escape(what or 'The figures')} below are those of the other "
                f"pipelines; {', '.join(html.escape(repr(n)) for n in lost)} "
                f"{'is' if len(lost) == 1 else 'are'} missing from them.</p>")
    return HTML("".join(failure_html(f) for f in failures.values()) + tail)
