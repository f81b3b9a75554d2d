"""Setting up a training run: the one place where params become a graph, a strategy, a model
(:func:`~workbook_lib.pipelines.builtin.make_model`) and perturbations (used by notebook 03's
loop, the DDP worker, the memory probe, the benchmarks and notebook 06).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..configs.validation import Params
from ..data.perturbations import sample_perturbations
from ..data.snapshots import CellGraph, load_snapshot
from ..pipelines.builtin import batch_size_for, make_model
from ..strategies import REGISTRY, Strategy, make_strategy
from ..strategies.model import PerturbGIN


@dataclass
class Run:
    """Everything one strategy needs to train: built by :func:`build_run`."""

    graph: CellGraph
    strategy: Strategy
    model: PerturbGIN
    device: torch.device
    batch_size: int
    dual: bool  # the Lazy model's dual forward (exact strategies only)
    perturbation_k: int | dict[int, float]  # genes deleted per sample (params)
    seed: int  # the params' seed

    def perturbations(self, n: int, salt: int = 0) -> torch.Tensor:
        """``n`` perturbations, seeded by the params' seed (and ``salt`` for another stream)."""
        return sample_perturbations(self.graph.num_genes, self.perturbation_k, n,
                                    seed=self.seed + 7919 * salt)


def build_run(params: Params, strategy: str, *, graph: CellGraph | None = None,
              device: torch.device | str | None = None, batch_size: int | None = None,
              scale: float | None = None, hidden: int | None = None, layers: int | None = None,
              form: str | None = None, storage_dir: str | Path | None = None) -> Run:
    """Build a run of ``strategy`` (``strategies.REGISTRY``) from validated params.

    Args:
        graph: the snapshot if loaded (else loaded at ``scale``); device: default the params'.
        batch_size: default :func:`batch_size_for`.
        scale, hidden, layers: override the params' sizes (e.g. the real spec).
        form: message form of replicated strategies (``gather_scatter`` or ``spmm``).
        storage_dir: where strategy 3 keeps its masks.
    """
    from ..common.device import resolve_device

    if strategy not in REGISTRY:
        raise ValueError(f"'strategy' must be one of {list(REGISTRY)} (got {strategy!r})")
    dev = resolve_device(params.device) if device is None else torch.device(device)
    if graph is None:
        graph = load_snapshot(params.data, scale=scale)
    kw: dict = {"aggr": params.aggr, "device": dev}
    if form is not None:
        kw["form"] = form
    if strategy == "replicated_mask_stored":
        kw["storage_dir"] = storage_dir
    s = make_strategy(strategy, graph, **kw)
    model = make_model(graph, params.model, dev, seed=params.seed, hidden=hidden, layers=layers,
                       strategy=strategy)
    if batch_size is None:
        batch_size = batch_size_for(params.loop, strategy)
    return Run(graph=graph, strategy=s, model=model, device=dev, batch_size=batch_size,
               dual=bool(params.dual_forward) and s.exact,
               perturbation_k=params.perturbation_k, seed=params.seed)
