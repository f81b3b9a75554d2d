"""How many CPUs this process may use (the cgroup quota, the affinity, SLURM's allocation: the
tightest limit) and how a run's threads and DataLoader workers fit in them (see :mod:`.cpu`)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..results.cpu import CpuAllowance, ThreadFit, fit


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




def fit_threads(*, procs: int = 1, workers: int = 0, requested: int | None = None,
                allowance: CpuAllowance | None = None) -> ThreadFit:
    """:func:`workbook_lib.results.cpu.fit` with this process's defaults: ``requested`` the
    current ``torch.get_num_threads()``, ``allowance`` :func:`allowed_cpus`."""
    if requested is None:
        import torch

        requested = torch.get_num_threads()
    return fit(procs=procs, workers=workers, requested=requested,
               allowance=allowance or allowed_cpus())
