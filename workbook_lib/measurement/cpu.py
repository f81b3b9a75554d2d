"""What the process got of the CPUs while it was timed, who else used them, and how many CPUs
it may use.

A machine shared with another CPU-heavy job can look quiet: every step is slowed by the same
amount, so the IQR stays small while the median is wrong by orders of magnitude (a step made of
many small parallel regions waits at each region's barrier for a thread that is not scheduled).
The spread of the samples cannot see that; what the process got of the CPUs can. A
:class:`CpuMeter` therefore runs beside every timed region (the loop's steps, :func:`measure`,
:func:`interleave`) and records, over exactly the timed intervals:

* **CPU use**: the process's CPU time (user + system, all its threads:
  ``time.process_time``) over wall time x its compute threads (``torch.get_num_threads()``, at
  most the CPUs it may use). Child processes (DataLoader workers) are not counted here: their CPU
  time is in their own processes (they are in the run's process tree below).
* **Share of the CPU its compute threads asked for**: their run time over their run time plus
  their run-queue wait (the time they were ready to run and no CPU was free), from the kernel's
  per-thread ``/proc/self/task/*/schedstat``. A thread that sleeps (waiting for a batch, idle
  between parallel regions) asks for nothing, so a serial step alone still gets ~100%; beside a
  CPU hog it gets what the scheduler leaves it. *Compute threads* are the main thread (which
  runs the timed step) and the threads native code starts for it under its name (PyTorch's
  intra-op OpenMP threads); the others are *helpers*, their run and wait recorded apart and not
  ruled on: Python threads beside the main one (ipykernel's I/O threads, a rank's heartbeat) and
  threads a library named for itself (``gloo_tcp_loop``, ``pt_gloo_runloop``, ``ZMQbg/IO/0``,
  ``cuda-EvtHandlr``).
  Measured on this project's 2-CPU machine at ``params/ci.yaml``, with the run given priority
  over the machine's other processes: a DDP rank of 2 (1 thread each, a configuration that
  fits) got 42-62% over all its threads; its main thread got ~90% while gloo's threads, woken
  for each message while both CPUs ran the two ranks' compute, got 14-69%: a cost of DDP on
  those CPUs that every rerun pays, not a disturbance (judged on compute threads: 86-100%).
* **CPU pressure**: the share of wall time in which some task on the machine waited for a CPU
  (``/proc/pressure/cpu``, "some"), where the kernel exposes it; "not available here" otherwise,
  never a guess. It is machine-wide context: other jobs waiting among themselves raise it.
* **Who else used the CPUs**: the machine's busy CPU time on the CPUs this process may run on
  (``/proc/stat``'s ``cpuN`` lines of its affinity: user + nice + system + irq + softirq +
  steal) and this run's process tree's CPU time over the same intervals; the difference is
  **other jobs' use**, both in CPUs (CPU-seconds per wall-second). The tree is the run's root
  process and all its descendants: the root is named by ``WORKBOOK_RUN_ROOT`` (set by ``python
  -m workbook_lib run`` to itself, so that papermill, the notebook kernel, torchrun, the ranks
  and their DataLoader workers all count as this run; the torchrun launcher passes it on to the
  ranks, and a rank whose root is on another node takes its node's torchrun agent), where that
  process is this one or an ancestor of it, else this process. Each process
  counts with user + system + the CPU time of its reaped children (``/proc/PID/stat``), so a
  DataLoader worker that exits and is reaped between two reads still counts (in its parent);
  one whose parent left the tree before reaping it (an orphan) takes its CPU time with it and
  counts as another job's. ``/proc/stat`` and ``/proc/PID/stat`` count in ticks of 10 ms, so
  each interval's difference is off by about a tick: other jobs' use is told over the timed
  intervals when that resolution (:func:`resolution`: tick x sqrt(intervals) / their wall time)
  is within :data:`RESOLUTION` (0.025 CPU), else over the span from the first interval's start
  to the last one's end (one difference; the loop's arms take turns within it) when its
  resolution is, else not at all.

**The rules.** A figure is *contended* (:data:`CONTENDED_BELOW`) when its compute threads got
less than 80% of the CPU time they asked for (run / (run + run-queue wait) < 0.8). Where the
kernel has no per-thread schedstat, the CPU use (CPU time / (wall x threads)) is ruled on
instead, with the same 80%: a weaker proxy, since a serial step uses one thread of several alone
too, and the figure says which rule it was judged by. Pressure is reported, not ruled on: it
counts other jobs' waits among themselves.

A contended figure's **cause** (:attr:`CpuShare.cause`) is *other jobs* when other jobs used at
least :data:`OTHERS_SEEN` (0.1) of a CPU on average over the window, else *this run's own
processes* (self-oversubscription: its ranks, DataLoader workers, threads beyond its CPUs), named
with the configuration that fits (:func:`fit_threads`). 0.1 CPU is five times an idle machine's
background (the kernel's threads, the system's daemons, interrupts and the hypervisor's steal:
0.02 CPU, measured over a minute on this project's 2-CPU machine) and four times the coarsest
resolution it is told with; it is low on purpose: a job using a tenth of a CPU already costs a
step of a few milliseconds a scheduler slice now and then, which is enough to make it contended
(measured: 4 ms data-only steps beside other jobs using 0.14 CPU got 74% of their CPU). Both
causes keep the figure marked and not relied on: a figure contended by its own processes
measures threads waiting for each other on a configuration whose threads outnumber its CPUs, not
the pipeline; its remedy is the configuration that fits, not a rerun. Where ``/proc/stat`` or
the tree cannot be read, or the window is too short for the ticks, the cause is *not told
apart*, and said so.

:func:`allowed_cpus` says how many CPUs the process may use: the tightest of its affinity
(``os.sched_getaffinity``), the cgroup's CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``) and SLURM's allocation (``SLURM_CPUS_PER_TASK``, else
``SLURM_CPUS_ON_NODE``); :func:`fit_threads` turns that into compute threads per process for
``procs`` processes with ``workers`` DataLoader workers each.

Written here rather than taken from a library: psutil gives a process's CPU times but neither
the per-thread run-queue wait nor CPU pressure nor cgroup quotas; these are a few ``/proc`` and
``/sys`` reads. The process tree is walked through ``/proc/PID/task/TID/children`` (a few reads
per process of the tree) rather than psutil's ``Process.children``, which reads every process
of the machine: 4.5 ms per call on this project's busy 2-CPU machine, twice per timed step;
psutil is the fallback where the kernel has no ``children`` file.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# the CPUs this process may use (cpu_allowance) and what it got of them (cpu_share): read from
# here by every measurement
from .cpu_allowance import CpuAllowance, ThreadFit, allowed_cpus, fit_threads  # noqa: F401
from ..results.cpu import (CONTENDED_BELOW, NOT_TOLD, OTHER_JOBS, OTHERS_SEEN,  # noqa: F401
                        OWN_PROCESSES, RESOLUTION, RULE, RULE_FALLBACK, TICKS, CpuShare,
                        causes_text, resolution, worse)

ROOT_ENV = "WORKBOOK_RUN_ROOT"  # the pid of the run's root process (see the module docstring)
PRESSURE_PATH = Path("/proc/pressure/cpu")


# ---------------------------------------------------------------------------------------------
# what the process got while it was timed, and who else used its CPUs


def read_pressure(path: Path = PRESSURE_PATH) -> float | None:
    """Total microseconds in which some task waited for a CPU (``some total=``), or None where
    the kernel does not expose CPU pressure."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("some"):
            for part in line.split():
                if part.startswith("total="):
                    return float(part[6:])
    return None


