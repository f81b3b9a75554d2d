"""Strategy 4: masks generated on the device from the perturbation indices.

Two forms: ``device_mask_loop`` (a Python loop with ``.item()`` per deleted gene and per edge
type - each one a device-to-host sync on a GPU) and ``device_mask_vectorized`` (no sync).
The batch carries only the indices; the replicated ``edge_index`` is built on the device.
"""
from __future__ import annotations

import torch

from ..data.perturbations import node_keep_mask
from ..strategies.base import ReplicatedAggregateMixin, Strategy, incidence_cache


class DeviceMaskLoop(ReplicatedAggregateMixin, Strategy):
    name = "device_mask_loop"
    label = "4a device masks, loop with .item()"
    title = "device masks built in an .item() loop"
    number = 4

    def _prepare(self):
        for t, (off, pos) in incidence_cache(self.graph).items():
            self.dev[f"inc_off_{t}"] = off.to(self.device)
            self.dev[f"inc_pos_{t}"] = pos.to(self.device)

    def syncs_per_batch(self, pert: torch.Tensor) -> int:
        """Host syncs of :meth:`make_masks`: one ``.item()`` per gene slot, two per deleted
        gene and edge type."""
        b, k = pert.shape
        valid = int((pert >= 0).sum())
        return b * k + 2 * valid * len(self.graph.edge_types)

    def make_masks(self, pert: torch.Tensor) -> dict[str, torch.Tensor]:
        b, k = pert.shape
        masks = {t: torch.ones(b, self.graph.num_edges(t), dtype=torch.bool, device=self.device)
                 for t in self.graph.edge_types}
        for i in range(b):
            for j in range(k):
                g = pert[i, j].item()
                if g < 0:
                    continue
                for t in self.graph.edge_types:
                    off = self.dev[f"inc_off_{t}"]
                    start, stop = off[g].item(), off[g + 1].item()
                    masks[t][i, self.dev[f"inc_pos_{t}"][start:stop]] = False
        return masks

    def device_prepare(self, batch):
        ctx = super().device_prepare(batch)
        masks = self.make_masks(batch["pert"])
        ctx["edges"] = {}
        for t in self.graph.edge_types:
            src, dst = self.replicate(t, ctx["B"])
            ctx["edges"][t] = (src, dst, masks[t].reshape(-1))
        return ctx

    def aggregate(self, h, edge_type, ctx):
        return self._replicated_aggregate(h, edge_type, ctx)


class DeviceMaskVectorized(DeviceMaskLoop):
    name = "device_mask_vectorized"
    label = "4b device masks, vectorized"
    title = "vectorized device masks"

    def _prepare(self):
        pass  # needs only the wildtype edges (kept on the device by the base class)

    def syncs_per_batch(self, pert):
        return 0

    def make_masks(self, pert):
        deleted = ~node_keep_mask(pert, self.n)  # [B, N]
        return {t: ~(deleted[:, self.dev[f"wt_{t}"][0]] | deleted[:, self.dev[f"wt_{t}"][1]])
                for t in self.graph.edge_types}
