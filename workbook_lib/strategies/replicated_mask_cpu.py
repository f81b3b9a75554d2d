"""Strategy 2: replicated graph + boolean edge masks built in CPU workers from an incidence
cache (the investigation's "Lazy Hetero" collate: B copies of ``edge_index``, one mask per sample)."""
from __future__ import annotations

import torch

from ..data.snapshots import CellGraph
from ..strategies.base import ReplicatedAggregateMixin, Strategy, incidence_cache, tensor_bytes


class ReplicatedMaskCPU(ReplicatedAggregateMixin, Strategy):
    name = "replicated_mask_cpu"
    label = "2 replicated + masks (CPU incidence cache)"
    title = "replicated masks (the Lazy pipeline)"
    number = 2

    def _prepare(self):
        self.host["incidence"] = incidence_cache(self.graph)

    def masks_for(self, pert_row: torch.Tensor) -> dict[str, torch.Tensor]:
        """Boolean keep-mask per edge type for one sample (False = removed edge)."""
        genes = pert_row[pert_row >= 0]
        out = {}
        for t, ei in self.graph.edge_index.items():
            mask = torch.ones(ei.shape[1], dtype=torch.bool)
            offsets, pos = self.host["incidence"][t]
            for g in genes.tolist():
                mask[pos[offsets[g]:offsets[g + 1]]] = False
            out[t] = mask
        return out

    def make_item(self, index, pert_row):
        return {"index": index, "pert": pert_row, "masks": self.masks_for(pert_row)}

    def collate(self, items):
        batch = super().collate(items)
        b = len(items)
        off = (torch.arange(b) * self.n).view(b, 1, 1)
        batch["edge_index"] = {t: (ei.unsqueeze(0) + off).permute(1, 0, 2).reshape(2, -1)
                               for t, ei in self.graph.edge_index.items()}
        batch["masks"] = {t: torch.cat([it["masks"][t] for it in items])
                          for t in self.graph.edge_types}
        return batch

    def device_prepare(self, batch):
        ctx = super().device_prepare(batch)
        ctx["edges"] = {t: (ei[0], ei[1], batch["masks"][t])
                        for t, ei in batch["edge_index"].items()}
        return ctx

    def aggregate(self, h, edge_type, ctx):
        return self._replicated_aggregate(h, edge_type, ctx)


def measured_replicated_bytes(graph: CellGraph, pert: torch.Tensor,
                              batch_size: int = 4) -> tuple[float, int]:
    """What strategy 2 really carries: mask bytes per sample in a batch its collate built (the
    same with the dual forward: its wildtype pass runs on the unperturbed graph), and the bytes
    of its prepared incidence cache."""
    s = ReplicatedMaskCPU(graph, device="cpu").prepare()
    rows = pert[:batch_size]
    batch = s.collate([s.make_item(i, r) for i, r in enumerate(rows)])
    return tensor_bytes(batch["masks"]) / len(rows), tensor_bytes(s.host["incidence"])
