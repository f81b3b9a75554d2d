"""Executing the notebooks with papermill, exporting their HTML, writing the index.

Each notebook runs from its jupytext source (never a stale ``.ipynb``), with every params key
injected as a papermill parameter (validated before any work), in a fresh kernel. Its executed
notebook, HTML report and results JSON land in the run folder; a failing notebook keeps its
partial output (and its HTML, the failing cell marked) and the others still run.

HTML reports hide code by default (``exclude_input``, nbconvert's own option; ``--show-code``
keeps it) and carry the figures inline. A notebook counts as complete only when its results JSON
says so, every file it lists exists, and its HTML exists; ``--resume`` skips exactly those whose
params (those a result depends on: where a run executes is not compared), snapshot and inputs
(the results of the notebooks they read, by checksum) are unchanged, and reruns the rest.

SIGINT, SIGTERM and SIGHUP stop the kernel and every process it started (torchrun and its
ranks run in their own sessions and are found through the process tree, snapshotted before
anything dies), keep what finished, update the index and exit 130.

Nothing is created before every check has passed (params, device, the run folder's path, the
snapshot with the checks every notebook's set-up makes, the params of inputs read but not rerun);
then the run holds each notebook it runs against a second writer (:mod:`.runlock`). A file that
cannot be written (a full disk) fails the notebook concerned, naming the file, and the run goes
on.
"""
from __future__ import annotations

import html
import json
import logging
import math
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from .catalog import BY_NAME, inputs_of, requires_of
from .exceptions import NotebookFailedError, ParamsError
from .paths import NOTEBOOK_DIR
from .records import to_json
from .common import processes, progress as terminal
from .running import environment
from .measurement import cpu
from .configs.params import check_gap, results_relevant
from .common.files import atomic_write_text
from .running.results import file_checksum, read_meta, read_results, results_path

if TYPE_CHECKING:
    from .analysis.stability import StabilityResult

log = logging.getLogger(__name__)


def notebook_dir() -> Path:
    """Where the notebook sources are (``WORKBOOK_NOTEBOOK_DIR`` overrides, for tests)."""
    return Path(os.environ.get("WORKBOOK_NOTEBOOK_DIR", NOTEBOOK_DIR))


def available_notebooks() -> list[str]:
    """Notebook names in execution order (sources present in the notebook folder)."""
    d = notebook_dir()
    return sorted(p.stem for p in d.glob("[0-9][0-9]_*.py")) or \
        sorted(p.stem for p in d.glob("[0-9][0-9]_*.ipynb"))


def title(name: str) -> str:
    return BY_NAME[name].title if name in BY_NAME else name


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


@dataclass
class NotebookOutcome:
    name: str
    status: str  # ok, failed, kept (complete from an earlier run), interrupted, not run
    seconds: float = 0.0
    error: str | None = None
    failed_cell: int | None = None
    failed_exec: int | None = None
    files: dict = field(default_factory=dict)
    note: str = ""

    @property
    def where(self) -> str:
        if self.failed_cell is None:
            return "cell unknown"
        run = f", In [{self.failed_exec}]" if self.failed_exec is not None else ""
        return f"cell {self.failed_cell}{run}"


def report_files(out_dir: Path, name: str) -> dict[str, str]:
    return {k: f"{name}.{k}" for k in ("html", "ipynb", "json")
            if (out_dir / f"{name}.{k}").is_file()}


def export_html(ipynb: Path, html_path: Path, *, show_code: bool = False) -> Path:
    """A self-contained HTML report of an executed notebook (figures inline; code hidden
    unless ``show_code``), written atomically."""
    from nbconvert import HTMLExporter

    templates = Path(__file__).resolve().parent / "report" / "templates"
    exporter = HTMLExporter(template_name="workbook", extra_template_basedirs=[str(templates)],
                            exclude_input=not show_code, exclude_input_prompt=True,
                            exclude_output_prompt=True, embed_images=True)
    body, _ = exporter.from_filename(str(ipynb))
    atomic_write_text(html_path, body)
    return html_path


def _failed_cell(ipynb: Path) -> int | None:
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


def _notebook_node(name: str):
    src = notebook_dir() / f"{name}.py"
    if src.is_file():
        from .running.notebooks import read

        return read(name, notebook_dir())
    import nbformat

    return nbformat.read(str(notebook_dir() / f"{name}.ipynb"), as_version=4)


