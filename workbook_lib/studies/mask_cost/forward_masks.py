"""What the dual forward adds to the masks a forward reads (notebook 02; read by a claim of 05).

:func:`dual_forward_masks` sums the distinct per-edge float or boolean storages (B x E_t long)
that the replicated pipeline's forward reads, without and with the dual forward, as seen by a
``TorchDispatchMode``: what the operators read rather than what the code says.
"""
from __future__ import annotations

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ...configs.validation import Params
from ...results.mask_cost import DualForwardMasks


class _PerEdgeReads(TorchDispatchMode):
    def __init__(self, lengths: set[int]):
        super().__init__()
        self.lengths = lengths
        self.seen: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for a in pytree.tree_leaves((args, kwargs)):
            if isinstance(a, torch.Tensor) and a.dim() == 1 and a.numel() in self.lengths \
                    and (a.dtype == torch.bool or a.is_floating_point()):
                st = a.untyped_storage()
                self.seen[st.data_ptr()] = st.nbytes()
        return func(*args, **kwargs)


def mask_bytes_read(strategy, model, ctx: dict, batch_size: int, *, dual: bool) -> int:
    """Bytes of the distinct per-edge (B x E_t long) float or boolean tensors one forward of
    ``model`` with ``strategy`` reads on ``ctx`` (the batch :func:`workbook_lib.strategies.build_ctx`
    prepares), with or without the ``dual`` forward.
    """
    lengths = {batch_size * strategy.graph.num_edges(t) for t in strategy.graph.edge_types}
    probe = _PerEdgeReads(lengths)
    with torch.no_grad(), probe:
        model(strategy, ctx, dual=dual)
    return int(sum(probe.seen.values()))


def dual_forward_masks(params: Params, graph, device, *, strategy: str = "replicated_mask_cpu",
                       batch_size: int = 2) -> DualForwardMasks:
    """Measure what the dual forward adds to the mask bytes a forward reads (see the module
    docstring). ``batch_size`` must be at least 2 (B x E_t would not tell a batch from one
    wildtype copy)."""
    from ...strategies import build_ctx
    from ...training.factory import build_run

    if batch_size < 2:
        raise ValueError(f"'batch_size' must be at least 2 (got {batch_size})")
    run = build_run(params, strategy, graph=graph, device=device, batch_size=batch_size)
    ctx = build_ctx(run.strategy, run.perturbations(batch_size))
    single = mask_bytes_read(run.strategy, run.model, ctx, batch_size, dual=False)
    dual = mask_bytes_read(run.strategy, run.model, ctx, batch_size, dual=True)
    return DualForwardMasks(strategy, batch_size, graph.num_edges(), single, dual)
