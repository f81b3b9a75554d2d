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
"""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch.profiler import record_function
from torch.utils.data import DataLoader, Dataset

from ..measurement.syncs import SyncCounter
from ..measurement.timing import DEFAULT_TARGET, Stat, StepClock
from ..records import Record
from ..common.progress import progress
from ..pipelines.protocol import Pipeline

MODES = ("data", "forward", "forward_backward", "full")
MAIN_STAGES = ("loader_wait", "h2d", "device_prep", "forward", "backward", "optimizer")
WORKER_STAGES = ("worker_fetch", "worker_collate")
ALLREDUCE = ("every", "last", "never")


class TimedDataset(Dataset):
    """The pipeline's dataset, each item read with its fetch time (timed inside the worker)."""

    def __init__(self, pipeline: Pipeline):
        self.items = pipeline.dataset()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        t0 = time.perf_counter()
        item = self.items[i]
        return item, time.perf_counter() - t0


class TimedCollate:
    """The pipeline's collate, timed, with the items' fetch times summed (runs in workers);
    returns ``(batch, worker times)``."""

    def __init__(self, pipeline: Pipeline):
        self.collate = pipeline.collate

    def __call__(self, timed_items):
        t0 = time.perf_counter()
        batch = self.collate([it for it, _ in timed_items])
        return batch, {"fetch_s": sum(s for _, s in timed_items),
                       "collate_s": time.perf_counter() - t0}


def make_loader(pipeline: Pipeline, batch_size: int | None = None, *, num_workers: int = 0,
                pin_memory: bool = False, persistent_workers: bool = False) -> DataLoader:
    """A DataLoader over the pipeline's dataset producing its batches (full batches only)."""
    b = batch_size or pipeline.batch_size
    ds = TimedDataset(pipeline)
    if len(ds) < b:
        raise ValueError(f"pipeline {pipeline.name!r}: its dataset must hold at least one batch "
                         f"of {b} samples (got {len(ds)})")
    loader = DataLoader(ds, batch_size=b, shuffle=False, num_workers=num_workers,
                        collate_fn=TimedCollate(pipeline),
                        pin_memory=pin_memory and torch.device(pipeline.device).type == "cuda",
                        drop_last=True, persistent_workers=persistent_workers and num_workers > 0)
    loader.wb_pin_memory = pin_memory  # what a GPU run would do (the sync count follows it)
    return loader


def cycle(loader: DataLoader) -> Iterator:
    """Batches of ``loader`` forever (a new epoch when one ends)."""
    while True:
        yield from loader


@dataclass(frozen=True)
class Variant:
    """What one timed step does (see the module docstring)."""

    name: str
    mode: str = "full"
    micro_batches: int = 1
    allreduce: str = "every"
    gather: bool = False
    sync_stages: bool = True  # False: a pipelined step, synchronized only at its start and end

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"'mode' must be one of {list(MODES)} (got {self.mode!r})")
        if self.micro_batches <= 0:
            raise ValueError(f"'micro_batches' must be a positive integer (got {self.micro_batches})")
        if self.allreduce not in ALLREDUCE:
            raise ValueError(f"'allreduce' must be one of {list(ALLREDUCE)} (got {self.allreduce!r})")


