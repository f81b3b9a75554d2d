"""Text on a terminal or in a headline: a message on one line, rows as aligned columns.

Written here rather than taken from ``tabulate`` (a dependency for a few plain tables) or pandas'
``to_string`` (it right-aligns text, and the quick commands would import pandas).
"""
from __future__ import annotations


def one_line(text: object, limit: int = 300, *, keep_end: bool = False) -> str:
    """``text`` (a message or an exception) on one line of at most ``limit`` characters, cut
    with ``...`` at its end, or in its middle with ``keep_end`` (a params error names its key
    first and what is wrong last)."""
    s = " ".join(str(text).split())
    if len(s) <= limit:
        return s
    if keep_end:
        head = (limit - 5) // 2
        return s[:head] + " ... " + s[len(s) - (limit - 5 - head):]
    return s[:limit - 3].rstrip(" ;,") + "..."


def capitalized(text: str) -> str:
    """``text`` with its first character upper-case (the rest as it is: "the pipeline 'x'"
    starts a sentence as "The pipeline 'x'")."""
    return text[:1].upper() + text[1:]


def text_table(rows: list[list], align: str = "") -> list[str]:
    """Rows of cells as lines of aligned columns two spaces apart (a first row may be the
    header), without trailing spaces.

    Args:
        rows: the cells, row by row, every row as long (shown with ``str``).
        align: one character per column: ``>`` right-aligns it, anything else (or nothing)
            left-aligns it.
    """
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(map(len, column)) for column in zip(*cells)]
    return ["  ".join(c.rjust(w) if align[i:i + 1] == ">" else c.ljust(w)
                      for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in cells]
