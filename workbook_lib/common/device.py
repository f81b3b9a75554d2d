"""The device a run uses and the memory it may use: ``device`` params -> ``torch.device``
(:func:`resolve_device`), the host's tightest memory limit (:func:`memory_limit`), and the CPU
allocator setting a process applies once (:func:`configure_cpu_allocator`).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..exceptions import ParamsError


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


def allocator_state() -> dict:
    """What :func:`configure_cpu_allocator` did in this process (``applied``, ``detail``)."""
    return dict(_ALLOCATOR_STATE)
