"""The training loop every timing of a step goes through (notebook 03, the DDP worker, 06).

A step is the real thing: a ``torch.utils.data.DataLoader`` fetches and collates a pipeline's
samples (in worker processes when ``num_workers > 0``), the batch is moved to the device, the
pipeline's device preparation runs, then its model and loss. The pipeline
(:mod:`workbook_lib.pipelines`) is a built-in strategy or the user's own: the loop is the same.
An :class:`Arm` is one timed series of such steps: a pipeline, its model (plain or wrapped in
``DistributedDataParallel``), a batch stream and a :class:`Variant` saying how far the step goes:

* modes ``data`` (the empty task: fetch, collate, transfer and device preparation, no model
  call), ``forward`` (+ forward and loss), ``forward_backward`` and ``full`` (+ the optimizer);
* for DDP: micro-batches per optimizer step, which of them all-reduce (``every``, only the
  ``last`` as with ``no_sync()`` accumulation, or ``never``), and the loss-side all-gather.

Every stage is timed between device syncs in a :class:`~workbook_lib.measurement.timing.StepClock`
(a variant with ``sync_stages=False`` is the same step synchronized only at its start and end: on
a GPU the per-stage syncs serialize the host's work with the device's, so the pipelined step is
reported beside the stage attribution)
and wrapped in a ``wb:<stage>`` profiler range (for the exclusive-time trace breakdown); the
DataLoader workers time their own fetch and collate and send the times with the batch.

:func:`run_arms` runs arms until each is precise enough: warm-up steps first (never recorded),
then one step with the sync counter on (counting has a per-operator cost, so it never runs in a
timed step), then timed steps until IQR/median <= the target with at least ``min_steps``, or
``max_steps``, or the time budget. With ``num_workers == 0`` the arms are **interleaved** (one
step of each in turn), so their ratios carry no drift of the machine; with worker processes they
run one after another, since workers prefetching while another arm runs would hide the data
pipeline's cost.

**A pipeline that fails costs only its own arms** (``run_arms(..., failures={})``): a step that
raises (in any stage, in the main process or in a DataLoader worker) or stalls stops every arm of
that pipeline; a :class:`~workbook_lib.failures.PipelineFailure` naming its stage and step is
recorded and the other arms go on. Without ``failures`` (DDP ranks, whose collectives must
match) the failure is raised as :class:`~workbook_lib.failures.PipelineFailed`.

**Stalls** (``stall_timeout_s``): a stage in the main process is stopped by a
:class:`~workbook_lib.common.watchdog.Watchdog` once it has run ``stall_timeout_s`` seconds or,
once the pipeline has completed a step, :data:`STALL_FACTOR` times its slowest step (but at
least :data:`STALL_FLOOR_S` seconds), whichever is shorter. With DataLoader workers each worker
watches its own batch (its items and collate) for ``stall_timeout_s`` and reports the stage, and
the DataLoader's ``timeout`` (a little longer) stops a wait that no worker reported; the workers
are shut down with the stream.

**A loss that is not finite** is detected without a host sync in the step: each step's loss is
kept (detached) and checked once when the arm ends; the arm's result counts the steps whose loss
was NaN or infinite and names the first.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Callable, Iterator

import torch
from torch.utils.data import DataLoader

from ..common.progress import note, progress
from ..common.watchdog import Watchdog
from ..failures import PipelineFailed, PipelineFailure
from ..measurement.syncs import SyncCounter
from ..measurement.timing import DEFAULT_TARGET, StepClock
from ..pipelines.protocol import Pipeline
from ..results.timing import ArmResult, MAIN_STAGES
# an arm is built with the loop's Arm and Variant
from .arms import MODES, Arm, Variant  # noqa: F401
from .timed_data import TimedCollate, TimedDataset

WORKER_STAGES = ("worker_fetch", "worker_collate")
STALL_FACTOR = 20.0  # a stage this many times the pipeline's slowest step has stalled...
STALL_FLOOR_S = 30.0  # ...but never under this many seconds (stall_timeout_s may be shorter)
LOADER_TIMEOUT_MARGIN_S = 2.0  # the DataLoader's own timeout: the workers' limit plus this


def make_loader(pipeline: Pipeline, batch_size: int | None = None, *, num_workers: int = 0,
                pin_memory: bool = False, persistent_workers: bool = False,
                stall_timeout_s: float | None = None) -> DataLoader:
    """A DataLoader over the pipeline's dataset producing its batches (full batches only).

    Args:
        stall_timeout_s: with workers, how long a worker may spend on one batch before it
            reports a stall (and the DataLoader's ``timeout``, a little longer); None: no limit.
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
        warmup_steps=warmup, timed_steps=clock.n, stopped_by=stopped_by, nonfinite_steps=bad,
        first_nonfinite_step=first, nonfinite_value=value, loss_steps=checked,
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


def run_arms(arms: list[Arm], *, warmup_steps: int = 1, min_steps: int = 10,
             max_steps: int = 30, target: float = DEFAULT_TARGET, budget_s: float = 120.0,
             interleave: bool = True, count_syncs: bool = True,
             agree: Callable[[bool], bool] | None = None, desc: str = "loop",
             failures: dict[str, PipelineFailure] | None = None,
             stall_timeout_s: float | None = None, notebook: str = "",
             procs: int = 1) -> dict[str, ArmResult]:
    """Run every arm until it is precise enough (see the module docstring).

    Args:
        arms: the arms; their names must be unique.
        warmup_steps: untimed steps per arm first (never recorded).
        min_steps: the fewest timed steps per arm.
        max_steps: the most timed steps per arm.
        target: stop an arm once its step time's IQR/median is at most this.
        budget_s: time for the timed steps of all arms; once spent, arms stop at ``min_steps``.
        interleave: one step of each arm in turn (else arm after arm, each with a fresh stream).
        count_syncs: run one untimed step per arm under the sync counter.
        agree: for DDP, turns this rank's "stop" into one every rank agrees on (collectives
            must match across ranks); None on a single process.
        desc: the progress bar's label.
        failures: where a pipeline that fails is recorded (pipeline -> its failure): its arms
            stop, the others go on, and its arms are left out of the result. None: the first
            failure is raised (:class:`~workbook_lib.failures.PipelineFailed`); always so with
            ``agree`` (a rank cannot leave its collectives).
        stall_timeout_s: the stall limit of a stage (:func:`stall_limit`); None: no limit.
        notebook: written into the failure records ("03").
        procs: the run's processes sharing these CPUs (DDP ranks on the node), for the CPU
            figures' cause.

    Returns:
        ``{arm name: ArmResult}`` of the arms whose pipeline did not fail.
    """
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise ValueError(f"arm names must be unique (got {names})")
    if warmup_steps < 0:
        raise ValueError(f"'warmup_steps' must be >= 0 (got {warmup_steps})")
    if min_steps <= 0:
        raise ValueError(f"'min_steps' must be a positive integer (got {min_steps})")
    if max_steps < min_steps:
        raise ValueError(f"'max_steps' must be >= min_steps={min_steps} (got {max_steps})")
    if agree is not None:
        failures = None
    device = torch.device(arms[0].pipeline.device)
    clocks = {a.name: StepClock(device, children=_children_label(a.loader), procs=procs,
                                workers=getattr(a.loader, "num_workers", 0)) for a in arms}
    counters: dict[str, SyncCounter | None] = {a.name: None for a in arms}
    stopped = {a.name: "" for a in arms}
    agree = agree or (lambda flag: flag)
    slowest: dict[str, float] = {}  # pipeline -> its slowest step so far (the stall rule)
    shown = [0.0]  # when the progress line last named the arm running
    failed: set[str] = set()

    def stop_reason(arm: Arm, spent: float, budget: float) -> str:
        c = clocks[arm.name]
        if c.n < min_steps:
            return ""
        if c.wall().rel_iqr <= target:
            return "precision target"
        if c.n >= max_steps:
            return "max steps"
        if spent >= budget:
            return "time budget"
        return ""

    def prelude(arm: Arm, shared: dict) -> None:
        if interleave:
            key = id(arm.loader)
            if key not in shared:
                shared[key] = cycle(arm.loader)
            arm.stream = shared[key]
        else:
            arm.stream = cycle(arm.loader)

    def run_step(arm: Arm, *, timed: bool, counter: SyncCounter | None = None) -> bool:
        """One step of ``arm``; False when its pipeline failed (recorded, its arms stopped)."""
        pipe = arm.pipeline.name
        if pipe in failed:
            return False
        limit = stall_limit(stall_timeout_s, slowest.get(pipe))
        arm.watchdog = watchdog if limit else None
        arm.watch_loader = getattr(arm.loader, "num_workers", 0) == 0
        t0 = time.perf_counter()
        # the arm running, on the terminal (at most once a second: a refresh writes the line)
        bar.set_postfix_str(arm.name, refresh=t0 - shown[0] > 1.0)
        if t0 - shown[0] > 1.0:
            shown[0] = t0
        if arm.watchdog is not None:
            arm.watchdog.arm(limit)  # once per step, outside its timed region
        try:
            arm.step(clocks[arm.name], timed=timed, counter=counter)
        except PipelineFailed as exc:
            f = exc.failure
            f.notebook = notebook
            if failures is None:
                raise
            failures[pipe] = f
            failed.add(pipe)
            for other in arms:
                if other.pipeline.name == pipe:
                    close_stream(other.stream)
                    other.stream = None
            note(f"{desc}: {f.line()}; the other pipelines go on")
            return False
        finally:
            if arm.watchdog is not None:
                arm.watchdog.disarm()
        slowest[pipe] = max(slowest.get(pipe, 0.0), time.perf_counter() - t0)
        return True

    def count_step(arm: Arm) -> None:
        if count_syncs:
            counters[arm.name] = SyncCounter(device)
            run_step(arm, timed=False, counter=counters[arm.name])

    shared: dict = {}
    total = len(arms) * max_steps
    bar = progress(desc=desc, total=total)
    watchdog = Watchdog(announce=note, why="stall_timeout_s, or "
                        f"{STALL_FACTOR:g}x the slowest step and at least {STALL_FLOOR_S:g} s") \
        if stall_timeout_s else None
    try:
        with watchdog if watchdog is not None else nullcontext():
            if interleave:
                for a in arms:
                    prelude(a, shared)
                for _ in range(warmup_steps):
                    for a in arms:
                        run_step(a, timed=False)
                for a in arms:
                    count_step(a)
                t0 = time.perf_counter()
                active = [a for a in arms if a.pipeline.name not in failed]
                while active:
                    for a in active:
                        if run_step(a, timed=True):
                            bar.update(1)
                    spent = time.perf_counter() - t0
                    still = []
                    for a in active:
                        if a.pipeline.name in failed:
                            continue
                        why = stop_reason(a, spent, budget_s)
                        if agree(bool(why)):
                            stopped[a.name] = why or "stopped with the other ranks"
                        else:
                            still.append(a)
                    active = still
            else:
                per_arm = budget_s / max(1, len(arms))
                for a in arms:
                    if a.pipeline.name in failed:
                        continue
                    prelude(a, shared)
                    ok = all(run_step(a, timed=False) for _ in range(warmup_steps))
                    if ok:
                        count_step(a)
                    t0 = time.perf_counter()
                    while a.pipeline.name not in failed:
                        if run_step(a, timed=True):
                            bar.update(1)
                        else:
                            break
                        why = stop_reason(a, time.perf_counter() - t0, per_arm)
                        if agree(bool(why)):
                            stopped[a.name] = why or "stopped with the other ranks"
                            break
                    close_stream(a.stream)  # ends this arm's worker processes
                    a.stream = None
    finally:
        bar.close()
        for a in arms:
            if not interleave:
                close_stream(a.stream)
            a.stream = None
            a.watchdog = None
        for st in shared.values():
            close_stream(st)
    return {a.name: _result(a, clocks[a.name], warmup_steps, counters[a.name], stopped[a.name],
                            target) for a in arms if a.pipeline.name not in failed}


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
