"""The training loop every timing of a step goes through (notebook 03, the DDP worker, 06).

A step is the real thing: a ``DataLoader`` fetches and collates a pipeline's samples, the batch
is moved to the device and prepared, then the model and loss run. An :class:`Arm` is one timed
series of such steps; its :class:`Variant` says how far a step goes (modes ``data``, ``forward``,
``forward_backward``, ``full``; for DDP, micro-batches and which of them all-reduce). Every stage
is timed between device syncs in a :class:`~workbook_lib.measurement.timing.StepClock` and marked
with a ``wb:<stage>`` profiler range. :func:`run_arms` runs arms until each is precise enough,
interleaved when there are no worker processes; a pipeline that fails or stalls costs only its
own arms, and non-finite losses are counted when an arm ends (docs/development.md).
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch.utils.data import DataLoader

from ..common.progress import note, progress
from ..common.watchdog import Watchdog
from ..failures import PipelineFailed, PipelineFailure
from ..measurement.syncs import SyncCounter
from ..measurement.timing import DEFAULT_TARGET, StepClock
from ..pipelines.protocol import Pipeline
from ..results.timing import MAIN_STAGES, WORKER_STAGES, ArmResult  # noqa: F401
# an arm is built with the loop's Arm and Variant
from .arms import MODES, Arm, Variant  # noqa: F401
from .timed_data import TimedCollate, TimedDataset

STALL_FACTOR = 20.0  # a stage this many times the pipeline's slowest step has stalled...
STALL_FLOOR_S = 30.0  # ...but never under this many seconds (stall_timeout_s may be shorter)
LOADER_TIMEOUT_MARGIN_S = 2.0  # the DataLoader's own timeout: the workers' limit plus this


def make_loader(pipeline: Pipeline, batch_size: int | None = None, *, num_workers: int = 0,
                pin_memory: bool = False, persistent_workers: bool = False,
                stall_timeout_s: float | None = None) -> DataLoader:
    """A DataLoader over the pipeline's dataset producing its full batches; ``stall_timeout_s``:
    with workers, how long one batch may take before a stall is reported (None: no limit).
    """
    b = batch_size or pipeline.batch_size
    ds = TimedDataset(pipeline, stall_s=stall_timeout_s if num_workers > 0 else None)
    if len(ds) < b:
        raise ValueError(f"pipeline {pipeline.name!r}: its dataset must hold at least one batch "
                         f"of {b} samples (got {len(ds)})")
    timeout = (stall_timeout_s + LOADER_TIMEOUT_MARGIN_S
               if stall_timeout_s and num_workers > 0 else 0)
    loader = DataLoader(ds, batch_size=b, shuffle=False, num_workers=num_workers,
                        collate_fn=TimedCollate(pipeline),
                        pin_memory=pin_memory and torch.device(pipeline.device).type == "cuda",
                        drop_last=True, persistent_workers=persistent_workers and num_workers > 0,
                        timeout=timeout)
    loader.wb_pin_memory = pin_memory  # what a GPU run would do (the sync count follows it)
    return loader


def cycle(loader: DataLoader) -> Iterator:
    """Batches of ``loader`` forever (a new epoch when one ends). Closing the stream (or an
    error in it) shuts its DataLoader workers down at once, a stalled one included (terminated
    after the DataLoader's own grace period), instead of whenever the iterator is collected."""
    while True:
        it = iter(loader)
        try:
            yield from it
        except GeneratorExit:
            if not getattr(loader, "persistent_workers", False):
                _shutdown(it)
            raise
        except BaseException:
            _shutdown(it)
            if getattr(loader, "_iterator", None) is it:
                loader._iterator = None  # a persistent iterator that failed: never reused
            raise


def _shutdown(it) -> None:
    stop = getattr(it, "_shutdown_workers", None)  # multi-process iterators only
    if stop is not None:
        try:
            stop()
        except Exception:  # noqa: BLE001 - tearing down after a failure
            pass


def close_stream(stream) -> None:
    """Close a batch stream of :func:`cycle` (its workers shut down)."""
    close = getattr(stream, "close", None)
    if close is not None:
        close()


def _result(arm: Arm, clock: StepClock, warmup: int, counted: SyncCounter | None,
            stopped_by: str, target: float) -> ArmResult:
    bad, first, value, checked = arm.nonfinite()
    stages = clock.stages([s for s in MAIN_STAGES if any(s in st for st in clock.steps)],
                          target=target)
    known = set(MAIN_STAGES)
    extra = {k: v for k, v in clock.stages(target=target).items() if k not in known}
    return ArmResult(
        name=arm.name, strategy=arm.pipeline.name, variant=arm.variant.name,
        mode=arm.variant.mode, batch_size=arm.batch_size,
        micro_batches=arm.variant.micro_batches, step=clock.wall(target=target), stages=stages,
        extra=extra, syncs_per_step=None if counted is None else float(counted.total),
        sync_kinds={} if counted is None else {k: float(v) for k, v in counted.by_kind.items()},
        syncs_by_stage={} if counted is None else {k: float(v) for k, v in counted.by_stage.items()},
        ops_by_stage={} if counted is None else {k: float(v)
                                                 for k, v in counted.ops_by_stage.items()},
        warmup_steps=warmup, timed_steps=clock.n, stopped_by=stopped_by, nonfinite_steps=bad,
        first_nonfinite_step=first, nonfinite_value=value, loss_steps=checked,
        loss_split=arm.loss_split,
        batch_contents={} if counted is None else dict(counted.contents))


def _children_label(loader: DataLoader) -> str | None:
    """What an arm's CPU figure says about its DataLoader workers' CPU time (excluded: it is in
    their own processes); None without workers (the default label)."""
    w = getattr(loader, "num_workers", 0)
    return None if not w else (f"not counted: the {w} DataLoader worker process(es)' CPU time "
                               "is in their own processes (this figure is the main process's)")


def stall_limit(stall_timeout_s: float | None, slowest_step_s: float | None) -> float | None:
    """How long a stage may run before it counts as stalled: ``stall_timeout_s`` until the
    pipeline has completed a step, then the shorter of it and :data:`STALL_FACTOR` x its
    slowest step (at least :data:`STALL_FLOOR_S`). None: not watched."""
    if not stall_timeout_s:
        return None
    if not slowest_step_s:
        return float(stall_timeout_s)
    return min(float(stall_timeout_s), max(STALL_FACTOR * slowest_step_s, STALL_FLOOR_S))


@dataclass(frozen=True)
class Plan:
    """How long arms run: untimed warm-up steps, then timed steps until the median is known to
    ``target`` (:meth:`Stat.known_to`) with at least ``min_steps``, or ``max_steps``, or
    ``budget_s`` spent (then arms stop at ``min_steps``)."""

    warmup_steps: int = 1
    min_steps: int = 10
    max_steps: int = 30
    target: float = DEFAULT_TARGET
    budget_s: float = 120.0

    def __post_init__(self):
        if self.warmup_steps < 0:
            raise ValueError(f"'warmup_steps' must be >= 0 (got {self.warmup_steps})")
        if self.min_steps <= 0:
            raise ValueError(f"'min_steps' must be a positive integer (got {self.min_steps})")
        if self.max_steps < self.min_steps:
            raise ValueError(f"'max_steps' must be >= min_steps={self.min_steps} "
                             f"(got {self.max_steps})")

    def stop_reason(self, clock: StepClock, spent: float, budget: float,
                    partner: StepClock | None = None) -> str:
        """Why an arm whose steps are in ``clock`` stops now ("" when it goes on); with a
        ``partner`` (the other arm of a ratio timed in the same rounds), its precision is the
        per-round ratio's too, both ways round (a median's interval is not symmetric under
        1/x: the ratio known one way can miss the target the other)."""
        if clock.n < self.min_steps:
            return ""
        if clock.wall().known_to(self.target) and (partner is None or (
                _ratio(clock, partner).known_to(self.target)
                and _ratio(partner, clock).known_to(self.target))):  # the gap may be either
            return "precision target"
        if clock.n >= self.max_steps:
            return "max steps"
        if spent >= budget:
            return "time budget"
        return ""


def _ratio(a: StepClock, b: StepClock):
    """The per-round ratio of two clocks' step times (their first rounds, in order)."""
    from ..measurement.timing import Stat

    xs = [r["_wall"] for r in a.steps]
    ys = [r["_wall"] for r in b.steps]
    n = min(len(xs), len(ys))
    return Stat.from_samples([x / y for x, y in zip(xs[:n], ys[:n])] or [float("inf")])


class Stepper:
    """Runs one step of an arm at a time and keeps what the steps leave: the clocks, the sync
    counts, the slowest step per pipeline (the stall rule) and the failures. A pipeline that
    fails stops all its arms; an arm marked ``optional`` that fails stops alone (its failure
    is recorded under the arm's name)."""

    def __init__(self, arms: list[Arm], *, failures: dict[str, PipelineFailure] | None,
                 stall_timeout_s: float | None, notebook: str, desc: str, procs: int,
                 count_syncs: bool):
        names = [a.name for a in arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique (got {names})")
        self.arms, self.failures, self.notebook, self.desc = arms, failures, notebook, desc
        self.stall_timeout_s, self.count_syncs = stall_timeout_s, count_syncs
        self.device = torch.device(arms[0].pipeline.device)
        self.clocks = {a.name: StepClock(self.device, children=_children_label(a.loader),
                                         procs=procs, workers=getattr(a.loader, "num_workers", 0))
                       for a in arms}
        self.counters: dict[str, SyncCounter | None] = {a.name: None for a in arms}
        self.stopped = {a.name: "" for a in arms}
        self.slowest: dict[str, float] = {}
        self.failed: set[str] = set()  # pipelines, and optional arms, that failed
        self.watchdog = Watchdog(announce=note, why="stall_timeout_s, or "
                                 f"{STALL_FACTOR:g}x the slowest step and at least "
                                 f"{STALL_FLOOR_S:g} s") if stall_timeout_s else None
        self.bar = None
        self._shown = 0.0

    def live(self, arm: Arm) -> bool:
        return arm.pipeline.name not in self.failed and arm.name not in self.failed

    def step(self, arm: Arm, *, timed: bool, counter: SyncCounter | None = None) -> bool:
        """One step of ``arm``; False when it failed (recorded, its arms stopped)."""
        if not self.live(arm):
            return False
        pipe = arm.pipeline.name
        limit = stall_limit(self.stall_timeout_s, self.slowest.get(pipe))
        arm.watchdog = self.watchdog if limit else None
        arm.watch_loader = getattr(arm.loader, "num_workers", 0) == 0
        t0 = time.perf_counter()
        if self.bar is not None:  # the arm running, at most once a second
            self.bar.set_postfix_str(arm.name, refresh=t0 - self._shown > 1.0)
            if t0 - self._shown > 1.0:
                self._shown = t0
        if arm.watchdog is not None:
            arm.watchdog.arm(limit)  # once per step, outside its timed region
        try:
            arm.step(self.clocks[arm.name], timed=timed, counter=counter)
        except PipelineFailed as exc:
            self._failed(arm, exc.failure)
            return False
        finally:
            if arm.watchdog is not None:
                arm.watchdog.disarm()
        self.slowest[pipe] = max(self.slowest.get(pipe, 0.0), time.perf_counter() - t0)
        return True

    def _failed(self, arm: Arm, f: PipelineFailure) -> None:
        f.notebook = self.notebook
        if self.failures is None:
            raise PipelineFailed(f)
        key = arm.name if arm.optional else arm.pipeline.name
        self.failures[key] = f
        self.failed.add(key)
        for other in self.arms:
            if other.name == key or (not arm.optional and other.pipeline.name == key):
                close_stream(other.stream)
                other.stream = None
        note(f"{self.desc}: {f.line()}" + (f" (its arm '{arm.name}' only)" if arm.optional
                                          else "; the other pipelines go on"))

    def count(self, arm: Arm) -> None:
        """One untimed step under the sync counter."""
        if self.count_syncs and self.live(arm):
            self.counters[arm.name] = SyncCounter(self.device)
            self.step(arm, timed=False, counter=self.counters[arm.name])

    def results(self, plan: Plan) -> dict[str, ArmResult]:
        return {a.name: _result(a, self.clocks[a.name], plan.warmup_steps,
                                self.counters[a.name], self.stopped[a.name], plan.target)
                for a in self.arms if self.live(a)}


def _interleaved(st: Stepper, plan: Plan, agree: Callable[[bool], bool],
                 pairs: dict[str, str]) -> None:
    """One step of each arm in turn (arms sharing a loader share its stream); an arm of a pair
    goes on until their per-round ratio is known to the target too."""
    shared: dict = {}
    try:
        for a in st.arms:
            if id(a.loader) not in shared:
                shared[id(a.loader)] = cycle(a.loader)
            a.stream = shared[id(a.loader)]
        for _ in range(plan.warmup_steps):
            for a in st.arms:
                st.step(a, timed=False)
        for a in st.arms:
            st.count(a)
        t0 = time.perf_counter()
        active = [a for a in st.arms if st.live(a)]
        while active:
            for a in active:
                if st.step(a, timed=True):
                    st.bar.update(1)
            spent = time.perf_counter() - t0
            still = []
            for a in active:
                if not st.live(a):
                    continue
                other = pairs.get(a.name)
                why = plan.stop_reason(st.clocks[a.name], spent, plan.budget_s,
                                       st.clocks[other] if other in st.clocks and
                                       any(b.name == other and st.live(b) for b in st.arms)
                                       else None)
                if agree(bool(why)):
                    st.stopped[a.name] = why or "stopped with the other ranks"
                else:
                    still.append(a)
            active = still
    finally:
        for stream in shared.values():
            close_stream(stream)


def _sequential(st: Stepper, plan: Plan, agree: Callable[[bool], bool],
                pairs: dict[str, str]) -> None:
    """Arm after arm, each with a fresh stream (closed when it ends)."""
    per_arm = plan.budget_s / max(1, len(st.arms))
    for a in st.arms:
        if not st.live(a):
            continue
        a.stream = cycle(a.loader)
        try:
            if all(st.step(a, timed=False) for _ in range(plan.warmup_steps)):
                st.count(a)
            t0 = time.perf_counter()
            while st.step(a, timed=True):
                st.bar.update(1)
                why = plan.stop_reason(st.clocks[a.name], time.perf_counter() - t0, per_arm)
                if agree(bool(why)):
                    st.stopped[a.name] = why or "stopped with the other ranks"
                    break
        finally:
            close_stream(a.stream)  # ends this arm's worker processes
            a.stream = None


def run_arms(arms: list[Arm], *, warmup_steps: int = 1, min_steps: int = 10,
             max_steps: int = 30, target: float = DEFAULT_TARGET, budget_s: float = 120.0,
             interleave: bool = True, count_syncs: bool = True,
             agree: Callable[[bool], bool] | None = None, desc: str = "loop",
             failures: dict[str, PipelineFailure] | None = None,
             stall_timeout_s: float | None = None, notebook: str = "",
             procs: int = 1, pairs: list[tuple[str, str]] = ()) -> dict[str, ArmResult]:
    """Run every arm until it is precise enough: warm-up steps, one untimed step under the sync
    counter, then timed steps until the median is known to ``target`` (:meth:`Stat.known_to`;
    at least ``min_steps``), ``max_steps`` or the budget.

    Args:
        arms: the arms; their names must be unique.
        warmup_steps, min_steps, max_steps, target, budget_s: the :class:`Plan`.
        interleave: one step of each arm in turn (else arm after arm, each with a fresh stream).
        count_syncs: run one untimed step per arm under the sync counter.
        agree: for DDP, makes this rank's "stop" one every rank agrees on; None on one process.
        desc: the progress bar's label.
        failures: where failures are recorded (pipeline, or optional arm's name -> failure); None
            (always so with ``agree``): the first failure is raised as ``PipelineFailed``.
        stall_timeout_s: a stage's stall limit (:func:`stall_limit`); None: no limit.
        notebook: written into the failure records ("03").
        procs: the run's processes sharing these CPUs, for the CPU figures' cause.
        pairs: arms whose ratio is a figure: each runs until that ratio meets the target too.

    Returns:
        ``{arm name: ArmResult}`` of the arms that did not fail.
    """
    plan = Plan(warmup_steps, min_steps, max_steps, target, budget_s)
    st = Stepper(arms, failures=None if agree is not None else failures,
                 stall_timeout_s=stall_timeout_s, notebook=notebook, desc=desc, procs=procs,
                 count_syncs=count_syncs)
    st.bar = progress(desc=desc, total=len(arms) * max_steps)
    try:
        with st.watchdog if st.watchdog is not None else nullcontext():
            both = {**dict(pairs), **{b: a for a, b in pairs}}
            (_interleaved if interleave else _sequential)(st, plan, agree or (lambda f: f), both)
    finally:
        st.bar.close()
        for a in arms:
            a.stream = None
            a.watchdog = None
    return st.results(plan)


def project_epochs(step_seconds: float, samples_per_step: int, num_samples: int, *,
                   train_fraction: float = 0.8) -> dict:
    """Steps per epoch (``train_fraction`` of ``num_samples``) x time per step: epoch time and
    epochs per 24 h. Pure arithmetic on a measured step time."""
    import math

    if samples_per_step <= 0:
        raise ValueError(f"'samples_per_step' must be a positive integer (got {samples_per_step})")
    steps = math.ceil(num_samples * train_fraction / samples_per_step)
    epoch_s = steps * step_seconds
    return {"steps_per_epoch": steps, "epoch_seconds": epoch_s, "epochs_per_day": 86400 / epoch_s}
