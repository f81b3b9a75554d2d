"""User pipelines named in the ``pipelines`` params key: import, build, check.

An entry is ``"TARGET"`` or ``"NAME=TARGET"`` with TARGET ``package.module:factory`` or
``path/to/file.py:factory``; the factory is called as ``factory(params, graph, device)`` and
returns a pipeline (:mod:`workbook_lib.pipelines.protocol`). :func:`check_pipeline` runs one batch
through every stage before anything is timed, so a pipeline that cannot work is refused with one
line naming it and what is wrong.

:class:`DDPLike` stands in for a real single-process DDP, which would need a process group (a
TCP store, global state, a CUDA device id) where the check only needs its surface.
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import math
import re
import sys
from typing import Any, Callable

import torch

from ..configs.validation import Params
from ..common.watchdog import Stalled, Watchdog
from ..configs.specs import PipelineSpec, spec_file
from ..failures import describe_exception
from ..exceptions import PipelineError
from .protocol import DEFAULTED, REQUIRED, Pipeline


def resolve_factory(spec: PipelineSpec) -> Callable:
    """Import the spec's module (or file) and return its factory."""
    try:
        if spec.is_file:
            path = spec_file(spec.module)
            if path is None:
                raise PipelineError(spec.name, f"the file {spec.module} does not exist")
            modname = f"workbook_user_pipeline_{re.sub(r'[^A-Za-z0-9_]', '_', spec.name)}"
            if modname in sys.modules and getattr(sys.modules[modname], "__file__", None) == str(path):
                mod = sys.modules[modname]
            else:
                # as Python does for a script: its folder on the path, so it imports neighbours
                if str(path.parent) not in sys.path:
                    sys.path.insert(0, str(path.parent))
                loader_spec = importlib.util.spec_from_file_location(modname, path)
                mod = importlib.util.module_from_spec(loader_spec)
                sys.modules[modname] = mod  # so DataLoader workers and pickling find it
                loader_spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(spec.module)
    except PipelineError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module: its error, in one line
        raise PipelineError(spec.name, f"{spec.module} does not import: "
                                       f"{describe_exception(exc)}") from None
    fn = getattr(mod, spec.factory, None)
    if fn is None:
        raise PipelineError(spec.name, f"{spec.module} has no '{spec.factory}'")
    if not callable(fn):
        raise PipelineError(spec.name, f"{spec.target} is not callable")
    return fn


def build_user_pipeline(spec: PipelineSpec, params: Params, graph, device: torch.device):
    """Call the spec's factory and check the object has every stage of the protocol."""
    fn = resolve_factory(spec)
    try:
        pipe = fn(params, graph, device)
    except Exception as exc:  # noqa: BLE001 - the user's factory: its error, in one line
        raise PipelineError(spec.name, f"the factory {spec.target} raised "
                                       f"{describe_exception(exc)}") from None
    missing = [m for m in REQUIRED if not callable(getattr(pipe, m, None))]
    defaults = [m for m in missing if m in DEFAULTED]
    if missing:  # the defaults come from the base class (a user trial's duck-typed class)
        raise PipelineError(spec.name, f"the factory returned a {type(pipe).__name__} without "
                                       f"{', '.join(missing)} (see workbook_lib.pipelines."
                                       "Pipeline" + (f"; subclass it for the defaults of "
                                                     f"{', '.join(defaults)}" if defaults
                                                     else "") + ")")
    if isinstance(pipe, Pipeline):  # a subclass that left a stage to the base's placeholder
        unset = [m for m in REQUIRED if m not in DEFAULTED and m not in vars(pipe) and
                 getattr(type(pipe), m, None) is getattr(Pipeline, m)]  # (set on the instance:
        # its own, a review)
        if unset:
            raise PipelineError(spec.name, f"{type(pipe).__name__} does not define "
                                           f"{', '.join(unset)} (Pipeline has no default for "
                                           f"{'it' if len(unset) == 1 else 'them'})")
    model = getattr(pipe, "model", None)
    if not isinstance(model, torch.nn.Module):
        raise PipelineError(spec.name, f"'model' must be a torch.nn.Module (got "
                                       f"{type(model).__name__})")
    bs = getattr(pipe, "batch_size", None)
    if not isinstance(bs, int) or isinstance(bs, bool) or bs <= 0:
        raise PipelineError(spec.name, f"'batch_size' must be a positive integer (got {bs!r})")
    if not hasattr(pipe, "device"):
        pipe.device = torch.device(device)
    pipe.device = torch.device(pipe.device)
    pipe.name = spec.name
    if not getattr(pipe, "title", ""):
        pipe.title = spec.name
    if not hasattr(pipe, "exact"):
        pipe.exact = None  # not stated
    return pipe


