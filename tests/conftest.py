import contextlib
import fcntl
import logging
import multiprocessing.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from workbook_lib.data.snapshots import CellGraph, content_checksum
from workbook_lib.configs.cells import parameters_cell
from workbook_lib.configs.validation import load_params_file

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WORKBOOK_PROGRESS", "0")

# The suite's processes (PyG writes a module file per MessagePassing class and process) keep
# their temporary files in a folder of their own, removed at the end: not the system's
_TMP = tempfile.mkdtemp(prefix="wb-tests-")
os.environ["TMPDIR"] = _TMP
tempfile.tempdir = None


def _remove_tmp() -> None:
    shutil.rmtree(_TMP, ignore_errors=True)


# after multiprocessing's own clean-up of its folders in it (exit priority -100)
multiprocessing.util.Finalize(None, _remove_tmp, exitpriority=-200)

# ------------------------------------------------------------------ side-by-side workers
# ``make test`` runs the suite in pytest-xdist workers, one file per worker at a time
# (``--dist loadfile``: a file's fixtures run once), longest files first. Each worker and the
# processes it starts (kernels, CLI runs, torchrun ranks) get an equal share of the allowed CPUs
# as compute threads: two PyTorch processes with two OpenMP threads each on two CPUs spin
# against each other and run many times slower (docs/development.md). ``pytest`` alone runs
# the suite in this one process with every thread.
MAX_WORKERS = 4  # beyond this the longest file bounds the suite's time, and memory grows


def _allowed_cpus() -> int:
    from workbook_lib.measurement.cpu_allowance import allowed_cpus
    return allowed_cpus().cpus


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: `-n auto`
def pytest_xdist_auto_num_workers(config):
    return max(1, min(MAX_WORKERS, _allowed_cpus()))


def _share_the_cpus() -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # the product's own rule for processes sharing the CPUs
        from workbook_lib.measurement.cpu_allowance import fit_threads
        threads = fit_threads(procs=workers).threads
        os.environ["OMP_NUM_THREADS"] = str(threads)  # what the worker's processes inherit
        torch.set_num_threads(threads)


_share_the_cpus()

# The files that take longest (seconds, one process on the 2-core reference machine), run first:
# the last file to start should be a short one
LONGEST_FIRST = ["test_notebooks.py",  # 260: every notebook under papermill, its habits
                 "test_own_pipelines_e2e.py",  # 180: the CLI run of user pipelines, examples
                 "test_matrix.py",  # 185: the matrix of pipeline sets, in pinned lanes
                 "test_cluster.py", "test_ddp.py", "test_runner_cli.py",  # 90-120 each
                 "test_faulty.py", "test_equal.py", "test_measurement.py"]  # 40-90 each


def _quiet(limit_s: float = 60.0, idle: float = 0.15) -> None:
    """Before an alone test: wait (at most ``limit_s``) until the machine's CPUs are idle, so that
    processes a previous test left exiting (kernels, ranks, loader workers) are gone: three
    samples of 0.1 s in a row at most ``idle`` busy (a process exiting in bursts shows in one of
    them; one sample of 0.5 s cost each of the suite's 40 alone tests, most of them assertions
    on a module fixture's results, half a second on an idle machine)."""
    import time

    import psutil

    end, quiet = time.monotonic() + limit_s, 0
    while quiet < 3 and time.monotonic() < end:
        quiet = quiet + 1 if psutil.cpu_percent(interval=0.1) / 100 <= idle else 0


@contextlib.contextmanager
def _turn(config, alone: bool):
    """Run one test beside the other workers' tests, or alone (``@pytest.mark.alone``: a test
    whose assertion needs the CPUs to itself). A readers-writer lock over two files in the run's
    shared temporary folder: every test holds ``run`` shared, an alone test holds it exclusive;
    an alone test waits at ``gate`` holding it, so that no new test starts before it."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not config.option.basetemp:
        yield  # one process: nothing runs beside
        return
    shared = Path(config.option.basetemp).parent  # the controller's, one folder per worker in it
    with open(shared / "turn.gate", "a") as gate, open(shared / "turn.run", "a") as run:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(run, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        if alone:
            _quiet()
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # set-up (a file's fixtures: whole notebook runs), call and tear-down in one turn
    with _turn(item.config, alone=item.get_closest_marker("alone") is not None):
        yield


def pytest_collection_modifyitems(config, items):
    """The longest files first; a file with a test that runs alone last, so that it waits for
    the other workers' last (short) tests, not for a whole notebook run."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    last = {item.path for item in items if item.get_closest_marker("alone")}
    items.sort(key=lambda item: len(rank) + 1 if item.path in last  # stable: files keep order
               else rank.get(item.path.name, len(rank)))


def skip_when_other_jobs(loops) -> None:
    """Skip an idle-machine test whose loop figures other jobs contended (the CPU meter's cause,
    named in the reason): its rule cannot be judged on them. Contention by the run's own
    processes, or not told apart, is no reason: the test goes on and its assertions judge it."""
    from workbook_lib.measurement.cpu import OTHER_JOBS

    for key, arm in loops.arms.items():
        cpu = arm.step.cpu
        if cpu is not None and arm.step.contended and cpu.cause == OTHER_JOBS:
            pytest.skip(f"{key}: {cpu.explain()}")


@pytest.fixture
def ci_params():
    return load_params_file(ROOT / "params" / "ci.yaml")


def make_graph(num_genes=12, types=None, seed=0) -> CellGraph:
    """A small random directed graph with a few edge types (no self-loops, no duplicates)."""
    g = torch.Generator().manual_seed(seed)
    types = types or {"a": 30, "b": 20, "c": 8}
    ei = {}
    for t, e in types.items():
        codes = set()
        while len(codes) < e:
            s, d = torch.randint(0, num_genes, (2,), generator=g).tolist()
            if s != d:
                codes.add((s, d))
        arr = torch.tensor(sorted(codes, key=lambda x: (x[1], x[0]))).T.contiguous() if codes \
            else torch.empty(2, 0, dtype=torch.long)
        ei[t] = arr
    return CellGraph(name="tiny", num_genes=num_genes, edge_index=ei, source="test",
                     checksum=content_checksum(num_genes, ei))


@pytest.fixture(autouse=True)
def _quiet_logs():
    logging.getLogger("papermill").setLevel(logging.WARNING)


def builtin_pipeline(graph, name, pert, *, batch_size=4, hidden=4, layers=2, dual=True,
                     **strategy_kw):
    """A built-in strategy with a small PerturbGIN as a pipeline (for loop tests)."""
    from workbook_lib.pipelines.builtin import BuiltinPipeline
    from workbook_lib.strategies import make_strategy
    from workbook_lib.strategies.model import PerturbGIN

    s = make_strategy(name, graph, **strategy_kw)
    m = PerturbGIN(graph.num_genes, graph.edge_types, hidden=hidden, layers=layers)
    return BuiltinPipeline(s, m, pert, batch_size, dual=dual)


def write_trace(tmp_path, events):
    """A Chrome trace of complete CPU events ``(name, ts, dur, tid)`` (microseconds) in
    ``tmp_path/t.json``."""
    import json

    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": n, "ts": ts, "dur": d, "pid": 1, "tid": tid, "cat": "cpu_op"}
        for n, ts, d, tid in events]}))
    return p


def write_notebook(path, *cells):
    """A notebook whose first cell is the workbook's parameters cell (tagged for papermill),
    then ``cells``, on the python3 kernel."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                  "language": "python"}}
    p = nbformat.v4.new_code_cell(parameters_cell())
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p] + [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, str(path))
