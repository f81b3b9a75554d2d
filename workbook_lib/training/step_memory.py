"""Peak memory of one training step of a pipeline, measured in a fresh process by
:mod:`workbook_lib.measurement.memory`.

:func:`measure_point` hands the fresh process :func:`setup_step`, which builds the pipeline and
one batch at the point's sizes; the step (collate to backward) runs after a warm-up step, each
stage watched for a stall; a failure comes back as a ``PipelineFailed`` record.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..common.watchdog import Stalled, process_watchdog
from ..configs.validation import Params
from ..data.snapshots import load_snapshot
from ..measurement.memory import MemoryPoint, StepToMeasure, measure_in_fresh_process
from ..failures import PipelineFailed, failure_from
from ..pipelines import build_pipeline, is_builtin


@dataclass(frozen=True)
class StepSpec:
    """One memory point's step, as the fresh process builds it (pickled to it)."""

    params: Params  # the run's, with the point's scale, hidden, layers and dual forward
    strategy: str  # a built-in strategy or a user pipeline of ``params``
    batch_size: int
    device: str
    form: str  # a replicated built-in strategy's message form


def setup_step(cfg: StepSpec) -> StepToMeasure:
    """The fresh process's set-up: the pipeline's training step on one batch (see module docs)."""
    p = cfg.params
    b = cfg.batch_size
    graph = load_snapshot(p.data)
    builtin = is_builtin(cfg.strategy)
    pipe = build_pipeline(p, cfg.strategy, graph, cfg.device, batch_size=b, n_items=b,
                          form=cfg.form if builtin else None, check=False)
    limit = p.stall_timeout_s
    wd = process_watchdog(why="stall_timeout_s")
    steps = [0]

    def stage(where: str, fn):
        """One stage, watched for a stall; a failure raised as the pipeline's (its record goes
        to the parent as the exception's ``details``)."""
        try:
            if limit:
                wd.start(f"'{pipe.name}'", where, limit)
            return fn()
        except PipelineFailed:
            raise
        except (Exception, Stalled) as exc:  # noqa: BLE001 - the pipeline's code: recorded
            raise PipelineFailed(failure_from(exc, pipeline=pipe.name, notebook="02",
                                              stage=where, step=steps[0],
                                              mode=f"memory probe, B={b}")) from exc
        finally:
            wd.stop()

    ds = stage("data item", pipe.dataset)
    if len(ds) < b:
        raise ValueError(f"pipeline {pipe.name!r}: its dataset holds {len(ds)} items, fewer than "
                         f"a batch of {b}")
    items = [stage("data item", lambda i=i: ds[i]) for i in range(b)]

    def step():
        host = stage("collate", lambda: pipe.collate(items))
        batch = stage("transfer", lambda: pipe.to_device(host))
        inputs = stage("device prep", lambda: pipe.prepare(batch))
        out = stage("forward", lambda: pipe.forward(pipe.model, inputs))
        loss = stage("loss", lambda: _trainable(pipe.loss(out, batch), b))
        stage("backward", loss.backward)
        steps[0] += 1
    return StepToMeasure(step, torch.device(pipe.device),
                         after_warm_up=lambda: pipe.model.zero_grad(set_to_none=True))


def _trainable(loss, b: int):
    """``loss``, or a ValueError saying why a loss without a gradient cannot be probed: the sweep
    runs batch sizes the pipeline's own check never saw (one, say)."""
    if isinstance(loss, torch.Tensor) and not loss.requires_grad:
        raise ValueError(f"the loss at a batch of {b} does not require grad: nothing in it "
                         "depends on the model at this batch size (a loss over pairs of samples "
                         f"has no pair in a batch of one); leave {b} out of memory_batch_sizes")
    return loss


def measure_point(params: Params, *, strategy: str, batch_size: int, scale: float, hidden: int,
                  layers: int, device: str = "cpu", form: str = "gather_scatter",
                  dual: bool = True, timeout_s: float = 900.0) -> MemoryPoint:
    """Peak memory of one training step of ``strategy`` at these sizes, in a fresh process.

    Args:
        params: validated params (the point's sizes replace scale, hidden and layers).
        strategy: a built-in strategy or a user pipeline's name.
        batch_size, scale, hidden, layers: the point; device: where the step runs.
        form, dual: a replicated strategy's message form; the Lazy model's dual forward.
        timeout_s: the fresh process's time limit.
    """
    cfg = StepSpec(params.replace(scale=scale, hidden=hidden, layers=layers,
                                  dual_forward=bool(dual)),
                   strategy, batch_size, device, form)
    point = dict(strategy=strategy, form=form, batch_size=batch_size, scale=scale,
                 hidden=hidden, layers=layers)
    return measure_in_fresh_process(setup_step, cfg, point, device=device, timeout_s=timeout_s)
