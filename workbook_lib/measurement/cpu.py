"""What the process got of the CPUs while it was timed, and how many CPUs it may use.

A machine shared with another CPU-heavy job can look quiet: every step is slowed by the same
amount, so the IQR stays small while the median is wrong by orders of magnitude (a step made of
many small parallel regions waits at each region's barrier for a thread that is not scheduled).
The spread of the samples cannot see that; what the process got of the CPUs can. A
:class:`CpuMeter` therefore runs beside every timed region (the loop's steps, :func:`measure`,
:func:`interleave`) and records, over exactly the timed intervals:

* **CPU use**: the process's CPU time (user + system, all its threads:
  ``time.process_time``) over wall time x its compute threads (``torch.get_num_threads()``, at
  most the CPUs it may use). Child processes (DataLoader workers) are not counted: their CPU time
  is in their own processes, and the label says so where a run has workers.
* **Share of the CPU its threads asked for**: the threads' run time over their run time plus
  their run-queue wait (the time they were ready to run and no CPU was free), from the kernel's
  per-thread ``/proc/self/task/*/schedstat``. A thread that sleeps (waiting for a batch, idle
  between parallel regions) asks for nothing, so a serial step alone still gets ~100%; beside a
  CPU hog it gets what the scheduler leaves it.
* **CPU pressure**: the share of wall time in which some task on the machine waited for a CPU
  (``/proc/pressure/cpu``, "some"), where the kernel exposes it; "not available here" otherwise,
  never a guess. It is machine-wide context: other jobs waiting among themselves raise it.

**The rule** (:data:`CONTENDED_BELOW`): a figure is *contended* when its threads got less than
80% of the CPU time they asked for (run / (run + run-queue wait) < 0.8). Where the kernel has no
per-thread schedstat, the CPU use (CPU time / (wall x threads)) is ruled on instead, with the
same 80%: a weaker proxy, since a serial step uses one thread of several alone too, and the
figure says which rule it was judged by. Pressure is reported, not ruled on: it counts other
jobs' waits.

:func:`allowed_cpus` says how many CPUs the process may use: the tightest of its affinity
(``os.sched_getaffinity``), the cgroup's CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``) and SLURM's allocation (``SLURM_CPUS_PER_TASK``, else
``SLURM_CPUS_ON_NODE``); :func:`fit_threads` turns that into compute threads per process for
``procs`` processes with ``workers`` DataLoader workers each.

Written here rather than taken from a library: psutil gives a process's CPU times but neither
the per-thread run-queue wait nor CPU pressure nor cgroup quotas; these are a few ``/proc`` and
``/sys`` reads.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..records import Record

CONTENDED_BELOW = 0.8  # a figure whose threads got less than this share of their asked CPU
PRESSURE_PATH = Path("/proc/pressure/cpu")
RULE = (f"contended: its threads got less than {CONTENDED_BELOW:.0%} of the CPU time they "
        "asked for (run / (run + run-queue wait), per-thread schedstat)")
RULE_FALLBACK = (f"contended: CPU time below {CONTENDED_BELOW:.0%} of wall x threads (no "
                 "per-thread schedstat here)")


# ---------------------------------------------------------------------------------------------
# the CPUs this process may use


@dataclass
class CpuAllowance(Record):
    """The CPUs a process may use: the tightest limit and every limit found."""

    cpus: int  # the tightest of the limits below (at least 1)
    source: str  # which limit that is
    host: int  # CPUs of the machine (os.cpu_count)
    affinity: int | None = None  # os.sched_getaffinity
    quota: float | None = None  # cgroup CPU quota, in CPUs (quota / period)
    slurm: int | None = None  # SLURM_CPUS_PER_TASK, else SLURM_CPUS_ON_NODE

    def describe(self) -> str:
        parts = [f"{self.host} on the machine"]
        if self.affinity is not None:
            parts.append(f"affinity {self.affinity}")
        if self.quota is not None:
            parts.append(f"cgroup quota {self.quota:g}")
        if self.slurm is not None:
            parts.append(f"SLURM {self.slurm}")
        return f"{self.cpus} CPUs ({self.source}; " + ", ".join(parts) + ")"


def _cgroup_quota(proc_cgroup: Path, cgroup_root: Path) -> float | None:
    """The tightest CPU quota (in CPUs) of this process's cgroup and its ancestors (v2
    ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``); None when unlimited."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        v2 = controllers == ""
        if not v2 and "cpu" not in controllers.split(","):
            continue
        rel = Path(path.lstrip("/"))
        bases = [cgroup_root] if v2 else [cgroup_root / "cpu,cpuacct", cgroup_root / "cpu"]
        for base in bases:
            for d in dict.fromkeys([base / rel, *[base / p for p in rel.parents]]):
                try:
                    if v2:
                        quota, period = (d / "cpu.max").read_text().split()[:2]
                    else:
                        quota = (d / "cpu.cfs_quota_us").read_text().strip()
                        period = (d / "cpu.cfs_period_us").read_text().strip()
                except (OSError, ValueError):
                    continue
                if quota.lstrip("-").isdigit() and period.isdigit() and int(quota) > 0 \
                        and int(period) > 0:
                    found.append(int(quota) / int(period))
    return min(found) if found else None


