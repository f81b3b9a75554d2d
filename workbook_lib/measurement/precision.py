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


class rounding_probe:
    """Within the block, every floating-point tensor a submodule of ``model`` returns (the model
    itself included) is multiplied by ``1 + rel * u``, ``u`` uniform in [-1, 1] per element
    (drawn from torch's global RNG): rounding of relative size ``rel`` at each module's output,
    independent on each side of a subtraction. How far that moves a result (an output, a
    gradient) is how far float32 rounding of that size can move it, cancellation included: a
    gradient that is a difference of two large terms moves as much as the terms do.

    Args:
        model: the module whose submodules' outputs are perturbed.
        rel: the relative size (> 0).
    """

    def __init__(self, model: torch.nn.Module, rel: float):
        if not rel > 0:
            raise ValueError(f"'rel' must be > 0 (got {rel})")
        self.model, self.rel, self.handles = model, float(rel), []

    def _hook(self, module, inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return output * (1 + self.rel * (2 * torch.rand_like(output) - 1))
        return None

    def __enter__(self) -> "rounding_probe":
        self.handles = [m.register_forward_hook(self._hook) for m in self.model.modules()]
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