def _read(path: str) -> str | None:
    """A small ``/proc`` file's text, or None where it cannot be read. Plain ``os`` calls on
    string paths: the meter reads some thirty of these around every timed call, and ``open()``
    with ``pathlib`` joins made each read of a notebook kernel's 15 threads cost about 3 ms
    (a third of 02's ci run was the meter)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 65536).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _comm(path) -> str | None:
    text = _read(os.fspath(path))
    return None if text is None else text.strip()


def python_threads() -> set[int]:
    """Native ids of this process's Python threads other than the main thread."""
    main = threading.main_thread()
    return {t.native_id for t in threading.enumerate()
            if t is not main and t.native_id is not None}


def read_threads(task_dir: Path = Path("/proc/self/task"), *,
                 names: dict[int, bool] | None = None, python: set[int] | None = None
                 ) -> dict[int, tuple[int, int, bool]] | None:
    """Per thread of this process: (ns run on a CPU, ns waiting on a run queue, helper?), or
    None where the kernel has no schedstat. A *helper* is a thread whose name differs from the
    main thread's (a library named it for itself: ``gloo_tcp_loop``, ``ZMQbg/IO/0``) or one of
    ``python`` (Python threads beside the main one: ipykernel's I/O, a heartbeat).

    Args:
        task_dir: the process's ``task`` folder.
        names: a cache tid -> named as a helper? (a thread's name is read once).
        python: native ids of Python threads that are helpers (default: none).
    """
    out = {}
    base = os.fspath(task_dir)
    try:
        tids = os.listdir(base)
    except OSError:
        return None
    cache = {} if names is None else names
    main = None
    for tid in tids:
        text = _read(f"{base}/{tid}/schedstat")
        if text is None:
            continue  # a thread that ended meanwhile
        try:
            run, wait = text.split()[:2]
        except ValueError:
            continue
        t = int(tid)
        if t not in cache:
            if main is None:
                main = _comm(os.path.dirname(base) + "/comm") or ""
            name = _comm(f"{base}/{tid}/comm")
            cache[t] = name is not None and name != main
        out[t] = (int(run), int(wait), cache[t] or t in (python or ()))
    return out or None


