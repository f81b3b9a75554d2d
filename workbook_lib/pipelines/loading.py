"""User pipelines named in the ``pipelines`` params key: import, build, check (the entries are
parsed as plain strings with the schema: :func:`workbook_lib.configs.params.parse_specs`).

An entry is ``"TARGET"`` or ``"NAME=TARGET"``, where TARGET is ``package.module:factory`` or
``path/to/file.py:factory`` (a relative path is taken from the repository root, then from the
current folder). The factory is called as ``factory(params, graph, device)`` with the validated
params, the snapshot (:class:`~workbook_lib.data.snapshots.CellGraph`; ``graph.to_hetero_data()``
gives a PyG ``HeteroData``) and the ``torch.device``, and returns a pipeline
(:mod:`workbook_lib.pipelines.protocol`). Without ``NAME=`` the pipeline's name is its own
``name`` attribute when set, else the module's (file's) name.

:func:`check_pipeline` runs one batch through every stage before anything is timed, so a
pipeline that cannot work is refused with one line naming it and what is wrong.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from typing import Any, Callable

import torch

from ..configs.params import PipelineSpec, spec_file
from ..exceptions import PipelineError
from .protocol import REQUIRED


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
                                       f"{type(exc).__name__}: {_one_line(exc)}") from None
    fn = getattr(mod, spec.factory, None)
    if fn is None:
        raise PipelineError(spec.name, f"{spec.module} has no '{spec.factory}'")
    if not callable(fn):
        raise PipelineError(spec.name, f"{spec.target} is not callable")
    return fn


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def build_user_pipeline(spec: PipelineSpec, params: dict, graph, device: torch.device):
    """Call the spec's factory and check the object has every stage of the protocol."""
    fn = resolve_factory(spec)
    try:
        pipe = fn(params, graph, device)
    except Exception as exc:  # noqa: BLE001 - the user's factory: its error, in one line
        raise PipelineError(spec.name, f"the factory {spec.target} raised "
                                       f"{type(exc).__name__}: {_one_line(exc)}") from None
    missing = [m for m in REQUIRED if not callable(getattr(pipe, m, None))]
    if missing:
        raise PipelineError(spec.name, f"the factory returned a {type(pipe).__name__} without "
                                       f"{', '.join(missing)} (see workbook_lib.pipelines.Pipeline)")
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
        pipe.exact = True
    return pipe


def _leading(x: Any) -> int | None:
    if isinstance(x, torch.Tensor):
        return x.shape[0] if x.dim() > 0 else None
    if isinstance(x, (list, tuple)) and x:
        return _leading(x[0])
    if isinstance(x, dict) and x:
        return _leading(next(iter(x.values())))
    return None


def check_pipeline(pipe, *, batch_size: int | None = None) -> None:
    """One batch through every stage (dataset, collate, transfer, prepare, forward, loss,
    backward), no timing. Raises :class:`PipelineError` naming the pipeline and the stage.

    The rules: the dataset holds at least one batch; ``forward`` returns a tensor (or a
    tuple/list/dict of them) with one leading row per sample of the batch; ``loss`` returns a
    scalar tensor that requires grad; backward gives some trainable parameter a gradient.
    """
    name = getattr(pipe, "name", "") or type(pipe).__name__
    b = batch_size or pipe.batch_size

    def stage(what: str, fn):
        try:
            return fn()
        except PipelineError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's code: its error, in one line
            raise PipelineError(name, f"{what} raised {type(exc).__name__}: "
                                      f"{_one_line(exc)}") from None

    ds = stage("dataset()", pipe.dataset)
    n = stage("len(dataset())", lambda: len(ds))
    if n < b:
        raise PipelineError(name, f"the dataset holds {n} items, fewer than one batch of {b}")
    items = [stage(f"dataset()[{i}]", lambda i=i: ds[i]) for i in range(b)]
    batch = stage("collate", lambda: pipe.collate(items))
    batch = stage("to_device", lambda: pipe.to_device(batch, False))
    inputs = stage("prepare", lambda: pipe.prepare(batch))
    pipe.model.train()
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
    stage("backward", loss.backward)
    if not any(p.grad is not None for p in pipe.model.parameters()):
        raise PipelineError(name, "backward gave no parameter of 'model' a gradient")
    pipe.model.zero_grad(set_to_none=True)


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {list(x.shape)}"
    return type(x).__name__
