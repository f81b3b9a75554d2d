"""Jobs of an ``alone`` test file in fresh processes, in lanes of one pinned CPU each: the
matrix's cases (``test_matrix.py``) and the planted pairs (``test_planted.py``).

Each job is a small timed run on one compute thread. One at a time they leave every CPU but one
idle (the matrix took 335 s so on the 2-core reference machine, 165-190 s in lanes); two
unpinned at a time, a case's sub-millisecond gap was measured contended in two of three runs.
So each lane, one per physical core the process may use, takes the next job from a shared queue
and runs it in a fresh process pinned to the lane's CPU before the job starts
(``os.sched_setaffinity``). Hand-written: a process pool pins its workers (an ``initializer``),
but one pool per CPU fed from one queue, the whole-machine jobs first, is not a library's.

Jobs that start processes of their own (a notebook's probes, DDP ranks, a DataLoader worker)
need more than one CPU: they run first, one at a time, unpinned (``whole``). On one physical
core (two hyperthreads included) there is one unpinned lane: the jobs run one at a time.

In a lane nothing else is free to take a stray process that wakes on the job's CPU, which can
slow one step of a pair's fast pipeline past the slow one's; on 5 to 8 paired steps every pair
must agree for a gap to be resolved (``gap.resolved``), so jobs whose expectation needs a
resolved gap time :data:`STEADY` steps (measured: a 1.81x gap went unresolved on one such pair
in 2 of 6 runs at 6 steps).
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
# from 9 paired steps the gap's rule judges by quartiles and the median's interval: one
# disturbed pair no longer vetoes a gap (the params of a judged job)
STEADY = {"loop_steps": 9, "loop_max_steps": 9}


def lane_cpus() -> list[int]:
    """One allowed CPU per physical core (two hyperthreads of one core would slow each other
    where the contention meter cannot see it), as many as the process may use (a cgroup quota
    or SLURM's allocation can be tighter than the affinity: ``allowed_cpus``), at most
    :data:`MAX_LANES`: the lanes' CPUs; [] where that is one."""
    from workbook_lib.measurement.cpu_allowance import allowed_cpus

    seen, cpus = set(), []
    for cpu in sorted(os.sched_getaffinity(0)):
        try:
            core = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") \
                .read_text().strip()
        except OSError:
            core = str(cpu)  # no topology: each CPU its own core
        if core not in seen:
            seen.add(core)
            cpus.append(cpu)
    n = min(MAX_LANES, len(cpus), int(allowed_cpus().cpus))
    return cpus[:n] if n > 1 else []


@contextlib.contextmanager
def fork_server(preload: list[str], paths: list[str]) -> Iterator:
    """multiprocessing's fork server, which imports ``preload`` once (PyTorch and the modules the
    jobs use), with ``paths`` on its ``PYTHONPATH`` (the test modules it imports); yields its
    context. The server is one per process: where an earlier test of this worker started it,
    its own preload stands (the children still get this process's ``sys.path``)."""
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
    """``fn(*args)`` in this fresh process, pinned to ``cpu`` first where given, on one compute
    thread, with the platform's start method for the processes it starts (DataLoader
    workers)."""
    import torch

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    multiprocessing.set_start_method(None, force=True)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    return fn(*args)


def _named(exc: BaseException, key: str) -> BaseException:
    exc.add_note(f"(job {key!r}, tests/lanes.py)")
    return exc


def _drain(ctx, fn: Callable, jobs: dict[str, tuple], todo: queue.Queue, cpu: int | None,
           stop: threading.Event, failed: list, done: dict) -> None:
    """One lane: the jobs of ``todo``, one at a time, each in a fresh process of ``ctx`` pinned
    to ``cpu`` (None: unpinned), until the queue is empty or ``stop`` is set; what each returns
    into ``done``, the first exception (a job's, named; the pool's; an interrupt) into
    ``failed``, which sets ``stop``."""
    try:
        with ProcessPoolExecutor(1, mp_context=ctx, max_tasks_per_child=1) as pool:
            while not stop.is_set():
                try:
                    k = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    done[k] = pool.submit(pinned, fn, cpu, jobs[k]).result()
                except BaseException as exc:
                    failed.append(_named(exc, k))
                    stop.set()
    except BaseException as exc:  # the pool itself: raised by the caller
        failed.append(exc)
        stop.set()


def run(ctx, fn: Callable, jobs: dict[str, tuple], whole: tuple[str, ...] = ()) -> dict:
    """``fn(*jobs[key])`` for every key, each in a fresh process of ``ctx`` (:func:`pinned`):
    the keys in ``whole`` first, one at a time, unpinned (one lane in this thread); then the
    others in lanes (:func:`lane_cpus`; one unpinned lane where there is one core), in the
    order given (put the longest first). ``fn`` must be importable by the fork server. Returns
    key -> what ``fn`` returned. The first exception a job raised is raised, naming the job,
    once every lane has stopped; so is an interrupt of the caller (no job starts after it)."""
    missing = set(whole) - set(jobs)
    if missing:
        raise ValueError(f"whole-machine jobs not among the jobs: {sorted(missing)}")
    done: dict = {}
    failed: list[BaseException] = []
    stop = threading.Event()
    first: queue.Queue = queue.Queue()
    todo: queue.Queue = queue.Queue()
    for k in jobs:
        (first if k in whole else todo).put(k)
    _drain(ctx, fn, jobs, first, None, stop, failed, done)
    threads = [threading.Thread(target=_drain, args=(ctx, fn, jobs, todo, cpu, stop, failed,
                                                     done))
               for cpu in ([] if failed else lane_cpus() or [None])]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    finally:  # an interrupt (a timeout's signal, Ctrl-C): the lanes take no further job
        stop.set()
        for t in threads:
            t.join()
    if failed:
        raise failed[0]
    return done
