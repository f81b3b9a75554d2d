"""Notebook 02's result: exactness re-checked, the cost model, message forms, mask generation,
one layer across B, the strategy benchmark and peak memory."""
from __future__ import annotations


import torch

from ...configs.validation import Params
from ...common.progress import note
from ...results.bench import BenchResult
from ...results.mask_cost import CostModelStudy, DualForwardMasks, LayerSweep, MaskGeneration
from . import costmodel
from .layers import exactness_report  # noqa: F401 (the notebook's exactness section)
from .memory import memory_study  # noqa: F401 (the notebook's peak-memory section)


BUILTIN_ONLY = ("exactness of the built-in strategies, the cost model of masking against "
                "filtering, mask generation, one layer across batch size, the strategy benchmark "
                "and the dual forward's masks")


def builtin_note(params: Params) -> str:
    """One line saying which sections are about the built-in strategies and were not run
    (``strategies: []``), or "" when they ran."""
    if params.strategies:
        return ""
    return (f"No built-in strategy in this run (strategies: []): {BUILTIN_ONLY} are the "
            "investigation's and were not run; this notebook measures your pipelines' peak "
            "memory per batch size.")


def cost_model_study(params: Params, num_nodes: int, device: torch.device) -> CostModelStudy | None:
    """The cost model's sweep and fit (None without built-in strategies: see
    :func:`builtin_note`)."""
    import time

    if not params.strategies:
        return None

    t0 = time.perf_counter()
    note("02: cost-model sweep (every primitive interleaved)")
    cfg = costmodel.SweepConfig(num_nodes=num_nodes, edges=params.sweep_edges,
                                hidden=params.sweep_hidden, p=params.sweep_p,
                                device=device, warmup=params.warmup,
                                min_rounds=params.min_repeats,
                                target=params.precision_target,
                                max_time_s=10 * params.time_budget_s,
                                seed=params.seed)
    pts = costmodel.sweep(cfg)
    model = costmodel.fit(pts)
    return CostModelStudy(points=pts, model=model, crossover=costmodel.crossover_checks(model, pts),
                          run_hidden=params.hidden,
                          crossover_at_run_hidden=model.crossover_p(params.hidden),
                          seconds=time.perf_counter() - t0)


def mask_generation_study(params: Params, graph, device: torch.device) -> MaskGeneration | None:
    """Producing one sample's edge removal in each built-in form (None without built-in
    strategies)."""
    import tempfile

    from .layers import mask_generation

    if not params.strategies:
        return None
    return mask_generation(graph, params.perturbation_k, params.batch_size_lazy, device,
                           warmup=params.warmup, min_rounds=params.min_repeats,
                           target=params.precision_target, seed=params.seed,
                           storage_dir=tempfile.mkdtemp(prefix="wb-masks-"))


def layer_study(params: Params, graph, device: torch.device) -> LayerSweep | None:
    """One middle layer of the built-in forms across batch size (None when none of them
    runs)."""
    from .layers import layer_across_batch

    names = [s for s in ("replicated_mask_cpu", "replicated_filter_device", "node_mask_shared",
                         "dango_wildtype") if s in params.strategies]
    if not names:
        return None
    return layer_across_batch(graph, names, params.layer_batch_sizes, params.hidden,
                              params.perturbation_k, device, aggr=params.aggr,
                              warmup=params.warmup, min_rounds=params.min_repeats,
                              target=params.precision_target, seed=params.seed)


def benchmark(params: Params) -> BenchResult | None:
    """The strategy benchmark of the built-in forms (None without built-in strategies)."""
    from .bench import run_bench

    return run_bench(params) if params.strategies else None


def dual_masks(params: Params, graph, device: torch.device) -> DualForwardMasks | None:
    """What the dual forward adds to the mask bytes (None without built-in strategies)."""
    from .forward_masks import dual_forward_masks

    return dual_forward_masks(params, graph, device) if params.strategies else None
