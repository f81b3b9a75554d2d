"""Message computation primitives shared by every strategy.

Two ways to compute the same aggregation ``out[i] = AGG_{j -> i} w_ij * h[j]``:

* gather-scatter: materialise one message per edge (``h[src]``, ``[E, H]``), weight it, and
  ``index_add_`` it into the targets (what PyG's default ``MessagePassing`` does);
* CSR sparse-dense product: ``A @ h`` with ``A[i, j] = w_ij``, no per-edge message tensor.

Edge lists are directed (row 0 source, row 1 target) and sorted by target, so a CSR matrix with
rows = targets is built without sorting and without a device-to-host sync.
"""
from __future__ import annotations

import warnings

import torch

from ..nodemask import kernels as nodemask_kernels


def csr_from_sorted(src: torch.Tensor, dst: torch.Tensor, num_rows: int, num_cols: int,
                    values: torch.Tensor | None = None) -> torch.Tensor:
    """CSR matrix ``[num_rows, num_cols]`` with ``A[dst, src] = values`` (dst must be sorted).

    ``crow`` comes from ``searchsorted`` (no host sync, unlike ``bincount`` on CUDA).
    """
    if values is None:
        values = torch.ones(src.numel(), device=src.device)
    rows = torch.arange(num_rows + 1, device=dst.device, dtype=dst.dtype)
    crow = torch.searchsorted(dst, rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "CSR support is in beta"
        return torch.sparse_csr_tensor(crow, src, values.to(torch.float32),
                                       size=(num_rows, num_cols), check_invariants=False)


def gather_scatter(h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_nodes: int,
                   weight: torch.Tensor | None = None) -> torch.Tensor:
    """Sum aggregation with materialised messages: ``index_add_(dst, h[src] * weight)``."""
    msg = h.index_select(0, src)
    if weight is not None:
        msg = msg * weight.unsqueeze(-1).to(msg.dtype)
    out = torch.zeros((num_nodes,) + tuple(h.shape[1:]), dtype=h.dtype, device=h.device)
    return out.index_add_(0, dst, msg)


def in_degree(dst: torch.Tensor, num_nodes: int, weight: torch.Tensor | None = None,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Weighted in-degree ``[num_nodes]`` (the denominator of mean aggregation)."""
    w = torch.ones(dst.numel(), dtype=dtype, device=dst.device) if weight is None \
        else weight.to(dtype)
    return torch.zeros(num_nodes, dtype=dtype, device=dst.device).index_add_(0, dst, w)


def spmm(a: torch.Tensor, x: torch.Tensor, a_t: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ x`` for a CSR ``a`` and dense ``x`` (differentiable in ``x``). With ``a_t`` (the
    CSR of ``a.T``) the backward is one more sparse product instead of a transpose per call."""
    return nodemask_kernels.spmm(a, a_t, x)


def mean_divide(summed: torch.Tensor, degree: torch.Tensor) -> torch.Tensor:
    """Mean aggregation from a sum: divide by ``max(degree, 1)`` (isolated nodes get 0)."""
    d = degree.clamp(min=1)
    while d.dim() < summed.dim():
        d = d.unsqueeze(-1)
    return summed / d
