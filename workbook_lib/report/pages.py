"""Every HTML page the workbook writes has one look: one base template and one stylesheet.

The pages are jinja2 templates in ``report/templates/workbook/`` extending ``page.html.j2``,
which inlines ``workbook.css`` (as nbconvert's ``index.html.j2`` for the notebooks' reports
does), so each page is one self-contained file. No template here may take the name of one of
nbconvert's: this folder is searched first.
"""
from __future__ import annotations

import functools
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates" / "workbook"
STYLESHEET = TEMPLATES / "workbook.css"


@functools.cache
def _environment():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True)


def render(template: str, **context) -> str:
    """One page: ``template`` (a file name in ``report/templates/workbook/``, e.g.
    ``"trace.html.j2"``) filled from ``context``; strings are escaped unless marked safe (:func:`markup`).
    """
    return _environment().get_template(template).render(**context)


def markup(html: str):
    """``html`` marked as markup the page inserts as it is (already escaped where needed)."""
    from markupsafe import Markup

    return Markup(html)


def stylesheet() -> str:
    """The one stylesheet every page inlines."""
    return STYLESHEET.read_text(encoding="utf-8")
