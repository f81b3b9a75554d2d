"""One look: every HTML page the workbook writes (the run folder's index, a notebook's report,
the trace, compare and stability pages) inlines the one stylesheet, ``workbook.css``, exactly
once, and no Python module carries a copy of CSS of its own."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from workbook_lib.tools import compare as cmp
from workbook_lib.tools import stability as stab
from workbook_lib.tools.headlines import RATIO, Figure
from workbook_lib.configs.validation import validate
from workbook_lib.report import compare_view, pages, stability_view, trace_view
from workbook_lib.report.html import index_page
from workbook_lib.running.papermill_run import NotebookOutcome, export_html

PACKAGE = Path(pages.__file__).resolve().parent.parent
CSS = pages.stylesheet().strip()


def _one_look(page: str) -> None:
    """The stylesheet inlined once, whole, in a <style> element; no stylesheet linked."""
    assert len(CSS) > 500 and page.count(CSS) == 1
    assert re.search(r"<style[^>]*>\s*" + re.escape(CSS) + r"\s*</style>", page)
    assert not re.search(r"<link[^>]*stylesheet", page)


def _figure(value, label="per-step ratio <slow/fast>"):
    return Figure("per_step_ratio_03", label, "03", value, 0.05 * value, None, "x", "lower",
                  RATIO)


def test_the_index_has_the_one_look(tmp_path):
    params = validate({"scale": 0.002, "device": "cpu"})
    outcomes = [NotebookOutcome("01_graph_inventory", "ok", 3.0),
                NotebookOutcome("05_verdict", "failed", 1.0, error="boom <here>")]
    page = index_page(tmp_path, outcomes, params)
    _one_look(page)
    assert page.count("<style") == 1
    assert "<tr class=\"failed\">" in page and "boom &lt;here&gt;" in page  # escaped
    assert "No verdict:</b> the verdict failed" in page


def test_a_report_has_the_one_look(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print('hi')")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    nb.cells = [nbformat.v4.new_markdown_cell("# A report"), cell]
    ipynb = tmp_path / "01_x.ipynb"
    nbformat.write(nb, str(ipynb))
    page = export_html(ipynb, tmp_path / "01_x.html").read_text()
    _one_look(page)
    # still the workbook's own report, on JupyterLab's template (no template of this folder
    # takes the place of one of nbconvert's)
    assert 'id="glossary"' in page and "jp-Notebook" in page and "hi" in page


def test_the_trace_page_has_the_one_look(tmp_path):
    from test_trace import _synthetic, _write

    from workbook_lib import traces as ta

    bds = [ta.breakdown(ta.read_trace(_write(tmp_path / f"{n}.json", _synthetic(steps=s))))
           for n, s in (("a", 2), ("b", 3))]
    page = trace_view.page(bds, ["a.json", "b.json"], ta.diff(bds[0], bds[1]))
    _one_look(page)
    assert page.count("<style") == 1
    assert "b.json against a.json" in page and "<td class=\"n\">" in page


def test_the_compare_page_has_the_one_look(tmp_path, monkeypatch):
    runs = [tmp_path / "run1", tmp_path / "run2"]
    for d in runs:
        d.mkdir()
    figs = {runs[0]: _figure(2.0), runs[1]: _figure(20.0)}
    monkeypatch.setattr(cmp, "headline_figures", lambda d: {"per_step_ratio_03": figs[d]})
    c = cmp.compare_runs(runs)
    assert c.rows[0].against_first[0][1] == "worse"  # a record, judged in analysis
    path = compare_view.write_page(c, tmp_path / "cmp.html")
    page = path.read_text()
    _one_look(page)
    assert page.count("<style") == 1
    assert "per-step ratio &lt;slow/fast&gt;" in page
    assert "<td class=\"worse\">10x (worse)</td>" in page


def test_the_stability_page_has_the_one_look(tmp_path, monkeypatch):
    runs = [tmp_path / "run1", tmp_path / "run2"]
    for d in runs:
        d.mkdir()
    figs = {runs[0]: _figure(2.0), runs[1]: _figure(20.0)}
    monkeypatch.setattr(stab, "headline_figures", lambda d: {"per_step_ratio_03": figs[d]})
    page = stability_view.page(stab.compare_figures(runs))
    _one_look(page)
    assert page.count("<style") == 1
    assert "<tr class=\"bad\">" in page and "DIFFERS" in page


@pytest.mark.parametrize("root,pattern", [(PACKAGE, "*.py"), (pages.TEMPLATES, "*.j2")])
def test_css_lives_in_one_file(root, pattern):
    """No <style in any module (CSS cannot be copied into Python again); in the templates only
    the two that inline workbook.css have one."""
    found = sorted(p.relative_to(root).as_posix() for p in root.rglob(pattern)
                   if "<style" in p.read_text(encoding="utf-8"))
    assert found == ([] if pattern == "*.py" else ["index.html.j2", "page.html.j2"])
    for name in found:
        text = (root / name).read_text(encoding="utf-8")
        assert re.search(r"<style>\s*\{% include \"workbook.css\" %\}\s*</style>", text), name
