"""Execute the notebooks with papermill, export HTML, write the index and environment files."""
from __future__ import annotations

import html
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from tqdm import tqdm

from ..running import environment
from ..running import processes
from ..exceptions import NotebookFailedError, ParamsError
from ..paths import REPO_ROOT
from ..running.results import read_results, to_jsonable

log = logging.getLogger(__name__)

from ..paths import NOTEBOOK_DIR




def notebook_dir() -> Path:
    """Where the source notebooks are (``WORKBOOK_NOTEBOOK_DIR`` overrides, for tests)."""
    return Path(os.environ.get("WORKBOOK_NOTEBOOK_DIR", NOTEBOOK_DIR))


TITLES = {
    "01_graph_inventory": "Graph size inventory",
    "02_mask_cost_model": "Mask cost model and strategy comparison",
    "03_data_vs_model_timing": "Data-only vs model timing",
    "04_ddp_scaling": "DDP scaling",
    "05_verdict": "Verdict",
}


def available_notebooks() -> list[str]:
    """Notebook names (without .ipynb) in execution order."""
    return sorted(p.stem for p in notebook_dir().glob("[0-9][0-9]_*.ipynb"))


def report_files(out_dir: Path, name: str) -> dict[str, str]:
    """``{"ipynb"|"html"|"json": file name}`` for the files of ``name`` present in ``out_dir``."""
    return {k: f"{name}.{k}" for k in ("ipynb", "html", "json")
            if (out_dir / f"{name}.{k}").is_file()}


@dataclass
class NotebookOutcome:
    name: str
    status: str  # ok, failed, skipped
    seconds: float = 0.0
    error: str | None = None
    failed_cell: int | None = None  # index in the executed notebook (papermill's cells included)
    failed_exec: int | None = None  # its execution count, as shown "In [N]" in the report
    files: dict = field(default_factory=dict)

    @property
    def where(self) -> str:
        if self.failed_cell is None:
            return "cell unknown"
        run = f", In [{self.failed_exec}]" if self.failed_exec is not None else ""
        return f"cell {self.failed_cell}{run}"


def export_html(ipynb: Path, html_path: Path, *, hide_code: bool = False) -> Path:
    """Export an executed notebook to a self-contained HTML file (figures embedded)."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(exclude_input=hide_code, embed_images=True)
    body, _ = exporter.from_filename(str(ipynb))
    html_path.write_text(body, encoding="utf-8")
    return html_path


def _failed_cell(ipynb: Path) -> int | None:
    """Index of the first code cell whose output is an error (papermill keeps them)."""
    import nbformat

    try:
        nb = nbformat.read(str(ipynb), as_version=4)
    except Exception:  # noqa: BLE001 - a missing/partial file just means 'unknown'
        return None
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and any(o.get("output_type") == "error"
                                            for o in cell.get("outputs", [])):
            return i
    return None


def execute_one(name: str, params: dict, out_dir: Path, *, hide_code: bool = False,
                progress: bool = True, log_output: bool = True,
                timeout: int | None = None) -> NotebookOutcome:
    """Run one notebook with papermill into ``out_dir`` and export its HTML (also on failure)."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    src = notebook_dir() / f"{name}.ipynb"
    if not src.is_file():
        raise ParamsError(f"no notebook named {name!r}; available: {available_notebooks()}")
    out_nb = out_dir / f"{name}.ipynb"
    out_html = out_dir / f"{name}.html"
    t0 = time.perf_counter()
    outcome = NotebookOutcome(name=name, status="ok")
    try:
        pm.execute_notebook(
            str(src), str(out_nb),
            parameters={"params_file": None, "params": to_jsonable(params),
                        "run_dir": str(out_dir)},
            cwd=str(notebook_dir()), kernel_name="python3", progress_bar=progress,
            log_output=log_output, execution_timeout=timeout,
        )
    except KeyboardInterrupt:
        outcome.status = "interrupted"
        outcome.error = "interrupted (SIGINT/SIGTERM)"
        outcome.seconds = time.perf_counter() - t0
        raise
    except PapermillExecutionError as exc:
        outcome.status = "failed"
        outcome.error = f"{exc.ename}: {exc.evalue}"
        outcome.failed_cell = exc.cell_index
        outcome.failed_exec = exc.exec_count
    except Exception as exc:  # noqa: BLE001 - kernel death etc.: record and go on
        outcome.status = "failed"
        outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.failed_cell = _failed_cell(out_nb)
    outcome.seconds = time.perf_counter() - t0
    if out_nb.is_file():
        try:
            export_html(out_nb, out_html, hide_code=hide_code)
        except Exception as exc:  # noqa: BLE001
            log.error("HTML export of %s failed: %s", out_nb, exc)
    outcome.files = report_files(out_dir, name)
    return outcome


