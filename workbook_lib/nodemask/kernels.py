"""Sparse products of the node-mask shared graph.

One prepared CSR matrix ``A`` (all edge types stacked, int32 indices where they fit, its
transpose prepared for the backward) multiplies every sample's ``[N, H]`` features, by kernel
``slab`` (CPU default: one CSR product per sample slab, which stays in cache) or ``wide`` (CUDA
default: one product of ``[N, B*H]``). :func:`stacked_aggregate_linear` is a wildtype layer's
``sum_t (A_t x) W_t^T`` as one stacked sparse product and one dense product each way.
"""
from __future__ import annotations

import torch

from .parts import timed_function

KERNELS = ("slab", "wide")

# Every sparse product of the shared graph runs inside a profiler range named with this prefix
# and its multiply-add count, so that the benchmark can read the achieved rate of a step's
# sparse products from one profiled step (``studies.mask_cost.bench.achieved_rates``).
SPARSE_TAG = "workbook::sparse_product::"


# Rows moved by a sparse product of ones (a gather's backward): data movement, not the model's
# arithmetic; the benchmark counts what runs inside such a range as neither sparse nor dense.
MOVE_TAG = "workbook::row_movement"


# Dense multiply-adds done inside another product's kernel (the pooled layer's weighted sums
# inside the compiled push): an empty range carrying their count, so that the benchmark counts
# them with the dense work (their time is the enclosing product's).
DENSE_INSIDE_TAG = "workbook::dense_inside::"


def dense_inside(macs: int) -> None:
    """Mark ``macs`` dense multiply-adds done inside the enclosing product (see the tag)."""
    with torch.profiler.record_function(f"{DENSE_INSIDE_TAG}{int(macs)}"):
        pass


def nnz(*mats) -> int:
    """Stored entries of sparse matrices (metadata only: no device read)."""
    return sum(int(m._nnz()) for m in mats)


def sparse_range(macs: int):
    """A profiler range marking a sparse product of ``macs`` multiply-adds (see SPARSE_TAG)."""
    return torch.profiler.record_function(f"{SPARSE_TAG}{int(macs)}")


def default_kernel(device: torch.device) -> str:
    """``wide`` on CUDA, ``slab`` elsewhere (see the module docstring)."""
    return "wide" if torch.device(device).type == "cuda" else "slab"


def csr_index_dtype(*sizes: int) -> torch.dtype:
    """int32 for CSR indices when every size (rows, columns, entries) fits it, else int64: the
    product runs faster on int32 indices."""
    return torch.int32 if max(sizes) < 2 ** 31 - 1 else torch.int64


def to_csr(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int],
           *, index_dtype: torch.dtype | None = None) -> torch.Tensor:
    """A CSR matrix from COO triplets (any order); int32 indices when they fit."""
    n_rows, n_cols = shape
    order = torch.argsort(rows * n_cols + cols, stable=True)
    rows, cols, values = rows[order], cols[order], values[order]
    crow = torch.zeros(n_rows + 1, dtype=torch.long, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=n_rows), 0)
    if index_dtype is None:
        index_dtype = csr_index_dtype(n_rows, n_cols, int(values.numel()))
    return torch.sparse_csr_tensor(crow.to(index_dtype), cols.to(index_dtype),
                                   values.to(torch.float32), size=shape, check_invariants=False)


def transpose(a: torch.Tensor) -> torch.Tensor:
    """The CSR matrix of ``a.T`` with the same index type."""
    crow, col, val = a.crow_indices(), a.col_indices(), a.values()
    rows = torch.repeat_interleave(torch.arange(a.shape[0], device=col.device),
                                   (crow[1:] - crow[:-1]).long())
    return to_csr(col.long(), rows, val, (a.shape[1], a.shape[0]), index_dtype=crow.dtype)


def _product(a: torch.Tensor, x: torch.Tensor, kernel: str) -> torch.Tensor:
    """``a @ x_b`` for every slab of ``x`` ``[B, C, H]`` -> ``[B, R, H]``."""
    b, c, h = x.shape
    if kernel == "wide":
        wide = x.permute(1, 0, 2).reshape(c, b * h)
        with sparse_range(nnz(a) * b * h):
            prod = torch.sparse.mm(a, wide)
        return prod.view(a.shape[0], b, h).permute(1, 0, 2).contiguous()
    x = x.contiguous()
    out = x.new_empty(b, a.shape[0], h)
    with sparse_range(nnz(a) * b * h):
        for i in range(b):
            out[i].addmm_(a, x[i], beta=0)
    return out