def _leading(x: Any) -> int | None:
    if isinstance(x, torch.Tensor):
        return x.shape[0] if x.dim() > 0 else None
    if isinstance(x, (list, tuple)) and x:
        return _leading(x[0])
    if isinstance(x, dict) and x:
        return _leading(next(iter(x.values())))
    return None


class DDPLike(torch.nn.Module):
    """What ``torch.nn.parallel.DistributedDataParallel`` exposes of the model it wraps: calling
    it, ``.module``, the parameters and buffers, ``train``/``eval``, ``zero_grad``,
    ``no_sync()``; any other attribute raises ``AttributeError`` as DDP does."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        yield


_NO_ATTR = re.compile(r"'DDPLike' object has no attribute '(\w+)'")


def check_pipeline(pipe, *, batch_size: int | None = None, num_workers: int = 0,
                   stall_timeout_s: float | None = None, ddp: bool = True) -> list[str]:
    """One batch through every stage (dataset, collate, a DataLoader with ``num_workers``,
    transfer, prepare, forward through :class:`DDPLike`, loss, backward, one optimizer step), untimed;
    the model's state is restored. Returns warnings (e.g. a loss not finite on this batch).

    Args:
        pipe: the pipeline; batch_size: default the pipeline's.
        num_workers: the run's DataLoader workers (0: the main process only).
        stall_timeout_s: how long one stage may run (None: no limit).
        ddp: whether notebook 04 will run it; when False a forward that reaches into the model
            (``model.conv(...)``) is a warning, not a refusal.

    Raises:
        PipelineError: naming the pipeline, the stage and the rule broken.
    """
    name = getattr(pipe, "name", "") or type(pipe).__name__
    b = batch_size or pipe.batch_size
    warnings: list[str] = []

    devices = [torch.device(pipe.device)] if torch.device(pipe.device).type == "cuda" else []
    with Watchdog(why="stall_timeout_s") as wd, torch.random.fork_rng(devices=devices):
        def stage(what: str, fn):
            try:
                with wd.watch(f"pipeline '{name}'", what, stall_timeout_s):
                    return fn()
            except PipelineError:
                raise
            except Stalled as exc:
                raise PipelineError(name, f"{what} made no progress for {exc.waited_s:.0f} s "
                                          "(stall_timeout_s): it blocks") from None
            except Exception as exc:  # noqa: BLE001 - the user's code: its error, in one line
                raise PipelineError(name, f"{what} raised {describe_exception(exc)}") from None

        ds = stage("dataset()", pipe.dataset)
        n = stage("len(dataset())", lambda: len(ds))
        if n < b:
            raise PipelineError(name, f"the dataset holds {n} items, fewer than one batch of {b}")
        items = [stage(f"dataset()[{i}]", lambda i=i: ds[i]) for i in range(b)]
        batch = stage("collate", lambda: pipe.collate(items))
        if num_workers > 0:
            _check_workers(pipe, name, ds, batch, b, num_workers, stage)
        batch = stage("to_device", lambda: pipe.to_device(batch, False))
        model = pipe.model
        state = copy.deepcopy(model.state_dict())
        try:
            _full_step(pipe, name, batch, b, stage, warnings, ddp)
        finally:
            with torch.no_grad():
                model.load_state_dict(state)
            model.zero_grad(set_to_none=True)
    return warnings


def _full_step(pipe, name: str, batch, b: int, stage, warnings: list[str],
               ddp: bool = True) -> None:
    inputs = stage("prepare", lambda: pipe.prepare(batch))
    pipe.model.train()
    wrapped = DDPLike(pipe.model)
    try:
        out = stage("forward", lambda: pipe.forward(wrapped, inputs))
    except PipelineError as exc:
        m = _NO_ATTR.search(exc.problem)
        if m is None:
            raise
        rule = (f"forward uses model.{m.group(1)}, which DDP's wrapper does not have (notebook "
                "04 wraps the model in DistributedDataParallel): call model(...) and let the "
                "model's own forward use its parts")
        if ddp:
            raise PipelineError(name, rule + "; or leave notebook 04 out (--only 01 02 03 05 "
                                             "06), where this is a warning") from None
        warnings.append(f"pipeline '{name}': {rule}; it would fail in notebook 04, which this "
                        "run leaves out: the other notebooks run it as it is")
        out = stage("forward", lambda: pipe.forward(pipe.model, inputs))
    lead = _leading(out) if getattr(pipe, "per_sample_output", True) else b
    if lead is None:
        raise PipelineError(name, f"forward must return a tensor with one row per sample "
                                  f"(got {_describe(out)})")
    if lead != b:
        raise PipelineError(name, f"forward returned {lead} rows for a batch of {b} samples "
                                  f"({_describe(out)}); the first dimension must be the sample")
    loss = stage("loss", lambda: pipe.loss(out, batch))
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise PipelineError(name, f"loss must be a scalar tensor (got {_describe(loss)})")
    if not loss.requires_grad:
        raise PipelineError(name, "the loss does not require grad: nothing to train")
    value = float(loss.detach().float().reshape(()))
    if not math.isfinite(value):
        warnings.append(f"pipeline '{name}': the loss is not finite on the first batch "
                        f"({value}): the notebooks time it and name it (its timings would be "
                        "of a diverged step)")
    stage("backward", loss.backward)
    if not any(p.grad is not None for p in pipe.model.parameters()):
        raise PipelineError(name, "backward gave no parameter of 'model' a gradient")
    if not callable(getattr(pipe, "configure_optimizer", None)):
        raise PipelineError(name, "has no configure_optimizer(parameters) (subclass "
                                  "workbook_lib.pipelines.Pipeline for the default AdamW)")
    opt = stage("configure_optimizer", lambda: pipe.configure_optimizer(
        [p for p in pipe.model.parameters() if p.requires_grad]))
    if not isinstance(opt, torch.optim.Optimizer):
        raise PipelineError(name, f"configure_optimizer must return a torch.optim.Optimizer "
                                  f"(got {type(opt).__name__})")
    stage("optimizer step", opt.step)
    opt.zero_grad(set_to_none=True)


def _check_workers(pipe, name: str, ds, batch, b: int, workers: int, stage) -> None:
    """The batch sent back from a worker (pickled as a DataLoader worker pickles it) and one
    batch built in a worker process."""
    from multiprocessing.reduction import ForkingPickler

    from torch.utils.data import DataLoader

    try:
        ForkingPickler.dumps(batch)
    except Exception as exc:  # noqa: BLE001 - what the worker would meet sending it back
        raise PipelineError(name, f"collate returns a batch that a DataLoader worker cannot send "
                                  f"back (num_workers: {workers}; it is pickled): "
                                  f"{describe_exception(exc)}; return tensors, "
                                  "lists, dicts or tuples of them") from None

    def first_batch():
        loader = DataLoader(ds, batch_size=b, num_workers=1, collate_fn=pipe.collate,
                            drop_last=True)
        it = iter(loader)
        try:
            return next(it)
        finally:
            stop = getattr(it, "_shutdown_workers", None)
            if stop is not None:
                stop()
    stage(f"a DataLoader worker (num_workers: {workers})", first_batch)


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {list(x.shape)}"
    return type(x).__name__
