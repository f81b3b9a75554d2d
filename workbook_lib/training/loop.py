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

import math
import os
import re
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch.profiler import record_function
from torch.utils.data import DataLoader, Dataset

from ..common.progress import note, progress
from ..common.watchdog import Stalled, Watchdog, current, process_watchdog
from ..failures import (LOOP_STAGE_NAMES, RAISED, STALLED, PipelineFailed, PipelineFailure,
                        failure_from, one_line)
from ..measurement.syncs import SyncCounter
from ..measurement.timing import DEFAULT_TARGET, StepClock
from ..pipelines.protocol import Pipeline
from ..results.timing import ArmResult, MAIN_STAGES

MODES = ("data", "forward", "forward_backward", "full")
WORKER_STAGES = ("worker_fetch", "worker_collate")
ALLREDUCE = ("every", "last", "never")
STALL_FACTOR = 20.0  # a stage this many times the pipeline's slowest step has stalled...
STALL_FLOOR_S = 30.0  # ...but never under this many seconds (stall_timeout_s may be shorter)
LOADER_TIMEOUT_MARGIN_S = 2.0  # the DataLoader's own timeout: the workers' limit plus this
_DDP_NO_ATTR = re.compile(r"'DistributedDataParallel' object has no attribute '(\w+)'")


@dataclass
class DataFailure:
    """What a dataset item or collate that failed hands the loop instead of a batch (picklable:
    it comes back from a DataLoader worker like a batch)."""

    stage: str  # "data item" or "collate"
    kind: str  # raised or stalled
    message: str
    traceback: str
    waited_s: float | None = None


def _in_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


class TimedDataset(Dataset):
    """The pipeline's dataset, each item read with its fetch time (timed inside the worker).

    An item that raises or stalls becomes a :class:`DataFailure` (and so does every later item:
    the pipeline is finished). In a DataLoader worker the batch's items and collate are watched
    by the worker's own watchdog for ``stall_s``; in the main process the loop's watchdog names
    the stage."""

    def __init__(self, pipeline: Pipeline, stall_s: float | None = None):
        self.items = pipeline.dataset()
        self.name = getattr(pipeline, "name", "") or type(pipeline).__name__
        self.stall_s = stall_s
        self.failed: DataFailure | None = None

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        if self.failed is not None:
            return self.failed, 0.0
        wd = _data_watchdog(self.stall_s)
        if wd is not None:
            if wd.limit is None and _in_worker():
                wd.start(f"'{self.name}' (DataLoader worker)", "data item", self.stall_s)
            else:
                wd.rename("data item")
        t0 = time.perf_counter()
        try:
            item = self.items[i]
        except (Exception, Stalled) as exc:  # noqa: BLE001 - the user's item: recorded
            self.failed = _data_failure("data item", exc)
            return self.failed, 0.0
        return item, time.perf_counter() - t0


def _data_watchdog(stall_s: float | None) -> Watchdog | None:
    """The watchdog of the data stages: a DataLoader worker's own (when a limit is set), else
    the loop's in this process (naming the stage only)."""
    if _in_worker():
        return process_watchdog(why="stall_timeout_s") if stall_s else None
    return current()


def _data_failure(stage: str, exc: BaseException) -> DataFailure:
    import traceback

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if isinstance(exc, Stalled):
        return DataFailure(exc.stage or stage, STALLED, one_line(exc), tb, exc.waited_s)
    return DataFailure(stage, RAISED, f"{stage} raised {type(exc).__name__}: {one_line(exc)}",
                       tb)


