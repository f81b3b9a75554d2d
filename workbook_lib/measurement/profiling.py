"""A ``torch.profiler`` run of a few training steps, exported as a Chrome trace and broken
down by exclusive time (see ``trace_analysis``)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from ..measurement import trace_analysis as ta
from ..training.loop import run_loop


def profile_steps(strategy, model, pert, *, batch_size: int, trace_path: str | Path,
                  steps: int, wait: int = 1, warmup: int = 1, active: int = 3,
                  dual: bool = False) -> dict:
    """Profile ``steps`` full training steps (after the loop's own warm-up step) with a
    schedule clamped to fit them; never raises at teardown because of the schedule.

    Returns categories by exclusive time, the naive (nested, double-counted) sums, the wall
    time of the active steps, coverage (categories / wall), the clamping note and trace path.
    """
    sched, note = ta.clamp_schedule(steps, wait, warmup, active)
    trace_path = Path(trace_path)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU]
    if strategy.device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    exported = []

    def on_ready(prof):
        prof.export_chrome_trace(str(trace_path))
        exported.append(trace_path)

    n_steps = sched["wait"] + sched["warmup"] + sched["active"]
    with profile(activities=acts, schedule=schedule(**sched, repeat=1),
                 on_trace_ready=on_ready) as prof:
        res = run_loop(strategy, model, pert, mode="full", batch_size=batch_size, steps=n_steps,
                       warmup_steps=0, dual=dual, count_syncs=False, profiler=prof)
    if not exported:
        raise RuntimeError(f"the profiler wrote no trace for {strategy.name} ({sched})")
    first = sched["wait"] + sched["warmup"]
    # independent clock: the loop's own perf_counter from the start of the first active step to
    # the end of the last (the trace export inside profiler.step() is outside it)
    wall = res.step_spans[first + sched["active"] - 1][1] - res.step_spans[first][0]
    events = ta.load_trace(trace_path)
    exclusive = ta.exclusive_breakdown(events)
    naive = ta.naive_breakdown(ta.load_trace(trace_path))
    return {"schedule": sched, "note": note, "wall_s": wall, "categories": exclusive,
            "naive": naive, "coverage": sum(exclusive.values()) / wall if wall else None,
            "naive_total_over_wall": sum(naive.values()) / wall if wall else None,
            "trace": str(trace_path)}