@contextmanager
def _environ(values: dict[str, str]):
    """``os.environ`` with ``values`` set for a while (what a kernel started now inherits)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# The kernel's own start-up warnings (e.g. ipykernel's note that a local kernel talks over TCP)
# are not about the workbook; its errors still reach the terminal.
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]


class _EveryKeyInjected(logging.Filter):
    """The runner injects every params key into every notebook (each notebook's parameters cell
    lists only the keys it reads, and validates all): papermill's "unknown parameter" notes for
    the others say nothing to a reader of the terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Passed unknown parameter")


logging.getLogger("papermill").addFilter(_EveryKeyInjected())


def execute_one(name: str, params: dict, out_dir: Path, *, show_code: bool = False,
                progress: bool = True, log_output: bool = True) -> NotebookOutcome:
    """Run one notebook with papermill into ``out_dir``; export its HTML (also on failure)."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    out_nb, out_html = out_dir / f"{name}.ipynb", out_dir / f"{name}.html"
    t0 = time.perf_counter()
    outcome = NotebookOutcome(name=name, status="ok")
    # the kernel inherits this process's environment: --quiet drops its bars too (the one-line
    # stage notes stay, unless WORKBOOK_PROGRESS=0 turned everything off)
    quiet = {} if progress or not terminal.enabled() else {"WORKBOOK_PROGRESS": "notes"}
    # this process is the run's root: the kernel's (and its ranks') CPU figures count papermill,
    # the kernel, torchrun, the ranks and their DataLoader workers as the run's own processes
    root = {cpu.ROOT_ENV: str(cpu.run_root())}
    try:
        with _environ({**quiet, **root}):
            pm.execute_notebook(_notebook_node(name), str(out_nb),
                                parameters={**to_json(params), "run_dir": str(out_dir)},
                                cwd=str(notebook_dir()), kernel_name="python3",
                                progress_bar=progress, log_output=log_output,
                                extra_arguments=KERNEL_ARGUMENTS)
    except KeyboardInterrupt:
        outcome.status, outcome.error = "interrupted", "interrupted (signal)"
        outcome.seconds = time.perf_counter() - t0
        raise
    except PapermillExecutionError as exc:
        outcome.status = "failed"
        outcome.error = f"{exc.ename}: {exc.evalue}"
        outcome.failed_cell, outcome.failed_exec = exc.cell_index, exc.exec_count
    except OSError as exc:  # e.g. a full disk while papermill writes the notebook
        outcome.status = "failed"
        outcome.error = f"{type(exc).__name__}: {_os_error(exc) if exc.filename else exc}" + (
            "" if exc.filename else f" (writing {out_nb})")
        outcome.failed_cell = _failed_cell(out_nb)
    except Exception as exc:  # noqa: BLE001 - a dead kernel etc.: recorded, the run goes on
        outcome.status, outcome.error = "failed", f"{type(exc).__name__}: {exc}"
        outcome.failed_cell = _failed_cell(out_nb)
    outcome.seconds = time.perf_counter() - t0
    if out_nb.is_file():
        try:
            export_html(out_nb, out_html, show_code=show_code)
        except Exception as exc:  # noqa: BLE001 - a report that cannot be written: not complete
            why = _os_error(exc) if isinstance(exc, OSError) else str(exc)
            why = f"HTML export to {out_html} failed: {why}"
            log.error("%s: %s", name, why)
            # the notebook's own failure, when it failed, stays the error reported
            outcome.error = f"{outcome.error}; {why}" if outcome.status == "failed" else why
            outcome.status = "failed"
            mark_incomplete(out_dir, name, why)
    outcome.files = report_files(out_dir, name)
    return outcome


def mark_incomplete(out_dir: Path, name: str, why: str) -> None:
    doc = read_results(out_dir, name)
    if doc and "_meta" in doc:
        doc["_meta"]["complete"] = False
        doc["_meta"]["incomplete_because"] = why
        try:
            atomic_write_text(results_path(out_dir, name), json.dumps(doc, indent=1))
        except OSError:
            results_path(out_dir, name).unlink(missing_ok=True)


def completeness(out_dir: Path, name: str, params: dict,
                 checksum: str | None = None) -> tuple[bool, str]:
    """(complete, why not) for ``--resume``: results complete with the same result-relevant
    params and snapshot, every file written present, the HTML present, inputs unchanged."""
    meta = read_meta(out_dir, name)
    if meta is None:
        return False, "no readable results"
    if not meta.complete:
        return False, "results marked incomplete"
    if results_relevant(meta.params) != to_json(results_relevant(params)):
        changed = sorted(k for k in set(meta.params) | set(params)
                         if meta.params.get(k) != to_json(params).get(k)
                         and k in results_relevant(params))
        return False, f"params changed ({', '.join(changed[:5])})"
    if checksum is not None and meta.snapshot_checksum not in (None, checksum):
        return False, "snapshot changed"
    missing = [f for f in meta.files if not (out_dir / f).exists()]
    if missing:
        return False, f"{len(missing)} file(s) it wrote are missing"
    if not (out_dir / f"{name}.html").is_file():
        return False, "no HTML report"
    for dep in inputs_of(name):
        path = results_path(out_dir, dep)
        if dep in meta.inputs:
            if not path.is_file() or file_checksum(path) != meta.inputs[dep]:
                return False, f"its input {dep} changed"
        elif dep in requires_of(name):
            return False, f"made without its input {dep}"
        elif path.is_file() and getattr(read_meta(out_dir, dep), "complete", False):
            # an optional input complete now, made after it (e.g. after a cancelled job)
            return False, f"made without its input {dep}, which is complete now"
    for dep, fname in FILE_INPUTS.get(name, ()):
        path = out_dir / fname
        if path.is_file() and meta.inputs.get(dep) != file_checksum(path):
            return False, f"{fname} in the run folder is not the one it quoted"
        if not path.is_file() and dep in meta.inputs:
            return False, f"{fname} it quoted is gone"
    return True, ""


# files other commands write into a run folder that a notebook reads when present:
# notebook -> ((key in its recorded inputs, file name), ...)
FILE_INPUTS = {"05_verdict": (("bench", "bench.json"),)}


def write_index(out_dir: Path, outcomes: list[NotebookOutcome], params: dict) -> Path:
    """``index.html``: the verdict's answer first, then one row per notebook with its status,
    headline and links (reports, results, traces, DDP logs; all relative)."""
    from .report.html import index_page

    page = index_page(out_dir, outcomes, params)
    path = out_dir / "index.html"
    atomic_write_text(path, page)
    return path


class _Terminated(KeyboardInterrupt):
    """SIGTERM/SIGHUP (a cluster's time limit, a closed terminal) as an interrupt."""


_AT_SIGNAL: dict[int, psutil.Process] = {}


def _on_signal(signum, frame):
    # snapshot every descendant before anything dies: once the kernel is gone, torchrun and
    # its ranks (own sessions) are re-parented and could no longer be found
    try:
        for c in psutil.Process().children(recursive=True):
            _AT_SIGNAL.setdefault(c.pid, c)
    except psutil.Error:
        pass
    # stop the kernel outright: a kernel asked to shut down while its client is going away
    # replies on a closed socket and prints a traceback on the terminal. What nbclient and
    # asyncio then report about the dead kernel is expected: the runner says what happened.
    for name in ("papermill", "asyncio", "traitlets"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    for proc in list(_AT_SIGNAL.values()):
        try:
            if any("ipykernel" in part for part in proc.cmdline()):
                proc.kill()
        except psutil.Error:
            pass
    raise _Terminated()


def out_path(out_dir: str | Path) -> Path:
    """The run folder as an absolute path, refusing an empty one or a file (nothing created)."""
    if str(out_dir).strip() == "":
        raise ParamsError("--out: empty path (name the run folder, e.g. runs/default)",
                          key="out", value=str(out_dir))
    try:
        out = Path(out_dir).expanduser().resolve()
    except (OSError, RuntimeError) as exc:
        raise ParamsError(f"--out {out_dir}: not a usable path ({exc})", key="out",
                          value=str(out_dir)) from None
    try:
        is_file = out.exists() and not out.is_dir()
    except OSError as exc:  # e.g. a name too long
        raise ParamsError(f"--out {out}: cannot write there ({exc.strerror or exc})",
                          key="out", value=str(out)) from None
    if is_file:
        raise ParamsError(f"--out {out}: is a file, not a folder", key="out", value=str(out))
    return out


def _check_out_dir(out: Path) -> Path:
    """Create the run folder and fail fast, in one line, when it cannot be written; on failure
    remove the folders this created."""
    out = out_path(out)
    created = []
    try:
        probe_dir = out
        while not probe_dir.exists() and probe_dir.parent != probe_dir:
            created.append(probe_dir)
            probe_dir = probe_dir.parent
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("x")
        probe.unlink()
    except OSError as exc:
        for d in created:  # deepest first
            try:
                d.rmdir()
            except OSError:
                pass
        raise ParamsError(f"--out {out}: cannot write there ({exc.strerror or exc})",
                          key="out", value=str(out)) from None
    return out


def write_environment(out: Path, params: dict, names: list[str], *, resume: bool) -> Path:
    """This job's environment record in ``environment/<job>.json`` (one per job: several SLURM
    jobs share a run folder), and ``environment.json`` merged from every record
    (:func:`environment.merge_records`). A run that does not resume starts the records anew."""
    import os
    import time as _time

    uses = any(n not in DEVICE_FREE for n in names)
    rec = {**environment.collect(params, uses_device=uses, run_level=True),
           "notebooks": list(names)}
    folder = out / "environment"
    if not resume and folder.is_dir():
        for f in folder.glob("*.json"):
            f.unlink()
    folder.mkdir(exist_ok=True)
    job = os.environ.get("SLURM_JOB_ID") or f"local-{_time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    atomic_write_text(folder / f"{job}.json", json.dumps(to_json(rec), indent=1))
    records = []
    for f in sorted(folder.glob("*.json")):
        try:
            records.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    path = out / "environment.json"
    atomic_write_text(path, json.dumps(to_json(environment.merge_records(records)), indent=1))
    return path


# notebooks that measure nothing on the device: they run on a CPU node whatever 'device' says
# (the SLURM layout gives them no GPU)
DEVICE_FREE = ("01_graph_inventory", "05_verdict")


def run_notebooks(params: dict, out_dir: str | Path, *, only: list[str] | None = None,
                  show_code: bool = False, resume: bool = False, progress: bool = True,
                  log_output: bool = True) -> list[NotebookOutcome]:
    """Run the notebooks in order into ``out_dir`` (see the module docstring).

    Every check comes before anything is created: the notebooks named, the device, the run
    folder's path, the snapshot (loaded and checked against the params, as every notebook's
    set-up does), the inputs a notebook run alone would read. Then the run folder is created
    and held against a second writer (:mod:`.runlock`). Signals are handled from the start, so a
    SIGTERM while the snapshot builds is an interrupt (exit 130) like any other.

    Raises:
        ParamsError: an unknown notebook, an unwritable folder, a snapshot that does not load,
            inputs made with other params; before any work.
        RunFolderInUseError: another run holds one of these notebooks in ``out_dir``.
        NotebookFailedError: one or more notebooks failed (the others ran).
        KeyboardInterrupt: on SIGINT/SIGTERM/SIGHUP, after stopping every child process.
    """
    from .running.runlock import hold

    _AT_SIGNAL.clear()
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    prev = {s: signal.signal(s, _on_signal) for s in sigs} if _main_thread() else {}
    try:
        names = resolve_only(only)
        check_gap(params, names)
        if any(n not in DEVICE_FREE for n in names):  # 'cuda' without a GPU fails here, first
            environment.resolve_device(params["device"])
        out = out_path(out_dir)
        checksum = snapshot_checksum(params)  # loads and checks the snapshot
        check_inputs_match(out, names, params)
        out = _check_out_dir(out)
        with hold(out, names):
            return _run_held(names, params, out, checksum, show_code=show_code, resume=resume,
                             progress=progress, log_output=log_output)
    finally:
        for s, handler in prev.items():
            signal.signal(s, handler)


def run_stability(params: dict, out_dir: str | Path, *, runs: int = 2,
                  tolerance: float = 0.15, only: list[str] | None = None,
                  progress: bool = True) -> StabilityResult:
    """Run the notebooks ``runs`` times and compare every headline figure
    (:mod:`workbook_lib.analysis.stability`)."""
    from .analysis.stability import compare_figures
    from .report.stability_view import page

    if runs < 2:
        raise ParamsError(f"--runs must be at least 2 (got {runs})", key="runs", value=runs)
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise ParamsError(f"--tolerance must be a positive number (got {tolerance})",
                          key="tolerance", value=tolerance)
    resolve_only(only)  # an unknown notebook refused before the first run
    out = Path(out_dir)
    dirs = [out / f"run{i + 1}" for i in range(runs)]
    for d in dirs:
        run_notebooks(params, d, only=only, progress=progress, log_output=False)
    res = compare_figures(dirs, tolerance)
    atomic_write_text(out / "stability.json", json.dumps(res.to_json(), indent=1))
    atomic_write_text(out / "stability.html", page(res))
    return res


def check_inputs_match(out: Path, names: list[str], params: dict) -> None:
    """Refuse to run a notebook on inputs made with other params: a notebook run now (e.g.
    ``--only 05 --set hidden=8``) whose input is not run now but present in the run folder,
    made with different result-relevant params, would label old measurements with new params.
    """
    now = to_json(results_relevant(params))
    for name in names:
        for dep in inputs_of(name):
            if dep in names:
                continue
            meta = read_meta(out, dep)
            if meta is None:
                continue
            made = results_relevant(meta.params)
            changed = sorted(k for k in set(made) | set(now) if made.get(k) != now.get(k))
            if changed:
                shown = ", ".join(f"{k}={made.get(k)!r} there, {now.get(k)!r} now"
                                  for k in changed[:3])
                raise ParamsError(
                    f"{name} reads {dep}, made in {out} with other params ({shown}"
                    f"{', ...' if len(changed) > 3 else ''}); run {dep} too (add it to --only, "
                    "or drop --only) or use the params it was made with", key=changed[0],
                    value=now.get(changed[0]))


def _run_held(names: list[str], params: dict, out: Path, checksum: str, *, show_code: bool,
              resume: bool, progress: bool, log_output: bool) -> list[NotebookOutcome]:
    """The run itself, the folder created and held."""
    try:
        write_environment(out, params, names, resume=resume)
    except OSError as exc:  # recorded; each notebook records its own environment too
        log.error("could not write %s: %s", out / "environment.json", _os_error(exc))
    outcomes: list[NotebookOutcome] = []
    seen: dict[int, psutil.Process] = {}
    from .common.progress import progress as bar_of

    try:
        bar = bar_of(names, desc="notebooks") if progress else names
        for name in bar:
            if resume:
                ok, why = completeness(out, name, params, checksum)
                if ok:
                    log.info("%s: complete from an earlier run with the same params, snapshot "
                             "and inputs: kept (--resume)", name)
                    outcomes.append(NotebookOutcome(name, "kept", files=report_files(out, name)))
                    continue
                log.info("%s: rerun (%s)", name, why)
            try:
                results_path(out, name).unlink(missing_ok=True)  # never leave stale results
            except OSError as exc:
                outcomes.append(NotebookOutcome(name, "failed", error=_os_error(exc)))
                continue
            o = execute_one(name, params, out, show_code=show_code, progress=progress,
                            log_output=log_output)
            outcomes.append(o)
            if o.status == "failed":
                log.error("%s FAILED at %s: %s (partial notebook kept: %s)", name, o.where,
                          o.error, out / f"{name}.ipynb")
            _try_index(out, outcomes, params)
    except KeyboardInterrupt:
        seen.update(_AT_SIGNAL)
        try:
            for c in psutil.Process().children(recursive=True):
                seen.setdefault(c.pid, c)
        except psutil.Error:
            pass
        killed = processes.terminate(seen.values())
        log.error("interrupted: stopped the kernel and %d process(es) it had started; "
                  "finished notebooks kept in %s", len(killed), out)
        done = {o.name for o in outcomes}
        rest = [n for n in names if n not in done]
        if rest:
            outcomes.append(NotebookOutcome(rest[0], "interrupted", error="interrupted"))
        _try_index(out, outcomes, params)
        raise
    _try_index(out, outcomes, params)
    failures = [o for o in outcomes if o.status == "failed"]
    if failures:
        summary = "; ".join(f"{o.name} ({o.where}): {o.error}" for o in failures)
        raise NotebookFailedError(f"{len(failures)} notebook(s) failed: {summary}",
                                  failures=failures)
    return outcomes


def _os_error(exc: OSError) -> str:
    """'No space left on device: /run/02.html' (the file named, never an empty path)."""
    where = exc.filename or ""
    return f"{exc.strerror or exc}" + (f": {where}" if where else "")


def _try_index(out: Path, outcomes, params) -> None:
    try:
        write_index(out, outcomes, params)
    except OSError as exc:
        log.error("could not write %s/index.html: %s", out, exc)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def snapshot_checksum(params: dict) -> str:
    """Load (building the cache if needed) and check the snapshot, with the checks every
    notebook's set-up makes; its content checksum."""
    from .running.notebook import load_checked_snapshot

    return load_checked_snapshot(params).checksum


def escape(s: str) -> str:
    return html.escape(str(s))
