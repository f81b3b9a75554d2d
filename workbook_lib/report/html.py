"""The run folder's ``index.html``: the verdict's answer first, then every notebook's status,
headline and links (reports, notebooks, results, traces, DDP logs), all relative to the folder
so it can be moved or served as it is."""
from __future__ import annotations

import html
import json
from pathlib import Path

from ..catalog import BY_NAME, NOTEBOOK_NAMES
from ..running.results import read_meta, read_results

STATUS_TEXT = {"ok": "ok", "failed": "FAILED", "kept": "kept from an earlier run",
               "interrupted": "interrupted", "earlier": "from an earlier run",
               "partial": "partial (incomplete results)", "not run": "not run"}
CSS = """body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;color:#222}
td,th{border-bottom:1px solid #ddd;padding:6px 8px;vertical-align:top;text-align:left}
th{background:#f4f4f4} tr.failed,tr.interrupted,tr.partial{background:#fbe3e3}
tr.kept,tr.earlier{color:#555} code{font-size:90%} .answer{background:#f3f8fc;
border-left:4px solid #3b7dbf;padding:.6em 1.2em;margin:1em 0} .missing{background:#fcf3e3;
border-left:4px solid #c98a1a;padding:.6em 1.2em} .links a{margin-right:.7em}
small{color:#666}"""


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


def _verdict_block(out_dir: Path, outcomes) -> str:
    failed = next((o for o in outcomes if o.name == "05_verdict" and o.status == "failed"), None)
    meta = read_meta(out_dir, "05_verdict")
    doc = read_results(out_dir, "05_verdict")
    if failed is None and meta is not None and meta.complete and doc and doc.get("answer"):
        return (f"<div class='answer'>{_md(doc['answer'])}<p><a href='05_verdict.html'>"
                "The verdict's evidence: causes, claims, the fix</a></p></div>")
    why = (f"the verdict failed: {html.escape(failed.error or '')}" if failed else
           "no complete verdict in this folder yet")
    return (f"<div class='missing'><b>No verdict:</b> {why}. It needs notebook 03's timings "
            "(01, 02 and 04 are used when complete); <code>python -m workbook_lib run --resume "
            "--out THIS_FOLDER</code> finishes what is missing.</div>")


def index_page(out_dir: Path, outcomes, params: dict) -> str:
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
        when = ""
        if meta and status in ("kept", "earlier"):
            when = f"<br><small>made {html.escape(str(meta.environment.get('created', '')))}</small>"
        secs = f"{o.seconds:.0f} s" if o and o.status not in ("kept",) else "—"
        files = {k: f"{name}.{k}" for k in ("html", "ipynb", "json")
                 if (out_dir / f"{name}.{k}").is_file()}
        labels = {"html": "report", "ipynb": "notebook", "json": "results"}
        links = [f"<a href='{html.escape(f)}'>{labels[k]}</a>" for k, f in files.items()]
        links += [f"<a href='{html.escape(h)}'>{html.escape(t)}</a>"
                  for t, h in _extra_links(out_dir, name)]
        rows.append(
            f"<tr class='{status}'><td><b>{html.escape(BY_NAME[name].title if name in BY_NAME else name)}</b><br>"
            f"<code>{name}</code></td><td>{STATUS_TEXT.get(status, status)}{when}</td>"
            f"<td>{secs}</td><td>{html.escape(head)}</td>"
            f"<td class='links'>{' '.join(links)}</td></tr>")
    git = env.get("git", {}) or {}
    extra = " ".join(f"<a href='{f}'>{f}</a>" for f in ("environment.json", "bench.json")
                     if (out_dir / f).is_file())
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Perturbed-graph GNN workbook: {html.escape(out_dir.name)}</title><style>{CSS}</style>
</head><body><h1>Why does the perturbed-graph model train slowly?</h1>
<p>Run <code>{html.escape(out_dir.name)}</code>: snapshot <b>{html.escape(str(params['snapshot']))}</b>
at scale {params['scale']:g}, H = {params['hidden']}, {params['layers']} layers, seed
{params['seed']}, on {html.escape(str(env.get('device_label', params['device'])))}; git
{html.escape(str(git.get('revision') or 'unknown')[:12])}{' (modified)' if git.get('dirty') else ''}.
{extra}</p>
{_verdict_block(out_dir, outcomes)}
<h2>Notebooks</h2>
<table><tr><th>notebook</th><th>status</th><th>time</th><th>headline</th><th>files</th></tr>
{''.join(rows)}</table></body></html>"""
