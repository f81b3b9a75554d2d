"""Delta propagation: a middle layer whose per-sample cost follows what a deletion changed.

After an incremental first layer, sample ``b``'s masked input to the next layer is
``D_b h1_b = h1 + e_b``, with ``e_b`` non-zero only on the correction rows ``R_b``
(:class:`~workbook_lib.nodemask.corrections.Corrections`): the change ``d1_b`` on kept rows,
``-h1`` on deleted genes. So ``sum_t A_t (D_b h1_b) W_t^T = sum_t A_t h1 W_t^T +
sum_t A_t (e_b W_t^T)``: one wildtype product per batch, plus per sample a *push* of the messages
``e_b[r] W_t^T`` (:func:`grouped_messages`) along the out-edges of ``R_b`` only (:func:`push`).
Mean aggregation scales messages by ``1 / deg_tb`` and corrects the wildtype part on those rows
by ``S_t (1 / deg_tb - 1 / deg_t) W_t^T``. Exact (float32 rounding), outputs and gradients, with
every kernel: ``numba`` (CPU default), ``pull`` and ``index_add`` (PyTorch; CUDA default).
Only the second layer is delta-propagated: by the third nearly every gene has changed.

Hand-written because stock PyTorch has no fast column-sliced sparse product on a CPU; numba is the
maintained way to compile one that installs as a wheel (no compiler at run time).
"""
from __future__ import annotations


import numpy as np
import torch

from .push_torch import (_index_add_backward, _index_add_forward, _pull_backward,
                         _pull_forward, message_slots)
from .compiled import kernels as _compiled
from .first_order import refuse_second_order
from .kernels import MOVE_TAG, dense_inside, sparse_range
from .parts import timed_function

PUSH_KERNELS = ("numba", "pull", "index_add")

