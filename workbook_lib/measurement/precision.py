"""How far two float32 computations of the same sums may differ when they add in another order
(a GPU's atomic ``index_add_``/scatter sums in whatever order its threads arrive)."""
from __future__ import annotations

import torch


def float32_tolerance(graph, layers: int, floor: float = 2e-5) -> float:
    """Relative tolerance for a float32 result summed in another order.

    Each layer adds up to ``d`` terms per node (the largest in-degree over the edge types,
    summed); random-order rounding errors grow like ``eps * sqrt(d)`` per sum and add up over
    the layers. ``eps`` is float32's (2^-23), times 32 as a margin for the readout and the
    backward pass. Never below ``floor`` (the CPU tests' tolerance).

    Args:
        graph: a CellGraph (``num_genes``, ``edge_index`` per type).
        layers: message-passing layers.
        floor: the smallest tolerance returned.
    """
    if layers < 0:
        raise ValueError(f"'layers' must be >= 0 (got {layers})")
    eps = torch.finfo(torch.float32).eps
    d = 0
    for ei in graph.edge_index.values():
        if ei.numel():
            d += int(torch.bincount(ei[1], minlength=graph.num_genes).max())
    return max(floor, 32 * eps * max(1, d) ** 0.5 * max(1, layers))
