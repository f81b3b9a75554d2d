"""The delta push's PyTorch kernels, ``pull`` and ``index_add`` (forward and backward), and
:func:`message_slots`; :mod:`workbook_lib.nodemask.delta` picks among these and the compiled ones.
"""
from __future__ import annotations

import torch

from .edges import PushPlan


def _enumerate(plan: PushPlan, b: int, pair_gene: torch.Tensor, pair_out: torch.Tensor,
               ptr: torch.Tensor, slot: torch.Tensor):
    """Sample ``b``'s out-edges of ``R_b``: ``(row within the batch's pairs, slot)`` on the
    device of ``pair_gene``, built with sizes known on the host."""
    lo, hi, m = plan.ranges[b], plan.ranges[b + 1], plan.entries[b]
    dev = pair_gene.device
    genes, cnt = pair_gene[lo:hi], pair_out[lo:hi]
    rows = torch.repeat_interleave(torch.arange(lo, hi, device=dev), cnt, output_size=m)
    start = torch.repeat_interleave(ptr[genes], cnt, output_size=m)
    offs = torch.repeat_interleave(torch.cumsum(cnt, 0) - cnt, cnt, output_size=m)
    within = torch.arange(m, device=dev) - offs
    return rows, slot[start + within]


def _weight_column(sl: torch.Tensor, w: torch.Tensor, n: int, t: int) -> torch.Tensor:
    """The column of ``w`` weighing out-edges landing on slots ``sl``: the slot itself for
    ``[B, N*T]`` weights, the receiving gene for ``[B, N]`` ones."""
    return sl if w.shape[1] == n * t else sl // t


def _index_add_forward(out, u, w, graph, corr):
    plan, n, t = corr.plan, graph.num_nodes, graph.num_types
    flat = out.view(-1, out.shape[-1])
    for b in range(len(plan.ranges) - 1):
        if plan.entries[b]:
            rows, sl = _enumerate(plan, b, corr.pair_gene, corr.pair_out, graph.out_ptr,
                                  graph.out_slot)
            q = corr.msg_index.index_select(0, (sl % t) * corr.pair_gene.numel() + rows)
            msg = u.index_select(0, q) * w[b].index_select(0, _weight_column(sl, w, n, t)
                                                          ).unsqueeze(-1)
            flat.index_add_(0, b * n + sl // t, msg)


def _index_add_backward(gu, grad, w, graph, corr):
    plan, n, t = corr.plan, graph.num_nodes, graph.num_types
    gflat = grad.view(-1, grad.shape[-1])
    for b in range(len(plan.ranges) - 1):
        if plan.entries[b]:
            rows, sl = _enumerate(plan, b, corr.pair_gene, corr.pair_out, graph.out_ptr,
                                  graph.out_slot)
            q = corr.msg_index.index_select(0, (sl % t) * corr.pair_gene.numel() + rows)
            msg = gflat.index_select(0, b * n + sl // t) * w[b].index_select(
                0, _weight_column(sl, w, n, t)).unsqueeze(-1)
            gu.index_add_(0, q, msg)


def message_slots(corr) -> torch.Tensor:
    """``[M]``: ``row * T + type`` of each message, its place in ``[R, T, Ho]``."""
    counts = corr.plan.type_counts
    dev = corr.msg_pair.device
    types = torch.repeat_interleave(torch.arange(len(counts), device=dev),
                                    torch.tensor(counts, device=dev),
                                    output_size=int(sum(counts)))
    return corr.msg_pair * len(counts) + types


def _pull_forward(out, u, w, graph, corr):
    """Per sample and type, ``A_t`` times the rows of ``R_b`` scattered into a zero ``[N, H]``
    operand: the full product's sparse work, but none of its dense work."""
    plan, n, t = corr.plan, graph.num_nodes, graph.num_types
    full = u.new_zeros(corr.pair_gene.numel() * t, u.shape[-1]).index_copy_(
        0, message_slots(corr), u).view(-1, t, u.shape[-1])
    wv = w.view(w.shape[0], n, -1).expand(w.shape[0], n, t)
    dense = u.new_zeros(t, n, u.shape[-1])
    for b in range(len(plan.ranges) - 1):
        lo, hi = plan.ranges[b], plan.ranges[b + 1]
        if hi == lo:
            continue
        genes = corr.pair_gene[lo:hi]
        dense.zero_()
        dense.index_copy_(1, genes, full[lo:hi].transpose(0, 1))
        for j, a in enumerate(graph.per_type):
            out[b].addcmul_(wv[b, :, j].unsqueeze(-1), torch.mm(a, dense[j]))


def _pull_backward(gu, grad, w, graph, corr):
    plan, n, t = corr.plan, graph.num_nodes, graph.num_types
    full = gu.new_zeros(corr.pair_gene.numel(), t, gu.shape[-1])
    wv = w.view(w.shape[0], n, -1).expand(w.shape[0], n, t)
    for b in range(len(plan.ranges) - 1):
        lo, hi = plan.ranges[b], plan.ranges[b + 1]
        if hi == lo:
            continue
        genes = corr.pair_gene[lo:hi]
        for j, a_t in enumerate(graph.per_type_t):
            g = torch.mm(a_t, grad[b] * wv[b, :, j].unsqueeze(-1))
            full[lo:hi, j] = g.index_select(0, genes)
    gu.copy_(full.view(-1, gu.shape[-1]).index_select(0, message_slots(corr)))
