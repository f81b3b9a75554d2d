"""Running the notebooks in order into a run folder (``python -m workbook_lib run``).

Nothing is created before every check has passed (params, device, path, snapshot, the inputs of
notebooks not rerun); then each notebook is held against a second writer (:mod:`.runlock`) and
run with :func:`.papermill_run.execute_one`; a failing one does not stop the others, and
``resume`` keeps the complete ones (:func:`.resume.completeness`). SIGINT, SIGTERM and SIGHUP
stop the kernel and every process it started, keep what finished and exit 130. The index page
is written by the caller's ``write_index``: this floor knows nothing of how a page looks.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import psutil

from ..configs.validation import Params
from ..common import processes
from ..common.files import atomic_write_text
from ..configs.validation import PARAMS_FILE, check_gap, params_file_name, params_yaml
from ..exceptions import NotebookFailedError, ParamsError
from ..records import to_json
from . import environment
from .notebooks import resolve_only
from .papermill_run import NotebookOutcome, execute_one, os_error, report_files
from .resume import check_inputs_match, completeness
from .results import results_path

log = logging.getLogger(__name__)

# writes the run folder's index page from the outcomes so far: (run folder, outcomes, params)
IndexWriter = Callable[[Path, list[NotebookOutcome], dict], object]


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


def write_environment(out: Path, params: Params, names: list[str], *, resume: bool) -> Path:
    """This job's environment record in ``environment/<job>.json`` (one per job: several SLURM
    jobs share a run folder), and ``environment.json`` merged from every record
    (:func:`environment.merge_records`). A run that does not resume starts the records anew."""
    uses = any(n not in DEVICE_FREE for n in names)
    rec = {**environment.collect(params, uses_device=uses, run_level=True),
           "notebooks": list(names)}
    folder = out / "environment"
    if not resume and folder.is_dir():
        for f in folder.glob("*.json"):
            f.unlink()
    folder.mkdir(exist_ok=True)
    job = os.environ.get("SLURM_JOB_ID") or f"local-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
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


def run_notebooks(params: Params, out_dir: str | Path, *, only: list[str] | None = None,
                  show_code: bool = False, resume: bool = False, progress: bool = True,
                  log_output: bool = True,
                  write_index: IndexWriter | None = None) -> list[NotebookOutcome]:
    """Run the notebooks in order into ``out_dir`` (see the module docstring).

    Every check comes before the run folder is created; signals are handled from the start, so a
    SIGTERM while the snapshot builds is an interrupt (exit 130) like any other.

    Args:
        params: validated params (:func:`workbook_lib.configs.validation.validate`).
        out_dir: the run folder (created once every check has passed).
        only: ``--only`` values (names or numbers); None runs every notebook.
        show_code: keep the code cells in the HTML reports.
        resume: keep the notebooks complete from an earlier run (:mod:`.resume`).
        progress: progress bars; False leaves the one-line stage notes.
        log_output: show the kernel's output on the terminal.
        write_index: refreshes the run folder's index page after each notebook and at the end
            (the CLI passes ``workbook_lib.report.html.write_index``); None writes no index.

    Raises:
        ParamsError: a bad notebook name, folder, snapshot or inputs; before any work.
        RunFolderInUseError: another run holds one of these notebooks in ``out_dir``.
        NotebookFailedError: one or more notebooks failed (the others ran).
        KeyboardInterrupt: on SIGINT/SIGTERM/SIGHUP, after stopping every child process.
    """
    from .runlock import hold

    _AT_SIGNAL.clear()
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    prev = {s: signal.signal(s, _on_signal) for s in sigs} if _main_thread() else {}
    try:
        names = resolve_only(only)
        check_gap(params, names)
        if any(n not in DEVICE_FREE for n in names):  # 'cuda' without a GPU fails here, first
            environment.resolve_device(params.device)
        out = out_path(out_dir)
        checksum = snapshot_checksum(params)  # loads and checks the snapshot
        check_inputs_match(out, names, params)
        out = _check_out_dir(out)
        with hold(out, names), _run_temp(out):
            return _run_held(names, params, out, checksum, show_code=show_code, resume=resume,
                             progress=progress, log_output=log_output,
                             write_index=write_index)
    finally:
        for s, handler in prev.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _run_temp(out: Path):
    """The run's processes keep their temporary files in the run folder, removed at its end
    (``TMPDIR`` and ``tempfile`` restored)."""
    import shutil

    from ..common.files import restore_temp, use_run_temp

    before = os.environ.get("TMPDIR")
    d = use_run_temp(out, "run")
    try:
        yield d
    finally:
        restore_temp(before)
        shutil.rmtree(d, ignore_errors=True)
        with contextlib.suppress(OSError):
            d.parent.rmdir()  # when no other process of the run keeps files there


def _run_held(names: list[str], params: Params, out: Path, checksum: str, *, show_code: bool,
              resume: bool, progress: bool, log_output: bool,
              write_index: IndexWriter | None) -> list[NotebookOutcome]:
    """The run itself, the folder created and held."""
    try:
        write_environment(out, params, names, resume=resume)
    except OSError as exc:  # recorded; each notebook records its own environment too
        log.error("could not write %s: %s", out / "environment.json", os_error(exc))
    text = params_yaml(params)
    for name in (PARAMS_FILE, params_file_name(params)):  # what `equal` and a rerun take as
        try:  # --params: the last run's, and these params' own (05 names it)
            atomic_write_text(out / name, text)
        except OSError as exc:
            log.error("could not write %s: %s", out / name, os_error(exc))
    outcomes: list[NotebookOutcome] = []
    seen: dict[int, psutil.Process] = {}
    from ..common.progress import progress as bar_of

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
                outcomes.append(NotebookOutcome(name, "failed", error=os_error(exc)))
                continue
            o = execute_one(name, params, out, show_code=show_code, progress=progress,
                            log_output=log_output)
            outcomes.append(o)
            if o.status == "failed":
                log.error("%s FAILED at %s: %s (partial notebook kept: %s)", name, o.where,
                          o.error, out / f"{name}.ipynb")
            _try_index(write_index, out, outcomes, params)
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
        _try_index(write_index, out, outcomes, params)
        raise
    _try_index(write_index, out, outcomes, params)
    failures = [o for o in outcomes if o.status == "failed"]
    if failures:
        summary = "; ".join(f"{o.name} ({o.where}): {o.error}" for o in failures)
        raise NotebookFailedError(f"{len(failures)} notebook(s) failed: {summary}",
                                  failures=failures)
    return outcomes



def _try_index(write_index: IndexWriter | None, out: Path, outcomes, params) -> None:
    if write_index is None:
        return
    try:
        write_index(out, outcomes, params)
    except OSError as exc:
        log.error("could not write %s/index.html: %s", out, exc)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def snapshot_checksum(params: Params) -> str:
    """Load (building the cache if needed) and check the snapshot, with the checks every
    notebook's set-up makes; its content checksum."""
    from .notebook import load_checked_snapshot

    return load_checked_snapshot(params).checksum
