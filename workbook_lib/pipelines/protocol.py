"""The one seam of what the workbook measures: a training pipeline, stage by stage.

Every notebook that times, profiles or measures the memory of a training step does so through
this protocol, for the built-in strategies (:mod:`workbook_lib.pipelines.builtin`), for a
PyTorch Lightning module (:mod:`workbook_lib.pipelines.lightning`) and for a user's own pipeline
(named in the ``pipelines`` params key) alike.

=================  ==========================================  ===============================
stage              method                                      where it runs
=================  ==========================================  ===============================
dataset item       ``dataset()[i]``                             DataLoader worker (host)
collate            ``collate(items)``                           DataLoader worker (host)
transfer           ``to_device(batch, non_blocking)``           host -> device
device prep        ``prepare(batch)`` -> inputs                 device (masks, filtering...)
forward            ``forward(model, inputs)`` -> output         device
loss               ``loss(output, batch)`` -> scalar tensor     device
=================  ==========================================  ===============================

plus ``model`` (the ``torch.nn.Module`` that is trained; DDP wraps it, so ``forward`` must call
the ``model`` it is given, not ``self.model``), ``batch_size`` (samples per step, the
DataLoader's batch size), ``configure_optimizer`` (default AdamW, lr 1e-3) and, optionally,
``shared_forward(model)``: the part of the forward that every sample of a batch shares (a
wildtype pass), when the pipeline can run it alone.

The harness owns everything else: the DataLoader (workers, pinning), timing each stage between
device syncs, warm-up, repeats, DDP. A pipeline never times itself.

A pipeline is a plain class: subclass :class:`Pipeline` (the defaults below then apply) or write
the same methods yourself; :func:`check_pipeline` says what is missing.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

REQUIRED = ("dataset", "collate", "to_device", "prepare", "forward", "loss")


def move_to(obj: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """``obj`` with every tensor on ``device``: tensors, dicts, lists, tuples, and objects with a
    ``.to(device)`` method (PyG ``Data``/``HeteroData``/``Batch``). A tensor already there is not
    copied."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, dict):
        return {k: move_to(v, device, non_blocking) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(move_to(v, device, non_blocking) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(move_to(v, device, non_blocking) for v in obj)
    to = getattr(obj, "to", None)
    if callable(to):
        try:
            return to(device, non_blocking=non_blocking)
        except TypeError:  # a .to() without non_blocking
            return to(device)
    return obj


class Pipeline:
    """Base class of a training pipeline (see the module docstring for the stages).

    Subclasses set ``model``, ``device`` and ``batch_size`` and implement ``dataset``,
    ``collate``, ``forward`` and ``loss``; ``to_device``, ``prepare``, ``configure_optimizer``
    and ``shared_forward`` have defaults.

    Attributes:
        name: short identifier (results, tables); set by the loader from the params key when
            empty.
        title: for sentences in reports ("the Lazy model"); defaults to the name.
        exact: whether the pipeline computes the perturbed-graph forward exactly (the verdict
            recommends only exact pipelines).
        per_sample_output: ``forward`` returns one row per sample (checked on one batch); False
            when it returns something else (e.g. a Lightning ``training_step``'s loss).
        model: the ``torch.nn.Module`` trained (and wrapped by DDP).
        device: where the model runs.
        batch_size: samples per training step.
    """

    name: str = ""
    title: str = ""
    exact: bool = True
    per_sample_output: bool = True
    model: torch.nn.Module
    device: torch.device
    batch_size: int

    @property
    def label(self) -> str:
        """Name for tables."""
        return self.title or self.name

    def dataset(self) -> Sequence:
        """A map-style dataset (``len`` and ``[i]``) of items; read in DataLoader workers."""
        raise NotImplementedError

    def collate(self, items: list) -> Any:
        """A batch from a list of items, on the host (runs in DataLoader workers)."""
        raise NotImplementedError

    def to_device(self, batch: Any, non_blocking: bool = False) -> Any:
        """The batch on ``self.device`` (default: :func:`move_to`)."""
        return move_to(batch, self.device, non_blocking)

    def prepare(self, batch: Any) -> Any:
        """On-device work before the model (mask generation, filtering); default: the batch."""
        return batch

    def forward(self, model: torch.nn.Module, inputs: Any) -> torch.Tensor:
        """The model's output for prepared ``inputs``. Call ``model`` (it may be the DDP wrapper
        of ``self.model``), not ``self.model``."""
        raise NotImplementedError

    def loss(self, output: torch.Tensor, batch: Any) -> torch.Tensor:
        """A scalar loss from the output and the batch (labels)."""
        raise NotImplementedError

    def configure_optimizer(self, parameters) -> torch.optim.Optimizer:
        """The optimizer of the full step (default AdamW, lr 1e-3)."""
        return torch.optim.AdamW(parameters, lr=1e-3)

    def shared_forward(self, model: torch.nn.Module) -> torch.Tensor | None:
        """The pass every sample of a batch shares (e.g. a wildtype pass), or None."""
        return None
