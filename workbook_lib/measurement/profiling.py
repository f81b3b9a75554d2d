"""Profiling warm training steps with ``torch.profiler`` and breaking the trace down by
exclusive time (:mod:`workbook_lib.traces`); per function of the pipeline's code:
:mod:`.code_sites`. The steps are warm by construction: the caller's loop ran its warm-up, and
the profiler's schedule waits and warms up at least one step more before recording.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from ..results.profile import NOT_OWN, ProfileResult, SiteTime  # noqa: F401
from ..common.progress import native_stderr_to_terminal
from .. import traces as ta


# the investigation's analyzer: an event's category from keywords in its name, first match wins
KEYWORDS = (("optimizer", ("optim", "step")), ("backward", ("backward",)),
            ("forward", ("forward",)), ("data", ("dataloader", "collate", "copy", "memcpy")))


def keyword_category(name: str) -> str:
    n = name.lower()
    return next((cat for cat, words in KEYWORDS if any(w in n for w in words)), "other")


def investigation_sums(events: list) -> dict[str, float]:
    """Seconds per category as the investigation's trace analyzer computed them: every event's
    inclusive duration summed under a category named by keywords in its name, parents and
    children alike, on every thread. ``ProfilerStep#N`` (a whole training step) matches "step"
    and counts as the optimizer. The workbook's own ``wb:`` ranges are left out (the
    investigation's traces had none)."""
    out: dict[str, float] = {}
    for e in events:
        if e.name.startswith(ta.STAGE_PREFIX):
            continue
        cat = keyword_category(e.name)
        out[cat] = out.get(cat, 0.0) + e.dur / 1e6
    return out


def profile_steps(step: Callable[[], float], *, steps_done: int, wait: int = 1, warmup: int = 1,
                  active: int = 3, trace_path: str | Path, device: torch.device,
                  relative_to: str | Path | None = None) -> ProfileResult:
    """Profile ``wait + warmup + active`` calls of ``step`` (each one training step that returns
    its own wall time in seconds) after ``steps_done`` warm steps already run by the caller.

    Raises:
        ValueError: ``wait`` or ``warmup`` below 1 (the recorded steps would not be warm) or
            ``active`` below 1.
    """
    if wait < 1 or warmup < 1:
        raise ValueError(f"'wait' and 'warmup' must be >= 1 so that only warm steps are "
                         f"recorded (got wait={wait}, warmup={warmup})")
    if active < 1:
        raise ValueError(f"'active' must be a positive integer (got {active})")
    trace_path = Path(trace_path)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    exported: list[Path] = []

    def on_ready(prof):
        prof.export_chrome_trace(str(trace_path))
        exported.append(trace_path)

    walls = []
    with native_stderr_to_terminal(), profile(
            activities=acts, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=on_ready) as prof:
        for _ in range(wait + warmup + active):
            walls.append(step())
            prof.step()
    if not exported:
        raise RuntimeError(f"the profiler wrote no trace ({wait=}, {warmup=}, {active=})")
    events = ta.load_trace(trace_path)
    first = steps_done + wait + warmup + 1
    shown = trace_path
    if relative_to is not None:
        try:
            shown = trace_path.resolve().relative_to(Path(relative_to).resolve())
        except ValueError:
            pass
    return ProfileResult(
        schedule={"wait": wait, "warmup": warmup, "active": active,
                  "cuda": int(device.type == "cuda")},
        profiled_steps=(f"steps {first}-{first + active - 1} of the run (after {steps_done} loop "
                        f"warm-up step(s), then profiler wait {wait} and warmup {warmup})"),
        wall_s=sum(walls[wait + warmup:]),
        categories=ta.exclusive_breakdown(events),
        naive=ta.naive_breakdown(ta.load_trace(trace_path)),
        trace=str(shown), summed=investigation_sums(events),
        sync_wait=ta.sync_wait_by_stage(events) if device.type == "cuda" else {})
