"""Which DDP world sizes this allocation can run, with how many processes and threads each.

The capacity comes from the allocation, not the machine: on SLURM the CPUs of this task
(``SLURM_CPUS_PER_TASK``, else ``SLURM_CPUS_ON_NODE``) and the GPUs it was given; elsewhere the
CPUs this process may run on (``os.sched_getaffinity``, the cgroup CPU quota) and the visible
GPUs; the tightest of these when several apply. A world size is run
on ``nnodes`` nodes with ``world // nnodes`` processes per node; one that does not divide evenly,
or needs more processes per node than the node has GPUs (CUDA) or CPU cores (CPU), is skipped
with the reason.

Host threads and DataLoader workers per rank come from the allocation and are **the same at every
world size**: a rank's share is ``cpus // the most processes per node of any launch``; with
``num_workers > 0`` it holds ``min(num_workers, share - 1)`` workers (at least 1) and the rest
as intra-op threads. Comparing world sizes at equal threads per rank keeps the CPU's thread
scaling out of the DDP factor; what the threads alone do is measured apart, by the smallest
world size's launch running its arms with the whole share of a single process as well
(``threads_all``), interleaved with the others.
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