def write_index(out_dir: Path, outcomes: list[NotebookOutcome], params: dict) -> Path:
    """``index.html``: one row per notebook with its status, headline and links."""
    env = json.loads((out_dir / "environment.json").read_text()) \
        if (out_dir / "environment.json").is_file() else {}
    rows = []
    seen = {o.name for o in outcomes}
    outcomes = list(outcomes) + [  # results of earlier runs into the same folder
        NotebookOutcome(name=n, status="earlier run", files=report_files(out_dir, n))
        for n in available_notebooks() if n not in seen and (out_dir / f"{n}.json").is_file()]
    outcomes.sort(key=lambda o: o.name)
    for o in outcomes:
        res = read_results(out_dir, o.name) or {}
        headline = res.get("_meta", {}).get("headline", "")
        if o.status == "failed":
            cell = f" ({o.where})" if o.failed_cell is not None else ""
            headline = f"FAILED{cell}: {o.error}"
        links = " ".join(f'<a href="{html.escape(f)}">{k}</a>' for k, f in o.files.items())
        rows.append(f"<tr class='{o.status}'><td>{html.escape(TITLES.get(o.name, o.name))}"
                    f"<br><code>{o.name}</code></td><td>{o.status}</td>"
                    f"<td>{o.seconds:.0f} s</td><td>{html.escape(headline)}</td>"
                    f"<td>{links}</td></tr>")
    git = env.get("git", {})
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>Perturbed-graph GNN workbook - {html.escape(out_dir.name)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}
td,th{{border-bottom:1px solid #ddd;padding:6px;vertical-align:top;text-align:left}}
tr.failed{{background:#fdd}} tr.skipped{{color:#888}} code{{font-size:90%}}</style></head>
<body><h1>Perturbed-graph GNN workbook</h1>
<p>Run folder <code>{html.escape(str(out_dir))}</code>; snapshot
<b>{html.escape(str(params['snapshot']))}</b> at scale {params['scale']:g}, seed {params['seed']},
device {html.escape(str(env.get('device_label', params['device'])))};
git {html.escape(str(git.get('revision')))}{' (dirty)' if git.get('dirty') else ''};
<a href="environment.json">environment.json</a>.</p>
<table><tr><th>notebook</th><th>status</th><th>time</th><th>headline</th><th>files</th></tr>
{''.join(rows)}</table></body></html>"""
    path = out_dir / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a cluster's time limit), turned into an interrupt of the main thread."""


_AT_INTERRUPT: dict[int, psutil.Process] = {}


def _on_signal(signum, frame):
    # snapshot every descendant *before* anything dies: once the kernel is killed, torchrun
    # and its ranks (own sessions) are re-parented and could no longer be found
    try:
        for c in psutil.Process().children(recursive=True):
            _AT_INTERRUPT.setdefault(c.pid, c)
    except psutil.Error:
        pass
    raise _Terminated()


def run_notebooks(params: dict, out_dir: str | Path, *, only: list[str] | None = None,
                  hide_code: bool = False, resume: bool = False, progress: bool = True,
                  log_output: bool = True) -> list[NotebookOutcome]:
    """Run the notebooks in order into ``out_dir``.

    A failing notebook keeps its partial output and the others still run; at the end
    NotebookFailedError lists what failed and where. ``resume`` skips notebooks whose results
    are complete with the same params and snapshot checksum. SIGINT/SIGTERM stop the kernel and
    every process it started (torchrun and its ranks included), keep what finished, update the
    index and raise KeyboardInterrupt.
    """
    names = available_notebooks()
    if only:
        unknown = [n for n in only if n not in names]
        if unknown:
            raise ParamsError(f"--only: unknown notebook(s) {unknown}; available: {names}")
        names = [n for n in names if n in only]
    environment.resolve_device(params["device"])  # 'cuda' without a GPU fails here, first
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "environment.json").write_text(
        json.dumps(to_jsonable(environment.collect(params)), indent=2))
    checksum = snapshot_checksum(params) if resume else None
    outcomes: list[NotebookOutcome] = []
    me = psutil.Process()
    seen: dict[int, psutil.Process] = {}
    _AT_INTERRUPT.clear()
    prev = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)} \
        if _main_thread() else {}
    try:
        bar = tqdm(names, desc="notebooks", unit="nb", disable=not progress)
        for name in bar:
            bar.set_postfix_str(name)
            if resume and is_complete(out, name, params, checksum):
                log.info("%s: results complete with the same params and snapshot, skipped "
                         "(--resume)", name)
                outcomes.append(NotebookOutcome(name=name, status="skipped",
                                                files=report_files(out, name)))
                continue
            (out / f"{name}.json").unlink(missing_ok=True)  # never leave stale results behind
            o = execute_one(name, params, out, hide_code=hide_code, progress=progress,
                            log_output=log_output)
            outcomes.append(o)
            if o.status == "failed":
                log.error("%s FAILED at %s: %s (partial notebook kept: %s)", name,
                          o.where, o.error, out / f"{name}.ipynb")
            write_index(out, outcomes, params)
    except KeyboardInterrupt:
        seen.update(_AT_INTERRUPT)
        try:
            for c in me.children(recursive=True):
                seen.setdefault(c.pid, c)
        except psutil.Error:
            pass
        killed = processes.terminate(seen.values())
        log.error("interrupted: stopped the kernel and %d process(es) it left; finished "
                  "notebooks kept in %s", len(killed), out)
        outcomes.append(NotebookOutcome(name=next((n for n in names if n not in
                                                   {o.name for o in outcomes}), "?"),
                                        status="interrupted", error="interrupted"))
        write_index(out, outcomes, params)
        raise
    finally:
        for sig, handler in prev.items():
            signal.signal(sig, handler)
    write_index(out, outcomes, params)
    failures = [o for o in outcomes if o.status == "failed"]
    if failures:
        summary = "; ".join(f"{o.name} ({o.where}): {o.error}" for o in failures)
        raise NotebookFailedError(f"{len(failures)} notebook(s) failed: {summary}",
                                  failures=failures)
    return outcomes


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def snapshot_checksum(params: dict) -> str:
    """Content checksum of the snapshot the params name (generated graphs come from cache)."""
    from ..data.snapshots import load_snapshot

    return load_snapshot(params).checksum


def is_complete(out_dir: Path, name: str, params: dict, checksum: str | None = None) -> bool:
    """True when ``name``'s results file is complete and was made with the same params (and,
    when given, the same snapshot checksum)."""
    res = read_results(out_dir, name)
    if not res:
        return False
    meta = res.get("_meta", {})
    if checksum is not None and meta.get("snapshot_checksum") != checksum:
        return False
    return bool(meta.get("complete")) and meta.get("params") == to_jsonable(params)
