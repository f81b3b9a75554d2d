"""The run folder's ``index.html``: the verdict's answer first, then every notebook's status,
headline and links (reports, notebooks, results, traces, DDP logs), all relative to the folder
so it can be moved or served as it is. Its markup is the template ``run_index.html.j2``
(:mod:`workbook_lib.report.pages`)."""
from __future__ import annotations

import json
from pathlib import Path

from ..configs.validation import Params
from ..catalog import BY_NAME, NOTEBOOK_NAMES
from ..common.files import atomic_write_text
from ..running.results import read_meta, read_results
from .pages import markup, render

STATUS_TEXT = {"ok": "ok", "failed": "FAILED", "kept": "kept from an earlier run",
               "interrupted": "interrupted", "earlier": "from an earlier run",
               "partial": "partial (incomplete results)", "not run": "not run"}


def _md(text: str) -> str:
    from nbconvert.filters.markdown import markdown2html

    return markdown2html(text)


def _extra_links(out_dir: Path, name: str) -> list[tuple[str, str]]:
    links = []
    if name == "03_data_vs_model_timing":
        links += [(f"trace {p.stem}", f"traces_03/{p.name}")
                  for p in sorted((out_dir / "traces_03").glob("*.json"))]
    if name == "04_ddp_scaling":
        for d in sorted((out_dir / "ddp_04").glob("world*")):
            links.append((f"{d.name}: torchrun log", f"ddp_04/{d.name}/torchrun.log"))
            links += [(f"{d.name}: {p.stem}", f"ddp_04/{d.name}/{p.name}")
                      for p in sorted(d.glob("rank*.log"))]
    return [(t, h) for t, h in links if (out_dir / h).exists()]


def _verdict(out_dir: Path, outcomes) -> tuple[str | None, str]:
    """(the verdict's answer as markup, or None; why there is none)."""
    failed = next((o for o in outcomes if o.name == "05_verdict" and o.status == "failed"), None)
    meta = read_meta(out_dir, "05_verdict")
    doc = read_results(out_dir, "05_verdict")
    if failed is None and meta is not None and meta.complete and doc and doc.get("answer"):
        return markup(_md(doc["answer"])), ""
    return None, (f"the verdict failed: {failed.error or ''}" if failed else
                  "no complete verdict in this folder yet")


def index_page(out_dir: Path, outcomes, params: Params) -> str:
    """The run folder's ``index.html`` (template ``run_index.html.j2``) from the run folder
    ``out_dir``, this run's notebook ``outcomes`` and its ``params``.
    """
    env = {}
    if (out_dir / "environment.json").is_file():
        try:
            env = json.loads((out_dir / "environment.json").read_text())
        except (OSError, json.JSONDecodeError):
            env = {}
    by = {o.name: o for o in outcomes}
    present = {p.stem for p in out_dir.glob("[0-9][0-9]_*.ipynb")} | \
        {p.stem for p in out_dir.glob("[0-9][0-9]_*.json")}
    names = sorted(set(by) | present, key=lambda n: (n not in NOTEBOOK_NAMES, n))
    rows = []
    labels = {"html": "report", "ipynb": "notebook", "json": "results"}
    for name in names:
        o = by.get(name)
        meta = read_meta(out_dir, name)
        status = o.status if o else ("earlier" if meta and meta.complete else "partial")
        if o and o.status == "ok" and meta is not None and not meta.complete:
            status = "partial"
        head = meta.headline if meta else ""
        if o and o.status == "failed":
            cell = f" ({o.where})" if o.failed_cell is not None else ""
            head = f"FAILED{cell}: {o.error}"
        made = (str(meta.environment.get("created", ""))
                if meta and status in ("kept", "earlier") else "")
        links = [(labels[k], f"{name}.{k}") for k in ("html", "ipynb", "json")
                 if (out_dir / f"{name}.{k}").is_file()] + _extra_links(out_dir, name)
        rows.append({"status": status, "name": name,
                     "title": BY_NAME[name].title if name in BY_NAME else name,
                     "status_text": STATUS_TEXT.get(status, status), "made": made,
                     "time": f"{o.seconds:.0f} s" if o and o.status not in ("kept",) else "—",
                     "headline": head, "links": links})
    git = env.get("git", {}) or {}
    answer, no_verdict = _verdict(out_dir, outcomes)
    return render("run_index.html.j2", run=out_dir.name, snapshot=str(params.snapshot),
                  scale=f"{params.scale:g}", hidden=params.hidden,
                  layers=params.layers, seed=params.seed, builtin=bool(params.strategies),
                  device=str(env.get("device_label", params.device)),
                  revision=str(git.get("revision") or "unknown")[:12],
                  dirty=bool(git.get("dirty")),
                  files=[f for f in ("environment.json", "bench.json")
                         if (out_dir / f).is_file()],
                  answer=answer, no_verdict=no_verdict, rows=rows)


def write_index(out_dir: Path, outcomes, params: Params) -> Path:
    """Write :func:`index_page` to ``out_dir/index.html`` (what
    :func:`workbook_lib.running.run_folder.run_notebooks` calls after each notebook); its path."""
    path = out_dir / "index.html"
    atomic_write_text(path, index_page(out_dir, outcomes, params))
    return path