def _slurm_cpus(env) -> int | None:
    for var in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        v = str(env.get(var, "")).split("(")[0]
        if v.isdigit() and int(v) > 0:
            return int(v)
    return None


def allowed_cpus(*, proc_cgroup: Path = Path("/proc/self/cgroup"),
                 cgroup_root: Path = Path("/sys/fs/cgroup"), environ: dict | None = None,
                 affinity: int | None = None) -> CpuAllowance:
    """The CPUs this process may use (see the module docstring).

    Args:
        proc_cgroup, cgroup_root, environ: where to read (tests point them elsewhere).
        affinity: the affinity's CPU count (default: ``os.sched_getaffinity(0)``).
    """
    env = os.environ if environ is None else environ
    host = os.cpu_count() or 1
    if affinity is None and hasattr(os, "sched_getaffinity"):
        affinity = len(os.sched_getaffinity(0))
    quota = _cgroup_quota(proc_cgroup, cgroup_root)
    slurm = _slurm_cpus(env)
    limits = []  # the most specific first: it names a tie
    if slurm is not None:
        limits.append((slurm, "SLURM allocation"))
    if quota is not None:
        # a quota of 1.5 CPUs runs 1 thread at full speed, not 2
        limits.append((max(1, math.floor(quota)), "cgroup CPU quota"))
    if affinity is not None:
        limits.append((affinity, "os.sched_getaffinity"))
    limits.append((host, "os.cpu_count"))
    cpus, source = min(limits, key=lambda x: x[0])
    return CpuAllowance(cpus=max(1, int(cpus)), source=source, host=host, affinity=affinity,
                        quota=quota, slurm=slurm)


@dataclass
class ThreadFit(Record):
    """Compute threads per process, and why."""

    threads: int
    workers: int  # DataLoader workers per process
    procs: int  # processes sharing the CPUs
    allowance: CpuAllowance
    why: str