_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system (idle iowait) irq softirq steal


def read_busy(cpus: set[int] | None = None, path: Path = Path("/proc/stat")) -> float | None:
    """Seconds the machine's CPUs in ``cpus`` (all where None) were busy since boot: user + nice
    + system + irq + softirq + steal of their ``cpuN`` lines; None where unreadable."""
    text = _read(os.fspath(path))
    if text is None:
        return None
    total, seen = 0, 0
    for line in text.splitlines():
        parts = line.split()
        if not parts or not parts[0].startswith("cpu") or not parts[0][3:].isdigit():
            continue
        if cpus is not None and int(parts[0][3:]) not in cpus:
            continue
        vals = parts[1:]
        total += sum(int(vals[i]) for i in _BUSY_FIELDS if i < len(vals))
        seen += 1
    return total / TICKS if seen else None


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (field 3 onwards), or None."""
    text = _read(f"{os.fspath(proc)}/{pid}/stat")
    if text is None:
        return None
    return text[text.rfind(")") + 2:].split()


def _parent(pid: int, proc: Path = Path("/proc")) -> int | None:
    f = _stat_fields(pid, proc)
    return int(f[1]) if f else None


def _children(pid: int, proc: Path) -> list[int] | None:
    """The children of ``pid`` from its threads' ``children`` files; None where the kernel has
    none (then the caller asks psutil)."""
    task = f"{os.fspath(proc)}/{pid}/task"
    try:
        tids = os.listdir(task)
    except OSError:
        return []
    kids: list[int] = []
    for tid in tids:
        try:
            fd = os.open(f"{task}/{tid}/children", os.O_RDONLY)
        except FileNotFoundError:
            if not os.path.exists(f"{task}/{tid}"):
                continue  # the thread ended
            return None
        except OSError:
            continue
        try:
            kids.extend(int(x) for x in os.read(fd, 65536).split())
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
    return kids


def tree_pids(root: int, proc: Path = Path("/proc")) -> list[int]:
    """``root`` and all its descendants (processes that end meanwhile are left out)."""
    out, stack, seen = [], [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        kids = _children(pid, proc)
        if kids is None:  # no children files: psutil walks the whole machine instead
            import psutil

            try:
                return [root] + [c.pid for c in psutil.Process(root).children(recursive=True)]
            except psutil.Error:
                return [root]
        stack.extend(kids)
    return out


def tree_cpu(root: int, proc: Path = Path("/proc")) -> tuple[float, int] | None:
    """(CPU seconds, processes) of ``root`` and its descendants: each process's user + system
    time plus its reaped children's (``/proc/PID/stat`` fields 14-17), this process's own from
    ``time.process_time`` (exact, not in ticks); None where ``root``'s stat cannot be read."""
    me = os.getpid()
    total, n = 0.0, 0
    for pid in tree_pids(root, proc):
        f = _stat_fields(pid, proc)
        if f is None or len(f) < 15:
            if pid == root:
                return None
            continue
        utime, stime, cutime, cstime = (int(x) for x in f[11:15])
        if pid == me:
            total += time.process_time() + (cutime + cstime) / TICKS
        else:
            total += (utime + stime + cutime + cstime) / TICKS
        n += 1
    return total, n


