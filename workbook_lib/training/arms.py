"""An arm: one timed series of training steps of a pipeline, the variant saying how far each step
goes, and how one stage of a step is timed (see :mod:`.loop`, whose :func:`~.loop.run_arms`
runs arms)."""
from __future__ import annotations

import math
import re
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Iterator

import torch
from torch.profiler import record_function
from torch.utils.data import DataLoader

from ..common.watchdog import Stalled, Watchdog
from ..failures import LOOP_STAGE_NAMES, STALLED, PipelineFailed, PipelineFailure, failure_from
from ..measurement.syncs import SyncCounter
from ..measurement.timing import StepClock
from ..pipelines.protocol import LossSplit, Pipeline
from ..results.timing import GC_PAUSE, MODES
from .timed_data import DataFailure


ALLREDUCE = ("every", "last", "never")
_DDP_NO_ATTR = re.compile(r"'DistributedDataParallel' object has no attribute '(\w+)'")


def moves_every_tensor(pipe) -> bool:
    """Whether the pipeline's ``to_device`` is the protocol's default or a built-in strategy's:
    both move every tensor of the batch (and skip those already on the device)."""
    from ..pipelines.builtin import BuiltinPipeline

    own = getattr(type(pipe), "to_device", None)
    return own is Pipeline.to_device or isinstance(pipe, BuiltinPipeline)