def _np(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor, sharing memory (through DLPack: not a host copy, and not
    counted as one by :mod:`workbook_lib.measurement.syncs`)."""
    return np.from_dlpack(t.detach())


def default_push_kernel(device: torch.device | str) -> str:
    """``numba`` on a CPU, ``index_add`` on CUDA."""
    return "numba" if torch.device(device).type == "cpu" else "index_add"


@timed_function
class _GroupedMessages(torch.autograd.Function):
    """``u[m] = e[msg_pair[m]] W_t^T`` per type ``t``, written in place; backward: the messages'
    gradients added to their rows with ``back`` and one weight-gradient product per type."""

    @staticmethod
    def forward(ctx, e, weight, msg_pair, counts, back):
        hd, ho = e.shape[-1], weight.shape[0]
        ec = e.index_select(0, msg_pair)  # [M, H]
        out = e.new_empty(ec.shape[0], ho)
        lo = 0
        for i, m in enumerate(counts):
            if m:
                torch.mm(ec[lo:lo + m], weight[:, i * hd:(i + 1) * hd].T, out=out[lo:lo + m])
            lo += m
        ctx.counts, ctx.back, ctx.rows = counts, back, e.shape[0]
        ctx.save_for_backward(ec, weight, msg_pair)
        return out

    @staticmethod
    def backward(ctx, grad):
        ec, weight, msg_pair = ctx.saved_tensors
        hd = ec.shape[-1]
        grad = grad.contiguous()
        ge = gw = None
        if ctx.needs_input_grad[0]:
            gec = torch.empty_like(ec)
            lo = 0
            for i, m in enumerate(ctx.counts):
                if m:
                    torch.mm(grad[lo:lo + m], weight[:, i * hd:(i + 1) * hd],
                             out=gec[lo:lo + m])
                lo += m
            if ctx.back is not None and gec.device.type == "cpu":
                with torch.profiler.record_function(MOVE_TAG):
                    ge = torch.sparse.mm(ctx.back, gec)
            else:
                ge = gec.new_zeros(ctx.rows, hd).index_add_(0, msg_pair, gec)
        if ctx.needs_input_grad[1]:
            gw = weight.new_zeros(weight.shape)
            lo = 0
            for i, m in enumerate(ctx.counts):
                if m:
                    gw[:, i * hd:(i + 1) * hd] = grad[lo:lo + m].T @ ec[lo:lo + m]
                lo += m
        return ge, gw, None, None, None


def grouped_messages(e: torch.Tensor, weight: torch.Tensor, msg_pair: torch.Tensor,
                     type_counts: list[int], back: torch.Tensor | None = None) -> torch.Tensor:
    """``[M, H_out]``: the messages ``e[msg_pair[m]] W_t^T``, grouped by type ``t``
    (``type_counts[t]`` rows each): one product per type for the whole batch.

    Args:
        e: ``[R, H]`` the rows' changes; ``weight``: ``[H_out, T*H]`` (type-major input).
        msg_pair: ``[M]`` the row of each message; ``type_counts``: messages per type (host ints).
        back: optional CSR ``[R, M]``, each row's messages (``Corrections.msg_back``).
    """
    t, hd = len(type_counts), e.shape[-1]
    if weight.shape[1] != t * hd:
        raise ValueError(f"'weight' must be [H_out, {t}*{hd}] (got {list(weight.shape)})")
    if sum(type_counts) != msg_pair.numel():
        raise ValueError(f"'type_counts' sum to {sum(type_counts)}, 'msg_pair' has "
                         f"{msg_pair.numel()} messages")
    return _GroupedMessages.apply(e, weight, msg_pair, list(type_counts), back)


@timed_function
class _Push(torch.autograd.Function):
    """``out[b] = act(base + rows at (b, gene) + sum over rows p of sample b, out-edges (n, t)
    of gene(p): w[b, n*T + t] u[m(p, t)])`` (``[B, N, Ho]``; ``act`` ReLU or none); gradients
    for ``base``, ``u`` and ``rows``."""

    @staticmethod
    def forward(ctx, base, u, rows, w, graph, corr, kernel, relu):
        bsz = len(corr.plan.ranges) - 1
        base, u, rows, w = base.contiguous(), u.contiguous(), rows.contiguous(), w.contiguous()
        with sparse_range(corr.plan.total_entries * u.shape[-1]):  # useful multiply-adds
            if kernel == "numba":
                out = base.new_empty(bsz, *base.shape)
                _numba_threads()
                _compiled().fwd(
                    _np(out), _np(base), _np(u), _np(rows), _np(corr.plan.pair_ptr),
                    _np(corr.pair_gene.long()), *_typed_out_edges(graph), _np(corr.msg_index),
                    graph.num_types, _np(w), _per_slot(graph, w), relu)
            else:
                out = base.unsqueeze(0).repeat(bsz, 1, 1)  # new memory even for B = 1
                (_pull_forward if kernel == "pull" else _index_add_forward)(
                    out, u, w, graph, corr)
                out.index_put_((corr.pair_sample, corr.pair_gene), rows, accumulate=True)
                if relu:
                    out.relu_()
        ctx.args = (graph, corr, kernel, u.shape, relu)
        ctx.save_for_backward(w, out if relu else None)
        return out

    @staticmethod
    def backward(ctx, grad):
        graph, corr, kernel, u_shape, relu = ctx.args
        if kernel == "numba":
            refuse_second_order(ctx, "the compiled push's kernels")
        w, out = ctx.saved_tensors
        grad = grad.contiguous()
        gu = grad.new_empty(u_shape) if kernel == "numba" else grad.new_zeros(u_shape)
        with sparse_range(corr.plan.total_entries * u_shape[-1]):
            if kernel == "numba":
                _numba_threads()
                numba = _compiled().numba
                chunks = max(1, min(numba.get_num_threads(), grad.shape[0]))
                parts = grad.new_zeros(chunks, *grad.shape[1:])
                scratch = grad.new_empty(chunks, *grad.shape[1:])
                grows = grad.new_empty(corr.pair_gene.numel(), grad.shape[-1])
                _compiled().bwd(
                    _np(gu), _np(grows), _np(parts), _np(scratch), _np(grad),
                    _np(out if relu else grad), _np(corr.plan.pair_ptr),
                    _np(corr.pair_gene.long()), *_typed_out_edges(graph), _np(corr.msg_index),
                    graph.num_types, _np(w), _per_slot(graph, w), relu)
                gbase = parts.sum(0)
            else:
                g = grad * (out > 0) if relu else grad
                gbase = g.sum(0)
                grows = g[corr.pair_sample, corr.pair_gene]
                (_pull_backward if kernel == "pull" else _index_add_backward)(
                    gu, g, w, graph, corr)
        return gbase, gu, grows, None, None, None, None, None


@timed_function
class _PushPool(torch.autograd.Function):
    """The compiled push (rows and ReLU included) followed by ``pooled[b, k] = sum_n wp[b, k, n]
    out[b, n]`` in one pass per sample, the ``[B, N, Ho]`` output never written. Gradients for
    ``base``, ``u`` and ``rows`` (``wp`` is a constant)."""

    @staticmethod
    def forward(ctx, base, u, rows, w, wp, graph, corr):
        bsz, kk = wp.shape[0], wp.shape[1]
        base, u, rows, w, wp = (x.contiguous() for x in (base, u, rows, w, wp))
        _numba_threads()
        numba = _compiled().numba
        chunks = max(1, min(numba.get_num_threads(), bsz))
        pooled = base.new_empty(bsz, kk, base.shape[-1])
        mask = torch.empty(bsz, *base.shape, dtype=torch.uint8)
        scratch = base.new_empty(chunks, *base.shape)
        with sparse_range(corr.plan.total_entries * u.shape[-1]):
            dense_inside(pooled.numel() * base.shape[0])  # the weighted sums: B K N Ho
            _compiled().fwd_pool(
                _np(pooled), _np(mask), _np(scratch), _np(base), _np(u), _np(rows),
                _np(corr.plan.pair_ptr), _np(corr.pair_gene.long()), *_typed_out_edges(graph),
                _np(corr.msg_index), graph.num_types, _np(w), _per_slot(graph, w), _np(wp))
        ctx.args = (graph, corr, u.shape, chunks)
        ctx.save_for_backward(w, wp, mask)
        return pooled

    @staticmethod
    def backward(ctx, gpooled):
        graph, corr, u_shape, chunks = ctx.args
        refuse_second_order(ctx, "the compiled push's kernels")
        w, wp, mask = ctx.saved_tensors
        gpooled = gpooled.contiguous()
        n, ho = mask.shape[1], mask.shape[2]
        gu = gpooled.new_empty(u_shape)
        grows = gpooled.new_empty(corr.pair_gene.numel(), ho)
        parts = gpooled.new_zeros(chunks, n, ho)
        scratch = gpooled.new_empty(chunks, n, ho)
        _numba_threads()
        with sparse_range(corr.plan.total_entries * u_shape[-1]):
            dense_inside(gpooled.numel() * n)  # the rows' gradient: B K N Ho
            _compiled().bwd_pool(
                _np(gu), _np(grows), _np(parts), _np(scratch), _np(gpooled), _np(mask), _np(wp),
                _np(corr.plan.pair_ptr), _np(corr.pair_gene.long()), *_typed_out_edges(graph),
                _np(corr.msg_index), graph.num_types, _np(w), _per_slot(graph, w))
        return parts.sum(0), gu, grows, None, None, None, None


def push_pooled(graph, corr, base: torch.Tensor, u: torch.Tensor, weight: torch.Tensor,
                pool: torch.Tensor, kernel: str | None = None, *,
                rows: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, K, Ho]``: ``pool`` ``[B, K, N]`` (weights, no gradient) times each sample's rows of
    ``push(graph, corr, base, u, weight, kernel, rows=rows, relu=True)``; with ``numba`` the
    push's output is never written. Differentiable in ``base``, ``u`` and ``rows``."""
    kernel = kernel or default_push_kernel(base.device)
    _check_push_args(graph, corr, base, weight, kernel)
    bsz = len(corr.plan.ranges) - 1
    if pool.dim() != 3 or pool.shape[0] != bsz or pool.shape[2] != graph.num_nodes:
        raise ValueError(f"'pool' must be [B, K, N] with B={bsz}, N={graph.num_nodes} "
                         f"(got {list(pool.shape)})")
    if kernel != "numba" or pool.requires_grad:
        return torch.bmm(pool, push(graph, corr, base, u, weight, kernel, rows=rows, relu=True))
    if u.dim() == 3:
        u = u.reshape(-1, u.shape[-1]).index_select(0, message_slots(corr))
    if rows is None:
        rows = base.new_zeros(corr.pair_gene.numel(), base.shape[-1])
    return _PushPool.apply(base, u, rows, weight, pool, graph, corr)


def _typed_out_edges(graph) -> tuple[np.ndarray, np.ndarray]:
    """The compiled kernels' out-edges grouped by (sender, type): receivers
    ``node[ptr[s*T + t]:ptr[s*T + t + 1]]`` (``SharedGraph.out_type_ptr``/``out_type_node``)."""
    return _np(graph.out_type_ptr), _np(graph.out_type_node)


def _per_slot(graph, w: torch.Tensor) -> bool:
    """True when ``w`` weighs receiving slots (``[B, N*T]``), False for receiving genes."""
    return bool(w.shape[1] == graph.num_nodes * graph.num_types)


def _numba_threads() -> None:
    """As many numba threads as PyTorch uses (a DDP rank set to one thread stays on one)."""
    numba = _compiled().numba
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))


