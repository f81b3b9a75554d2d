"""Which DDP world sizes this allocation can run, with how many processes and threads each.

The capacity comes from the allocation (SLURM's CPUs and GPUs of this task, else the CPU
affinity, cgroup quota and visible GPUs: the tightest). A world size runs on ``nnodes`` nodes;
one that does not divide evenly or does not fit a node is skipped with the reason. Threads and
DataLoader workers per rank are the same at every world size, so thread scaling stays out of the
DDP factor; the thread effect is measured apart (``threads_all``). Rules: docs/development.md.
"""
from __future__ import annotations


import torch

from ..results.ddp import Launch, Plan


def allocated_cpus() -> tuple[int, str]:
    """CPUs this task may use, and where that figure came from: the tightest of SLURM's
    allocation, the affinity and the cgroup's CPU quota
    (:func:`workbook_lib.measurement.cpu.allowed_cpus`)."""
    from ..measurement.cpu import allowed_cpus

    a = allowed_cpus()
    return a.cpus, a.source


def allocated_gpus() -> tuple[int, str]:
    if not torch.cuda.is_available():
        return 0, "no CUDA device"
    return torch.cuda.device_count(), "torch.cuda.device_count (CUDA_VISIBLE_DEVICES)"


def plan(world_sizes: list[int], *, backend: str, device: torch.device, nnodes: int = 1,
         cpus: tuple[int, str] | None = None, gpus: tuple[int, str] | None = None,
         num_workers: int = 0) -> Plan:
    """Place each requested world size on the allocation (see the module docstring)."""
    cuda = torch.device(device).type == "cuda"
    notes = []
    chosen = backend if backend != "auto" else ("nccl" if cuda else "gloo")
    if chosen == "nccl" and not cuda:
        notes.append("backend 'nccl' needs GPUs and this run is on the CPU: gloo is used "
                     "(set backend: gloo to silence this note)")
        chosen = "gloo"
    cap, source = (gpus or allocated_gpus()) if cuda else (cpus or allocated_cpus())
    ncpu, csource = cpus or allocated_cpus()
    if cap <= 0:
        cap, source = 1, source + " (none: 1 assumed)"
    out = Plan(chosen, "cuda" if cuda else "cpu", cap, source, nnodes, notes=notes,
               cpus=ncpu, cpus_source=csource)
    placed = []
    for w in world_sizes:
        if w % nnodes:
            out.skipped[w] = (f"{w} ranks do not divide over {nnodes} nodes (processes per node "
                              "must be a whole number)")
            continue
        per = w // nnodes
        if per > cap:
            what = "GPUs" if cuda else "CPU cores"
            out.skipped[w] = (f"needs {per} processes per node, the allocation has {cap} {what} "
                              f"per node ({source})")
            continue
        placed.append((w, per))
    if not placed:
        return out
    share = max(1, ncpu // max(per for _, per in placed))
    workers = max(1, min(num_workers, share - 1)) if num_workers > 0 else 0
    threads = max(1, share - workers)
    if num_workers > workers:
        notes.append(f"DataLoader workers per rank: {workers} (num_workers={num_workers} does not "
                     f"fit the {share} CPUs of a rank's share of {ncpu} ({csource}))")
    for i, (w, per) in enumerate(placed):
        whole = max(1, ncpu // per - workers) if i == 0 else None
        out.launches.append(Launch(w, nnodes, per, threads, workers,
                                   whole if whole and whole > threads else None))
    if out.launches[0].world_size != min(world_sizes):
        notes.append("the smallest world size requested cannot run here: efficiencies are "
                     "relative to the smallest one that ran")
    return out
