"""One notebook run by papermill into a run folder, and its HTML report.

The notebook runs from its jupytext source in a fresh kernel, every params key injected as a
papermill parameter. Its executed notebook, HTML report (code hidden unless ``show_code``,
figures inline) and results JSON land in the run folder; a failing notebook keeps its partial
output, the failing cell marked, and a file that cannot be written fails it, naming the file.
"""
from __future__ import annotations

import errno
import functools
import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..configs.validation import Params
from ..common import progress as terminal
from ..common.files import atomic_write_text
from ..measurement import cpu
from ..paths import PACKAGE_DIR
from ..records import to_json
from .notebooks import notebook_dir, notebook_node
from .results import read_results, results_path

log = logging.getLogger(__name__)


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

    templates = PACKAGE_DIR / "report" / "templates"
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
# are not about the workbook; its errors still reach the terminal, except the one traceback a
# shutdown can race into (kernel_quiet says which).
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR",
                    "--IPKernelApp.extensions=workbook_lib.running.kernel_quiet"]


@functools.cache
def kernel_manager_class():
    """papermill's kernel manager (jupyter_client's ``AsyncKernelManager``), except that shutting
    down a kernel never interrupts it first: on a loaded machine that SIGINT can land in the
    kernel's reply handler and print a traceback on the run's terminal. Everything else (the
    shutdown request, the wait, the kill, an interrupt on a cell's time-out) is jupyter_client's.
    Built on first use.
    """
    from jupyter_client.manager import AsyncKernelManager

    class NoInterruptAtShutdown(AsyncKernelManager):
        _in_shutdown = False

        async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
            self._in_shutdown = True
            try:
                await super().shutdown_kernel(now=now, restart=restart)
            finally:
                self._in_shutdown = False

        async def _async_interrupt_kernel(self) -> None:
            if not self._in_shutdown:
                await super()._async_interrupt_kernel()

    return NoInterruptAtShutdown


class _EveryKeyInjected(logging.Filter):
    """The runner injects every params key into every notebook (each notebook's parameters cell
    lists only the keys it reads, and validates all): papermill's "unknown parameter" notes for
    the others say nothing to a reader of the terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Passed unknown parameter")


logging.getLogger("papermill").addFilter(_EveryKeyInjected())


DISK_FULL = os.strerror(errno.ENOSPC)  # "No space left on device"


@functools.cache
def atomic_notebook_writes() -> None:
    """papermill writes the output notebook after every cell, with a plain ``open``: on a full
    disk that leaves a notebook cut mid-way (not JSON). From here on, papermill's writes to an
    absolute path go through a temporary file and a rename: the notebook is whole (the last
    cell it held) or absent."""
    from papermill.iorw import LocalHandler, papermill_io

    class AtomicLocalHandler(LocalHandler):
        def write(self, buf, path):
            atomic_write_text(Path(path), buf)

    papermill_io.register("/", AtomicLocalHandler())


def execute_one(name: str, params: Params, out_dir: Path, *, show_code: bool = False,
                progress: bool = True, log_output: bool = True) -> NotebookOutcome:
    """Run one notebook with papermill into ``out_dir``; export its HTML (also on failure)."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    atomic_notebook_writes()
    out_nb, out_html = out_dir.resolve() / f"{name}.ipynb", out_dir / f"{name}.html"
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
            pm.execute_notebook(notebook_node(name), str(out_nb),
                                parameters={**to_json(params), "run_dir": str(out_dir)},
                                cwd=str(notebook_dir()), kernel_name="python3",
                                progress_bar=progress, log_output=log_output,
                                extra_arguments=KERNEL_ARGUMENTS,
                                kernel_manager_class=kernel_manager_class())
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
        outcome.error = f"{type(exc).__name__}: {os_error(exc) if exc.filename else exc}" + (
            "" if exc.filename else f" (writing {out_nb})")
        outcome.failed_cell = _failed_cell(out_nb)
    except Exception as exc:  # noqa: BLE001 - a dead kernel etc.: recorded, the run goes on
        outcome.status, outcome.error = "failed", f"{type(exc).__name__}: {exc}"
        outcome.failed_cell = _failed_cell(out_nb)
    outcome.seconds = time.perf_counter() - t0
    if DISK_FULL in (outcome.error or ""):  # said once: no report is attempted on a full disk
        outcome.error = f"the disk is full ({outcome.error}); free space and run again with " \
                        "--resume"
    elif out_nb.is_file():
        try:
            export_html(out_nb, out_html, show_code=show_code)
        except Exception as exc:  # noqa: BLE001 - a report that cannot be written: not complete
            why = os_error(exc) if isinstance(exc, OSError) else str(exc)
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



def os_error(exc: OSError) -> str:
    """'No space left on device: /run/02.html' (the file named, never an empty path)."""
    where = exc.filename or ""
    return f"{exc.strerror or exc}" + (f": {where}" if where else "")