def run_root(environ: dict | None = None, proc: Path = Path("/proc")) -> int:
    """The run's root process: ``WORKBOOK_RUN_ROOT`` when it names this process or an ancestor
    of it, else this process (see the module docstring)."""
    env = os.environ if environ is None else environ
    me = os.getpid()
    v = str(env.get(ROOT_ENV, "")).strip()
    if not v.isdigit():
        return me
    want, pid = int(v), me
    if want <= 1:  # init: the whole machine would count as this run
        return me
    for _ in range(64):  # up the parent chain
        if pid == want:
            return want
        if pid is None or pid <= 1:
            break
        pid = _parent(pid, proc)
    return me


def mark_run_root(environ: dict | None = None) -> int:
    """Name the run's root in ``environ`` (default ``os.environ``) for the processes started
    from here: an existing valid root is kept, else this process is the root."""
    env = os.environ if environ is None else environ
    root = run_root(env)
    env[ROOT_ENV] = str(root)
    return root


@dataclass
class _Snap:
    wall: float
    cpu: float
    threads: dict[int, tuple[int, int, bool]] | None
    pressure: float | None
    busy: float | None
    tree: tuple[float, int] | None


class CpuMeter:
    """Accumulates what the process got of the CPUs over timed intervals, and what the
    machine and the run's process tree used over them.

    ``begin()`` before an interval and ``end()`` after it (outside the timed region: the reads
    cost well under a millisecond); ``share()`` sums them. An interval whose schedstat, pressure,
    ``/proc/stat`` or tree could not be read leaves those figures out (None), never guessed.

    Args:
        threads: the compute threads the work uses (default: ``torch.get_num_threads()`` at
            each ``begin``).
        allowance: the CPUs it may use (default: :func:`allowed_cpus`).
        children: what the figure says about child processes' CPU time.
        procs: the run's processes sharing these CPUs (DDP ranks on the node).
        workers: DataLoader worker processes of each.
        root: the run's root process (default: :func:`run_root`).
    """

    def __init__(self, threads: int | None = None, allowance: CpuAllowance | None = None,
                 children: str | None = None, *, procs: int = 1, workers: int = 0,
                 root: int | None = None):
        if procs < 1:
            raise ValueError(f"'procs' must be a positive integer (got {procs})")
        if workers < 0:
            raise ValueError(f"'workers' must be >= 0 (got {workers})")
        self._fixed_threads = threads
        self.allowance = allowance or allowed_cpus()
        self.children = children
        self.procs, self.workers = procs, workers
        self.root = run_root() if root is None else root
        try:
            self.cpus: set[int] | None = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self.cpus = None
        self._names: dict[int, bool] = {}
        self._start: _Snap | None = None
        self._first: _Snap | None = None
        self._last: _Snap | None = None
        self._threads: list[int] = []
        self.wall = self.cpu = 0.0
        self.run: float | None = 0.0
        self.wait: float | None = 0.0
        self.helper_run: float | None = 0.0
        self.helper_wait: float | None = 0.0
        self.pressure: float | None = 0.0
        self.busy: float | None = 0.0
        self.tree: float | None = 0.0
        self.tree_procs = 0
        self.n = 0

    def _threads_now(self) -> int:
        if self._fixed_threads is not None:
            return self._fixed_threads
        import torch

        return torch.get_num_threads()

    def _snap(self) -> _Snap:
        return _Snap(time.perf_counter(), time.process_time(),
                     read_threads(names=self._names, python=python_threads()),
                     read_pressure(), read_busy(self.cpus), tree_cpu(self.root))

    def begin(self) -> None:
        self._threads.append(self._threads_now())
        self._start = self._snap()
        if self._first is None:
            self._first = self._start

    def end(self) -> None:
        if self._start is None:
            raise RuntimeError("CpuMeter.end() without begin()")
        a, b = self._start, self._snap()
        self._start, self._last = None, b
        self.wall += b.wall - a.wall
        self.cpu += b.cpu - a.cpu
        if a.threads is None or b.threads is None or self.run is None:
            self.run = self.wait = self.helper_run = self.helper_wait = None
        else:
            for tid, (run, wait, helper) in b.threads.items():
                r0, w0, _ = a.threads.get(tid, (0, 0, helper))  # a new thread counts from 0
                if helper:
                    self.helper_run += (run - r0) / 1e9
                    self.helper_wait += (wait - w0) / 1e9
                else:
                    self.run += (run - r0) / 1e9
                    self.wait += (wait - w0) / 1e9
        if a.pressure is None or b.pressure is None or self.pressure is None:
            self.pressure = None
        else:
            self.pressure += (b.pressure - a.pressure) / 1e6
        if None in (a.busy, b.busy, self.busy):
            self.busy = None
        else:
            self.busy += b.busy - a.busy
        if a.tree is None or b.tree is None or self.tree is None:
            self.tree = None
        else:
            self.tree += b.tree[0] - a.tree[0]
            self.tree_procs = max(self.tree_procs, a.tree[1], b.tree[1])
        self.n += 1

    def cancel(self) -> None:
        """Drop an interval begun and not ended (the timed work raised)."""
        self._start = None

    def __enter__(self) -> "CpuMeter":
        self.begin()
        return self

    def __exit__(self, *exc) -> None:
        if self._start is not None:
            self.end()

    def share(self) -> CpuShare | None:
        """The intervals so far; None before the first."""
        if self.n == 0:
            return None
        threads = max(self._threads) if self._threads else 1
        allowed = self.allowance.cpus
        kw = {} if self.children is None else {"children": self.children}
        a, b = self._first, self._last
        span = span_busy = span_tree = None
        if a is not None and b is not None:
            span = b.wall - a.wall
            if a.busy is not None and b.busy is not None:
                span_busy = b.busy - a.busy
            if a.tree is not None and b.tree is not None:
                span_tree = b.tree[0] - a.tree[0]
        return CpuShare(wall_s=self.wall, cpu_s=self.cpu, threads=min(threads, allowed),
                        allowed=allowed, intervals=self.n, run_s=self.run, wait_s=self.wait,
                        pressure_s=self.pressure, helper_run_s=self.helper_run,
                        helper_wait_s=self.helper_wait, requested=threads, procs=self.procs,
                        workers=self.workers,
                        cpus_seen=len(self.cpus) if self.cpus else None,
                        busy_s=self.busy, tree_s=self.tree, span_s=span,
                        span_busy_s=span_busy, span_tree_s=span_tree,
                        tree_procs=self.tree_procs or None, **kw)