class TimedCollate:
    """The pipeline's collate, timed, with the items' fetch times summed (runs in workers);
    returns ``(batch, worker times)``, or ``(DataFailure, times)`` when an item or the collate
    failed."""

    def __init__(self, pipeline: Pipeline):
        self.collate = pipeline.collate

    def __call__(self, timed_items):
        zero = {"fetch_s": 0.0, "collate_s": 0.0}
        worker = _in_worker()
        try:
            failed = next((it for it, _ in timed_items if isinstance(it, DataFailure)), None)
            if failed is not None:
                return failed, zero
            wd = (process_watchdog() if _worker_watched() else None) if worker else current()
            if wd is not None:
                wd.rename("collate")
            t0 = time.perf_counter()
            try:
                batch = self.collate([it for it, _ in timed_items])
            except (Exception, Stalled) as exc:  # noqa: BLE001 - the user's collate: recorded
                return _data_failure("collate", exc), zero
            return batch, {"fetch_s": sum(s for _, s in timed_items),
                           "collate_s": time.perf_counter() - t0}
        finally:
            if worker and _worker_watched():
                process_watchdog().stop()  # this worker's batch is done


def _worker_watched() -> bool:
    from ..common import watchdog

    return os.getpid() in watchdog._PROCESS


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
        self.steps_run = 0  # steps begun (warm-up and the sync-counted step included)
        self.where = ""  # the stage running now (named when a step fails)
        # every micro-batch's loss, detached, with its step: checked for NaN/inf when the arm
        # ends (one host read then, none in the step)
        self.loss_checks: list[tuple[int, torch.Tensor]] = []
        # set (and armed for each step) by run_arms, or by a caller that arms it itself: stops
        # a stage of the step that stalls
        self.watchdog: Watchdog | None = None
        self.watch_loader = True  # False with DataLoader workers: they watch themselves

    @property
    def samples_per_step(self) -> int:
        return self.batch_size * self.variant.micro_batches

    def step(self, clock: StepClock, *, timed: bool, counter: SyncCounter | None = None) -> None:
        """One optimizer step (all its micro-batches), stages recorded in ``clock``.

        Mode ``data`` is the empty task: the batch is fetched, transferred and prepared, and no
        model runs (nothing to differentiate, nothing to zero).

        Raises:
            PipelineFailed: a stage raised or stalled (its stage, this arm's step index and the
                traceback in the record; ``notebook`` is left for the caller to fill in).
        """
        index = self.steps_run
        self.steps_run += 1
        try:
            self._step(clock, timed, counter, index)
        except PipelineFailed:
            raise
        except (Exception, Stalled) as exc:  # noqa: BLE001 - the pipeline's code: recorded
            stage = LOOP_STAGE_NAMES.get(self.where, self.where)
            if isinstance(exc, RuntimeError) and "DataLoader timed out" in str(exc):
                w = self.loader.timeout
                raise PipelineFailed(PipelineFailure(
                    self.pipeline.name, "", "data item or collate", STALLED,
                    f"no batch from the DataLoader workers for {w:g} s (a worker blocked in "
                    "a stage it could not be stopped in, died, or returned a batch that "
                    "cannot be pickled)", _format(exc), index, self.mode_name,
                    waited_s=float(w))) from None
            f = failure_from(exc, pipeline=self.pipeline.name, notebook="", stage=stage,
                             step=index, mode=self.mode_name)
            m = _DDP_NO_ATTR.search(str(exc)) if isinstance(exc, AttributeError) else None
            if m is not None:  # the rule the preflight checks, met here without it
                f.message = (f"forward uses model.{m.group(1)}, which DDP's wrapper does not "
                             "have: call model(...) and let the model's own forward use its "
                             "parts")
            raise PipelineFailed(f) from None
        finally:
            self.where = ""

    @property
    def mode_name(self) -> str:
        """The arm's name after its pipeline's ("full", "gap", "ddp@all-threads")."""
        return self.name.split("/", 1)[1] if "/" in self.name else self.variant.name

    def _stage(self, clock: StepClock, name: str, synced: bool,
               counter: SyncCounter | None = None):
        self.where = name
        wd = self.watchdog
        if wd is not None and (name != "loader_wait" or self.watch_loader):
            return _stage(clock, name, synced, counter, wd,
                          f"'{self.pipeline.name}' ({self.mode_name})")
        return _stage(clock, name, synced, counter)

    def _step(self, clock: StepClock, timed: bool, counter: SyncCounter | None,
              index: int) -> None:
        v, pipe = self.variant, self.pipeline
        if self.hooks is not None:
            self.hooks.begin_step()
        loss = None
        with clock.step(timed=timed):
            for micro in range(v.micro_batches):
                with self._stage(clock, "loader_wait", v.sync_stages):
                    batch, worker = next(self.stream)
                if isinstance(batch, DataFailure):
                    raise PipelineFailed(PipelineFailure(
                        pipe.name, "", batch.stage, batch.kind, batch.message, batch.traceback,
                        index, self.mode_name, waited_s=batch.waited_s))
                clock.add("worker_fetch", worker["fetch_s"])
                clock.add("worker_collate", worker["collate_s"])
                skip = self.ddp and (v.allreduce == "never" or
                                     (v.allreduce == "last" and micro < v.micro_batches - 1))
                with self.model.no_sync() if skip else nullcontext():
                    with self._stage(clock, "h2d", v.sync_stages, counter):
                        if counter is not None:  # as a GPU would: pageable copies synchronize
                            counter.transfer(batch, pinned=getattr(self.loader, "wb_pin_memory",
                                                                   self.loader.pin_memory))
                        batch = pipe.to_device(batch, non_blocking=self.loader.pin_memory)
                    with self._stage(clock, "device_prep", v.sync_stages, counter):
                        inputs = pipe.prepare(batch)
                    if v.mode == "data":
                        continue
                    with self._stage(clock, "forward", v.sync_stages, counter):
                        out = pipe.forward(self.model, inputs)
                        self.where = "loss"
                        loss = (pipe.loss(out, batch, gather=True) if v.gather
                                else pipe.loss(out, batch))
                    if isinstance(loss, torch.Tensor):
                        self.loss_checks.append((index, loss.detach()))
                    if v.mode != "forward":
                        with self._stage(clock, "backward", v.sync_stages, counter):
                            loss.backward()
            # the optimizer is outside the sync count: AdamW keeps its step counters on the host
            # (their .item() never waits for a GPU), which a CPU run could not tell apart
            if v.mode == "full":
                with self._stage(clock, "optimizer", v.sync_stages):
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
            elif v.mode != "data":
                self.model.zero_grad(set_to_none=True)
            if self.hooks is not None:
                self.hooks.end_step(clock)
        if self.record_losses and loss is not None:
            self.losses.append(loss.detach())

    def nonfinite(self) -> tuple[int, int | None, str, int]:
        """(steps whose loss was NaN or infinite, the first of them, "NaN"/"inf" of that one,
        steps checked), read once (one host sync) from the losses kept."""
        if not self.loss_checks:
            return 0, None, "", 0
        vals = torch.stack([x.float().sum() for _, x in self.loss_checks]).cpu().tolist()
        bad = sorted({i for (i, _), x in zip(self.loss_checks, vals) if not math.isfinite(x)})
        steps = len({i for i, _ in self.loss_checks})
        if not bad:
            return 0, None, "", steps
        first = next(x for (i, _), x in zip(self.loss_checks, vals) if i == bad[0]
                     and not math.isfinite(x))
        return len(bad), bad[0], "NaN" if math.isnan(first) else "inf", steps


def _format(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _takes_gather(pipeline: Pipeline) -> bool:
    import inspect

    try:
        return "gather" in inspect.signature(pipeline.loss).parameters
    except (TypeError, ValueError):
        return False


@contextmanager
def _stage(clock: StepClock, name: str, synced: bool = True, counter: SyncCounter | None = None,
           watchdog: Watchdog | None = None, what: str = ""):
    """One timed stage in a profiler range; with ``counter``, its host syncs counted (inside
    the clock's own device syncs, which are not the stage's); with an armed ``watchdog``, named
    to it (attribute writes, no system call), so that it is stopped should it stall (the device
    sync that ends the stage is part of it)."""
    if watchdog is not None:
        watchdog.enter(what, LOOP_STAGE_NAMES.get(name, name))
    try:
        with record_function(f"wb:{name}"), clock.stage(name, synced), \
                (counter.stage(name) if counter is not None else nullcontext()):
            yield
    finally:
        if watchdog is not None:
            watchdog.leave()


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
