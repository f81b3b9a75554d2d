"""The correction rows of a batch of perturbed graphs (per sample: the deleted genes and their
out-neighbours, the only rows whose aggregation differs from the wildtype's) and every index the
layers and the delta push need (:class:`Corrections`): built on the host in one compiled pass
when numba is there, else by PyTorch operations (the same fields)."""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from .compiled import kernels as _compiled
from .edges import OutEdges, PushPlan
from .kernels import selection_csr


def validate_deleted(deleted: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Check a ``[B, k]`` integer tensor of deleted genes (``-1`` pads): ValueError for a wrong
    shape or dtype, a gene outside ``0..N-1``, or one deleted twice in a sample."""
    if not isinstance(deleted, torch.Tensor):
        raise TypeError(f"'deleted' must be a tensor (got {type(deleted).__name__})")
    if deleted.dim() != 2:
        hint = "; use deleted.unsqueeze(0) for one sample" if deleted.dim() == 1 else ""
        raise ValueError(f"'deleted' must be [B, k] (got shape {list(deleted.shape)}){hint}")
    if deleted.dtype.is_floating_point or deleted.dtype == torch.bool:
        raise ValueError(f"'deleted' must hold integer gene indices (got {deleted.dtype})")
    if deleted.numel():
        d = deleted.detach().cpu().long()
        lo, hi = int(d.min()), int(d.max())
        if lo < -1 or hi >= num_nodes:
            bad = d[(d < -1) | (d >= num_nodes)][0].item()
            raise ValueError(f"'deleted' holds gene index {bad}, outside 0..{num_nodes - 1} "
                             "(-1 pads shorter rows)")
        s, _ = torch.sort(d, dim=1)
        dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
        if dup.any():
            row = int(dup.any(1).nonzero()[0])
            gene = int(s[row, 1:][dup[row]][0])
            raise ValueError(f"'deleted' deletes gene {gene} twice in sample {row}")
    return deleted.long()


@dataclass
class Corrections:
    """The (sample, gene) rows a deletion changes in a first layer, and what feeds them; built on
    the host with its sizes in ``plan``, so a GPU step never reads a count back."""

    pair_sample: torch.Tensor  # [R]
    pair_gene: torch.Tensor  # [R]
    pair_deleted: torch.Tensor  # [R] bool: the gene itself is deleted in that sample
    entry_slot: torch.Tensor  # [E] pair * T + type: where each out-edge lands
    entry_source: torch.Tensor  # [E] the deleted gene sending it
    pair_out: torch.Tensor | None = None  # [R] out-degree of each row's gene (delta layer)
    changed_slot: torch.Tensor | None = None  # [Q] distinct entry_slot: (row, type) whose
    #                                           in-degree a deletion lowers (mean aggregation)
    plan: PushPlan | None = None  # host-side sizes of the delta layer's push
    source_gene: torch.Tensor | None = None  # [G] the batch's distinct deleted genes
    entry_source_index: torch.Tensor | None = None  # [E] entry_source as an index into it
    deleted_pair: torch.Tensor | None = None  # [D] the rows whose gene is deleted
    msg_pair: torch.Tensor | None = None  # [M] row of each message, type-major (delta layer)
    msg_index: torch.Tensor | None = None  # [T*R] message of (type, row), -1 where none
    pool_drop: torch.Tensor | None = None  # [F] b*T*N + t*N + j: the deleted genes' in-edges
    entry_msg: torch.Tensor | None = None  # [E] source index * T + type: its message's row
    entry_pair: torch.Tensor | None = None  # [E] entry_slot // T: the row it lands on
    msg_back: torch.Tensor | None = None  # CSR [R, M]: the messages of each row (CPU backward)
    gene_back: torch.Tensor | None = None  # CSR [N, R]: the rows of each gene (CPU backward)
    entry_msg_back: torch.Tensor | None = None  # CSR [G*T, E]: the entries of each message
    entry_pair_csr: torch.Tensor | None = None  # CSR [R, E]: the entries landing on each row
    deleted_gene: torch.Tensor | None = None  # [D] pair_gene[deleted_pair]
    deleted_back: torch.Tensor | None = None  # CSR [N, D]: the deleted rows of each gene
    source_back: torch.Tensor | None = None  # CSR [N, G]: where each gene is in source_gene

    # the row selections' transposes, for a CPU (a GPU's index_add_ needs no such table)
    BACKWARD_ONLY_ON_CPU = ("msg_back", "gene_back", "entry_msg_back", "entry_pair_csr",
                            "deleted_back", "source_back")

    def to(self, device) -> "Corrections":
        device = torch.device(device)

        def mv(name, t):
            if t is None or (name in self.BACKWARD_ONLY_ON_CPU and device.type != "cpu"):
                return None
            return t.to(device, non_blocking=True)
        return Corrections(**{f.name: (getattr(self, f.name) if f.name == "plan" else
                                       mv(f.name, getattr(self, f.name))) for f in fields(self)})


def corrections(out_edges: OutEdges, deleted: torch.Tensor) -> Corrections:
    """Correction rows for ``deleted`` ``[B, k]``, computed where ``deleted`` is (host: no sync),
    from ``SharedGraph.out_edges``; also the delta layer's messages grouped by type
    (``msg_pair``, ``msg_index``, ``plan.type_counts``) and the pooled layer's ``pool_drop``."""
    deleted = validate_deleted(deleted, out_edges.num_nodes)
    if out_edges.sends is None or out_edges.in_ptr is None:
        raise ValueError("'out_edges' carries no type or in-edge lists: use "
                         "SharedGraph.out_edges")
    if deleted.device.type == "cpu" and _compiled():
        return _corrections_compiled(out_edges, deleted)
    return _corrections_torch(out_edges, deleted)


def _csr(crow: torch.Tensor, col: torch.Tensor, rows: int) -> torch.Tensor:
    """The selection CSR ``[rows, len(col)]`` of ones from int32 ``crow`` and ``col``, in the
    default dtype (ones filled by NumPy)."""
    ones = torch.from_numpy(np.ones(col.numel(), dtype=np.float64 if torch.get_default_dtype()
                                    == torch.float64 else np.float32))  # as torch.ones would
    return torch.sparse_csr_tensor(crow, col, ones, size=(rows, col.numel()),
                                   check_invariants=False)


def _corrections_compiled(out_edges: OutEdges, deleted: torch.Tensor) -> Corrections:
    """:func:`corrections` on the host in one compiled pass
    (:func:`~workbook_lib.nodemask.numba_push.corrections_host`): the same tensors."""
    n, t = out_edges.num_nodes, out_edges.num_types
    k = _compiled().corrections_host
    arr = k(deleted.contiguous().numpy(), out_edges.ptr.numpy(), out_edges.slot.numpy(), n, t,
            out_edges.sends.numpy(), out_edges.in_ptr.numpy(), out_edges.in_slot.numpy())
    (pair_sample, pair_gene, is_del, entry_slot, e_gene, pair_out, changed_slot, pair_ptr,
     entries, source_gene, source_index, deleted_pair, deleted_gene, msg_pair, msg_index,
     type_counts, pool_drop, entry_msg, entry_pair, msg_crow, msg_col) = (
        torch.from_numpy(a) for a in arr)
    plan = PushPlan.from_counts(pair_ptr, entries, pair_out)
    plan.type_counts = type_counts.tolist()
    plan.num_deleted = int(deleted_pair.numel())
    r, g = pair_gene.numel(), source_gene.numel()
    sel = _compiled().selection
    return Corrections(pair_sample=pair_sample, pair_gene=pair_gene, pair_deleted=is_del,
                       entry_slot=entry_slot, entry_source=e_gene, pair_out=pair_out,
                       changed_slot=changed_slot, plan=plan, source_gene=source_gene,
                       entry_source_index=source_index, deleted_pair=deleted_pair,
                       msg_pair=msg_pair, msg_index=msg_index, pool_drop=pool_drop,
                       entry_msg=entry_msg, entry_pair=entry_pair,
                       msg_back=_csr(msg_crow, msg_col, r),
                       gene_back=_csr(*(torch.from_numpy(a) for a in sel(arr[1], n)), n),
                       entry_msg_back=_csr(*(torch.from_numpy(a) for a in sel(arr[17], g * t)),
                                           g * t),
                       entry_pair_csr=_csr(*(torch.from_numpy(a) for a in sel(arr[18], r)), r),
                       deleted_gene=deleted_gene,
                       deleted_back=_csr(*(torch.from_numpy(a) for a in sel(arr[12], n)), n),
                       source_back=_csr(*(torch.from_numpy(a) for a in sel(arr[9], n)), n))


def _corrections_torch(out_edges: OutEdges, deleted: torch.Tensor) -> Corrections:
    """:func:`corrections` in PyTorch operations, where ``deleted`` lives (any device)."""
    dev = deleted.device
    ptr, slot = out_edges.ptr.to(dev), out_edges.slot.to(dev)
    n, t = out_edges.num_nodes, out_edges.num_types
    b_all = torch.arange(deleted.shape[0], device=dev).unsqueeze(1).expand_as(deleted)
    valid = deleted >= 0
    samples, genes = b_all[valid], deleted[valid]
    counts = ptr[genes + 1] - ptr[genes]
    total = int(counts.sum())
    e_sample = torch.repeat_interleave(samples, counts, output_size=total)
    e_gene = torch.repeat_interleave(genes, counts, output_size=total)
    first = torch.repeat_interleave(ptr[genes], counts, output_size=total)
    within = torch.arange(total, device=dev) - torch.repeat_interleave(
        torch.cumsum(counts, 0) - counts, counts, output_size=total)
    e_slot = slot[first + within]
    keys = torch.cat([e_sample * n + e_slot // t, samples * n + genes])
    uniq, inv = torch.unique(keys, return_inverse=True)
    is_del = torch.zeros(uniq.numel(), dtype=torch.bool, device=dev)
    is_del[inv[total:]] = True
    pair_sample, pair_gene = uniq // n, uniq % n
    plan = PushPlan(pair_sample, pair_gene, out_edges.ptr, out_edges.slot, deleted.shape[0])
    entry_slot = inv[:total] * t + e_slot % t
    source_gene, source_of = torch.unique(genes, return_inverse=True)
    source_index = torch.repeat_interleave(source_of, counts, output_size=total)
    # the delta layer's messages: (row, type) where the row's gene sends on that type, listed
    # type-major; a running count gives each its place (no division, sort or mask selection)
    r = pair_gene.numel()
    sends = out_edges.sends.to(dev).index_select(1, pair_gene)  # [T, R] 0/1
    place = torch.cumsum(sends.view(-1), 0, dtype=torch.int32).view(t, r)
    type_counts = sends.sum(1)
    m = int(place[-1, -1]) if r else 0
    msg_index = (place * sends - 1).view(-1).long()  # [T*R]: type t, row p at t*R + p
    msg_pair = torch.empty(m + 1, dtype=torch.long, device=dev).scatter_(
        0, torch.where(msg_index >= 0, msg_index, m), torch.arange(r, device=dev).repeat(t))[:m]
    plan.type_counts = type_counts.tolist()
    # the pooled layer's weights: sample b loses the in-edges (j -> s, type t) of each deleted s
    in_ptr, in_slot = out_edges.in_ptr.to(dev), out_edges.in_slot.to(dev)
    icount = in_ptr[genes + 1] - in_ptr[genes]
    itotal = int(icount.sum())
    i_first = torch.repeat_interleave(in_ptr[genes], icount, output_size=itotal)
    i_within = torch.arange(itotal, device=dev) - torch.repeat_interleave(
        torch.cumsum(icount, 0) - icount, icount, output_size=itotal)
    i_sample = torch.repeat_interleave(samples, icount, output_size=itotal)
    pool_drop = i_sample * (t * n) + in_slot[i_first + i_within]
    deleted_pair = is_del.nonzero().flatten()
    deleted_gene = pair_gene.index_select(0, deleted_pair)
    plan.num_deleted = int(deleted_pair.numel())
    # the backward's scatters as sparse products (CPU): each row's messages, each gene's rows
    row_major = msg_index.view(t, r).T.reshape(-1)
    msg_back = selection_csr(msg_pair, r, order=row_major[row_major >= 0])
    gene_back = selection_csr(pair_gene, n)
    entry_msg = source_index * t + e_slot % t
    entry_pair = inv[:total]
    entry_msg_back = selection_csr(entry_msg, source_gene.numel() * t)
    entry_pair_csr = selection_csr(entry_pair, r)
    return Corrections(pair_sample=pair_sample, pair_gene=pair_gene, pair_deleted=is_del,
                       entry_slot=entry_slot, entry_source=e_gene,
                       pair_out=plan.pair_out.to(dev), changed_slot=torch.unique(entry_slot),
                       plan=plan, source_gene=source_gene, entry_source_index=source_index,
                       deleted_pair=deleted_pair, msg_pair=msg_pair, msg_index=msg_index,
                       pool_drop=pool_drop, entry_msg=entry_msg, entry_pair=entry_pair,
                       msg_back=msg_back, gene_back=gene_back, entry_msg_back=entry_msg_back,
                       entry_pair_csr=entry_pair_csr, deleted_gene=deleted_gene,
                       deleted_back=selection_csr(deleted_gene, n),
                       source_back=selection_csr(source_gene, n))
