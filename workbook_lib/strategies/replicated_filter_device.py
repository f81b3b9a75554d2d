"""Strategy 5: replicated graph *filtered* on the device (``isin`` + gather), not masked."""
from __future__ import annotations

import torch

from ..strategies.base import ReplicatedAggregateMixin, Strategy


class ReplicatedFilterDevice(ReplicatedAggregateMixin, Strategy):
    name = "replicated_filter_device"
    label = "5 replicated, filtered on device"
    title = "the replicated graph filtered on the device"
    number = 5

    def keep_mask(self, src, dst, pert):
        """Keep-mask of the replicated edges: neither endpoint deleted (``isin``)."""
        b = pert.shape[0]
        off = (torch.arange(b, device=pert.device) * self.n).unsqueeze(1)
        deleted = torch.where(pert >= 0, pert + off, torch.full_like(pert, -1)).reshape(-1)
        return ~(torch.isin(src, deleted) | torch.isin(dst, deleted))

    def device_prepare(self, batch):
        ctx = super().device_prepare(batch)
        ctx["edges"] = {}
        for t in self.graph.edge_types:
            src, dst = self.replicate(t, ctx["B"])
            idx = self.keep_mask(src, dst, batch["pert"]).nonzero().squeeze(1)  # host sync
            ctx["edges"][t] = (src.index_select(0, idx), dst.index_select(0, idx), None)
        return ctx

    def aggregate(self, h, edge_type, ctx):
        return self._replicated_aggregate(h, edge_type, ctx)
