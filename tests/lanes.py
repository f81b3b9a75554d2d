"""Jobs of an ``alone`` test file in fresh processes, in lanes of one pinned CPU each: the
matrix's cases (``test_matrix.py``) and the planted pairs (``test_planted.py``).

Each job is a small timed run on one compute thread. One at a time they leave every CPU but one
idle; two unpinned at a time, each waits for the CPU the other holds and its figures are marked
contended (measured: a sub-millisecond gap, in two of three runs). So each lane, one per physical
core, takes the next job from a shared queue and runs it in a process pinned to the lane's CPU
before the job starts (``os.sched_setaffinity``): no job waits for another's CPU. Written here,
not found in a library: ``concurrent.futures`` and ``multiprocessing.Pool`` pin no worker, and
pytest-xdist runs tests, not jobs inside one test's fixture.

Jobs that start processes of their own (a notebook's probes, DDP ranks, a DataLoader worker)
need more than one CPU: they run first, one at a time, unpinned (``whole``).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

MAX_LANES = 4  # as the suite's workers (tests/conftest.py)


def lane_cpus() -> list[int]:
    """One allowed CPU per physical core (two hyperthreads of one core would slow each other
    where the contention meter cannot see it), at most :data:`MAX_LANES`: the lanes' CPUs; []
    for one core."""
    seen, cpus = set(), []
    for cpu in sorted(os.sched_getaffinity(0)):
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            core = (topo / "physical_package_id").read_text().strip(), \
                (topo / "core_id").read_text().strip()
        except OSError:
            core = ("cpu", str(cpu))  # no topology: each CPU its own core
        if core not in seen:
            seen.add(core)
            cpus.append(cpu)
    return cpus[:MAX_LANES] if len(cpus) > 1 else []


@contextlib.contextmanager
def fork_server(preload: list[str], paths: list[str]) -> Iterator:
    """multiprocessing's fork server, which imports ``preload`` once (PyTorch and the modules the
    jobs use), with ``paths`` on its ``PYTHONPATH`` (the test modules it imports); yields its
    context."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(preload)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([before] if before else []))
    try:
        yield ctx
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def pinned(fn: Callable, cpu: int | None, args: tuple):
    """``fn(*args)`` in this process, pinned to ``cpu`` first where given."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    return fn(*args)


def run(ctx, fn: Callable, jobs: dict[str, tuple], whole: tuple[str, ...] = ()) -> dict:
    """``fn(*jobs[key])`` for every key, each in a fresh process of ``ctx``: the keys in
    ``whole`` first, one at a time, unpinned; then the others in lanes (:func:`lane_cpus`; one
    unpinned lane on one core), in the order given (put the longest first). ``fn`` must be
    importable by the fork server. Returns key -> what ``fn`` returned; the first exception a
    job raised is raised, after the lanes stop taking jobs."""
    done: dict = {}
    first = [k for k in jobs if k in whole]
    with ProcessPoolExecutor(1, mp_context=ctx, max_tasks_per_child=1) as pool:
        for k in first:
            done[k] = pool.submit(pinned, fn, None, jobs[k]).result()
    todo: queue.Queue = queue.Queue()
    for k in jobs:
        if k not in whole:
            todo.put(k)
    failed: list[BaseException] = []

    def lane(cpu):
        try:
            with ProcessPoolExecutor(1, mp_context=ctx, max_tasks_per_child=1) as pool:
                while not failed:
                    try:
                        k = todo.get_nowait()
                    except queue.Empty:
                        return
                    done[k] = pool.submit(pinned, fn, cpu, jobs[k]).result()
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            failed.append(exc)

    threads = [threading.Thread(target=lane, args=(cpu,)) for cpu in lane_cpus() or [None]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return done
