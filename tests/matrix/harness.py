"""Run a notebook's source in this process, as papermill would run it in a kernel, and render
every object it displays to HTML (what the exported report would hold).

Why not papermill: a kernel per notebook costs seconds of start-up, and the matrix runs dozens
of notebooks; executing the jupytext source cell by cell in one namespace runs the same code
(the parameters cell, then the injected values, then every code cell) and keeps each displayed
object, so that every view's output is rendered and checked. ``tests/test_notebooks.py`` runs
the notebooks through papermill and the CLI; this is for breadth.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass
class Executed:
    """One notebook run in-process: its status, the error (type, message) and what it showed."""

    name: str
    run_dir: Path
    status: str  # ok or failed
    error: tuple[str, str] | None = None
    html: list[str] = field(default_factory=list)
    cell: int | None = None
    seconds: float = 0.0  # wall time of the notebook's cells (what a case costs the suite)


def code_cells(name: str) -> tuple[list[str], int]:
    """The code cells of ``notebooks/NAME.py`` (jupytext percent format) and the index of the
    parameters cell."""
    src = (ROOT / "notebooks" / f"{name}.py").read_text()
    cells, cur, kind, params_at = [], None, None, -1
    for line in src.splitlines():
        if line.startswith("# %%"):
            if cur is not None and kind == "code":
                cells.append("\n".join(cur))
            kind = "markdown" if "[markdown]" in line else "code"
            if 'tags=["parameters"]' in line:
                params_at = len(cells)
            cur = []
        elif cur is not None:
            cur.append(line)
    if cur is not None and kind == "code":
        cells.append("\n".join(cur))
    return cells, params_at


def render(obj) -> str:
    """What an exported report holds for one displayed object."""
    if isinstance(obj, dict):  # raw mimebundle (plotting.show): a PNG with its alt text
        assert "image/png" in obj and obj.get("text/plain"), obj.keys()
        return f"<img alt='{obj['text/plain']}'>"
    to_html = getattr(obj, "to_html", None)  # a pandas Styler
    if callable(to_html):
        return to_html()
    html = getattr(obj, "_repr_html_", None)
    if callable(html):
        out = html()
        if out is not None:
            return out
    md = getattr(obj, "_repr_markdown_", None)
    if callable(md):
        return md() or ""
    return repr(obj)


VIEW_MODULES = ("inventory_view", "mask_cost_view", "timing_view", "ddp_view", "verdict_view",
                "adoption_view")


@contextlib.contextmanager
def views_traced(traced):
    """Every function of the notebooks' view modules runs inside ``traced()`` (a re-entrant
    context manager: a view calling another runs in one), so that a coverage tracer watches the
    rendering and not the measurement, which runs 1.5x slower under it."""
    import importlib
    import inspect

    if traced is None:
        yield
        return
    patched = []
    for m in VIEW_MODULES:
        mod = importlib.import_module(f"workbook_lib.report.{m}")
        for attr, fn in list(vars(mod).items()):
            if inspect.isfunction(fn):
                def call(*a, __fn=fn, **k):
                    with traced():
                        return __fn(*a, **k)
                patched.append((mod, attr, fn))
                setattr(mod, attr, call)
    try:
        yield
    finally:
        for mod, attr, fn in patched:
            setattr(mod, attr, fn)


def execute(name: str, params: dict, run_dir: Path, traced=None) -> Executed:
    """Run notebook ``name`` with ``params`` injected (every key, as the CLI does) into
    ``run_dir``, in this process. ``traced``: a re-entrant context manager factory that every
    view call and the rendering of what was displayed run in (:func:`views_traced`)."""
    import IPython.display as ipd
    from workbook_lib.configs.schema import FIELDS

    cells, params_at = code_cells(name)
    shown: list = []
    ns: dict = {"__name__": "__main__"}
    injected = {**{k: params[k] for k in FIELDS if k in params}, "run_dir": str(run_dir)}
    before = torch.get_num_threads()
    real = ipd.display
    ipd.display = lambda *objs, **kw: shown.extend(objs)
    out = Executed(name, Path(run_dir), "ok")
    start = time.perf_counter()
    try:
        with views_traced(traced):
            for i, code in enumerate(cells):
                try:
                    exec(compile(code, f"<{name} cell {i}>", "exec"), ns)
                    if i == params_at:  # papermill's injected cell
                        ns.update(injected)
                except Exception as exc:  # noqa: BLE001 - recorded, as papermill records it
                    out.status, out.error, out.cell = "failed", (type(exc).__name__, str(exc)), i
                    break
    finally:
        out.seconds = time.perf_counter() - start
        ipd.display = real
        torch.set_num_threads(before)
        with contextlib.suppress(Exception):
            import matplotlib.pyplot as plt
            plt.close("all")
    with (traced() if traced is not None else contextlib.nullcontext()):
        out.html = [render(o) for o in shown]  # a Styler's callbacks run here
    return out
