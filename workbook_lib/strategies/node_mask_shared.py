"""Strategy 6: node-mask shared graph.

Deleting genes S_b is a diagonal 0/1 matrix D_b on the adjacency: ``A_b = D_b A D_b`` and
``A_b X = D_b A (D_b X)``. Every sample of a batch shares one unmodified CSR adjacency; the batch
is one sparse product with the B samples' features side by side (``[N, B*H]``), rows of deleted
genes zeroed before and after. All T edge types are stacked into one ``[T*N, N]`` CSR matrix, so
a layer is a single sparse product. Mean aggregation divides by the per-sample degrees
``A (D_b 1)``, one more product. No per-sample edge tensor exists anywhere: the batch is k
indices per sample.
"""
from __future__ import annotations

import torch

from ..strategies import sparse_ops
from ..data.perturbations import node_keep_mask
from ..strategies.base import Strategy


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
        n = self.n
        src = torch.cat([ei[0] for ei in self.graph.edge_index.values()])
        row = torch.cat([ei[1] + i * n for i, ei in enumerate(self.graph.edge_index.values())])
        self.dev["csr_all"] = sparse_ops.csr_from_sorted(src.to(self.device),
                                                         row.to(self.device),
                                                         len(self.graph.edge_index) * n, n)
        self.dev["csr_all_t"] = sparse_ops.transpose_csr(self.dev["csr_all"])  # for backward

    def device_prepare(self, batch):
        ctx = super().device_prepare(batch)
        d = node_keep_mask(batch["pert"], self.n).T.to(torch.float32)  # [N, B]
        ctx["D"] = d
        if self.aggr == "mean":
            t = len(self.graph.edge_types)
            ctx["deg"] = sparse_ops.spmm(self.dev["csr_all"], d).view(t, self.n, -1)  # [T,N,B]
        return ctx

    def initial(self, embedding, ctx):
        return embedding.unsqueeze(1).expand(self.n, ctx["B"], embedding.shape[1])

    def aggregate_all(self, h, ctx):
        d = ctx["D"].unsqueeze(-1)  # [N, B, 1]
        n, b, hdim = h.shape
        t = len(self.graph.edge_types)
        x = (h * d).reshape(n, b * hdim)
        out = sparse_ops.spmm(self.dev["csr_all"], x, self.dev["csr_all_t"]).view(t, n, b, hdim) * d
        if self.aggr == "mean":
            out = sparse_ops.mean_divide(out, ctx["deg"])
        return out  # [T, N, B, H]

    def aggregate(self, h, edge_type, ctx):
        return self.aggregate_all(h, ctx)[self.graph.edge_types.index(edge_type)]

    def to_sample_major(self, h, ctx):
        return h.permute(1, 0, 2)  # [B, N, H]

    def wildtype_aggregate(self, h, edge_type):
        return self.wildtype_aggregate_all(h)[self.graph.edge_types.index(edge_type)]

    def wildtype_aggregate_all(self, h):
        t = len(self.graph.edge_types)
        out = sparse_ops.spmm(self.dev["csr_all"], h, self.dev["csr_all_t"]).view(t, self.n, -1)
        if self.aggr == "mean":
            if "wt_deg_all" not in self.dev:
                ones = torch.ones(self.n, 1, device=h.device)
                self.dev["wt_deg_all"] = sparse_ops.spmm(self.dev["csr_all"], ones).view(
                    t, self.n)
            out = sparse_ops.mean_divide(out, self.dev["wt_deg_all"])
        return out
