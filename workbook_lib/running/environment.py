"""The environment a run was made in: versions, device, CPU/GPU model, git revision."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import os
import platform
import socket
import subprocess

import torch

from ..exceptions import ParamsError
from ..paths import REPO_ROOT

PACKAGES = ("torch", "torch_geometric", "numpy", "papermill", "nbclient", "nbconvert",
            "matplotlib", "seaborn", "pandas", "pyyaml", "tqdm")


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu. ``cuda`` without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ParamsError("'device' is 'cuda' but no CUDA device is available "
                          "(use 'cpu' or 'auto') (got 'cuda')")
    if device not in ("cpu", "cuda"):
        raise ParamsError(f"'device' must be one of ['cpu', 'cuda', 'auto'] (got {device!r})")
    return torch.device(device)


_ALLOCATOR_STATE = {"applied": False, "detail": "not requested"}


def configure_cpu_allocator(enable: bool) -> dict:
    """Keep freed large blocks in the glibc heap (``mallopt``), so repeated large tensor
    allocations do not page-fault: PyTorch's CPU allocator returns every block above the mmap
    threshold to the OS, while its CUDA allocator caches them. Applied once per process and
    recorded in the environment; on non-glibc systems it reports that it was not applied."""
    if not enable:
        return dict(_ALLOCATOR_STATE)
    if _ALLOCATOR_STATE["applied"]:
        return dict(_ALLOCATOR_STATE)
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok = libc.mallopt(m_mmap_threshold, 1 << 30) == 1 and \
            libc.mallopt(m_trim_threshold, 1 << 31) == 1
        _ALLOCATOR_STATE.update(applied=ok, detail="glibc mallopt: mmap threshold 1 GiB, "
                                "trim threshold 2 GiB" if ok else "mallopt refused")
    except OSError as exc:
        _ALLOCATOR_STATE.update(applied=False, detail=f"not applied (no glibc: {exc})")
    return dict(_ALLOCATOR_STATE)


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


def device_label(device: torch.device) -> str:
    """Short label for figure titles: 'cpu (2 threads)' or 'cuda: NVIDIA H100'."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {cpu_model()} ({torch.get_num_threads()} threads)"


def allocator_record(params: dict | None, *, run_level: bool = False) -> dict:
    """What the environment says about the CPU allocator setting. The run-level record (the
    runner's process, which measures nothing) says what was requested of every notebook's
    kernel, not this process's state: each kernel applies it and records its own."""
    state = dict(_ALLOCATOR_STATE)
    if run_level and params is not None:
        requested = bool(params.get("cpu_allocator_cache"))
        state = {"requested": requested, "applied": None,
                 "detail": ("requested: applied by each notebook's kernel (each notebook's "
                            "results record what its kernel applied)") if requested
                 else "not requested"}
    return state


def collect(params: dict | None = None, *, run_level: bool = False) -> dict:
    """Everything needed to compare two runs later.

    Args:
        params: the run's validated params.
        run_level: the run folder's ``environment.json`` (written by the runner, whose own
            process measures nothing) rather than a notebook's.
    """
    dev = resolve_device(params["device"]) if params else torch.device("cpu")
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
        "gpu": gpu,
        "git": git_revision(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "cpu_allocator_cache": allocator_record(params, run_level=run_level),
        "params": params,
    }
