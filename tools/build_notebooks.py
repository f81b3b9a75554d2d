"""Build notebooks/NN_name.ipynb (no outputs) from notebooks/src/NN_name.py (percent format).

Cells start with '# %%'; '# %% [markdown]' cells have their '# ' prefixes stripped;
'# %% tags=["parameters"]' tags the papermill parameters cell. Run: make notebooks.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src"
OUT = ROOT / "notebooks"


def parse(text: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                  "language": "python"},
                   "language_info": {"name": "python"}}
    cells, cur, kind, tags = [], [], None, []

    def flush():
        if kind is None:
            return
        body = "\n".join(cur).strip("\n")
        if kind == "markdown":
            body = "\n".join(re.sub(r"^# ?", "", ln) for ln in body.splitlines())
            cell = nbformat.v4.new_markdown_cell(body)
        else:
            cell = nbformat.v4.new_code_cell(body)
        if tags:
            cell.metadata["tags"] = tags
        cells.append(cell)

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            cur = []
            kind = "markdown" if "[markdown]" in line else "code"
            m = re.search(r"tags=(\[.*\])", line)
            tags = json.loads(m.group(1)) if m else []
        elif kind is not None:
            cur.append(line)
    flush()
    for i, c in enumerate(cells):
        c["id"] = f"cell-{i:02d}"
    nb.cells = cells
    return nb


def build(check: bool = False) -> list[str]:
    stale = []
    for src in sorted(SRC.glob("[0-9][0-9]_*.py")):
        nb = parse(src.read_text())
        dest = OUT / f"{src.stem}.ipynb"
        text = nbformat.writes(nb) + "\n"
        if check:
            if not dest.is_file() or dest.read_text() != text:
                stale.append(dest.name)
        else:
            dest.write_text(text)
    return stale


if __name__ == "__main__":
    stale = build(check="--check" in sys.argv)
    if stale:
        print("out of date:", stale)
        sys.exit(1)
