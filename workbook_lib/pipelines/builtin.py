"""The built-in strategies as pipelines: a :class:`~workbook_lib.strategies.base.Strategy` (how a
batch of perturbed graphs is aggregated), the workbook's model
(:class:`~workbook_lib.strategies.model.PerturbGIN`), a stream of perturbations and their labels,
behind the same :class:`~workbook_lib.pipelines.protocol.Pipeline` protocol as a user's own; and
the model and batch size a built-in strategy trains with (:func:`make_model`,
:func:`batch_size_for`).
"""
from __future__ import annotations

import torch

from ..data.perturbations import synthetic_labels
from ..configs.schema import LoopSection, ModelSection
from ..data.snapshots import CellGraph
from ..strategies.base import Strategy
from ..strategies.model import PerturbGIN
from .protocol import Pipeline


def batch_size_for(loop: LoopSection, strategy: str) -> int:
    """The batch size a strategy trains with (``loop``: ``params.loop``): DANGO-style runs use
    ``batch_size_dango``, every perturbed-graph strategy ``batch_size_lazy`` (the
    investigation's 64 and 28)."""
    return loop.batch_size_dango if strategy == "dango_wildtype" else loop.batch_size_lazy


def make_model(graph: CellGraph, model: ModelSection, device, *, seed: int,
               hidden: int | None = None, layers: int | None = None,
               strategy: str | None = None) -> PerturbGIN:
    """The workbook's model for ``graph`` (``model``: ``params.model``), on ``device``;
    parameters a strategy never uses are frozen (DistributedDataParallel requires every
    trainable parameter to get a gradient)."""
    model = PerturbGIN(graph.num_genes, graph.edge_types,
                       hidden=model.hidden if hidden is None else hidden,
                       layers=model.layers if layers is None else layers,
                       seed=seed).to(device)
    if strategy is not None and strategy != "dango_wildtype":
        model.query.requires_grad_(False)  # the attention query belongs to the DANGO head
    return model


class _Items:
    """Item i = ``strategy.make_item(i, pert[i])`` plus its label ``y`` (read in workers)."""

    def __init__(self, strategy: Strategy, pert: torch.Tensor, labels: torch.Tensor):
        self.strategy, self.pert, self.labels = strategy, pert, labels

    def __len__(self) -> int:
        return len(self.pert)

    def __getitem__(self, i: int) -> dict:
        item = self.strategy.make_item(i, self.pert[i])
        item["y"] = self.labels[i]
        return item


class BuiltinPipeline(Pipeline):
    """A built-in strategy with the workbook's model.

    Args:
        strategy: the prepared strategy; model: the workbook's model (on its device).
        pert: ``[n, k]`` deleted genes of the samples served (-1 pads); batch_size: per step.
        dual: the Lazy model's dual forward (exact strategies only).
        labels: ``[n]`` targets (default: the synthetic labels of ``pert``).
    """

    def __init__(self, strategy: Strategy, model: torch.nn.Module, pert: torch.Tensor,
                 batch_size: int, *, dual: bool = False, labels: torch.Tensor | None = None):
        self.strategy, self.model = strategy, model
        self.name, self.title, self.exact = strategy.name, strategy.title, strategy.exact
        self.device, self.batch_size = strategy.device, batch_size
        self.dual = bool(dual) and strategy.exact
        self.pert = pert
        self.labels = synthetic_labels(pert) if labels is None else labels

    @property
    def label(self) -> str:
        return self.strategy.label

    def dataset(self) -> _Items:
        return _Items(self.strategy, self.pert, self.labels)

    def collate(self, items: list[dict]) -> dict:
        batch = self.strategy.collate(items)
        batch["y"] = torch.stack([it["y"] for it in items])
        return batch

    def to_device(self, batch: dict, non_blocking: bool = False) -> dict:
        return self.strategy.to_device(batch, non_blocking=non_blocking)

    def prepare(self, batch: dict) -> dict:
        return self.strategy.device_prepare(batch)

    def forward(self, model: torch.nn.Module, inputs: dict) -> torch.Tensor:
        return model(self.strategy, inputs, dual=self.dual)

    def loss(self, output: torch.Tensor, batch: dict, gather: bool = False) -> torch.Tensor:
        """Mean squared error; with ``gather`` every rank's predictions first (the
        investigation's loss-side all-gather, differentiable)."""
        y = batch["y"]
        if gather:
            from torch.distributed.nn.functional import all_gather

            output, y = torch.cat(all_gather(output)), torch.cat(all_gather(y))
        return ((output - y) ** 2).mean()

    def shared_forward(self, model: torch.nn.Module) -> torch.Tensor | None:
        inner = getattr(model, "module", model)
        return inner.wildtype_forward(self.strategy) if self.dual else None
