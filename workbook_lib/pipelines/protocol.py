"""The one seam of what the workbook measures: a training pipeline, stage by stage.

Every notebook that times, profiles or measures a training step goes through this protocol, for
built-in strategies, Lightning modules and user pipelines alike. The stages: dataset item
(``dataset()[i]``) and ``collate(items)`` in DataLoader workers, ``to_device(batch,
non_blocking)``, ``prepare(batch)``, ``forward(model, inputs)`` and ``loss(output, batch)`` (timed
apart, :class:`LossSplit`); plus ``model``, ``batch_size``, ``configure_optimizer`` and optionally
``shared_forward(model)`` and ``shared_encoder(batch) -> (encoder, x, graph, deleted)`` (what
:func:`workbook_lib.nodemask.convert` takes). The harness owns the DataLoader, timing, repeats and
DDP; a pipeline never times itself. Subclass :class:`Pipeline` or write the same methods (docs/own-pipeline.md).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

REQUIRED = ("dataset", "collate", "to_device", "prepare", "forward", "loss")
DEFAULTED = ("to_device", "prepare")  # the stages Pipeline gives a default


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


class LossSplit:
    """The loss's backward apart from the model's, in one backward pass: ``loss`` sees the output's
    tensors detached, ``loss_backward()`` stops at them and ``model_backward()`` carries their
    gradients through the model (gradients equal ``loss.backward()``'s).

    Args:
        output: what ``forward`` returned.
        parameters: the model's trainable parameters (a loss may use them, e.g. a penalty).
    """

    def __init__(self, output: Any, parameters: Sequence[torch.Tensor]):
        self.originals: list[torch.Tensor] = []
        self.leaves: list[torch.Tensor] = []
        self.parameters = list(parameters)
        self.why_not = _unsplittable(output)
        self.output = output if self.why_not else self._detach(output)
        self.loss: torch.Tensor | None = None

    def _detach(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            if not obj.requires_grad:
                return obj
            leaf = obj.detach().requires_grad_()
            self.originals.append(obj)
            self.leaves.append(leaf)
            return leaf
        if isinstance(obj, dict):
            return type(obj)((k, self._detach(v)) for k, v in obj.items())
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(self._detach(v) for v in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._detach(v) for v in obj)
        return obj

    @property
    def split(self) -> bool:
        return not self.why_not

    def loss_backward(self) -> None:
        """The loss's own backward: gradients of the output's tensors and of parameters the
        loss uses itself, nothing accumulated yet."""
        inputs = self.leaves + self.parameters
        self._grads = torch.autograd.grad(self.loss, inputs, allow_unused=True)

    def model_backward(self) -> None:
        """The model's backward from those gradients (and the loss's own parameter gradients
        accumulated in the same pass)."""
        pairs = [(t, g) for t, g in zip(self.originals + self.parameters, self._grads)
                 if g is not None]
        self._grads = ()
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])


def _unsplittable(output: Any) -> str:
    """Why the output's tensors cannot be handed to the loss detached ("" when they can)."""
    def tensors(obj: Any) -> bool | None:  # None: something else inside
        if isinstance(obj, torch.Tensor):
            return obj.requires_grad
        if isinstance(obj, dict):
            found = [tensors(v) for v in obj.values()]
        elif isinstance(obj, (list, tuple)):
            found = [tensors(v) for v in obj]
        else:
            return None
        return None if None in found else any(found)

    found = tensors(output)
    if found is None:
        return (f"forward returns a {type(output).__name__}, not tensors (or lists, tuples, "
                "dicts of them): the loss's backward is in the backward")
    if not found:
        return "no output tensor requires grad: the loss's backward is in the backward"
    return ""


class Pipeline:
    """Base class of a training pipeline: subclasses set ``model``, ``device`` and ``batch_size``
    and implement ``dataset``, ``collate``, ``forward`` and ``loss``; the other methods (and the
    optional ``shared_forward`` and ``shared_encoder``) have defaults.

    Attributes:
        name: short identifier (set by the loader from the params key when empty).
        title: for sentences in reports ("the Lazy model"); defaults to the name.
        exact: True (declared exact), False (another model) or None (not stated); the verdict
            recommends only a pipeline declared exact or proven equal by ``equal``.
        per_sample_output: ``forward`` returns one row per sample (False e.g. for Lightning).
        model, device, batch_size: the module trained (wrapped by DDP), where it runs, samples
            per step.
    """

    name: str = ""
    title: str = ""
    exact: bool | None = None
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

    def shared_encoder(self, batch: Any) -> tuple | None:
        """``(encoder, x, graph, deleted)`` of a batch: the per-sample encoder, its ``[N, F]``
        input as the model feeds it (the model's own tensor, e.g. its embedding parameter), the
        shared gene graph on ``x``'s device (an edge_index ``[2, E]``, a dict of them keyed by
        PyG ``(src, rel, dst)`` edge types, or a HeteroData) and the batch's ``[B, k]`` deleted
        genes (B the batch size, ``-1`` padded; it may stay on the host); None (the default)
        when the pipeline has no such encoder."""
        return None