def _check_push_args(graph, corr, base: torch.Tensor, weight: torch.Tensor, kernel: str) -> None:
    if kernel not in PUSH_KERNELS:
        raise ValueError(f"'push_kernel' must be one of {list(PUSH_KERNELS)} (got {kernel!r})")
    if kernel == "numba":
        if base.device.type != "cpu":
            raise ValueError("push_kernel='numba' runs on CPU tensors only; use 'index_add'")
    if corr.plan is None or corr.pair_out is None or corr.msg_index is None:
        raise ValueError("these corrections carry no push plan: build them with "
                         "workbook_lib.nodemask.corrections")
    n, t = graph.num_nodes, graph.num_types
    if weight.dim() != 2 or weight.shape[1] not in (n, n * t):
        raise ValueError(f"'weight' must be [B, N*T] (per receiving slot) or [B, N] (per "
                         f"receiving gene) with N={n}, T={t} (got {list(weight.shape)})")


def push(graph, corr, base: torch.Tensor, u: torch.Tensor, weight: torch.Tensor,
         kernel: str | None = None, *, rows: torch.Tensor | None = None,
         relu: bool = False) -> torch.Tensor:
    """``[B, N, Ho]``: ``base`` ``[N, Ho]`` for every sample, plus each correction row's messages
    pushed along its gene's out-edges of their type, each scaled by ``weight``, plus ``rows`` at
    the correction rows, then a ReLU if ``relu``. Differentiable in ``base``, ``u`` and ``rows``.

    Args:
        graph, corr: the ``SharedGraph`` and the batch's ``Corrections`` (carrying the plan).
        u: the messages, ``[M, Ho]`` grouped by type (:func:`grouped_messages`), or ``[R, T, Ho]``.
        weight: ``[B, N*T]`` per receiving slot (0 for a deleted receiver, 1/degree for mean
            aggregation) or ``[B, N]`` per receiving gene (e.g. the kept mask).
        kernel: ``numba``, ``pull`` or ``index_add``; default by device.
        rows: ``[R, Ho]`` added at row ``(pair_sample[p], pair_gene[p])`` (zero if not given).
    """
    kernel = kernel or default_push_kernel(base.device)
    _check_push_args(graph, corr, base, weight, kernel)
    if u.dim() == 3:
        u = u.reshape(-1, u.shape[-1]).index_select(0, message_slots(corr))
    if rows is None:
        rows = base.new_zeros(corr.pair_gene.numel(), base.shape[-1])
    return _Push.apply(base, u, rows, weight, graph, corr, kernel, relu)