class Arm:
    """One timed series of training steps (a pipeline, a model, a batch source, a variant).

    Args:
        name: unique name of the arm (e.g. ``"node_mask_shared/full"``).
        pipeline: what a step runs (:class:`~workbook_lib.pipelines.protocol.Pipeline`).
        loader: where batches come from (:func:`make_loader`; arms sharing a loader share its
            stream when interleaved).
        variant: what a step does.
        model: the pipeline's model or a ``DistributedDataParallel`` wrapping it (default
            ``pipeline.model``).
        optimizer: required for mode ``full``.
        hooks: optional object with ``begin_step()`` and ``end_step(clock)`` (e.g. DDP comm timing).
    """

    def __init__(self, name: str, pipeline: Pipeline, loader: DataLoader, variant: Variant, *,
                 model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, hooks=None):
        if variant.mode == "full" and optimizer is None:
            raise ValueError(f"arm {name!r}: mode 'full' needs an optimizer")
        if variant.gather and not _takes_gather(pipeline):
            raise ValueError(f"arm {name!r}: the loss-side all-gather needs a loss(output, batch, "
                             f"gather) (pipeline {pipeline.name!r} has none)")
        self.name, self.pipeline, self.loader = name, pipeline, loader
        self.model = pipeline.model if model is None else model
        self.variant, self.optimizer, self.hooks = variant, optimizer, hooks
        self.ddp = isinstance(self.model, torch.nn.parallel.DistributedDataParallel)
        self.batch_size = loader.batch_size
        self.stream: Iterator | None = None
        self.losses: list[torch.Tensor] = []  # every step's loss (detached; read after timing)
        self.record_losses = False

    @property
    def samples_per_step(self) -> int:
        return self.batch_size * self.variant.micro_batches

    def step(self, clock: StepClock, *, timed: bool, counter: SyncCounter | None = None) -> None:
        """One optimizer step (all its micro-batches), stages recorded in ``clock``.

        Mode ``data`` is the empty task: the batch is fetched, transferred and prepared, and no
        model runs (nothing to differentiate, nothing to zero)."""
        v, pipe = self.variant, self.pipeline
        if self.hooks is not None:
            self.hooks.begin_step()
        loss = None
        with clock.step(timed=timed):
            for micro in range(v.micro_batches):
                with _stage(clock, "loader_wait", v.sync_stages):
                    batch, worker = next(self.stream)
                clock.add("worker_fetch", worker["fetch_s"])
                clock.add("worker_collate", worker["collate_s"])
                skip = self.ddp and (v.allreduce == "never" or
                                     (v.allreduce == "last" and micro < v.micro_batches - 1))
                with self.model.no_sync() if skip else nullcontext():
                    with _stage(clock, "h2d", v.sync_stages, counter):
                        if counter is not None:  # as a GPU would: pageable copies synchronize
                            counter.transfer(batch, pinned=getattr(self.loader, "wb_pin_memory",
                                                                   self.loader.pin_memory))
                        batch = pipe.to_device(batch, non_blocking=self.loader.pin_memory)
                    with _stage(clock, "device_prep", v.sync_stages, counter):
                        inputs = pipe.prepare(batch)
                    if v.mode == "data":
                        continue
                    with _stage(clock, "forward", v.sync_stages, counter):
                        out = pipe.forward(self.model, inputs)
                        loss = (pipe.loss(out, batch, gather=True) if v.gather
                                else pipe.loss(out, batch))
                    if v.mode != "forward":
                        with _stage(clock, "backward", v.sync_stages, counter):
                            loss.backward()
            # the optimizer is outside the sync count: AdamW keeps its step counters on the host
            # (their .item() never waits for a GPU), which a CPU run could not tell apart
            if v.mode == "full":
                with _stage(clock, "optimizer", v.sync_stages):
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
            elif v.mode != "data":
                self.model.zero_grad(set_to_none=True)
            if self.hooks is not None:
                self.hooks.end_step(clock)
        if self.record_losses and loss is not None:
            self.losses.append(loss.detach())


def _takes_gather(pipeline: Pipeline) -> bool:
    import inspect

    try:
        return "gather" in inspect.signature(pipeline.loss).parameters
    except (TypeError, ValueError):
        return False


@contextmanager
def _stage(clock: StepClock, name: str, synced: bool = True, counter: SyncCounter | None = None):
    """One timed stage in a profiler range; with ``counter``, its host syncs counted (inside
    the clock's own device syncs, which are not the stage's)."""
    with record_function(f"wb:{name}"), clock.stage(name, synced), \
            (counter.stage(name) if counter is not None else nullcontext()):
        yield


