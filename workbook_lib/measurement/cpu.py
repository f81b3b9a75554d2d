"""What the process got of the CPUs while it was timed, who else used them, and how many CPUs
it may use.

A :class:`CpuMeter` runs beside every timed region (the loop's steps, :func:`measure`,
:func:`interleave`) and records over exactly the timed intervals: CPU use (CPU time over wall x
compute threads), the share of CPU time the compute threads asked for that they got (per-thread
``schedstat``: run / (run + run-queue wait); helper threads recorded apart), CPU pressure
(``/proc/pressure/cpu``) and other jobs' use (the machine's busy time on this process's CPUs
minus the run's process tree, rooted at ``WORKBOOK_RUN_ROOT``). A figure is contended below
:data:`CONTENDED_BELOW`; its cause is *other jobs* above :data:`OTHERS_SEEN`, else this run's
own processes. :func:`allowed_cpus` and :func:`fit_threads` say how many CPUs and threads fit.
The rules and their reasons: docs/development.md, "measurement/cpu.py".

Written here rather than taken from a library: psutil gives a process's CPU times but neither
the per-thread run-queue wait nor CPU pressure nor cgroup quotas, and its ``Process.children``
reads every process of the machine; these are a few ``/proc`` and ``/sys`` reads (psutil is the
fallback where the kernel has no ``children`` file).
"""
from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# the CPUs this process may use (cpu_allowance) and what it got of them (cpu_share): read from
# here by every measurement
from ..common.device import allocator_state
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
    """A small ``/proc`` file's text, or None where it cannot be read. Plain ``os`` calls on string
    paths: the meter reads some thirty of these around every timed call (docs/figures.md).
    """
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
    system: float = 0.0  # the process's system (kernel) CPU time, all threads
    faults: int | None = None  # its minor + major page faults; None without getrusage


@functools.cache  # measured once per process
def accounting_tick() -> float | None:
    """Seconds between the kernel's updates of a running thread's CPU time as ``/proc`` shows
    it (its scheduler tick: 4 ms at HZ = 250), measured once per process by spinning on this
    thread's ``schedstat`` until it has changed three times (at most 0.1 s); None where there is
    no schedstat or it did not change. What :attr:`CpuShare.lag_s` is made of."""
    path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
    tick = None
    try:
        prev, seen, stop = int(_read(path).split()[0]), [], time.perf_counter() + 0.1
        while len(seen) < 3 and time.perf_counter() < stop:
            v = int(_read(path).split()[0])
            if v != prev:
                seen.append(v)
                prev = v
        if len(seen) == 3:  # spinning, this thread ran all along: two ticks' CPU time between
            tick = (seen[2] - seen[0]) / 2 / 1e9
    except (AttributeError, IndexError, ValueError):  # no schedstat (_read gave None)
        tick = None
    return tick


def kernel_time() -> tuple[float, int | None]:
    """This process's system (kernel) CPU seconds and its minor + major page faults so far, from
    one ``getrusage`` (microseconds); where there is no ``resource`` module (Windows) the system
    time of ``os.times`` and no faults."""
    try:
        import resource
    except ImportError:
        return os.times().system, None
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_stime, int(r.ru_minflt + r.ru_majflt)


class CpuMeter:
    """Accumulates what the process got of the CPUs over timed intervals, and what the machine and
    the run's process tree used over them: ``begin()`` before an interval, ``end()`` after it
    (outside the timed region), ``share()`` sums them. A figure that could not be read is None.

    Args:
        threads: the compute threads (default: ``torch.get_num_threads()`` at each ``begin``).
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
        self.system = 0.0
        self.faults: int | None = 0
        self.n = 0

    def _threads_now(self) -> int:
        if self._fixed_threads is not None:
            return self._fixed_threads
        import torch

        return torch.get_num_threads()

    def _snap(self) -> _Snap:
        return _Snap(time.perf_counter(), time.process_time(),
                     read_threads(names=self._names, python=python_threads()),
                     read_pressure(), read_busy(self.cpus), tree_cpu(self.root),
                     *kernel_time())

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
        self.system += b.system - a.system
        if a.faults is None or b.faults is None or self.faults is None:
            self.faults = None
        else:
            self.faults += b.faults - a.faults
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
                        tree_procs=self.tree_procs or None, system_s=self.system,
                        page_faults=self.faults,
                        freed_kept=bool(allocator_state().get("applied")),
                        tick_s=accounting_tick(), **kw)
