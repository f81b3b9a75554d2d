"""The notebooks' sources and their built ``.ipynb`` files.

The tracked sources are jupytext percent-format scripts, ``notebooks/NN_name.py``; the ignored
``.ipynb`` beside each is built by ``make notebooks`` and paired with it, and the runner
executes the source itself, so a stale ``.ipynb`` never runs. Each source's ``parameters`` cell
is generated from the params schema (:func:`workbook_lib.configs.cells.parameters_cell`);
:func:`sync` rewrites it.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from ..catalog import NOTEBOOK_NAMES
from ..exceptions import ParamsError
from ..paths import NOTEBOOK_DIR
from .kernel import KERNEL_DISPLAY, KERNEL_NAME  # one name for the metadata and `make kernel`
from ..configs.cells import parameters_cell

METADATA_FILTER = "-jupytext.text_representation"
_PARAMS_CELL = re.compile(r'(# %% tags=\["parameters"\]\n)(.*?)(?=\n# %%)', re.S)


def source_path(name: str, directory: Path | None = None) -> Path:
    return (directory or NOTEBOOK_DIR) / f"{name}.py"


def ipynb_path(name: str, directory: Path | None = None) -> Path:
    return (directory or NOTEBOOK_DIR) / f"{name}.ipynb"


def with_parameters(text: str, name: str | None = None) -> str:
    """The source text with its parameters cell regenerated from the schema (the keys notebook
    ``name`` reads)."""
    if not _PARAMS_CELL.search(text):
        raise ValueError("no '# %% tags=[\"parameters\"]' cell followed by another cell")
    return _PARAMS_CELL.sub(lambda m: m.group(1) + parameters_cell(name) + "\n", text, count=1)


def read(name: str, directory: Path | None = None):
    """The notebook (an nbformat node) built from its source, without outputs."""
    import jupytext

    nb = jupytext.read(source_path(name, directory), fmt="py:percent")
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": KERNEL_DISPLAY,
                                 "language": "python"}
    meta = nb.metadata.setdefault("jupytext", {})
    meta["formats"] = "ipynb,py:percent"
    # no text_representation/jupytext_version header on save: a round trip through JupyterLab
    # or `jupytext --sync` leaves the tracked source byte-identical
    meta["notebook_metadata_filter"] = METADATA_FILTER
    return nb


def sync(check: bool = False, directory: Path | None = None) -> list[str]:
    """Regenerate every source's parameters cell and rebuild its ``.ipynb``.

    With ``check``, change nothing and return the sources whose parameters cell is stale.
    """
    import jupytext

    stale = []
    for name in NOTEBOOK_NAMES:
        src = source_path(name, directory)
        text = src.read_text(encoding="utf-8")
        new = with_parameters(text, name)
        if new != text:
            stale.append(src.name)
            if not check:
                src.write_text(new, encoding="utf-8")
        if not check:
            jupytext.write(read(name, directory), ipynb_path(name, directory), fmt="ipynb")
    return stale


def notebook_dir() -> Path:
    """Where the notebook sources are (``WORKBOOK_NOTEBOOK_DIR`` overrides, for tests)."""
    return Path(os.environ.get("WORKBOOK_NOTEBOOK_DIR", NOTEBOOK_DIR))


def available_notebooks() -> list[str]:
    """Notebook names in execution order (sources present in the notebook folder)."""
    d = notebook_dir()
    return sorted(p.stem for p in d.glob("[0-9][0-9]_*.py")) or \
        sorted(p.stem for p in d.glob("[0-9][0-9]_*.ipynb"))


def resolve_only(only: list[str] | None) -> list[str]:
    """``--only`` values (full names, ``02``, ``2`` or ``02_mask``) to notebook names."""
    names = available_notebooks()
    if not only:
        return names
    out = []
    for item in only:
        key = item.strip()
        if key.isdigit():
            key = f"{int(key):02d}"
        hits = [n for n in names if n == key or n.startswith(key + "_") or n.startswith(key)]
        if len(hits) != 1:
            raise ParamsError(f"--only: {item!r} names {'no' if not hits else 'more than one'} "
                              f"notebook; available: {', '.join(names)}", key="only", value=item)
        out.append(hits[0])
    return [n for n in names if n in out]


def notebook_node(name: str):
    """Notebook ``name`` as papermill runs it: read from its source when there is one (never a
    stale ``.ipynb``), else its ``.ipynb``."""
    if source_path(name, notebook_dir()).is_file():
        return read(name, notebook_dir())
    import nbformat

    return nbformat.read(str(ipynb_path(name, notebook_dir())), as_version=4)


if __name__ == "__main__":
    out = sync(check="--check" in sys.argv)
    if "--check" in sys.argv and out:
        print("parameters cell out of date (run `make notebooks`):", ", ".join(out))
        sys.exit(1)
