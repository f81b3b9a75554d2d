"""Profiling warm training steps with ``torch.profiler`` and breaking the trace down by
exclusive time (read with :mod:`workbook_lib.traces`); where in the pipeline's code the time
goes: :mod:`.code_sites`.

The steps profiled are warm by construction: the caller's loop has already run its warm-up steps,
and the profiler's own schedule then waits ``wait >= 1`` steps and warms up ``warmup >= 1`` more
before the ``active`` steps it records. The result says which steps of the run were recorded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from ..records import Record
from ..common.progress import native_stderr_to_terminal
from .. import traces as ta


@dataclass
class SiteTime(Record):
    """Where part of a stage's profiled time went: a function of the pipeline's own code (and
    the library frame under it that holds the time, if any), per recorded step."""

    function: str  # its qualified name where the source says it ("MyGather.backward")
    file: str  # as the trace names it (relative to the folder it was imported from)
    line: int  # the function's first line
    library: str  # "propagate (torch_geometric/...py:455)", or "" for the function's own work
    seconds: float  # host self time per recorded step
    ops: float  # operator calls per recorded step
    device_seconds: float = 0.0  # kernel time per recorded step (CUDA traces)

    @property
    def where(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


NOT_OWN = "(not in the pipeline's code)"


@dataclass
class ProfileResult(Record):
    """Categories by exclusive time of the profiled (warm) steps, and the naive nested sums."""

    schedule: dict[str, int]
    profiled_steps: str  # e.g. "steps 4-6 of the run (after 1 loop warm-up + profiler wait 1, warmup 1)"
    wall_s: float
    categories: dict[str, float] = field(default_factory=dict)  # seconds, exclusive time
    naive: dict[str, float] = field(default_factory=dict)  # seconds, nested durations summed
    trace: str = ""  # path of the Chrome trace (relative to the run folder where possible)
    summed: dict[str, float] = field(default_factory=dict)  # seconds, the investigation's sums
    # seconds the host waited at CUDA syncs per wb: stage over the recorded steps (the timer's
    # own syncs apart); empty on a CPU
    sync_wait: dict[str, float] = field(default_factory=dict)
    # stage -> where its time went in the pipeline's own code, largest first
    # (:mod:`.code_sites`); the function NOT_OWN holds what ran under no frame of it
    sites: dict[str, list[SiteTime]] = field(default_factory=dict)
    sites_note: str = ""  # why there are no sites ("" when there are)

    def sync_wait_per_step(self, stage: str) -> float | None:
        """Seconds per recorded step the host waited at syncs in ``stage`` (None: no CUDA
        trace)."""
        if not self.schedule.get("cuda", 0):
            return None
        active = self.schedule.get("active", 0)
        return self.sync_wait.get(stage, 0.0) / active if active else None

    @property
    def coverage(self) -> float:
        """Exclusive categories / wall time of the recorded steps (about 1 when they add up)."""
        return sum(self.categories.values()) / self.wall_s if self.wall_s else float("nan")

    @property
    def naive_over_wall(self) -> float:
        return sum(self.naive.values()) / self.wall_s if self.wall_s else float("nan")

    def shares(self) -> dict[str, float]:
        tot = sum(self.categories.values())
        return {k: v / tot for k, v in self.categories.items()} if tot else {}

    def summed_shares(self) -> dict[str, float]:
        """Shares of :attr:`summed` (what the investigation's analyzer reported)."""
        tot = sum(self.summed.values())
        return {k: v / tot for k, v in self.summed.items()} if tot else {}


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