def fit_threads(*, procs: int = 1, workers: int = 0, requested: int | None = None,
                allowance: CpuAllowance | None = None) -> ThreadFit:
    """Compute threads per process so that ``procs`` processes, each with ``workers``
    DataLoader workers (one thread each, as PyTorch sets them), never start more threads than
    the CPUs they may use: each process's share is ``cpus // procs``, its workers take up to
    ``share - 1`` of it, and the rest (at least 1) are compute threads; ``requested`` (the
    current setting) is never raised.

    Args:
        procs: processes sharing the allowance (DDP ranks on the node), at least 1.
        workers: DataLoader worker processes per process, at least 0.
        requested: the threads asked for (default: ``torch.get_num_threads()``).
        allowance: the CPUs (default: :func:`allowed_cpus`).
    """
    if procs < 1:
        raise ValueError(f"'procs' must be a positive integer (got {procs})")
    if workers < 0:
        raise ValueError(f"'workers' must be >= 0 (got {workers})")
    if requested is None:
        import torch

        requested = torch.get_num_threads()
    if requested < 1:
        raise ValueError(f"'requested' must be a positive integer (got {requested})")
    a = allowance or allowed_cpus()
    share = max(1, a.cpus // procs)
    used_by_workers = min(workers, max(0, share - 1))
    threads = max(1, min(requested, share - used_by_workers))
    who = f"{procs} processes" if procs > 1 else "1 process"
    why = (f"{a.describe()}; {who}"
           + (f", {workers} DataLoader worker(s) each" if workers else "")
           + f": {threads} compute thread(s) per process"
           + (f" (of {requested} asked)" if threads < requested else ""))
    return ThreadFit(threads=threads, workers=workers, procs=procs, allowance=a, why=why)


# ---------------------------------------------------------------------------------------------
# what the process got while it was timed


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


def read_schedstat(task_dir: Path = Path("/proc/self/task")) -> dict[int, tuple[int, int]] | None:
    """Per thread of this process: (ns run on a CPU, ns waiting on a run queue), or None where
    the kernel has no schedstat."""
    out = {}
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return None
    for tid in tids:
        try:
            with open(task_dir / tid / "schedstat") as fh:
                run, wait = fh.read().split()[:2]
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        out[int(tid)] = (int(run), int(wait))
    return out or None


@dataclass
class CpuShare(Record):
    """What a process got of the CPUs over the timed intervals of one figure."""

    wall_s: float  # summed wall time of the timed intervals
    cpu_s: float  # process CPU time (user + system, all threads) over them
    threads: int  # compute threads it asked for (torch threads, at most ``allowed``)
    allowed: int  # CPUs it may use
    intervals: int  # timed intervals measured
    run_s: float | None = None  # its threads' time on a CPU (schedstat)
    wait_s: float | None = None  # its threads' run-queue wait (schedstat)
    pressure_s: float | None = None  # machine-wide CPU "some" pressure over them
    children: str = "not counted (DataLoader workers' CPU time is in their own processes)"

    @property
    def use(self) -> float:
        """CPU time / (wall x threads)."""
        denom = self.wall_s * max(1, self.threads)
        return self.cpu_s / denom if denom > 0 else math.nan

    @property
    def got(self) -> float | None:
        """run / (run + run-queue wait) of its threads; None without schedstat."""
        if self.run_s is None or self.wait_s is None or self.run_s + self.wait_s <= 0:
            return None
        return self.run_s / (self.run_s + self.wait_s)

    @property
    def pressure(self) -> float | None:
        """Share of the wall time in which some task on the machine waited for a CPU."""
        if self.pressure_s is None or self.wall_s <= 0:
            return None
        return min(1.0, self.pressure_s / self.wall_s)

    @property
    def judged(self) -> float:
        """The share the rule judges: :attr:`got`, else :attr:`use`."""
        g = self.got
        return g if g is not None else self.use

    @property
    def contended(self) -> bool:
        """True when the judged share is below :data:`CONTENDED_BELOW` (see the module)."""
        j = self.judged
        return bool(self.intervals > 0 and not math.isnan(j) and j < CONTENDED_BELOW)

    @property
    def rule(self) -> str:
        return RULE if self.got is not None else RULE_FALLBACK

    def describe(self) -> str:
        """'got 52% of the CPU asked for, CPU use 49% of 2 threads, pressure 61%'."""
        got = "run-queue wait n/a" if self.got is None else \
            f"got {self.got:.0%} of the CPU asked for"
        pressure = "pressure not available here" if self.pressure is None else \
            f"CPU pressure {self.pressure:.0%}"
        flag = " (contended)" if self.contended else ""
        return (f"{got}, CPU use {self.use:.0%} of {self.threads} thread(s) on "
                f"{self.allowed} CPU(s), {pressure}{flag}")


def worse(*shares: "CpuShare | None") -> CpuShare | None:
    """The share with the lower judged value (a ratio of two figures is as contended as its
    worse side); None when none is given."""
    present = [s for s in shares if s is not None]
    if not present:
        return None
    return min(present, key=lambda s: (math.inf if math.isnan(s.judged) else s.judged))


@dataclass
class _Snap:
    wall: float
    cpu: float
    sched: dict[int, tuple[int, int]] | None
    pressure: float | None


def _snap() -> _Snap:
    return _Snap(time.perf_counter(), time.process_time(), read_schedstat(), read_pressure())


class CpuMeter:
    """Accumulates what the process got of the CPUs over timed intervals.

    ``begin()`` before an interval and ``end()`` after it (outside the timed region: the reads
    cost tens of microseconds); ``share()`` sums them. An interval whose schedstat or pressure
    could not be read leaves those figures out (None), never guessed.

    Args:
        threads: the compute threads the work uses (default: ``torch.get_num_threads()`` at
            each ``begin``).
        children: what the figure says about child processes' CPU time.
    """

    def __init__(self, threads: int | None = None, allowance: CpuAllowance | None = None,
                 children: str | None = None):
        self._fixed_threads = threads
        self.allowance = allowance or allowed_cpus()
        self.children = children
        self._start: _Snap | None = None
        self._threads: list[int] = []
        self.wall = self.cpu = 0.0
        self.run: float | None = 0.0
        self.wait: float | None = 0.0
        self.pressure: float | None = 0.0
        self.n = 0

    def _threads_now(self) -> int:
        if self._fixed_threads is not None:
            return self._fixed_threads
        import torch

        return torch.get_num_threads()

    def begin(self) -> None:
        self._threads.append(self._threads_now())
        self._start = _snap()

    def end(self) -> None:
        if self._start is None:
            raise RuntimeError("CpuMeter.end() without begin()")
        a, b = self._start, _snap()
        self._start = None
        self.wall += b.wall - a.wall
        self.cpu += b.cpu - a.cpu
        if a.sched is None or b.sched is None or self.run is None or self.wait is None:
            self.run = self.wait = None
        else:
            for tid, (run, wait) in b.sched.items():
                r0, w0 = a.sched.get(tid, (0, 0))  # a thread started meanwhile counts from 0
                self.run += (run - r0) / 1e9
                self.wait += (wait - w0) / 1e9
        if a.pressure is None or b.pressure is None or self.pressure is None:
            self.pressure = None
        else:
            self.pressure += (b.pressure - a.pressure) / 1e6
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
        return CpuShare(wall_s=self.wall, cpu_s=self.cpu, threads=min(threads, allowed),
                        allowed=allowed, intervals=self.n, run_s=self.run, wait_s=self.wait,
                        pressure_s=self.pressure, **kw)
