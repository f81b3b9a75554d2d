"""A batch of perturbed graphs on the shared graph: per-sample aggregation, exact.

For sample ``b`` with deleted genes ``S_b`` (``D_b`` zeroes their rows), per edge type ``t``:
any layer (:meth:`NodeMaskBatch.aggregate`) is ``agg_tb = D_b A_t (D_b h_b)``, divided by the
per-sample in-degree ``A_t (D_b 1)`` for mean aggregation; a first layer with a shared input
(:meth:`NodeMaskBatch.aggregate_shared`) is ``A_b x0 = D_b (A x0 - A[:, S_b] x0[S_b])``, the
wildtype plus corrections on the deleted genes and their out-neighbours; a linear last layer
before a mean over genes (:meth:`NodeMaskBatch.aggregate_pooled`) is
``sum_n agg_tb[n] = sum_j w_tb[j] h_b[j]`` with ``w_tb = D_b A_t^T (D_b / deg_tb)``; a second
layer after an incremental first one (:meth:`NodeMaskBatch.delta_layer`) is the wildtype plus a
push of the changes (:mod:`workbook_lib.nodemask.delta`). All exact (float32 rounding) for sum
and mean aggregation, outputs and gradients. Correction indices are computed where ``deleted``
lives: on the host no device sync, on a GPU one per batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .delta import default_push_kernel, grouped_messages, push, push_pooled
from .kernels import (add_at_rows, add_rows, batched_spmm, gather_rows, nnz,
                      sparse_range, stacked_aggregate_linear, typed_aggregate_linear, typed_spmm)

from .corrections import Corrections, corrections, validate_deleted





@dataclass
class DeltaFeatures:
    """Per-sample features: the wildtype ``[N, H]`` plus ``delta`` ``[R, H]`` at the correction
    rows (every other row is the wildtype's): :meth:`NodeMaskBatch.first_layer_delta`'s output."""

    wildtype: torch.Tensor
    delta: torch.Tensor
    rows: torch.Tensor  # [R] flat index sample * N + gene
    batch_size: int

    def dense(self) -> torch.Tensor:
        """``[B, N, H]`` (materialises every sample)."""
        n, h = self.wildtype.shape
        base = self.wildtype.unsqueeze(0).expand(self.batch_size, n, h).reshape(-1, h)
        return base.index_add(0, self.rows, self.delta).view(self.batch_size, n, h)


@dataclass
class SharedAggregation:
    """Per-sample aggregation of an input shared by all samples: the wildtype aggregation
    ``[N, T, H]`` plus ``delta`` ``[R, T, H]`` at the rows a deletion changes."""

    wildtype: torch.Tensor
    delta: torch.Tensor
    rows: torch.Tensor  # [R] flat index sample * N + gene
    batch_size: int

    def dense(self) -> torch.Tensor:
        """``[B, N, T, H]`` (materialises every sample: prefer :meth:`linear`)."""
        n, t, h = self.wildtype.shape
        base = self.wildtype.unsqueeze(0).expand(self.batch_size, n, t, h).reshape(-1, t, h)
        return base.index_add(0, self.rows, self.delta).view(self.batch_size, n, t, h)

    def linear(self, weight: torch.Tensor) -> torch.Tensor:
        """``sum_t agg_tb W_t^T`` for every (sample, gene): ``[B, N, H_out]`` for
        ``weight`` ``[H_out, T*H]`` (the per-type aggregations concatenated type-major)."""
        n, t, h = self.wildtype.shape
        wt = self.wildtype.reshape(n, t * h) @ weight.T
        corr = self.delta.reshape(-1, t * h) @ weight.T
        base = wt.unsqueeze(0).expand(self.batch_size, n, wt.shape[1]).reshape(-1, wt.shape[1])
        return base.index_add(0, self.rows, corr).view(self.batch_size, n, -1)


class NodeMaskBatch:
    """B copies of the shared graph, sample ``b`` without the genes in ``deleted[b]``.

    Args:
        graph: the prepared :class:`SharedGraph`.
        deleted: ``[B, k]`` gene indices (``-1`` pads rows that delete fewer genes).
        corrections: precomputed :func:`corrections` (e.g. from a DataLoader worker), else lazy.
        validate: check ``deleted`` (:func:`validate_deleted`: on a GPU a read back; validate
            in the collate and pass False in the step).
        push_kernel: ``numba``, ``pull`` or ``index_add`` (default by device).
    """

    def __init__(self, graph: SharedGraph, deleted: torch.Tensor,
                 corrections: Corrections | None = None, *, validate: bool = True,
                 push_kernel: str | None = None):
        self.graph = graph
        if validate:
            deleted = validate_deleted(deleted, graph.num_nodes)
        elif deleted.dim() != 2:
            raise ValueError(f"'deleted' must be [B, k] (got shape {list(deleted.shape)})")
        deleted = deleted.long()
        self.push_kernel = push_kernel or default_push_kernel(graph.device)
        self.deleted = deleted if deleted.device == graph.device else deleted.to(graph.device)
        self.batch_size = int(deleted.shape[0])
        n = graph.num_nodes
        keep = torch.ones(self.batch_size, n + 1, device=graph.device)
        idx = torch.where(self.deleted >= 0, self.deleted, torch.full_like(self.deleted, n))
        keep.scatter_(1, idx, 0.0)
        self.keep = keep[:, :n]  # [B, N] 1 = kept, 0 = deleted
        self._host_deleted = deleted if deleted.device.type == "cpu" else None
        self._corrections = corrections
        self._deg = None
        self._pool_w = None
        self._pool_w1 = None

    # ---------------------------------------------------------------- helpers
    def _check(self, h: torch.Tensor, shared: bool = False) -> None:
        n = self.graph.num_nodes
        want = "[N, H]" if shared else "[B, N, H]"
        if (shared and (h.dim() != 2 or h.shape[0] != n)) or (
                not shared and (h.dim() != 3 or h.shape[:2] != (self.batch_size, n))):
            raise ValueError(f"features must be {want} with N={n}"
                             + ("" if shared else f", B={self.batch_size}")
                             + f" (got {list(h.shape)})")

    def degrees(self) -> torch.Tensor:
        """``[B, N, T]`` per-sample in-degrees ``A_t (D_b 1)``."""
        if self._deg is None:
            g = self.graph
            with sparse_range(nnz(g.a) * self.batch_size):
                d = torch.sparse.mm(g.a, self.keep.T.contiguous())  # [N*T, B]
            self._deg = d.view(g.num_nodes, g.num_types, self.batch_size).permute(2, 0, 1)
        return self._deg

    def corrections(self) -> Corrections:
        if self._corrections is None:
            src = self._host_deleted if self._host_deleted is not None else self.deleted
            self._corrections = corrections(self.graph.out_edges, src).to(self.graph.device)
        return self._corrections

    def _on_deleted_rows(self, rows: torch.Tensor, wild: torch.Tensor,
                         scale: float) -> torch.Tensor:
        """``rows`` ``[R, H]`` plus ``scale * wild[gene]`` at the correction rows whose gene is
        deleted, added in place (``rows`` is a fresh intermediate)."""
        c = self.corrections()
        if c.deleted_pair is None:
            d = (~c.pair_deleted).to(rows.dtype).unsqueeze(1)
            return rows + scale * (1.0 - d) * wild.index_select(0, c.pair_gene)
        genes = c.deleted_gene if c.deleted_gene is not None else \
            c.pair_gene.index_select(0, c.deleted_pair)
        return add_at_rows(rows, gather_rows(wild, genes, c.deleted_back), c.deleted_pair, scale)

    @staticmethod
    def _wsum(weight: torch.Tensor, t: int) -> torch.Tensor:
        return weight.view(weight.shape[0], t, -1).sum(1)

    # ---------------------------------------------------------------- aggregations
    def aggregate(self, h: torch.Tensor) -> torch.Tensor:
        """Per-sample aggregation ``[B, N, T, H]`` of ``h`` ``[B, N, H]``."""
        self._check(h)
        g = self.graph
        k = self.keep.unsqueeze(-1)
        agg = batched_spmm(g.a, g.a_t, h * k, g.kernel).view(
            self.batch_size, g.num_nodes, g.num_types, h.shape[-1])
        if g.aggr == "mean":
            agg = agg / self.degrees().clamp(min=1).unsqueeze(-1)
        return agg * k.unsqueeze(-1)

    def aggregate_shared(self, x0: torch.Tensor) -> SharedAggregation:
        """Per-sample aggregation of ``x0`` ``[N, H]`` (the same input for every sample) as the
        wildtype aggregation plus corrections at the rows the deletions change."""
        self._check(x0, shared=True)
        g, c = self.graph, self.corrections()
        n, t, h = g.num_nodes, g.num_types, x0.shape[-1]
        sums = g.wildtype_sums(x0)  # [N, T, H]
        r = c.pair_gene.numel()
        lost = torch.zeros(r * t, h, device=x0.device, dtype=x0.dtype).index_add(
            0, c.entry_slot, x0[c.entry_source]).view(r, t, h)
        s_rows = sums[c.pair_gene]
        kept = (~c.pair_deleted).to(x0.dtype).view(r, 1, 1)
        if g.aggr == "mean":
            lost_deg = torch.zeros(r * t, device=x0.device).index_add(
                0, c.entry_slot, torch.ones_like(c.entry_slot, dtype=torch.float32)).view(r, t)
            deg_rows = g.deg[c.pair_gene]
            new = (s_rows - lost) / (deg_rows - lost_deg).clamp(min=1).unsqueeze(-1)
            wild = sums / g.deg.clamp(min=1).unsqueeze(-1)
            old = s_rows / deg_rows.clamp(min=1).unsqueeze(-1)
        else:
            new, wild, old = s_rows - lost, sums, s_rows
        return SharedAggregation(wildtype=wild, delta=new * kept - old,
                                 rows=c.pair_sample * n + c.pair_gene,
                                 batch_size=self.batch_size)

    def pooled_weights(self) -> torch.Tensor:
        """``[B, T, N]``: ``w_tb[j]`` with ``mean_n agg_tb[n] = sum_j w_tb[j] h_b[j]`` (sum: the
        kept out-degrees less the deleted genes' in-edges, over N; mean: one product of width B)."""
        if self._pool_w is None:
            g = self.graph
            n, t = g.num_nodes, g.num_types
            if g.aggr == "sum" and self._corrections_allowed():
                c = self.corrections()
                w = g.out_deg.unsqueeze(0).repeat(self.batch_size, 1, 1)  # [B, T, N]
                drop = c.pool_drop
                with sparse_range(drop.numel()):
                    w.view(-1).index_put_((drop,), torch.full_like(drop, -1.0, dtype=w.dtype),
                                          accumulate=True)
                self._pool_w = w * (self.keep / n).unsqueeze(1)
                return self._pool_w
            d = self.keep.T.contiguous()  # [N, B]
            v = d.repeat_interleave(t, dim=0)  # row n*T + t = D[n]
            with sparse_range(nnz(g.blockdiag_t, *([g.a] if g.aggr == "mean" else []))
                              * self.batch_size):
                if g.aggr == "mean":
                    v = v / torch.sparse.mm(g.a, d).clamp(min=1)
                w = torch.sparse.mm(g.blockdiag_t, v).view(n, t, self.batch_size)
            self._pool_w = (w * d.unsqueeze(1) / n).permute(2, 1, 0).contiguous()
        return self._pool_w

    def _corrections_allowed(self) -> bool:
        """The corrections are given or buildable without a device read (then the pooled
        weights need no product over E)."""
        c = self._corrections
        return (c.pool_drop is not None) if c is not None else self._host_deleted is not None

    def aggregate_pooled(self, h: torch.Tensor) -> torch.Tensor:
        """``[B, T, H]``: the mean over genes of each sample's per-type aggregation of ``h``
        (``[B, N, H]``, or ``[N, H]`` shared by all samples), without materialising it."""
        w = self.pooled_weights()
        if h.dim() == 2:
            self._check(h, shared=True)
            return w @ h
        self._check(h)
        return torch.bmm(w, h)

    # ---------------------------------------------------------------- GIN-shaped layers
    def layer(self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
              eps: float = 0.0, relu: bool = True) -> torch.Tensor:
        """``W [x_1 | ... | x_T] + b`` with ``x_t = (1 + eps) h + agg_t`` for every sample:
        ``[B, N, H_out]`` (ReLU'd unless ``relu=False``)."""
        self._check(h)
        g = self.graph
        b, n, hd = h.shape
        k = self.keep.unsqueeze(-1)
        if g.kernel == "slab":
            degp = (self.degrees().clamp(min=1).permute(0, 2, 1).unsqueeze(-1).contiguous()
                    if g.aggr == "mean" else None)
            lin = typed_aggregate_linear(h * k, weight, g.per_type, g.per_type_t, degp)
        else:
            agg = batched_spmm(g.a, g.a_t, h * k, g.kernel)  # [B, N*T, H]: raw sums
            if g.aggr == "mean":
                agg = (agg.view(b, n, g.num_types, hd) /
                       self.degrees().clamp(min=1).unsqueeze(-1))
            lin = agg.reshape(b, n, -1) @ weight.T
        pre = lin * k + (1.0 + eps) * (h @ self._wsum(weight, g.num_types).T)
        if bias is not None:
            pre = pre + bias
        return torch.relu(pre) if relu else pre

    def first_layer(self, x0: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None = None, *, eps: float = 0.0,
                    relu: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The same layer for an input ``x0`` ``[N, H]`` shared by every sample, computed
        incrementally. Returns ``(per-sample [B, N, H_out], wildtype [N, H_out])``."""
        sa = self.aggregate_shared(x0)
        n, t, hd = sa.wildtype.shape
        self_term = (1.0 + eps) * (x0 @ self._wsum(weight, t).T)
        if bias is not None:
            self_term = self_term + bias
        wt = sa.wildtype.reshape(n, t * hd) @ weight.T + self_term
        corr = sa.delta.reshape(-1, t * hd) @ weight.T
        base = wt.unsqueeze(0).expand(self.batch_size, n, wt.shape[1]).reshape(-1, wt.shape[1])
        out = base.index_add(0, sa.rows, corr).view(self.batch_size, n, -1)
        return (torch.relu(out), torch.relu(wt)) if relu else (out, wt)

    def _typed_linear(self, x: torch.Tensor, weight: torch.Tensor):
        """Each type's wildtype ``A_t x W_t^T`` ``[T, N, H_out]`` (raw sums; None when not needed)
        and the layer's aggregation term ``[N, H_out]``."""
        g = self.graph
        t, hd, ho = g.num_types, x.shape[-1], weight.shape[0]
        if g.aggr == "sum" and g.a_tt is not None:  # one stacked product each way, no [T, N, Ho]
            return None, stacked_aggregate_linear(x, weight, g.a, g.a_tt)
        sums = typed_spmm(g, x)  # [T, N, H]
        sw = torch.bmm(sums, weight.view(ho, t, hd).permute(1, 2, 0))  # [T, N, Ho]
        if g.aggr == "mean":
            lin = (sw / g.deg.clamp(min=1).T.unsqueeze(-1)).sum(0)
        else:
            lin = sw.sum(0)
        return sw, lin

    def _mean_row_terms(self, sw: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean aggregation at the correction rows: ``(new 1/deg [R, T], the wildtype part's
        change [R, H_out])`` with ``sum_t S_t (1/deg_tb - 1/deg_t) W_t^T``."""
        g, c = self.graph, self.corrections()
        t = g.num_types
        gene = c.pair_gene
        r = gene.numel()
        lost = torch.zeros(r * t, device=sw.device, dtype=dtype).index_add(
            0, c.entry_slot, torch.ones_like(c.entry_slot, dtype=dtype)).view(r, t)
        deg_rows = g.deg.index_select(0, gene)
        new_inv = 1.0 / (deg_rows - lost).clamp(min=1)
        diff = (new_inv - 1.0 / deg_rows.clamp(min=1)).reshape(-1)  # [R*T]
        q = c.changed_slot
        q_row, q_type = q // t, q % t
        rows = sw[q_type, gene.index_select(0, q_row)] * diff.index_select(0, q).unsqueeze(-1)
        change = torch.zeros(r, sw.shape[-1], device=sw.device, dtype=dtype).index_add(
            0, q_row, rows)
        return new_inv, change

    def first_layer_delta(self, x0: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor | None = None, *, eps: float = 0.0,
                          relu: bool = True) -> DeltaFeatures:
        """:meth:`first_layer` in delta form: the wildtype output and, at the correction rows
        only, each sample's difference from it (for :meth:`delta_layer`)."""
        self._check(x0, shared=True)
        g, c = self.graph, self.corrections()
        t, hd, ho = g.num_types, x0.shape[-1], weight.shape[0]
        sw, agg_lin = self._typed_linear(x0, weight)
        wt = agg_lin + (1.0 + eps) * (x0 @ self._wsum(weight, t).T)
        if bias is not None:
            wt = wt + bias
        gene = c.pair_gene
        kept = (~c.pair_deleted).to(x0.dtype).unsqueeze(1)
        # each deleted gene's messages x0[s] W_t, once per batch (not x0 W_t for every gene)
        w_push = weight.view(ho, t, hd).permute(2, 1, 0).reshape(hd, t * ho)
        xw = (gather_rows(x0, c.source_gene, c.source_back) @ w_push).view(-1, ho)  # [G*T, Ho]
        msgs = gather_rows(xw, c.entry_msg, c.entry_msg_back)  # [E_k, Ho]
        r = gene.numel()
        if g.aggr == "mean":
            new_inv, change = self._mean_row_terms(sw, x0.dtype)
            msgs = msgs * new_inv.reshape(-1).index_select(0, c.entry_slot).unsqueeze(-1)
        else:
            change = None
        lost = add_rows(msgs, c.entry_pair, r, c.entry_pair_csr)
        delta = change - lost if change is not None else -lost
        # a deleted gene aggregates nothing: its row loses the whole aggregation term
        delta = self._on_deleted_rows(delta * kept, agg_lin, -1.0)
        wt_rows = gather_rows(wt, gene, c.gene_back)
        new_rows = wt_rows + delta
        if relu:
            wt, wt_rows, new_rows = torch.relu(wt), torch.relu(wt_rows), torch.relu(new_rows)
        return DeltaFeatures(wildtype=wt, delta=new_rows - wt_rows,
                             rows=c.pair_sample * g.num_nodes + gene, batch_size=self.batch_size)

    def delta_parts(self, h: DeltaFeatures, weight: torch.Tensor,
                     bias: torch.Tensor | None, eps: float):
        """What the delta layer pushes: ``(base [N, Ho], messages [M, Ho], weights, rows
        [R, Ho])`` (see :meth:`delta_layer`), for ``delta.push`` or ``delta.push_pooled``."""
        g, c = self.graph, self.corrections()
        if c.plan is None or c.pair_out is None or c.changed_slot is None \
                or c.msg_pair is None:
            raise ValueError("these corrections carry no push plan: build them with "
                             "workbook_lib.nodemask.corrections")
        n, t = g.num_nodes, g.num_types
        h1, d1 = h.wildtype, h.delta
        gene = c.pair_gene
        kept = (~c.pair_deleted).to(h1.dtype).unsqueeze(1)
        # D_b h1_b - h1 at the correction rows: the change, or minus the whole row if deleted
        e = self._on_deleted_rows(d1 * kept, h1, -1.0)
        u = grouped_messages(e, weight, c.msg_pair, c.plan.type_counts, c.msg_back)  # [M, Ho]
        sw, agg_lin = self._typed_linear(h1, weight)
        wsum = self._wsum(weight, t)
        selfwt = (1.0 + eps) * (h1 @ wsum.T)
        if bias is not None:
            selfwt = selfwt + bias
        corr = (1.0 + eps) * (d1 @ wsum.T)  # the self term's change
        if g.aggr == "mean":
            keep = self.keep.unsqueeze(-1)  # [B, N, 1]: a deleted gene receives no message
            new_inv, change = self._mean_row_terms(sw, h1.dtype)
            inv = (1.0 / g.deg.clamp(min=1)).unsqueeze(0).repeat(self.batch_size, 1, 1)
            inv[c.pair_sample, gene] = new_inv
            w = (inv * keep).view(self.batch_size, n * t)
            corr = corr + change * kept
        else:
            w = self.keep  # [B, N]: one weight per receiving gene
        corr = self._on_deleted_rows(corr, agg_lin, -1.0)
        return agg_lin + selfwt, u, w, corr

    def delta_layer(self, h: DeltaFeatures, weight: torch.Tensor,
                    bias: torch.Tensor | None = None, *, eps: float = 0.0,
                    relu: bool = True, with_wildtype: bool = False):
        """:meth:`layer` for features in delta form, delta-propagated (equal to
        ``layer(h.dense(), ...)``); ``with_wildtype`` also returns the wildtype ``[N, H_out]``."""
        base, u, w, corr = self.delta_parts(h, weight, bias, eps)
        out = push(self.graph, self.corrections(), base, u, w, self.push_kernel, rows=corr,
                   relu=relu)
        if with_wildtype:
            return out, (torch.relu(base) if relu else base)
        return out

    def delta_pooled_layer(self, h: DeltaFeatures, weight: torch.Tensor,
                           bias: torch.Tensor | None, last_weight: torch.Tensor,
                           last_bias: torch.Tensor | None = None, *, eps: float = 0.0,
                           with_wildtype: bool = False):
        """``pooled_layer(delta_layer(h, weight, bias), last_weight, last_bias)`` in one go; with
        ``with_wildtype`` also the middle layer's wildtype output ``[N, H]``."""
        base, u, w, corr = self.delta_parts(h, weight, bias, eps)
        pooled = push_pooled(self.graph, self.corrections(), base, u, w, self._pool_weights_1(),
                             self.push_kernel, rows=corr)  # [B, T + 1, H]
        out = self._pooled_map(pooled, last_weight, last_bias, eps)
        return (out, torch.relu(base)) if with_wildtype else out

    def _pool_weights_1(self) -> torch.Tensor:
        """``[B, T + 1, N]``: the pooled weights and a row of ``1/N`` (the self term's mean)."""
        if self._pool_w1 is None:
            w = self.pooled_weights()
            n = self.graph.num_nodes
            self._pool_w1 = torch.cat([w, w.new_full((self.batch_size, 1, n), 1.0 / n)], 1)
        return self._pool_w1

    def _pooled_map(self, pooled: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None, eps: float) -> torch.Tensor:
        """The last layer's map of ``pooled`` ``[B, T + 1, H]`` (the T weighted sums and the
        mean): ``[B, H_out]``."""
        t = self.graph.num_types
        out = pooled[:, :t].reshape(self.batch_size, -1) @ weight.T + (1.0 + eps) * (
            pooled[:, t] @ self._wsum(weight, t).T)
        return out + bias if bias is not None else out

    def pooled_layer(self, h: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None, *, eps: float = 0.0) -> torch.Tensor:
        """The mean over genes of a last (linear, no activation) layer's output per sample:
        ``[B, H_out]``, exact because the mean of a linear map is the map of the mean."""
        t = self.graph.num_types
        wsum = self._wsum(weight, t)
        if h.dim() == 2:
            pooled = self.aggregate_pooled(h)  # [B, T, H]
            hbar = h.mean(dim=0).expand(self.batch_size, -1)
            out = pooled.reshape(self.batch_size, -1) @ weight.T + (1.0 + eps) * (hbar @ wsum.T)
            return out + bias if bias is not None else out
        self._check(h)
        pooled = torch.bmm(self._pool_weights_1(), h)  # [B, T + 1, H]: T weighted sums, mean
        return self._pooled_map(pooled, weight, bias, eps)
