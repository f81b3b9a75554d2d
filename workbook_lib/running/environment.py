"""The environment a run was made in: versions, device, CPU/GPU model, git revision."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import os
import platform
import socket
import subprocess
from pathlib import Path

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


_NO_LIMIT = 1 << 60  # cgroup v1 writes ~2**63 for "no limit"


def _cgroup_limits(proc_cgroup: Path, cgroup_root: Path) -> list[tuple[float, str]]:
    """Memory limits of this process's cgroup and its ancestors (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``). Inside a container the cgroup path named in ``/proc`` may be the
    host's while the mount shows the container's own group, so both are tried."""
    out = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2
            base, fname, label = cgroup_root, "memory.max", "cgroup memory.max"
        elif "memory" in controllers.split(","):  # v1
            base, fname, label = cgroup_root / "memory", "memory.limit_in_bytes", \
                "cgroup memory.limit_in_bytes"
        else:
            continue
        rel = Path(path.lstrip("/"))
        dirs = [base / rel, *[base / p for p in rel.parents]]
        for d in dict.fromkeys(dirs):
            try:
                text = (d / fname).read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < _NO_LIMIT:
                out.append((float(text), label))
    return out


def memory_limit(*, proc_cgroup: Path = Path("/proc/self/cgroup"),
                 cgroup_root: Path = Path("/sys/fs/cgroup"),
                 environ: dict | None = None) -> tuple[float, str]:
    """The memory this process may use on the host: the tightest of host RAM, the address-space
    and data rlimits (``ulimit -v``/``-d``), the cgroup's limit (a container, systemd, SLURM's
    cgroup plugin) and SLURM's ``--mem``/``--mem-per-cpu`` request. Returns (bytes, which).

    Args:
        proc_cgroup, cgroup_root, environ: where to read (tests point them elsewhere).
    """
    import resource

    import psutil

    env = os.environ if environ is None else environ
    found = [(float(psutil.virtual_memory().total), "host RAM")]
    for name, label in (("RLIMIT_AS", "address-space rlimit (ulimit -v)"),
                        ("RLIMIT_DATA", "data rlimit (ulimit -d)")):
        try:
            soft, _ = resource.getrlimit(getattr(resource, name))
        except (AttributeError, ValueError, OSError):
            continue
        if soft not in (resource.RLIM_INFINITY, -1) and soft > 0:
            found.append((float(soft), label))
    found += _cgroup_limits(proc_cgroup, cgroup_root)
    mb = 1024 * 1024
    if str(env.get("SLURM_MEM_PER_NODE", "")).isdigit() and int(env["SLURM_MEM_PER_NODE"]) > 0:
        found.append((float(env["SLURM_MEM_PER_NODE"]) * mb, "SLURM --mem"))
    per_cpu, cpus = env.get("SLURM_MEM_PER_CPU", ""), env.get(
        "SLURM_CPUS_ON_NODE", env.get("SLURM_CPUS_PER_TASK", ""))
    if str(per_cpu).isdigit() and str(cpus).isdigit() and int(per_cpu) > 0:
        found.append((float(per_cpu) * mb * int(cpus), "SLURM --mem-per-cpu x CPUs"))
    return min(found, key=lambda x: x[0])


_THREADS: dict = {}


def configure_threads(params: dict | None = None, *, procs: int = 1) -> dict:
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


def collect(params: dict | None = None, *, uses_device: bool = True,
            run_level: bool = False) -> dict:
    """Everything needed to compare two runs later.

    Args:
        params: the run's validated params.
        uses_device: False for a job whose notebooks measure nothing on the device (01, 05 on a
            CPU node): its record says so instead of resolving ``device`` (a CPU node has no GPU).
        run_level: the run folder's ``environment.json`` (written by the runner, whose own
            process measures nothing) rather than a notebook's.
    """
    if params and (uses_device or params["device"] != "cuda" or torch.cuda.is_available()):
        dev = resolve_device(params["device"])
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