@timed_function
class _BatchedSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, a_t, x, kernel):
        ctx.a_t, ctx.kernel = a_t, kernel
        return _product(a, x, kernel)

    @staticmethod
    def backward(ctx, grad):
        return None, None, _product(ctx.a_t, grad, ctx.kernel), None


def batched_spmm(a: torch.Tensor, a_t: torch.Tensor, x: torch.Tensor,
                 kernel: str = "slab") -> torch.Tensor:
    """``a @ x_b`` for every sample ``b`` of ``x`` (``[B, C, H]`` -> ``[B, R, H]``),
    differentiable in ``x`` (the backward uses the prepared transpose ``a_t``)."""
    if kernel not in KERNELS:
        raise ValueError(f"'kernel' must be one of {list(KERNELS)} (got {kernel!r})")
    if x.requires_grad:
        return _BatchedSpMM.apply(a, a_t, x, kernel)
    return _product(a, x, kernel)


@timed_function
class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, a_t, x):
        ctx.a_t = a_t
        with sparse_range(nnz(a) * x.shape[-1]):
            return torch.sparse.mm(a, x)

    @staticmethod
    def backward(ctx, grad):
        with sparse_range(nnz(ctx.a_t) * grad.shape[-1]):
            return None, None, torch.sparse.mm(ctx.a_t, grad.contiguous())


