"""Notebook 02's peak-memory study: one training step per (pipeline, batch size), each in a fresh
process, fitted per pipeline and projected to the device's memory (three built-in forms and every
user pipeline). Probes run side by side as far as the allowed CPUs fit their threads; one at a
time per GPU.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from ...configs.validation import Params
from ...common.text import one_line
from ...failures import RAISED, STALLED, PipelineFailure
from ...measurement.cpu_allowance import allowed_cpus
from ...measurement.memory import (STATUS_FAILED, STATUS_TIMEOUT, MemoryPoint, device_budget,
                                   fit_memory, probe_threads)
from ...common.progress import note, progress
from ...training.step_memory import measure_point
from ...results.mask_cost import MemoryStudy

STRATEGIES = (("replicated_mask_cpu", "gather_scatter"), ("replicated_mask_cpu", "spmm"),
              ("node_mask_shared", "spmm"))
REAL = {"scale": 1.0, "hidden": 64, "layers": 3}
REAL_BATCHES = {"replicated_mask_cpu": [1, 2, 3], "node_mask_shared": [2, 8, 16]}


def _label(strategy: str, form: str, sizes: dict) -> str:
    if form == "own":  # a user's pipeline: its own model's sizes, the run's graph
        return f"{strategy} (its own model) @ scale {sizes['scale']:g}"
    return (f"{strategy}:{form} @ scale {sizes['scale']:g}, H={sizes['hidden']}, "
            f"L={sizes['layers']}")


def memory_study(params: Params, device: torch.device, *, dual: bool | None = None,
                 parallel: int | None = None) -> MemoryStudy:
    """Every point of the sweep (and the real spec with ``memory_full_size``) probed on ``device``,
    then the fits; ``dual`` defaults to ``dual_forward``, ``parallel`` (probes at once) to what the
    CPUs fit.
    """
    from ...running.environment import device_label

    if parallel is None:
        parallel = 1 if device.type == "cuda" else \
            max(1, allowed_cpus().cpus // probe_threads())

    budget, label = device_budget(device)
    if params.memory_budget_gb is not None:
        budget, label = params.memory_budget_gb * 1e9, "memory_budget_gb"
    dual = params.dual_forward if dual is None else dual
    run_sizes = {"scale": params.scale, "hidden": params.hidden,
                 "layers": params.layers}
    from ...pipelines import user_specs

    # the built-in forms, then every user pipeline (its own form: "own") at the run's sizes
    pairs = (list(STRATEGIES) if params.strategies else []) + \
        [(name, "own") for name in user_specs(params)]
    jobs = [(s, f, b, run_sizes) for s, f in pairs for b in params.memory_batch_sizes]
    if params.memory_full_size and params.strategies:
        jobs += [(s, f, b, REAL) for s, f in STRATEGIES if (s, f) != ("replicated_mask_cpu", "spmm")
                 for b in REAL_BATCHES[s]]

    def one(job):
        s, f, b, sz = job
        return measure_point(params, strategy=s, form=f, batch_size=b, device=str(device),
                             dual=dual, **sz)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        points = list(progress(pool.map(one, jobs), total=len(jobs), desc="02 memory"))
    out = MemoryStudy(device=device_label(device), budget_bytes=budget, budget_label=label,
                      points=points)
    groups: dict[str, list[MemoryPoint]] = {}
    for (s, f, _b, sz), pt in zip(jobs, points):
        groups.setdefault(_label(s, f, sz), []).append(pt)
    for key, pts in groups.items():
        out.fits[key] = fit_memory(pts, budget, label, label=key)
    for name in user_specs(params):
        f = probe_failure(name, [pt for (s, _f, _b, _sz), pt in zip(jobs, points) if s == name])
        if f is not None:
            out.failures[name] = f
            note(f"02 memory: {f.line()}")
    return out


def probe_failure(name: str, points: list[MemoryPoint]) -> PipelineFailure | None:
    """The record of a pipeline whose memory probes failed (the first failed point's; out of
    memory is a measurement, not a failure), or None."""
    bad = [p for p in points if p.status in (STATUS_FAILED, STATUS_TIMEOUT)]
    if not bad:
        return None
    p = bad[0]
    kept = any(pt.usable for pt in points)
    if p.details:
        f = PipelineFailure.from_json(p.details)
    else:  # failed before the step: building the pipeline, or the probe timed out
        stalled = p.status == STATUS_TIMEOUT
        f = PipelineFailure(name, "02", "memory probe" if stalled else "build",
                            STALLED if stalled else RAISED, one_line(p.reason or p.status),
                            p.traceback, mode=f"memory probe, B={p.batch_size}")
    f.notebook, f.figures_kept = "02", kept
    others = [f"B={pt.batch_size}" for pt in bad[1:]]
    if others:
        f.message += f" (also at {', '.join(others)})"
    return f
