"""How many CPUs this process may use (the cgroup quota, the affinity, SLURM's allocation: the
tightest limit) and how a run's threads and DataLoader workers fit in them (see :mod:`.cpu`)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..records import Record


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
    """The CPUs this process may use (see :mod:`.cpu`'s docstring).

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