def spmm(a: torch.Tensor, a_t: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """``a @ x`` for a dense ``[C, W]`` ``x``, differentiable in ``x`` through ``a_t``."""
    if a_t is None or not x.requires_grad:
        with sparse_range(nnz(a) * x.shape[-1]):
            return torch.sparse.mm(a, x)
    return _SpMM.apply(a, a_t, x)


@timed_function
class _TypedAggregateLinear(torch.autograd.Function):
    """``out[b] = sum_t (A_t x_b / deg_tb) W_t^T`` with one CSR product per (sample, type), the
    aggregation kept as ``[B, T, N, H]`` (contiguous slabs) for the weight's gradient."""

    @staticmethod
    def forward(ctx, x, weight, per_type, per_type_t, degp):
        b, n, h = x.shape
        t = len(per_type)
        x = x.contiguous()
        agg = x.new_empty(b, t, n, h)
        with sparse_range(nnz(*per_type) * b * h):
            for i in range(b):
                for j in range(t):  # in-place addmm_: no temporary and copy (mm(out=) makes one)
                    agg[i, j].addmm_(per_type[j], x[i], beta=0)
        if degp is not None:  # [B, T, N, 1]
            agg.div_(degp)
        wr = weight.view(weight.shape[0], t, h).permute(1, 2, 0)  # [T, H, Ho]
        out = x.new_empty(b, n, weight.shape[0])
        for i in range(b):
            torch.sum(torch.bmm(agg[i], wr), dim=0, out=out[i])
        ctx.per_type_t, ctx.t = per_type_t, t
        ctx.save_for_backward(agg, weight, degp if degp is not None else torch.empty(0))
        ctx.has_deg = degp is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        agg, weight, degp = ctx.saved_tensors
        b, t, n, h = agg.shape
        ho = weight.shape[0]
        grad = grad.contiguous()
        wt = weight.view(ho, t, h).permute(1, 0, 2)  # [T, Ho, H]
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gx = grad.new_zeros(b, n, h) if need_x else None
        gw = grad.new_zeros(t, ho, h) if need_w else None
        for i in range(b):
            g_i = grad[i].unsqueeze(0).expand(t, n, ho)
            if need_w:  # sum_n g[b, n, o] agg[b, t, n, h]
                gw.add_(torch.bmm(g_i.transpose(1, 2), agg[i]))
            if need_x:
                ga = torch.bmm(g_i, wt)  # [T, N, H]
                if ctx.has_deg:
                    ga.div_(degp[i])
                with sparse_range(nnz(*ctx.per_type_t) * h):
                    for j in range(t):
                        gx[i].addmm_(ctx.per_type_t[j], ga[j])
        gweight = gw.permute(1, 0, 2).reshape(ho, t * h) if need_w else None
        return gx, gweight, None, None, None


def typed_aggregate_linear(x: torch.Tensor, weight: torch.Tensor, per_type: list,
                           per_type_t: list, degp: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, N, H_out]``: ``sum_t (A_t x_b / deg_tb) W_t^T`` for ``x`` ``[B, N, H]``, ``weight``
    ``[H_out, T*H]`` (type-major input features), per-type CSR matrices and their transposes,
    and optional per-sample degrees ``degp`` ``[B, T, N, 1]`` (mean aggregation)."""
    return _TypedAggregateLinear.apply(x, weight, per_type, per_type_t, degp)


@timed_function
class _StackedAggregateLinear(torch.autograd.Function):
    """``sum_t (A_t x) W_t^T`` ``[N, H_out]`` for one ``x`` ``[N, H]``: one CSR product of the
    stacked ``A`` ``[N*T, N]`` and one dense product; backward one CSR product of ``A_T``
    (``SharedGraph.a_tt``) with the output's gradient, then ``dx_j = sum_t (A_t^T g)_j W_t``."""

    @staticmethod
    def forward(ctx, x, weight, a, a_tt):
        n, h = x.shape
        t = a.shape[0] // n
        x = x.contiguous()
        sums = x.new_empty(n * t, h)
        with sparse_range(nnz(a) * h):
            sums.addmm_(a, x, beta=0)  # in place: no temporary and copy
        ctx.a_tt = a_tt
        ctx.save_for_backward(sums, weight)
        return sums.view(n, t * h) @ weight.T

    @staticmethod
    def backward(ctx, grad):
        sums, weight = ctx.saved_tensors
        ho, th = weight.shape
        n = grad.shape[0]
        t = sums.shape[0] // n
        h = th // t
        grad = grad.contiguous()
        gx = gw = None
        if ctx.needs_input_grad[0]:
            pushed = grad.new_empty(n * t, ho)
            with sparse_range(nnz(ctx.a_tt) * ho):
                pushed.addmm_(ctx.a_tt, grad, beta=0)  # [N*T, Ho]: row j*T + t = (A_t^T g)_j
            gx = pushed.view(n, t * ho) @ weight.view(ho, t, h).transpose(0, 1).reshape(t * ho, h)
        if ctx.needs_input_grad[1]:
            gw = grad.T @ sums.view(n, th)
        return gx, gw, None, None


def stacked_aggregate_linear(x: torch.Tensor, weight: torch.Tensor, a: torch.Tensor,
                             a_tt: torch.Tensor) -> torch.Tensor:
    """``[N, H_out]``: ``sum_t (A_t x) W_t^T`` (raw sums) for ``x`` ``[N, H]``, ``weight``
    ``[H_out, T*H]`` (type-major), the stacked ``a`` and its type-split transpose ``a_tt``
    (``SharedGraph.a_tt``); differentiable in ``x`` and ``weight``."""
    n = x.shape[0]
    if x.dim() != 2 or a.shape[1] != n or weight.shape[1] * n != a.shape[0] * x.shape[1]:
        raise ValueError(f"'x' [N, H], 'weight' [H_out, T*H] and 'a' [N*T, N] do not agree "
                         f"(got {list(x.shape)}, {list(weight.shape)}, {list(a.shape)})")
    return _StackedAggregateLinear.apply(x, weight, a, a_tt)


@timed_function
class _TypedSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, per_type, per_type_t):
        x = x.contiguous()
        out = x.new_empty(len(per_type), x.shape[0], x.shape[1])
        with sparse_range(nnz(*per_type) * x.shape[1]):
            for j, a in enumerate(per_type):
                out[j].addmm_(a, x, beta=0)
        ctx.per_type_t = per_type_t
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        gx = grad.new_zeros(grad.shape[1], grad.shape[2])
        with sparse_range(nnz(*ctx.per_type_t) * grad.shape[2]):
            for j, a in enumerate(ctx.per_type_t):
                gx.addmm_(a, grad[j])
        return gx, None, None


def typed_spmm(graph, x: torch.Tensor) -> torch.Tensor:
    """``[T, N, H]``: ``A_t @ x`` for every edge type, for one ``x`` ``[N, H]``, differentiable
    (``slab``: one CSR product per type; ``wide``: one stacked product, permuted)."""
    if graph.kernel == "slab":
        return _TypedSpMM.apply(x, graph.per_type, graph.per_type_t)
    s = spmm(graph.a, graph.a_t, x).view(graph.num_nodes, graph.num_types, x.shape[-1])
    return s.permute(1, 0, 2)


