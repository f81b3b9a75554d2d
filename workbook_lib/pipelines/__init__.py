"""Training pipelines: the protocol every measured thing implements (``protocol``), the built-in
strategies as pipelines (``builtin``), user pipelines named in params (``loading``) and the
Lightning adapter (``lightning``). :func:`build_pipeline` is the one place a name becomes a
pipeline ready to train.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..configs.validation import Params
from ..catalog import is_builtin
from ..exceptions import PipelineError
from ..configs.specs import PipelineSpec, parse_specs, spec_problem
from .loading import build_user_pipeline, check_pipeline
from .protocol import Pipeline, move_to

__all__ = ["Pipeline", "PipelineError", "PipelineSpec", "build_pipeline", "check_pipeline",
           "compared_names", "is_builtin", "label", "move_to", "parse_specs", "spec_problem",
           "title", "user_specs"]


def user_specs(params: Params) -> dict[str, PipelineSpec]:
    """The user pipelines of the params, by name."""
    return {s.name: s for s in parse_specs(params.pipelines or [])}


def compared_names(params: Params) -> list[str]:
    """Everything a run compares: the built-in ``strategies`` then the ``pipelines``."""
    return list(params.strategies) + list(user_specs(params))


def label(name: str) -> str:
    """A name for tables: the built-in strategy's numbered label, else the pipeline's name."""
    from ..strategies import REGISTRY

    return REGISTRY[name].label if name in REGISTRY else name


def title(name: str) -> str:
    """A name for sentences."""
    from ..strategies import REGISTRY

    return REGISTRY[name].title if name in REGISTRY else f"the pipeline '{name}'"


def build_pipeline(params: Params, name: str, graph, device: torch.device | str, *,
                   batch_size: int | None = None, pert: torch.Tensor | None = None,
                   n_items: int | None = None, salt: int = 0, form: str | None = None,
                   storage_dir: str | Path | None = None, hidden: int | None = None,
                   layers: int | None = None, labels: torch.Tensor | None = None,
                   middle: str | None = None, check: bool = True,
                   ddp: bool = False) -> Pipeline:
    """A pipeline ready to train.

    Args:
        params: validated params; graph: the loaded snapshot; device: where the model runs.
        name: a built-in strategy or an entry of ``params.pipelines``.
        batch_size: default the params' batch (built-in) or the pipeline's own (user).
        pert, n_items, form, storage_dir, hidden, layers, labels, middle: built-in only (the
            perturbations served or how many to sample, message form, strategy 3's folder, model
            sizes, targets, the shared graph's middle-layer form).
        check: user pipelines: run one batch through every stage first (:func:`check_pipeline`).
        ddp: with ``check``, refuse a forward that reaches into the model (False: a warning).

    Raises:
        PipelineError: an unknown name, or a user pipeline that cannot work.
    """
    dev = torch.device(device)
    from ..strategies import REGISTRY

    if name in REGISTRY:
        from ..data.perturbations import sample_perturbations
        from ..strategies import make_strategy
        from .builtin import BuiltinPipeline, batch_size_for, make_model

        b = batch_size or batch_size_for(params.loop, name)
        if pert is None:
            pert = sample_perturbations(graph.num_genes, params.perturbation_k,
                                        n_items or 8 * b, seed=params.seed + 7919 * salt)
        kw: dict = {"aggr": params.aggr, "device": dev}
        if form is not None:
            kw["form"] = form
        if name == "replicated_mask_stored":
            kw["storage_dir"] = storage_dir
        if middle is not None:
            kw["middle"] = middle
        s = make_strategy(name, graph, **kw)
        if name == "replicated_mask_stored":
            s.store(pert)
        model = make_model(graph, params.model, dev, seed=params.seed, hidden=hidden, layers=layers,
                       strategy=name)
        return BuiltinPipeline(s, model, pert, b, dual=params.dual_forward, labels=labels)
    specs = user_specs(params)
    if name not in specs:
        raise PipelineError(name, f"not a built-in strategy nor an entry of 'pipelines' "
                                  f"(pipelines: {list(specs)})")
    pipe = build_user_pipeline(specs[name], params, graph, dev)
    if batch_size is not None:
        pipe.batch_size = int(batch_size)
    if check:
        pipe.preflight_warnings = check_pipeline(
            pipe, num_workers=params.num_workers,
            stall_timeout_s=params.stall_timeout_s, ddp=ddp)
    return pipe


def preflight(params: Params, graph=None, device=None, warn=None, ddp: bool = True) -> list[str]:
    """Build and check every user pipeline of ``params`` on one batch (before any timing), as
    the notebooks will run it (:func:`check_pipeline`). Returns their names; raises
    :class:`PipelineError` on the first that cannot work; ``warn`` gets each warning (a loss
    that is not finite on the first batch; with ``ddp`` False, because notebook 04 is not run,
    a forward that reaches into the model) as a line."""
    specs = user_specs(params)
    if not specs:
        return []
    if graph is None:
        from ..data.snapshots import load_snapshot

        graph = load_snapshot(params.data)
    if device is None:
        from ..common.device import resolve_device

        device = resolve_device(params.device)
    for name in specs:
        pipe = build_pipeline(params, name, graph, device, ddp=ddp)
        for w in getattr(pipe, "preflight_warnings", []):
            if warn is not None:
                warn(w)
        del pipe
    return list(specs)