@dataclass
class ArmResult(Record):
    """The timed steps of one arm: wall time per optimizer step, per stage, syncs."""

    name: str
    strategy: str
    variant: str
    mode: str
    batch_size: int
    micro_batches: int
    step: Stat
    stages: dict[str, Stat] = field(default_factory=dict)
    extra: dict[str, Stat] = field(default_factory=dict)  # worker stages, hook figures
    syncs_per_step: float | None = None
    sync_kinds: dict[str, float] = field(default_factory=dict)
    syncs_by_stage: dict[str, float] = field(default_factory=dict)  # stage -> syncs it made
    warmup_steps: int = 0
    timed_steps: int = 0
    stopped_by: str = ""

    @property
    def samples_per_step(self) -> int:
        return self.batch_size * self.micro_batches

    @property
    def ms_per_sample(self) -> Stat:
        return self.step.scaled(1e3 / self.samples_per_step, "ms/sample")

    @property
    def it_per_s(self) -> Stat:
        return self.step.inverse("it/s")

    @property
    def untracked(self) -> Stat:
        """Wall time not inside any stage (loop overhead, zero_grad, hooks)."""
        parts = [self.stages[s].samples for s in MAIN_STAGES if s in self.stages]
        return Stat.from_samples([w - sum(p[i] for p in parts)
                                  for i, w in enumerate(self.step.samples)]).with_cpu(
            self.step.cpu)


def _result(arm: Arm, clock: StepClock, warmup: int, counted: SyncCounter | None,
            stopped_by: str, target: float) -> ArmResult:
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
        warmup_steps=warmup, timed_steps=clock.n, stopped_by=stopped_by)


def _children_label(loader: DataLoader) -> str | None:
    """What an arm's CPU figure says about its DataLoader workers' CPU time (excluded: it is in
    their own processes); None without workers (the default label)."""
    w = getattr(loader, "num_workers", 0)
    return None if not w else (f"not counted: the {w} DataLoader worker process(es)' CPU time "
                               "is in their own processes (this figure is the main process's)")


def run_arms(arms: list[Arm], *, warmup_steps: int = 1, min_steps: int = 10,
             max_steps: int = 30, target: float = DEFAULT_TARGET, budget_s: float = 120.0,
             interleave: bool = True, count_syncs: bool = True,
             agree: Callable[[bool], bool] | None = None, desc: str = "loop",
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
        procs: the run's processes sharing these CPUs (DDP ranks on the node), for the CPU
            figures' cause.

    Returns:
        ``{arm name: ArmResult}``.
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
    device = torch.device(arms[0].pipeline.device)
    clocks = {a.name: StepClock(device, children=_children_label(a.loader), procs=procs,
                                workers=getattr(a.loader, "num_workers", 0)) for a in arms}
    counters: dict[str, SyncCounter | None] = {a.name: None for a in arms}
    stopped = {a.name: "" for a in arms}
    agree = agree or (lambda flag: flag)

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

    def count_step(arm: Arm, clock: StepClock) -> None:
        if count_syncs:
            counters[arm.name] = SyncCounter(device)
            arm.step(clock, timed=False, counter=counters[arm.name])

    shared: dict = {}
    total = len(arms) * max_steps
    bar = progress(desc=desc, total=total)
    try:
        if interleave:
            for a in arms:
                prelude(a, shared)
            for _ in range(warmup_steps):
                for a in arms:
                    a.step(clocks[a.name], timed=False)
            for a in arms:
                count_step(a, clocks[a.name])
            t0 = time.perf_counter()
            active = list(arms)
            while active:
                for a in active:
                    a.step(clocks[a.name], timed=True)
                    bar.update(1)
                spent = time.perf_counter() - t0
                still = []
                for a in active:
                    why = stop_reason(a, spent, budget_s)
                    if agree(bool(why)):
                        stopped[a.name] = why or "stopped with the other ranks"
                    else:
                        still.append(a)
                active = still
        else:
            per_arm = budget_s / max(1, len(arms))
            for a in arms:
                prelude(a, shared)
                clock = clocks[a.name]
                for _ in range(warmup_steps):
                    a.step(clock, timed=False)
                count_step(a, clock)
                t0 = time.perf_counter()
                while True:
                    a.step(clock, timed=True)
                    bar.update(1)
                    why = stop_reason(a, time.perf_counter() - t0, per_arm)
                    if agree(bool(why)):
                        stopped[a.name] = why or "stopped with the other ranks"
                        break
                a.stream = None  # ends this arm's worker processes
    finally:
        bar.close()
        for a in arms:
            a.stream = None
    return {a.name: _result(a, clocks[a.name], warmup_steps, counters[a.name], stopped[a.name],
                            target) for a in arms}


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