@timed_function
class _AddRows(torch.autograd.Function):
    """``out[index[i]] += src[i]`` into ``rows`` zero rows, tagged as a sparse product both ways;
    with ``csr`` (:func:`selection_csr`) the forward is one sparse product, not ``index_add_``."""

    @staticmethod
    def forward(ctx, src, index, rows, csr):
        ctx.save_for_backward(index)
        with sparse_range(src.numel()):
            if csr is not None and src.device.type == "cpu" and src.dim() == 2:
                return torch.sparse.mm(csr, src.contiguous())
            return src.new_zeros(rows, *src.shape[1:]).index_add_(0, index, src)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        row = grad.numel() // max(grad.shape[0], 1)  # elements per row (no rows: none)
        with sparse_range(index.numel() * row):
            return grad.index_select(0, index), None, None, None


def add_rows(src: torch.Tensor, index: torch.Tensor, rows: int,
             csr: torch.Tensor | None = None) -> torch.Tensor:
    """``[rows, ...]``: the rows of ``src`` added at ``index`` (differentiable in ``src``); ``csr``
    (:func:`selection_csr`) makes it one sparse product on a CPU."""
    return _AddRows.apply(src, index, rows, csr)


@timed_function
class _GatherRows(torch.autograd.Function):
    """``x[index]`` whose backward adds the gradient's rows back with one sparse product of
    ``back`` (CSR ``[rows of x, len(index)]``) instead of ``index_add_``."""

    @staticmethod
    def forward(ctx, x, index, back):
        ctx.back, ctx.rows = back, x.shape[0]
        ctx.save_for_backward(index)
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        grad = grad.contiguous()
        if ctx.back is not None and grad.dim() == 2:
            with torch.profiler.record_function(MOVE_TAG):
                return torch.sparse.mm(ctx.back, grad), None, None
        return grad.new_zeros(ctx.rows, *grad.shape[1:]).index_add_(0, index, grad), None, None


def gather_rows(x: torch.Tensor, index: torch.Tensor, back: torch.Tensor | None = None):
    """``x.index_select(0, index)``, differentiable; with ``back`` (CSR ``[x.shape[0], len(index)]``
    of ones, row ``i`` the positions of ``i`` in ``index``) its backward is one sparse product on
    a CPU, else the plain gather."""
    if back is None or x.device.type != "cpu" or not x.requires_grad:
        return x.index_select(0, index)
    return _GatherRows.apply(x, index, back)


@timed_function
class _AddAtRows(torch.autograd.Function):
    """``rows[index] += alpha * src`` in place (``index`` without repeats), marked dirty, by
    gather, add and copy back (no ``index_add_``); backward: ``rows`` gets the gradient as is,
    ``src`` its rows at ``index``."""

    @staticmethod
    def forward(ctx, rows, src, index, alpha):
        ctx.alpha = alpha
        ctx.save_for_backward(index)
        ctx.mark_dirty(rows)
        return rows.index_copy_(0, index, rows.index_select(0, index).add_(src, alpha=alpha))

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return grad, grad.index_select(0, index).mul_(ctx.alpha), None, None


def add_at_rows(rows: torch.Tensor, src: torch.Tensor, index: torch.Tensor,
                alpha: float = 1.0) -> torch.Tensor:
    """``rows`` with ``alpha * src`` added at its distinct rows ``index``, in place (differentiable
    in both; ``rows`` must not be needed by the backward of what made it)."""
    return _AddAtRows.apply(rows, src, index, float(alpha))


def selection_csr(index: torch.Tensor, rows: int, order: torch.Tensor | None = None):
    """The CSR ``[rows, len(index)]`` with a one at ``(index[i], i)`` (the selection's transpose);
    ``order``: the positions grouped by ``index[i]`` ascending, if known (else a stable argsort)."""
    if order is None:
        order = torch.argsort(index, stable=True)
    crow = torch.zeros(rows + 1, dtype=torch.int32, device=index.device)
    crow[1:] = torch.cumsum(torch.bincount(index, minlength=rows), 0)
    return torch.sparse_csr_tensor(crow, order.to(torch.int32),
                                   torch.ones(index.numel(), device=index.device),
                                   size=(rows, index.numel()), check_invariants=False)
