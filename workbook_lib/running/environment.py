"""The environment a run was made in: versions, device, CPU/GPU model, git revision."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import os
import platform
import socket
import subprocess

import torch

from ..configs.validation import Params
from ..common.device import allocator_state, resolve_device
from ..paths import REPO_ROOT

# numba: the delta push's compiled kernel (a required dependency)
PACKAGES = ("torch", "torch_geometric", "numpy", "papermill", "nbclient", "nbconvert",
            "matplotlib", "seaborn", "pandas", "pyyaml", "tqdm", "numba")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_revision() -> dict:
    def _git(*args):
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                               timeout=10)
    try:
        rev = _git("rev-parse", "HEAD")
        if rev.returncode != 0:
            return {"revision": None, "dirty": None}
        dirty = _git("status", "--porcelain", "--untracked-files=no")
        return {"revision": rev.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"revision": None, "dirty": None}


def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


_THREADS: dict = {}


def configure_threads(params: Params | None = None, *, procs: int = 1) -> dict:
    """Never more compute threads than the CPUs this process may use (affinity, cgroup quota,
    SLURM's allocation), its DataLoader workers (``num_workers`` of ``params``) sharing them:
    :func:`workbook_lib.measurement.cpu.fit_threads`, applied with ``torch.set_num_threads`` (a
    thread count is only ever lowered) and recorded in the environment with why.

    Args:
        params: validated params (their ``num_workers``); None: no workers.
        procs: processes sharing the CPUs (DDP ranks on the node).
    """
    from ..measurement.cpu import fit_threads

    fit = fit_threads(procs=procs, workers=int((params or {}).get("num_workers") or 0))
    if torch.get_num_threads() != fit.threads:
        torch.set_num_threads(fit.threads)
    _THREADS.clear()
    _THREADS.update({"threads": fit.threads, "why": fit.why, "cpus": fit.allowance.cpus,
                     "cpus_source": fit.allowance.source})
    return dict(_THREADS)


def device_label(device: torch.device) -> str:
    """Short label for figure titles: 'cpu (2 threads)' or 'cuda: NVIDIA H100'."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    k = torch.get_num_threads()
    return f"cpu: {cpu_model()} ({k} thread{'s' if k != 1 else ''})"


def allocator_record(params: Params | None, *, run_level: bool = False) -> dict:
    """What the environment says about the CPU allocator setting. The run-level record (the
    runner's process, which measures nothing) says what was requested of every notebook's
    kernel, not this process's state: each kernel applies it and records its own."""
    state = allocator_state()
    if run_level and params is not None:
        requested = bool(params.cpu_allocator_cache)
        state = {"requested": requested, "applied": None,
                 "detail": ("requested: applied by each notebook's kernel (each notebook's "
                            "results record what its kernel applied)") if requested
                 else "not requested"}
    return state


def collect(params: Params | None = None, *, uses_device: bool = True,
            run_level: bool = False) -> dict:
    """Everything needed to compare two runs later.

    Args:
        params: the run's validated params.
        uses_device: False for a job whose notebooks measure nothing on the device (01, 05 on a
            CPU node): its record says so instead of resolving ``device`` (a CPU node has no GPU).
        run_level: the run folder's ``environment.json`` (written by the runner, whose own
            process measures nothing) rather than a notebook's.
    """
    if params and (uses_device or params.device != "cuda" or torch.cuda.is_available()):
        dev = resolve_device(params.device)
    else:
        dev = torch.device("cpu")
    gpu = None
    if torch.cuda.is_available():
        gpu = {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
               "cuda": torch.version.cuda,
               "memory_bytes": torch.cuda.get_device_properties(0).total_memory}
    return {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "versions": versions(),
        "device": str(dev),
        "device_label": device_label(dev),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "threads": dict(_THREADS) or None,  # configure_threads: how many, and why
        "gpu": gpu,
        "git": git_revision(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "cpu_allocator_cache": allocator_record(params, run_level=run_level),
        "uses_device": uses_device,
        "params": params,
    }


def merge_records(records: list[dict]) -> dict:
    """One run's environment from its jobs' records (one per job, e.g. per SLURM job): the
    device and machine of the latest job that used the device (a CPU-only job of the same run
    never relabels a GPU run "cpu"), else the latest job's; every job listed under ``jobs``."""
    if not records:
        raise ValueError("'records' must hold at least one environment record (got none)")
    by_time = sorted(records, key=lambda r: str(r.get("created", "")))
    used = [r for r in by_time if r.get("uses_device", True)]
    chosen = (used or by_time)[-1]
    return {**chosen, "jobs": [{k: r.get(k) for k in ("created", "host", "slurm_job_id",
                                                      "notebooks", "uses_device", "device",
                                                      "device_label")} for r in by_time]}
