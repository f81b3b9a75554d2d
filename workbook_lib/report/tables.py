"""Table formatting of every report: units in the values, noise beside every measured figure
(``median (IQR x, n=10)``), no index column, and ``(noisy)`` or ``(contended)`` marks with their
footnotes (a word, not a ``*``, which Markdown reads as emphasis).
"""
from __future__ import annotations

import html

import math
from typing import Any

import pandas as pd

from ..results.stat import Stat

IMPRECISE = "(noisy)"
FOOTNOTE = ("(noisy): the median was not known to within the precision target after the "
            "figure's time budget (its 95% interval, from the order statistics of the repeats, "
            "is wider than the target on either side of it; at n = 5 that interval is the "
            "repeats' whole range); read it with its IQR.")
CONTENDED = "(contended)"
CONTENDED_NOTE = ("(contended): measured while the process's compute threads got less than 80% "
                  "of the CPU time they asked for: it may look precise and still be wrong by "
                  "orders of magnitude. Each figure's CPU line says by whom: other jobs on the "
                  "same CPUs (rerun when they are done), or this run's own processes, whose "
                  "threads outnumber its CPUs (use the configuration it names).")


HEADLINE_MAX = 200  # characters of a notebook's headline on the index


def fmt_bytes(n: float | None) -> str:
    """1234567 -> '1.23 MB' (decimal units)."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.3g} {unit}" if unit != "B" else f"{int(n):,} B"
        n /= 1000
    return f"{n:.3g} TB"


def fmt_seconds(s: float | None) -> str:
    """0.0123 -> '12.3 ms'; 3.2 -> '3.20 s'; 4000 -> '1.1 h'."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "n/a"
    a = abs(s)
    if a >= 3600:
        return f"{s / 3600:.3g} h"
    if a >= 60:
        return f"{s / 60:.3g} min"
    if a >= 1:
        return f"{s:.3g} s"
    if a >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def fmt_num(v: float | None, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def fmt_ratio(v: float | None) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}x"


def line_cell(line: int, text: str, share: float) -> str:
    """A hottest-line cell: "13: `p = x[i]` (78%)" (its source cut at 50 characters)."""
    text = text if len(text) <= 50 else text[:47] + "..."
    return f"{line}: `{text}` ({share:.0%})" if text else f"{line} ({share:.0%})"


def fmt_pct(v: float | None, digits: int = 1) -> str:
    """A fraction as a percentage, ``digits`` decimals; under 1% (not 0) two significant digits
    whatever ``digits`` (a user trial: 0.17% of the genes read '0%' beside a table's 0.2%),
    never in exponent notation (a review: '1e-05%')."""
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else \
        f"{v * 100:.{_pct_decimals(v * 100, digits)}f}%"


def _pct_decimals(p: float, digits: int) -> int:
    """``digits``, or as many as two significant digits of ``p`` need where 0 < |p| < 1."""
    return max(digits, min(8, 1 - math.floor(math.log10(abs(p))))) if 0 < abs(p) < 1 else digits


def fmt_stat(st: Stat | None, *, scale: float = 1.0, unit: str = "", digits: int = 3) -> str:
    """'12.3 ms (IQR 0.41, n=10)', marked '(noisy)' when above its precision target."""
    if st is None:
        return "n/a"
    u = f" {unit}" if unit else ""
    return (f"{st.median * scale:.{digits}g}{u} (IQR {st.iqr * abs(scale):.2g}, n={st.n})"
            f"{marks(st)}")


def marks(st: Stat) -> str:
    """' (noisy)' for a figure not known to its precision target, ' (contended)' for one
    measured while the process got less CPU than it asked for; "" otherwise."""
    return ("" if st.precise else f" {IMPRECISE}") + \
        (f" {CONTENDED}" if getattr(st, "contended", False) else "")


def fmt_time_stat(st: Stat | None, per: float = 1.0) -> str:
    """A time Stat in the unit that reads best (ms or s), divided by ``per``."""
    if st is None:
        return "n/a"
    m = st.median / per
    scale, unit = (1e3 / per, "ms") if abs(m) < 1 else (1.0 / per, "s")
    return fmt_stat(st, scale=scale, unit=unit)


def table(rows: list[dict[str, Any]] | pd.DataFrame, caption: str | None = None,
          footnote: bool | None = None):
    """A Styler without the index column; a footnote when any cell carries the '*' flag."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    # cells are text, not markup: a function named `f.<genexpr>` was shown as `f.` (found by a
    # user trial: the browser took `<genexpr>` for a tag)
    cell_map = df.map if hasattr(pd.DataFrame, "map") else df.applymap  # pandas < 2.1
    df = cell_map(lambda v: html.escape(v, quote=False) if isinstance(v, str) else v)
    st = df.style.hide(axis="index")
    cells = [v for v in df.to_numpy().ravel() if isinstance(v, str)]
    flagged = footnote if footnote is not None else any(f" {IMPRECISE}" in v for v in cells)
    contended = any(v.endswith(f" {CONTENDED}") for v in cells)
    cap = " ".join(s for s in (caption, FOOTNOTE if flagged else None,
                               CONTENDED_NOTE if contended else None) if s)
    if cap:
        st = st.set_caption(html.escape(cap, quote=False))
    return st.set_table_styles([{"selector": "caption",
                                 "props": "caption-side: bottom; text-align: left; "
                                          "font-size: 85%; color: #555;"},
                                {"selector": "td, th", "props": "text-align: left;"}])


# the first view of a section that did not run says so, under the section's own heading
NOT_RUN = "*Not run here: none of this section's built-in strategies is in this run's " \
          "`strategies`.*"


def skip_none(fn):
    """A view of a section that did not run (its study returned None: no built-in strategy of
    its kind in this run) shows nothing: for the views after a section's first."""
    return _skipping(fn, "")


def say_not_run(fn):
    """A section's first view: when its study did not run it shows :data:`NOT_RUN`, so that a
    heading never stands over nothing."""
    return _skipping(fn, NOT_RUN)


def _skipping(fn, say: str):
    import functools

    from IPython.display import Markdown

    @functools.wraps(fn)
    def wrapper(first, *args, **kwargs):
        if first is None:
            return Markdown(say)
        return fn(first, *args, **kwargs)
    return wrapper


def plain_markdown(text: str) -> str:
    """``text`` shown as written in Markdown: HTML escaped, and the characters Markdown reads as
    emphasis, code or links backslash-escaped (a user trial: the headline's
    ``NeighbourDictDataset.__getitem__`` showed as a bold "getitem")."""
    import re

    return re.sub(r"([\\`*_\[\]])", r"\\\1", html.escape(text, quote=False))


def saved(path, headline_text: str):
    """The closing line of every notebook: the headline and where the results went."""
    from IPython.display import Markdown

    return Markdown(f"**Headline.** {plain_markdown(headline_text)}\n\nResults: "
                    f"`{path.name}` in the run folder.")
