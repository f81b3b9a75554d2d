"""What the schema says to people: the help text of every key (``python -m workbook_lib
params``) and each notebook's papermill ``parameters`` cell (one typed, commented line per key the
notebook reads; ``make notebooks`` writes them into ``notebooks/*.py`` and a test checks they
match).
"""
from __future__ import annotations

from .schema import (FIELDS, S_02, S_03, S_04, S_05, S_06, S_MEAS, S_MODEL, S_SNAP, SCHEMA,
                     SECTIONS)


def describe() -> str:
    """Every key by section (and the section's attribute), with its type, default and
    meaning."""
    attr = {cls.SECTION: name for name, cls in SECTIONS.items()}
    lines, section = [], None
    for f in SCHEMA:
        if f.section != section:
            section = f.section
            lines.append(f"\n# {section} (params.{attr[section]})")
        choices = f" (one of {', '.join(map(str, f.choices))})" if f.choices else ""
        where = " [placement: not compared by --resume]" if f.placement else ""
        lines.append(f"{f.name}: {f.type_hint} = {f.default!r}{choices}{where}\n"
                     f"    {f.doc}")
    return "\n".join(lines).lstrip()


def _cell_comment(doc: str) -> str:
    # papermill skips a parameter line holding more than one "=" (it reads it as code)
    return doc.replace(">=", "at least").replace("<=", "at most").replace(" = ", " is ") \
        .replace("=", " ")


# What each notebook reads: the schema's sections (every notebook reads the first three) plus
# single keys of other sections. A notebook's parameters cell lists these; papermill still injects
# any key, and the schema validates every one.
_COMMON = (S_SNAP, S_MODEL, S_MEAS)
NOTEBOOK_READS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "01_graph_inventory": (_COMMON, ("batch_size_lazy",)),
    "02_mask_cost_model": (_COMMON + (S_02,), ("batch_size_lazy", "batch_size_dango")),
    "03_data_vs_model_timing": (_COMMON + (S_03,), ("gap_strategies",)),
    "04_ddp_scaling": (_COMMON + (S_04,), ("batch_size_lazy", "batch_size_dango", "num_workers",
                                          "pin_memory", "persistent_workers",
                                          "gap_strategies")),
    "05_verdict": (_COMMON + (S_05,), ("batch_size_lazy", "batch_size_dango")),
    "06_adopt_fix": (_COMMON + (S_06,), ("batch_size_lazy", "gap_strategies")),
}


def keys_read(notebook: str | None = None) -> list[str]:
    """The params keys ``notebook`` reads, in schema order (every key for None or a notebook
    outside the catalog)."""
    if notebook not in NOTEBOOK_READS:
        return [f.name for f in SCHEMA]
    sections, extra = NOTEBOOK_READS[notebook]
    return [f.name for f in SCHEMA if f.section in sections or f.name in extra]


def parameters_cell(notebook: str | None = None) -> str:
    """The source of a notebook's papermill ``parameters`` cell: one typed, commented line per
    key the notebook reads (:func:`keys_read`), as ``papermill --help-notebook`` reads them."""
    lines = ["# The params keys this notebook reads (every key: python -m workbook_lib params); "
             "papermill sets them with -p KEY VALUE or -f FILE.yaml, and also takes any other key",
             "from typing import Dict, List, Optional, Union  # for the annotations below"]
    for name in keys_read(notebook):
        f = FIELDS[name]
        lines.append(f"{f.name}: {f.type_hint} = {f.default!r}  # {_cell_comment(f.doc)}")
    lines.append('run_dir: str = "runs/interactive"  # where results go (a relative path is '
                 "taken from the repository root)")
    return "\n".join(lines)
