"""Strategy 6: node-mask shared graph.

Deleting genes S_b is a diagonal 0/1 matrix D_b on the adjacency: ``A_b = D_b A D_b`` and
``A_b X = D_b A (D_b X)``. Every sample of a batch shares one unmodified CSR ``A`` per edge
type; the batch is one sparse product of ``A`` with the B samples' features side by side
(``[N, B*H]``), rows of deleted genes zeroed before and after. Mean aggregation divides by the
per-sample degrees ``A (D_b 1)``, one more product. No per-sample edge tensor exists anywhere:
the batch is k indices per sample.
"""
from __future__ import annotations

import torch

from .. import sparse_ops
from ..perturbations import node_keep_mask
from .base import Strategy


class NodeMaskShared(Strategy):
    name = "node_mask_shared"
    label = "6 node-mask shared graph"
    number = 6
    layout = "node_major"
    replicated = False

    def __init__(self, graph, **kw):
        kw.setdefault("form", "spmm")
        super().__init__(graph, **kw)

    def _prepare(self):
        for t, ei in self.graph.edge_index.items():
            self.dev[f"csr_{t}"] = sparse_ops.csr_from_sorted(ei[0].to(self.device),
                                                              ei[1].to(self.device),
                                                              self.n, self.n)

    def device_prepare(self, batch):
        ctx = super().device_prepare(batch)
        d = node_keep_mask(batch["pert"], self.n).T.to(torch.float32)  # [N, B]
        ctx["D"] = d
        if self.aggr == "mean":
            ctx["deg"] = {t: sparse_ops.spmm(self.dev[f"csr_{t}"], d)
                          for t in self.graph.edge_types}  # [N, B]
        return ctx

    def initial(self, embedding, ctx):
        return embedding.unsqueeze(1).expand(self.n, ctx["B"], embedding.shape[1])

    def aggregate(self, h, edge_type, ctx):
        d = ctx["D"].unsqueeze(-1)  # [N, B, 1]
        n, b, hdim = h.shape
        x = (h * d).reshape(n, b * hdim)
        out = sparse_ops.spmm(self.dev[f"csr_{edge_type}"], x).view(n, b, hdim) * d
        if self.aggr == "mean":
            out = sparse_ops.mean_divide(out, ctx["deg"][edge_type])
        return out

    def to_sample_major(self, h, ctx):
        return h.permute(1, 0, 2)  # [B, N, H]

    def wildtype_aggregate(self, h, edge_type):
        out = sparse_ops.spmm(self.dev[f"csr_{edge_type}"], h)
        if self.aggr == "mean":
            key = f"wt_deg_{edge_type}"
            if key not in self.dev:
                self.dev[key] = sparse_ops.in_degree(self.dev[f"wt_{edge_type}"][1], self.n)
            out = sparse_ops.mean_divide(out, self.dev[key])
        return out