@dataclass(frozen=True)
class Variant:
    """What one timed step does (see :mod:`.loop`'s docstring)."""

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
        pipeline: what a step runs; variant: how far it goes.
        loader: where batches come from (:func:`make_loader`; shared when interleaved).
        model: the pipeline's model or a ``DistributedDataParallel`` wrapping it.
        optimizer: required for mode ``full``.
        hooks: optional object with ``begin_step()`` and ``end_step(clock)`` (e.g. DDP comm timing).
        optional: a failure stops this arm alone (it needs a loader of its own).
    """

    def __init__(self, name: str, pipeline: Pipeline, loader: DataLoader, variant: Variant, *,
                 model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, hooks=None,
                 optional: bool = False):
        if variant.mode == "full" and optimizer is None:
            raise ValueError(f"arm {name!r}: mode 'full' needs an optimizer")
        if variant.gather and not _takes_gather(pipeline):
            raise ValueError(f"arm {name!r}: the loss-side all-gather needs a loss(output, batch, "
                             f"gather) (pipeline {pipeline.name!r} has none)")
        self.name, self.pipeline, self.loader = name, pipeline, loader
        self.model = pipeline.model if model is None else model
        self.variant, self.optimizer, self.hooks = variant, optimizer, hooks
        self.optional = optional
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
        # the trainable parameters (a loss may use some itself: LossSplit), and why the loss's
        # backward is not timed apart from the model's ("" when it is)
        self.parameters = [p for p in pipeline.model.parameters() if p.requires_grad]
        self.loss_split = ""

    @property
    def samples_per_step(self) -> int:
        return self.batch_size * self.variant.micro_batches

    def step(self, clock: StepClock, *, timed: bool, counter: SyncCounter | None = None) -> None:
        """One optimizer step (all its micro-batches), stages recorded in ``clock``; mode ``data``
        runs no model.

        Raises:
            PipelineFailed: a stage raised or stalled (``notebook`` left for the caller to fill in).
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

    def _check_batch(self, batch, index: int) -> None:
        """Raise the failure a DataLoader worker sent in place of the batch, if it did."""
        if isinstance(batch, DataFailure):
            raise PipelineFailed(PipelineFailure(
                self.pipeline.name, "", batch.stage, batch.kind, batch.message, batch.traceback,
                index, self.mode_name, waited_s=batch.waited_s))

    def _loss(self, out, batch, index: int):
        """The pipeline's loss of ``out`` (with the loss-side gather when the variant asks),
        kept detached to be checked for NaN/inf when the arm ends."""
        pipe = self.pipeline
        loss = pipe.loss(out, batch, gather=True) if self.variant.gather else pipe.loss(out, batch)
        if isinstance(loss, torch.Tensor):
            self.loss_checks.append((index, loss.detach()))
        return loss

    def _plain_step(self, clock: StepClock, timed: bool, index: int) -> None:
        """The pipelined step: what a plain training loop runs (fetch, transfer, prepare,
        forward, loss, one backward, optimizer), timed as one, with no stage records, loss
        split or profiler ranges, whose cost the synchronized modes add to every step; the
        watchdog watches the step as one stage."""
        pipe, wd = self.pipeline, self.watchdog
        what = f"'{pipe.name}' ({self.mode_name})"
        if self.hooks is not None:
            self.hooks.begin_step()
        with clock.step(timed=timed):
            self.where = "step"
            if wd is not None and self.watch_loader:
                wd.enter(what, LOOP_STAGE_NAMES["step"])
            try:
                batch, _worker = next(self.stream)
                if wd is not None and not self.watch_loader:
                    wd.enter(what, LOOP_STAGE_NAMES["step"])
                self._check_batch(batch, index)
                batch = pipe.to_device(batch, non_blocking=self.loader.pin_memory)
                out = pipe.forward(self.model, pipe.prepare(batch))
                self._loss(out, batch, index).backward()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            finally:
                if wd is not None:
                    wd.leave()
            if self.hooks is not None:
                self.hooks.end_step(clock)

    def _step(self, clock: StepClock, timed: bool, counter: SyncCounter | None,
              index: int) -> None:
        v, pipe = self.variant, self.pipeline
        if not v.sync_stages and v.mode == "full" and v.micro_batches == 1 and counter is None:
            return self._plain_step(clock, timed, index)
        if self.hooks is not None:
            self.hooks.begin_step()
        loss = None
        with clock.step(timed=timed):
            for micro in range(v.micro_batches):
                with self._stage(clock, "loader_wait", v.sync_stages):
                    batch, worker = next(self.stream)
                self._check_batch(batch, index)
                clock.add("worker_fetch", worker["fetch_s"])
                clock.add("worker_collate", worker["collate_s"])
                # the collector inside them, where they ran (a worker's: this process never sees)
                clock.add(f"{GC_PAUSE}:worker_fetch", worker["fetch_gc_s"])
                clock.add(f"{GC_PAUSE}:worker_collate", worker["collate_gc_s"])
                skip = self.ddp and (v.allreduce == "never" or
                                     (v.allreduce == "last" and micro < v.micro_batches - 1))
                with self.model.no_sync() if skip else nullcontext():
                    with self._stage(clock, "h2d", v.sync_stages, counter):
                        if counter is not None:  # as a GPU would: pageable copies synchronize
                            counter.transfer(batch, pinned=getattr(self.loader, "wb_pin_memory",
                                                                   self.loader.pin_memory),
                                             every_tensor=moves_every_tensor(pipe))
                        batch = pipe.to_device(batch, non_blocking=self.loader.pin_memory)
                    with self._stage(clock, "device_prep", v.sync_stages, counter):
                        inputs = pipe.prepare(batch)
                    if v.mode == "data":
                        continue
                    with self._stage(clock, "forward", v.sync_stages, counter):
                        out = pipe.forward(self.model, inputs)
                    with self._stage(clock, "loss", v.sync_stages, counter):
                        split = (LossSplit(out, self.parameters) if v.mode != "forward"
                                 else None)
                        if split is not None and split.split:
                            out = split.output
                        loss = self._loss(out, batch, index)
                    if split is not None:
                        self.loss_split = split.why_not
                        if split.split:
                            split.loss = loss
                            with self._stage(clock, "loss_backward", v.sync_stages, counter):
                                split.loss_backward()
                            with self._stage(clock, "backward", v.sync_stages, counter):
                                split.model_backward()
                        else:
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
